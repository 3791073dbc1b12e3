"""One typed, frozen configuration, validated when it is loaded.

``conf/faultwatch.toml`` mirrors the defaults declared here (a test keeps them equal), so the
embedded defaults and the documented file cannot drift. ``pipeline/defaults`` is a link to ``conf/``,
so a wheel carries the file as package data and an installed faultwatch finds it without a checkout.
An unknown key or a bad value fails at load with a message that names the key. Environment
variables may override connection settings and secrets only (:data:`ENV_OVERRIDES`); everything
else comes from the file.
"""

from __future__ import annotations

import dataclasses
import os
import re
import sys
from collections.abc import Mapping
from dataclasses import dataclass, field
from pathlib import Path
from types import MappingProxyType
from typing import Any, Literal

from pipeline import objstore, typedload
from schemas.errors import FaultwatchError

if sys.version_info >= (3, 11):
    import tomllib
else:  # pragma: no cover
    import tomli as tomllib

# The shipped defaults and scenarios: conf/ in the source tree (pipeline/defaults links to it),
# pipeline/defaults in an installed wheel.
DEFAULTS_DIR = (Path(__file__).resolve().parent / "defaults").resolve()
DEFAULT_CONFIG_PATH = DEFAULTS_DIR / "faultwatch.toml"


class ConfigError(FaultwatchError, ValueError):
    """A configuration problem; the message names the offending key."""


@dataclass(frozen=True)
class Secret:
    """A value that must never reach a log: its repr and str are masked."""

    value: str

    def __repr__(self) -> str:
        return "Secret('***')"

    __str__ = __repr__


@dataclass(frozen=True)
class KafkaConfig:
    bootstrap_servers: str = "127.0.0.1:9092"
    security_protocol: Literal["PLAINTEXT", "SSL", "SASL_PLAINTEXT", "SASL_SSL"] = "PLAINTEXT"
    sasl_mechanism: Literal["PLAIN", "SCRAM-SHA-256", "SCRAM-SHA-512"] | None = None
    sasl_username: str | None = None
    sasl_password: Secret | None = None
    ssl_cafile: str | None = None
    ssl_certfile: str | None = None
    ssl_keyfile: str | None = None
    ssl_password: Secret | None = None
    client_id: str = "faultwatch"
    request_timeout_ms: int = 30_000
    # How long a client keeps retrying an unreachable cluster before it fails with a clear error.
    connect_timeout_s: float = 30.0
    # Partitions of the topics that `faultwatch kafka` creates.
    partitions: int = 4
    # Offsets the job has not read that are gone (deleted by retention, the topic re-created, a broker
    # restarted empty) stop the query with a message naming them; false records each gap as a
    # quarantine row (reason "data_loss") and goes on from the oldest offset left.
    fail_on_data_loss: bool = True
    # Where a query without a checkpoint starts: "earliest" (each partition's oldest offset left),
    # "latest" (only what arrives from then on) or a time (ISO-8601 with a zone, or epoch ms), matched
    # against Kafka record timestamps. A checkpoint, once there, always wins.
    starting_offsets: str = "earliest"
    # "read_committed" skips records of aborted transactions and reads a partition only up to its
    # last stable offset; "read_uncommitted" reads everything written.
    isolation_level: Literal["read_committed", "read_uncommitted"] = "read_committed"
    # [kafka.client]: further kafka-python settings for every Kafka client faultwatch makes (the job's
    # consumers, the publisher, alerts, the feed client), e.g. ssl_check_hostname, sasl_kerberos_*,
    # ssl_ciphers, metadata_max_age_ms. Values of keys naming a password, secret or token are masked.
    client: Mapping[str, Any] = field(default_factory=dict)

    def __post_init__(self) -> None:
        masked = {k: Secret(str(v)) if _SECRET_KEY.search(k) and not isinstance(v, Secret) else v
                  for k, v in self.client.items()}
        object.__setattr__(self, "client", MappingProxyType(masked))

    # A mappingproxy does not pickle, and Spark ships the config to its tasks inside the sinks.
    def __getstate__(self) -> dict[str, Any]:
        return {**self.__dict__, "client": dict(self.client)}

    def __setstate__(self, state: dict[str, Any]) -> None:
        for key, value in state.items():
            object.__setattr__(self, key, MappingProxyType(value) if key == "client" else value)

    def validate(self) -> None:
        _positive(self, "request_timeout_ms", "connect_timeout_s", "partitions")
        self.starting_position()
        _check_client_settings(self.client)
        if self.security_protocol.startswith("SASL") and not (self.sasl_mechanism and self.sasl_username):
            raise ConfigError("kafka.sasl_mechanism and kafka.sasl_username are required for SASL")

    def starting_position(self) -> str:
        """``starting_offsets`` as the Kafka source takes it: "earliest", "latest" or epoch ms."""
        value = self.starting_offsets.strip()
        if value in ("earliest", "latest"):
            return value
        if value.isdigit():
            return value
        import datetime as dt

        try:
            when = dt.datetime.fromisoformat(value)
        except ValueError:
            when = None
        if when is None or when.tzinfo is None:
            raise ConfigError(
                f"kafka.starting_offsets must be 'earliest', 'latest', epoch milliseconds or an ISO-8601 time "
                f"with a zone (e.g. '2026-11-28T06:00:00+00:00'), got {self.starting_offsets!r}"
            )
        return str(int(when.timestamp() * 1000))

    def client_options(self) -> dict[str, Any]:
        """Keyword arguments for kafka-python clients (secrets unwrapped only here)."""
        opts: dict[str, Any] = {
            "bootstrap_servers": self.bootstrap_servers.split(","),
            "security_protocol": self.security_protocol,
            "client_id": self.client_id,
            "request_timeout_ms": self.request_timeout_ms,
        }
        if self.sasl_mechanism:
            opts["sasl_mechanism"] = self.sasl_mechanism
            opts["sasl_plain_username"] = self.sasl_username
            opts["sasl_plain_password"] = self.sasl_password.value if self.sasl_password else None
        for name in ("ssl_cafile", "ssl_certfile", "ssl_keyfile"):
            if getattr(self, name):
                opts[name] = getattr(self, name)
        if self.ssl_password:
            opts["ssl_password"] = self.ssl_password.value
        opts.update({k: v.value if isinstance(v, Secret) else v for k, v in self.client.items()})
        return opts


@dataclass(frozen=True)
class TopicsConfig:
    send_results: str = "rmq.send-results"
    consumer_progress: str = "rmq.consumer-progress"
    group_membership: str = "rmq.group-membership"
    avoidance: str = "rmq.avoidance"
    alerts: str = "rmq.alerts"

    def event_topics(self) -> dict[str, str]:
        """Event kind -> topic, for the three input topics."""
        return {
            "send_result": self.send_results,
            "consumer_progress": self.consumer_progress,
            "group_membership": self.group_membership,
        }

    def all(self) -> list[str]:
        return [getattr(self, f.name) for f in dataclasses.fields(self)]


@dataclass(frozen=True)
class S3Config:
    """How to reach ``s3://`` roots (pipeline/objstore.py); an unset key falls back to the standard
    AWS environment variable (AWS_ENDPOINT_URL, AWS_REGION, AWS_ACCESS_KEY_ID, AWS_SECRET_ACCESS_KEY)."""

    endpoint: str | None = None  # an S3-compatible server, e.g. "http://10.0.0.5:7070"; unset: AWS itself
    region: str | None = None
    access_key_id: str | None = None
    secret_access_key: Secret | None = None
    # How a Delta commit refuses to overwrite another writer's: "etag" sends If-None-Match (AWS S3 and
    # most S3-compatible servers); "dynamo:TABLE" coordinates through a DynamoDB table instead.
    conditional_put: str = "etag"


@dataclass(frozen=True)
class StorageConfig:
    root: str = "data/tables"
    checkpoint_root: str = "data/checkpoints"
    # JSON files of the current avoidance list, one per cluster, for producers that read files.
    publish_dir: str = "data/avoidance"
    # A table lacking columns this version writes: "evolve" adds them at start (older rows read as
    # null); "refuse" stops the start with a message naming them (see pipeline/deltaschema.py).
    schema_changes: Literal["evolve", "refuse"] = "evolve"
    # What commits the job's micro-batches: "deltalake" (the driver commits the Parquet files the
    # executors wrote) or "delta-spark" (Delta's own Spark writer; streaming/delta_spark_sink.py).
    writer: Literal["deltalake", "delta-spark"] = "deltalake"
    s3: S3Config = field(default_factory=S3Config)

    def validate(self) -> None:
        from pipeline.objstore import check_scheme

        check_scheme("root", self.root)
        check_scheme("checkpoint_root", self.checkpoint_root)
        if self.writer == "delta-spark" and "://" in self.root and not self.root.startswith("file:"):
            raise ConfigError(f"storage.writer: 'delta-spark' writes a local storage.root only, not {self.root!r}; "
                              "use writer = 'deltalake' (the default) for object storage")

    def table_path(self, name: str) -> str:
        from pipeline.objstore import join

        return join(self.root, name)


@dataclass(frozen=True)
class StreamConfig:
    trigger_interval_s: float = 5.0
    watermark_delay_s: float = 30.0
    max_events_per_batch: int = 800_000
    # A Kafka partition with more new records than this is read by several Spark tasks; partitions
    # with fewer than a tenth of it in all are read by one.
    max_events_per_task: int = 50_000
    max_event_bytes: int = 65_536
    # An event stamped further ahead of its Kafka record's timestamp is quarantined (wrong clock).
    max_future_skew_s: float = 300.0
    # Prefix of query names and Delta transaction app ids: two deployments sharing tables need two.
    app_id: str = "faultwatch"

    def validate(self) -> None:
        _positive(self, "trigger_interval_s", "max_events_per_batch", "max_events_per_task", "max_event_bytes",
                  "max_future_skew_s")
        if self.watermark_delay_s < 0:
            raise ConfigError("stream.watermark_delay_s must be >= 0")


@dataclass(frozen=True)
class MaintenanceConfig:
    """Upkeep of the Delta tables the streaming job writes (pipeline/maintenance.py): inside the job,
    after a micro-batch's commits, at most one table's step per micro-batch; or `faultwatch maintain`."""

    enabled: bool = True
    # A table is compacted (then checkpointed, expired log files removed) after this many
    # micro-batches that committed to it.
    compact_every_batches: int = 120
    # The publisher's own tables (publisher_cycles and the others it commits to every cycle) are
    # compacted after this many of its cycles: every cycle reads them back several times, and each
    # small file and commit since the last compaction adds to that (section 71 of docs/performance.md).
    publisher_compact_every_cycles: int = 10
    # Compaction bin-packs files smaller than this into files about this size; larger files stay.
    target_file_mb: int = 32
    # A table is vacuumed this often: files no log version within the retention references are deleted
    # (compacted-away files and the orphans of failed or replayed micro-batches).
    vacuum_interval_s: float = 3600.0
    vacuum_retention_h: float = 24.0
    # Commit files older than this are deleted once a checkpoint as old follows them
    # (delta.logRetentionDuration); time travel reaches back this far, as VACUUM allows.
    log_retention_h: float = 24.0
    # Rows whose event time (the table's time column) is this many hours behind the table's newest
    # row are deleted at each vacuum, before it; 0 keeps every row.
    data_retention_h: float = 720.0

    def validate(self) -> None:
        _positive(self, "compact_every_batches", "publisher_compact_every_cycles", "target_file_mb", "vacuum_interval_s", "vacuum_retention_h",
                  "log_retention_h")
        if self.data_retention_h < 0:
            raise ConfigError(f"maintenance.data_retention_h must be >= 0 (0 keeps every row), "
                              f"got {self.data_retention_h!r}")


JVM_FLAG_SETS = ("dev", "production")  # streaming/session.py JAVA_OPTIONS


@dataclass(frozen=True)
class SparkConfig:
    master: str = "local[2]"
    app_name: str = "faultwatch"
    shuffle_partitions: int = 4
    # The Spark JVMs' flags: "dev" (the quick JIT and the serial collector, cheapest on short runs
    # and small machines) or "production" (the optimising JIT and G1).
    jvm: str = "dev"
    conf: Mapping[str, str] = field(default_factory=dict)

    def validate(self) -> None:
        _positive(self, "shuffle_partitions")
        if self.jvm not in JVM_FLAG_SETS:
            raise ConfigError(f"spark.jvm must be one of {', '.join(map(repr, JVM_FLAG_SETS))}, got {self.jvm!r}")


@dataclass(frozen=True)
class FaultsConfig:
    # RocketMQ's own default for sendLatencyFaultEnable is false; used when an event does not say.
    default_send_latency_fault_enable: bool = False
    # ServiceDetector on (5.x): a RemotingException then marks the broker unreachable.
    detector_enabled: bool = False
    # A producer's state for a broker is dropped this long after its last send or window end.
    producer_idle_expiry_s: float = 900.0
    # Broker fault episodes are evaluated on an event-time grid once the watermark has passed it.
    evaluation_interval_s: float = 5.0
    # Opened by a quorum of recently active producers avoiding the broker ...
    active_producer_window_s: float = 60.0
    quorum_share: float = 0.5
    quorum_min_producers: int = 3
    # Producers running without fault tolerance count with the window their rules would give them.
    quorum_counts_shadow_windows: bool = True
    # ... or by an outlier against its peers (failure rate, p99 latency over a trailing window).
    outlier_window_s: float = 60.0
    outlier_failure_rate: float = 0.5
    outlier_min_sends: int = 20
    outlier_min_peers: int = 2
    outlier_latency_factor: float = 5.0
    outlier_min_latency_ms: int = 550
    # An episode closes once sends to the broker have succeeded for this long with no condition holding
    # (silence is not recovery: a dead broker drops out of the routes and nobody sends to it) ...
    episode_close_after_s: float = 30.0
    # ... or, for a broker nobody sends to any more (decommissioned, renamed), this long after it was
    # last heard of (closed_by "silence").
    episode_max_silence_s: float = 900.0
    max_producers_per_broker: int = 10_000
    # Events stamped further ahead of the batch time move no watermark and are quarantined.
    max_future_skew_s: float = 300.0
    # The default job keeps a cluster's brokers under this many state keys (brokers hashed by name):
    # each key costs a fixed share of every micro-batch, so a few keys, enough to use every task.
    shards: int = 8

    def validate(self) -> None:
        if isinstance(self.shards, bool) or not isinstance(self.shards, int) or self.shards < 1:
            raise ConfigError(f"faults.shards must be an integer >= 1, got {self.shards!r}")
        _positive(
            self,
            "producer_idle_expiry_s",
            "evaluation_interval_s",
            "active_producer_window_s",
            "quorum_min_producers",
            "outlier_window_s",
            "outlier_min_sends",
            "outlier_latency_factor",
            "max_producers_per_broker",
            "max_future_skew_s",
        )
        _share(self, "quorum_share", "outlier_failure_rate")
        if self.outlier_min_peers < 1:
            raise ConfigError(f"faults.outlier_min_peers must be >= 1, got {self.outlier_min_peers!r}")
        if self.episode_close_after_s < 0:
            raise ConfigError("faults.episode_close_after_s must be >= 0")
        if not self.episode_max_silence_s > 0 or self.episode_max_silence_s < self.episode_close_after_s:
            raise ConfigError(
                "faults.episode_max_silence_s must be > 0 and >= faults.episode_close_after_s "
                f"({self.episode_close_after_s!r}), got {self.episode_max_silence_s!r}"
            )
        if (self.evaluation_interval_s * 1000) % 1 or (60_000 % (self.evaluation_interval_s * 1000)):
            raise ConfigError(
                "faults.evaluation_interval_s must divide a minute into whole milliseconds, "
                f"got {self.evaluation_interval_s!r}"
            )


@dataclass(frozen=True)
class LagGroupConfig:
    # Where a consumer starts on a queue with no committed offset (-1): how such a queue's lag is read.
    consume_from_where: Literal[
        "CONSUME_FROM_LAST_OFFSET", "CONSUME_FROM_FIRST_OFFSET", "CONSUME_FROM_TIMESTAMP"
    ] = "CONSUME_FROM_LAST_OFFSET"
    # CONSUME_FROM_TIMESTAMP start; None = RocketMQ's default, 30 minutes before the queue was first seen.
    consume_timestamp_ms: int | None = None


@dataclass(frozen=True)
class LagConfig:
    # The queue status rules, by name: "burrow" (Burrow's evaluator exactly) or "faultwatch" (Burrow's
    # with the departures listed in pipeline/lag/status.py and docs/lag.md).
    rules: Literal["burrow", "faultwatch"] = "burrow"
    # Burrow's sliding window: the last N commits of each (group, queue), and N broker offsets.
    window_commits: int = 10
    # Burrow's allowed-lag: a lag at or below this counts as no lag.
    allowed_lag: int = 0
    # Burrow's minimum-complete: a queue whose window is less full than this share is OK.
    minimum_complete: float = 0.0
    # Burrow's offset-refresh: broker offsets are sampled once per this much event time.
    broker_offset_refresh_ms: int = 10_000
    # rules = "faultwatch": STALL and WARN need this many commits in the window.
    min_commits: int = 10
    # A group row alerts when its max time lag crosses above this bound.
    time_lag_alert_ms: int = 300_000
    # rules = "faultwatch": a commit with lag <= allowed_lag this recent excuses a pause in commits.
    caught_up_grace_ms: int = 60_000
    # Queues, (group, queue) pairs and memberships unseen this long are dropped from the state.
    queue_idle_expiry_s: float = 3600.0
    # Points kept per queue in the (offset -> store time) index.
    index_points: int = 32
    # After a membership change, progress from the previous owner is not flagged for this long
    # (RocketMQ clients rebalance every 20 s, each on its own timer).
    rebalance_grace_ms: int = 20_000
    # Events further than this ahead of the lag clock are quarantined (a producer clock years off
    # would otherwise make every consumer look stopped).
    max_future_skew_ms: int = 3_600_000
    # State keys per cluster: groups are spread over shards by hash, send results go to every shard.
    shards: int = 1
    # A shard without new events is re-evaluated (STOP, expiry) when event time has moved this far.
    idle_evaluation_s: float = 30.0
    # The combined query judges lag on this event-time grid, once the settle point has passed it.
    evaluation_interval_s: float = 5.0
    # A queue_lag row per (group, queue) at most this often while nothing changes; a new queue and a
    # status change always get a row (0 = a row for every batch with a commit).
    queue_row_interval_s: float = 60.0
    default: LagGroupConfig = field(default_factory=LagGroupConfig)
    groups: Mapping[str, LagGroupConfig] = field(default_factory=dict)

    def validate(self) -> None:
        _positive(
            self,
            "window_commits",
            "time_lag_alert_ms",
            "queue_idle_expiry_s",
            "shards",
            "idle_evaluation_s",
            "evaluation_interval_s",
            "broker_offset_refresh_ms",
        )
        if self.allowed_lag < 0:
            raise ConfigError(f"lag.allowed_lag must be >= 0, got {self.allowed_lag}")
        if not 0 <= self.minimum_complete <= 1:
            raise ConfigError(f"lag.minimum_complete must be between 0 and 1, got {self.minimum_complete}")
        if not 2 <= self.min_commits <= self.window_commits:
            raise ConfigError(
                f"lag.min_commits must be between 2 and lag.window_commits ({self.window_commits}), "
                f"got {self.min_commits}"
            )
        if self.index_points < 8:
            raise ConfigError(f"lag.index_points must be >= 8, got {self.index_points}")
        if self.queue_row_interval_s < 0:
            raise ConfigError(f"lag.queue_row_interval_s must be >= 0, got {self.queue_row_interval_s}")
        for name in ("caught_up_grace_ms", "rebalance_grace_ms", "max_future_skew_ms"):
            if getattr(self, name) < 0:
                raise ConfigError(f"lag.{name} must be >= 0, got {getattr(self, name)}")

    def for_group(self, group: str) -> LagGroupConfig:
        return self.groups.get(group, self.default)


@dataclass(frozen=True)
class PolicyConfig:
    """The avoidance policy (pipeline/policy): Envoy-style growth, share cap, hysteresis, expiry."""

    version: str = "1"
    # Avoidance after an episode: base × (repeat episodes), capped (Envoy's outlier ejection time).
    base_avoid_s: float = 30.0
    max_avoid_s: float = 300.0
    # Episodes that ended longer ago than this are forgotten; each decay_s of health forgives one.
    repeat_period_s: float = 3600.0
    decay_s: float = 600.0
    # Never avoid more than this share of a cluster's brokers (those seen within broker_seen_s).
    max_avoid_share: float = 0.5
    broker_seen_s: float = 900.0
    # Minimum time a published avoidance holds. Above publish.interval_s, so an open episode's
    # avoidance never lapses between two cycles; below 2 x interval minus the pipeline's lag, so a
    # released broker that is still bad fails a few probes and is caught by the very next cycle.
    hysteresis_s: float = 100.0
    # Producers drop a list this long after it was decided, so a dead publisher frees every broker.
    expiry_s: float = 180.0
    # The publisher refuses to publish when the newest input is older than this.
    max_input_age_s: float = 300.0

    def validate(self) -> None:
        _positive(
            self, "base_avoid_s", "max_avoid_s", "repeat_period_s", "decay_s", "broker_seen_s",
            "expiry_s", "max_input_age_s",
        )
        _share(self, "max_avoid_share")
        if not 0 <= self.hysteresis_s <= self.max_avoid_s:
            raise ConfigError("policy.hysteresis_s must be between 0 and policy.max_avoid_s")
        if self.base_avoid_s > self.max_avoid_s:
            raise ConfigError("policy.base_avoid_s must not exceed policy.max_avoid_s")
        if not self.version:
            raise ConfigError("policy.version must not be empty")


@dataclass(frozen=True)
class PublishConfig:
    """The publisher cycle (`faultwatch publish`, the Airflow DAG)."""

    interval_s: float = 60.0
    publish_alerts: bool = True
    # Delta transaction app id of the publisher's appends (two deployments sharing tables need two).
    app_id: str = "faultwatch-publisher"
    # Write one JSON file per cluster under storage.publish_dir for producers that read files.
    write_files: bool = True
    # The first cycle sends lag alerts of group_status rows this recent; later ones continue from
    # where the previous cycle stopped.
    alert_lookback_s: float = 300.0
    # How long a Kafka send may wait for the broker's acknowledgement.
    send_timeout_s: float = 30.0
    # `publish --every` / `--watch`: look this often for a new fault episode between the regular
    # cycles; one starts a cycle at once (0: regular cycles only).
    watch_interval_s: float = 1.0

    def validate(self) -> None:
        _positive(self, "interval_s", "alert_lookback_s", "send_timeout_s")
        if self.watch_interval_s < 0:
            raise ConfigError(f"publish.watch_interval_s must be >= 0 (0: no early cycles), got {self.watch_interval_s!r}")
        if not self.app_id:
            raise ConfigError("publish.app_id must not be empty")


ALERT_KINDS = ("broker_fault", "consumer_lag", "avoidance_refused")


@dataclass(frozen=True)
class AlertsConfig:
    """Alerts with a lifecycle (fire, repeat while active, resolve): to the alerts topic and Alertmanager."""

    # Alertmanager base URLs (v2 API: POST <url>/api/v2/alerts), every instance of a cluster; empty: Kafka only.
    alertmanager_urls: tuple[str, ...] = ()
    # Which alerts: broker_fault (an episode suspected or open), consumer_lag (a group WARN or worse, or
    # time lag over lag.time_lag_alert_ms), avoidance_refused (the newest avoidance cycle was refused).
    kinds: tuple[str, ...] = ALERT_KINDS
    # A firing alert's record on the alerts topic repeats this often (Alertmanager gets it every cycle).
    repeat_interval_s: float = 300.0
    # Consumer groups: status rows this recent count; a group without one resolves.
    group_lookback_s: float = 300.0
    # How long one Alertmanager request may take before it counts as failed (retried next cycle).
    timeout_s: float = 5.0
    # A resolution Alertmanager did not take is posted again each cycle for this long.
    resolution_retry_s: float = 3600.0

    def validate(self) -> None:
        _positive(self, "repeat_interval_s", "group_lookback_s", "timeout_s", "resolution_retry_s")
        unknown = [k for k in self.kinds if k not in ALERT_KINDS]
        if unknown:
            raise ConfigError(f"alerts.kinds: unknown {unknown}; valid values: {list(ALERT_KINDS)}")
        for url in self.alertmanager_urls:
            if not url.startswith(("http://", "https://")):
                raise ConfigError(f"alerts.alertmanager_urls: {url!r} is not an http(s) URL")


@dataclass(frozen=True)
class DemoConfig:
    scenario: str = "demo"
    duration_s: float = 120.0
    speed: float = 1.0
    refresh_s: float = 2.0


@dataclass(frozen=True)
class ServeConfig:
    """`faultwatch serve`: /metrics, the JSON API, the live page and /healthz over the Delta tables."""

    # Loopback unless told otherwise, as Prometheus exporters do.
    host: str = "127.0.0.1"
    port: int = 9640
    # How often the tables are read again (in the background: requests never wait for it).
    refresh_interval_s: float = 10.0
    # Per-queue lag series for at most this many (group, queue) pairs, the worst first.
    max_queue_series: int = 100
    # /healthz is 503 when the newest event of one of these tables is older than max_data_age_s.
    fresh_tables: tuple[str, ...] = ("send_results", "queue_lag")
    max_data_age_s: float = 300.0
    # Groups and queues whose newest row is this much older than their table's newest are left out.
    forget_after_s: float = 3600.0
    # The live page (GET /) reloads itself this often.
    page_refresh_s: float = 10.0
    # TLS when both are set (PEM files).
    tls_cert_file: str | None = None
    tls_key_file: str | None = None
    # Basic auth when both are set: the password's bcrypt hash, never the password.
    basic_auth_username: str | None = None
    basic_auth_password_hash: Secret | None = None
    # Limits on what one client may hold: a request head's size, the time to send one (slow
    # clients), to sit idle between requests, to take an answer off the server; open connections.
    max_header_bytes: int = 16384
    header_timeout_s: float = 10.0
    idle_timeout_s: float = 75.0
    send_timeout_s: float = 30.0
    max_connections: int = 1000
    # uvicorn's HTTP protocol and event loop (its --http and --loop): httptools and uvloop, or the
    # pure-Python h11 and asyncio's own loop.
    http: str = "httptools"
    loop: str = "uvloop"

    def validate(self) -> None:
        if self.http not in ("httptools", "h11"):
            raise ConfigError(f"serve.http must be 'httptools' or 'h11', got {self.http!r}")
        if self.loop not in ("uvloop", "asyncio"):
            raise ConfigError(f"serve.loop must be 'uvloop' or 'asyncio', got {self.loop!r}")
        _positive(self, "refresh_interval_s", "max_data_age_s", "forget_after_s", "page_refresh_s",
                  "header_timeout_s", "idle_timeout_s", "send_timeout_s", "max_connections")
        if not 1024 <= self.max_header_bytes <= 1 << 20:
            raise ConfigError(f"serve.max_header_bytes must be between 1024 and 1048576, got {self.max_header_bytes}")
        if not 0 <= self.port <= 65535:
            raise ConfigError(f"serve.port must be between 0 and 65535, got {self.port}")
        if self.max_queue_series < 0:
            raise ConfigError(f"serve.max_queue_series must be >= 0, got {self.max_queue_series}")
        if (self.tls_cert_file is None) != (self.tls_key_file is None):
            raise ConfigError("serve.tls_cert_file and serve.tls_key_file must be set together")
        if (self.basic_auth_username is None) != (self.basic_auth_password_hash is None):
            raise ConfigError("serve.basic_auth_username and serve.basic_auth_password_hash must be set together")
        if self.basic_auth_password_hash is not None and not _is_bcrypt(self.basic_auth_password_hash.value):
            raise ConfigError("serve.basic_auth_password_hash must be a bcrypt hash ($2b$..., 60 characters)")
        from schemas.tables import all_tables

        unknown = sorted(set(self.fresh_tables) - set(all_tables()))
        if unknown:
            raise ConfigError(f"serve.fresh_tables: unknown table {unknown[0]!r}; known: {sorted(all_tables())}")

    @property
    def tls(self) -> bool:
        return self.tls_cert_file is not None


def _is_bcrypt(value: str) -> bool:
    return len(value) == 60 and value[:4] in ("$2a$", "$2b$", "$2y$")


@dataclass(frozen=True)
class Config:
    kafka: KafkaConfig = field(default_factory=KafkaConfig)
    topics: TopicsConfig = field(default_factory=TopicsConfig)
    storage: StorageConfig = field(default_factory=StorageConfig)
    stream: StreamConfig = field(default_factory=StreamConfig)
    maintenance: MaintenanceConfig = field(default_factory=MaintenanceConfig)
    spark: SparkConfig = field(default_factory=SparkConfig)
    faults: FaultsConfig = field(default_factory=FaultsConfig)
    lag: LagConfig = field(default_factory=LagConfig)
    policy: PolicyConfig = field(default_factory=PolicyConfig)
    publish: PublishConfig = field(default_factory=PublishConfig)
    alerts: AlertsConfig = field(default_factory=AlertsConfig)
    demo: DemoConfig = field(default_factory=DemoConfig)
    serve: ServeConfig = field(default_factory=ServeConfig)

    def replace(self, **sections: Any) -> Config:
        """A copy with whole sections or ``section__key`` values replaced (tests, demo)."""
        out = self
        for name, value in sections.items():
            if "__" in name:
                sec, key = name.split("__", 1)
                out = dataclasses.replace(out, **{sec: dataclasses.replace(getattr(out, sec), **{key: value})})
            else:
                out = dataclasses.replace(out, **{name: value})
        return out


# Environment variables that may override the file: connection settings and secrets only.
ENV_OVERRIDES: dict[str, tuple[str, str]] = {
    "FAULTWATCH_KAFKA_BOOTSTRAP_SERVERS": ("kafka", "bootstrap_servers"),
    "FAULTWATCH_KAFKA_SECURITY_PROTOCOL": ("kafka", "security_protocol"),
    "FAULTWATCH_KAFKA_SASL_MECHANISM": ("kafka", "sasl_mechanism"),
    "FAULTWATCH_KAFKA_SASL_USERNAME": ("kafka", "sasl_username"),
    "FAULTWATCH_KAFKA_SASL_PASSWORD": ("kafka", "sasl_password"),
    "FAULTWATCH_KAFKA_SSL_CAFILE": ("kafka", "ssl_cafile"),
    "FAULTWATCH_KAFKA_SSL_CERTFILE": ("kafka", "ssl_certfile"),
    "FAULTWATCH_KAFKA_SSL_KEYFILE": ("kafka", "ssl_keyfile"),
    "FAULTWATCH_KAFKA_SSL_PASSWORD": ("kafka", "ssl_password"),
    "FAULTWATCH_SPARK_MASTER": ("spark", "master"),
    "FAULTWATCH_SPARK_JVM": ("spark", "jvm"),
    "FAULTWATCH_SERVE_TLS_CERT_FILE": ("serve", "tls_cert_file"),
    "FAULTWATCH_SERVE_TLS_KEY_FILE": ("serve", "tls_key_file"),
    "FAULTWATCH_SERVE_BASIC_AUTH_USERNAME": ("serve", "basic_auth_username"),
    "FAULTWATCH_SERVE_BASIC_AUTH_PASSWORD_HASH": ("serve", "basic_auth_password_hash"),
}


def load_config(
    path: str | os.PathLike[str] | None = None, env: Mapping[str, str] | None = None
) -> Config:
    """Load ``path`` (default: the shipped ``conf/faultwatch.toml``) plus environment overrides.

    Relative storage paths are kept relative to the working directory, as users expect of a CLI.
    """
    path = Path(path) if path is not None else DEFAULT_CONFIG_PATH
    try:
        raw = tomllib.loads(path.read_text(encoding="utf-8"))
    except FileNotFoundError:
        raise ConfigError(f"config file not found: {path}") from None
    except tomllib.TOMLDecodeError as exc:
        raise ConfigError(f"{path}: not valid TOML: {exc}") from None
    env = os.environ if env is None else env
    for var, (section, key) in ENV_OVERRIDES.items():
        if env.get(var):
            raw.setdefault(section, {})[key] = env[var]
    try:
        cfg = from_dict(raw)
        objstore.configure(cfg.storage, env)
    except ConfigError as exc:
        raise ConfigError(f"{path}: {exc}") from None
    except ValueError as exc:
        raise ConfigError(f"{path}: {exc}") from None
    try:
        objstore.probe("storage.root", cfg.storage.root)
        objstore.probe("storage.checkpoint_root", cfg.storage.checkpoint_root)
    except objstore.StorageError as exc:
        raise ConfigError(f"{path}: {exc}") from None
    return cfg


def from_dict(raw: Mapping[str, Any]) -> Config:
    return _build(Config, raw, prefix="")


def _secret(value: Any, key: str) -> Secret:
    if not isinstance(value, str):
        raise ConfigError(f"{key}: expected a string")
    return Secret(value)


def _build(cls: type, raw: Any, prefix: str) -> Any:
    return typedload.build(cls, raw, prefix, ConfigError, {Secret: _secret})


_SECRET_KEY = re.compile(r"password|secret|token|credential", re.IGNORECASE)
# [kafka.client] keys that have a [kafka] setting of their own (one place for each).
_OWN_KAFKA_KEYS = {
    "bootstrap_servers": "bootstrap_servers", "security_protocol": "security_protocol",
    "sasl_mechanism": "sasl_mechanism", "sasl_plain_username": "sasl_username",
    "sasl_plain_password": "sasl_password", "ssl_cafile": "ssl_cafile", "ssl_certfile": "ssl_certfile",
    "ssl_keyfile": "ssl_keyfile", "ssl_password": "ssl_password", "client_id": "client_id",
    "request_timeout_ms": "request_timeout_ms", "isolation_level": "isolation_level",
}


def _check_client_settings(client: Mapping[str, Any]) -> None:
    """Every [kafka.client] key must be a setting that kafka-python's consumer, producer and admin
    client all take, and a plain value (not a table)."""
    from kafka import KafkaAdminClient, KafkaConsumer, KafkaProducer

    common = set(KafkaConsumer.DEFAULT_CONFIG) & set(KafkaProducer.DEFAULT_CONFIG) & set(KafkaAdminClient.DEFAULT_CONFIG)
    for key, value in client.items():
        if key in _OWN_KAFKA_KEYS:
            raise ConfigError(f"kafka.client.{key}: set kafka.{_OWN_KAFKA_KEYS[key]} instead")
        if key not in common:
            raise ConfigError(f"kafka.client.{key}: not a setting every kafka-python client takes; "
                              f"valid keys here: {sorted(common - set(_OWN_KAFKA_KEYS))}")
        if not isinstance(value, (str, int, float, bool, Secret)):
            raise ConfigError(f"kafka.client.{key}: expected a string, number or boolean, got {value!r}")


def _positive(obj: Any, *names: str) -> None:
    for name in names:
        if getattr(obj, name) <= 0:
            raise ConfigError(f"{_section_of(obj)}.{name} must be > 0, got {getattr(obj, name)!r}")


def _share(obj: Any, *names: str) -> None:
    for name in names:
        if not 0 < getattr(obj, name) <= 1:
            raise ConfigError(f"{_section_of(obj)}.{name} must be in (0, 1], got {getattr(obj, name)!r}")


def _section_of(obj: Any) -> str:
    for f in dataclasses.fields(Config):
        if f.type == type(obj).__name__ or getattr(Config(), f.name).__class__ is type(obj):
            return f.name
    return type(obj).__name__


def describe(cfg: Config) -> str:
    """A loggable one-line summary (secrets masked by :class:`Secret`)."""
    return (
        f"kafka={cfg.kafka.bootstrap_servers} ({cfg.kafka.security_protocol}) "
        f"storage={cfg.storage.root} checkpoints={cfg.storage.checkpoint_root} "
        f"trigger={cfg.stream.trigger_interval_s}s watermark={cfg.stream.watermark_delay_s}s "
        f"spark={cfg.spark.master}"
    )
