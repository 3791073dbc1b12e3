#!/usr/bin/env bash
# Set up everything faultwatch needs on a fresh machine, then exit.
#   scripts/bootstrap.sh demo   -> system check (Java) + project venv with the core and demo dependencies
#   scripts/bootstrap.sh test   -> the same + test, Airflow and Great Expectations extras + Chromium
# Idempotent: a stamp per install set skips pip when pyproject.toml has not changed.
set -euo pipefail
cd "$(dirname "$0")/.."
target="${1:-demo}"
PYTHON="${PYTHON:-python3}"
VENV=".venv"

say() { printf 'bootstrap: %s\n' "$*"; }
die() { printf 'bootstrap: ERROR: %s\n' "$*" >&2; exit 1; }

can_apt() { command -v apt-get >/dev/null 2>&1 && [ "$(id -u)" = "0" ]; }
apt_updated=0
apt_install() {
  if ! can_apt; then return 1; fi
  if [ "$apt_updated" = 0 ]; then
    DEBIAN_FRONTEND=noninteractive apt-get update -qq >/dev/null || return 1
    apt_updated=1
  fi
  DEBIAN_FRONTEND=noninteractive apt-get install -y -qq --no-install-recommends "$@" >/dev/null
}

# 1. Python 3.10+
command -v "$PYTHON" >/dev/null 2>&1 || die "python3 not found: install Python 3.10 or later"
"$PYTHON" -c 'import sys; sys.exit(0 if sys.version_info >= (3, 10) else 1)' \
  || die "Python 3.10+ is needed, $PYTHON is $("$PYTHON" --version 2>&1)"
"$PYTHON" -c 'import venv, ensurepip' 2>/dev/null || apt_install python3-venv \
  || die "the Python venv module is missing: install python3-venv"

# 2. Java 17+ for Spark
java_ok() {
  local java="${JAVA_HOME:+$JAVA_HOME/bin/}java"
  command -v "$java" >/dev/null 2>&1 || return 1
  local v
  v=$("$java" -version 2>&1 | sed -n 's/.*version "\([0-9]*\).*/\1/p' | head -n1)
  [ -n "$v" ] && [ "$v" -ge 17 ]
}
if ! java_ok; then
  say "Java 17+ not found; installing openjdk-17-jre-headless"
  apt_install openjdk-17-jre-headless \
    || die "Spark needs Java 17 or later. Install it (e.g. apt-get install openjdk-17-jre-headless) or set JAVA_HOME."
  java_ok || die "Java 17+ still not found after installing it; set JAVA_HOME"
fi

# 3. Chromium for the report test (test set only)
if [ "$target" = "test" ] && ! command -v chromium >/dev/null 2>&1; then
  say "installing Chromium (headless report test)"
  apt_install chromium || die "the report test needs Debian's chromium package: apt-get install chromium"
fi

# 3b. Prometheus for the serve tests: promtool checks deploy/, a real server scrapes (test set only)
if [ "$target" = "test" ] && ! command -v promtool >/dev/null 2>&1; then
  say "installing Prometheus (deploy/ rules check and the scrape test)"
  apt_install prometheus || die "the serve tests need Debian's prometheus package: apt-get install prometheus"
fi

# 3c. Alertmanager for the alert lifecycle test (test set only)
if [ "$target" = "test" ] && ! command -v prometheus-alertmanager >/dev/null 2>&1; then
  say "installing Alertmanager (alert lifecycle test)"
  apt_install prometheus-alertmanager \
    || die "the alert test needs Debian's prometheus-alertmanager package: apt-get install prometheus-alertmanager"
fi

# 3d. Maven for the Java clients (clients/java: send hook, feed client, admin poller) and the real
#     RocketMQ and Apache Kafka jars of the tests (test set only); what Maven fetches is cached in ~/.m2
if [ "$target" = "test" ] && ! command -v mvn >/dev/null 2>&1; then
  say "installing Maven (the Java clients and the real-cluster tests)"
  apt_install maven || die "the Java clients need Maven: apt-get install maven"
fi
# 3e. An S3-compatible server for the object-storage tests (tests/integration/s3_server.py): Versity's
#     S3 gateway (Apache-2.0), built from its Go module through the Go module proxy (~1 min of 2 cores)
#     into ~/.cache/faultwatch/bin; the module's sources stay in Go's module cache. Once. It builds in
#     the background while Maven and pip below fetch theirs; step 8 waits for it.
VERSITYGW_VERSION="v1.8.0"
gw_bin="${XDG_CACHE_HOME:-$HOME/.cache}/faultwatch/bin"
gw_pid=""
if [ "$target" = "test" ] && [ ! -x "$gw_bin/versitygw" ]; then
  command -v go >/dev/null 2>&1 || apt_install golang-go || die "building the tests' S3 server needs Go: apt-get install golang-go"
  say "building Versity's S3 gateway $VERSITYGW_VERSION in the background (the S3 tests' server; first time: about a minute)"
  mkdir -p "$gw_bin"
  gw_log="$(mktemp)"
  GOBIN="$gw_bin" GOFLAGS=-buildvcs=false go install "github.com/versity/versitygw/cmd/versitygw@$VERSITYGW_VERSION" \
    >"$gw_log" 2>&1 &
  gw_pid=$!
  trap '[ -n "$gw_pid" ] && kill "$gw_pid" 2>/dev/null; true' EXIT  # a failed set-up leaves no build behind
fi
if [ "$target" = "test" ]; then
  say "building clients/java (first time: Maven fetches the jars into ~/.m2)"
  mvn -q -B -f clients/java/pom.xml install -DskipTests || die "building clients/java failed (see Maven's output above)"
fi

# 4. The project's virtual environment
case "$target" in
  demo) extras="[demo]" ;;
  test) extras="[dev,airflow]" ;;
  *) die "unknown target '$target' (demo or test)" ;;
esac
stamp="$VENV/.installed-${target}"
if [ ! -x "$VENV/bin/python" ]; then
  say "creating $VENV"
  "$PYTHON" -m venv "$VENV"
fi
if [ ! -f "$stamp" ] || [ pyproject.toml -nt "$stamp" ]; then
  say "installing faultwatch${extras} into $VENV (first time: a few minutes)"
  "$VENV/bin/python" -m pip install -q --upgrade pip
  "$VENV/bin/python" -m pip install -q -e ".${extras}"
  touch "$stamp"
fi
# 5. Spark's classes archived for the driver's JVM (streaming/class_archive.py): ~4 s off every
#    start. Built once per Spark, JDK and JVM flags (~45 s, ~150 MB under ~/.cache/faultwatch).
if [ "${FAULTWATCH_CLASS_ARCHIVE:-1}" != "0" ]; then
  "$VENV/bin/python" -m streaming.class_archive \
    || say "no class archive (Spark starts ~4 s slower; it is tried again in the background)"
fi
# 6. Apache Kafka's jars for the tests' broker (pipeline/kafka_apache.py): fetched into ~/.m2 now,
#    so the tests (and a second set-up) need no network.
if [ "$target" = "test" ]; then
  "$VENV/bin/python" -m pipeline.kafka_apache || die "could not resolve Apache Kafka's jars through Maven"
fi
# 7. delta-spark's jars for the job's Spark session (streaming/deltaspark.py): resolved through Maven
#    into ~/.m2 once, so a later start needs no network. The tests need them (Delta's own reads and
#    the delta-spark writer); the demo runs without them.
if [ "$target" = "test" ]; then
  "$VENV/bin/python" -m streaming.deltaspark || die "could not resolve delta-spark's jars through Maven (io.delta)"
elif command -v mvn >/dev/null 2>&1; then
  "$VENV/bin/python" -m streaming.deltaspark || say "no delta-spark jars (the job runs with the deltalake writer)"
fi
# 8. The S3 gateway of step 3e, then Hadoop's S3A jars for Spark's checkpoints on s3://
#    (streaming/s3a.py), fetched into ~/.m2 once.
if [ -n "$gw_pid" ]; then
  if ! wait "$gw_pid"; then
    cat "$gw_log" >&2
    die "could not build versitygw $VERSITYGW_VERSION with Go (the S3 tests' server; Go's output above)"
  fi
  gw_pid=""
  rm -f "$gw_log"
fi
if [ "$target" = "test" ]; then
  "$VENV/bin/python" -m streaming.s3a || die "could not resolve hadoop-aws and the AWS SDK modules through Maven"
fi
say "ready ($target)"
