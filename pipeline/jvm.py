"""Java programs from Maven Central: resolve an artifact's classpath once, cache it, start it.

The real systems faultwatch meets (Apache Kafka, RocketMQ's name server and brokers) ship as Maven
artifacts. Maven resolves them with their dependencies into ``~/.m2``; the resolved classpath is kept
under ``~/.cache/faultwatch/jvm/NAME`` so a second start needs neither Maven nor the network.
"""

from __future__ import annotations

import hashlib
import os
import shutil
import subprocess
from collections.abc import Sequence
from pathlib import Path

from schemas.errors import FaultwatchError


class JvmError(FaultwatchError, RuntimeError):
    pass


_POM = """<?xml version="1.0" encoding="UTF-8"?>
<project xmlns="http://maven.apache.org/POM/4.0.0">
  <modelVersion>4.0.0</modelVersion>
  <groupId>faultwatch.resolve</groupId>
  <artifactId>{name}</artifactId>
  <version>0</version>
  <packaging>pom</packaging>
  <dependencies>
{deps}
  </dependencies>
</project>
"""
_DEP = """    <dependency><groupId>{g}</groupId><artifactId>{a}</artifactId><version>{v}</version>{x}</dependency>"""
_EXCLUSION = "<exclusion><groupId>{g}</groupId><artifactId>{a}</artifactId></exclusion>"


def cache_dir() -> Path:
    root = os.environ.get("XDG_CACHE_HOME") or str(Path.home() / ".cache")
    return Path(root) / "faultwatch" / "jvm"


def java_binary() -> str:
    home = os.environ.get("JAVA_HOME")
    java = str(Path(home) / "bin" / "java") if home else shutil.which("java")
    if not java or not Path(java).exists():
        raise JvmError("java not found: install Java 17+ (scripts/bootstrap.sh does) or set JAVA_HOME")
    return java


def _coordinates(artifact: str) -> tuple[str, str, str]:
    parts = artifact.split(":")
    if len(parts) != 3 or not all(parts):
        raise JvmError(f"artifact {artifact!r} is not groupId:artifactId:version")
    return parts[0], parts[1], parts[2]


def maven_classpath(
    name: str, artifacts: Sequence[str], timeout_s: float = 900.0, exclusions: Sequence[str] = ()
) -> list[Path]:
    """The jars of ``artifacts`` and all their runtime dependencies, resolved by Maven on first use.

    ``name`` names the cache entry (e.g. ``kafka-4.1.0``); the entry is keyed by the artifact list, so
    a changed list resolves again. ``exclusions`` (``groupId:artifactId``) are left out of every
    artifact's dependencies. Raises :class:`JvmError` naming Maven's last lines on failure.
    """
    pairs = [x.split(":") for x in exclusions]
    if any(len(p) != 2 or not all(p) for p in pairs):
        raise JvmError(f"exclusions {list(exclusions)!r}: each must be groupId:artifactId")
    excluded = "<exclusions>" + "".join(_EXCLUSION.format(g=g, a=a) for g, a in pairs) + "</exclusions>" if pairs else ""
    deps = "\n".join(_DEP.format(g=g, a=a, v=v, x=excluded) for g, a, v in map(_coordinates, artifacts))
    key = hashlib.sha256("\n".join([*artifacts, *(f"-{x}" for x in exclusions)]).encode()).hexdigest()[:12]
    folder = cache_dir() / f"{name}-{key}"
    listing = folder / "classpath.txt"
    if listing.exists():
        jars = [Path(p) for p in listing.read_text().split(os.pathsep) if p]
        if jars and all(j.exists() for j in jars):
            return jars
    mvn = shutil.which("mvn")
    if mvn is None:
        raise JvmError(f"resolving {name} needs Maven (mvn): install it (Debian: apt-get install maven)")
    folder.mkdir(parents=True, exist_ok=True)
    (folder / "pom.xml").write_text(_POM.format(name=name, deps=deps))
    tmp = folder / "classpath.txt.tmp"
    cmd = [mvn, "-q", "-B", "-f", str(folder / "pom.xml"), "dependency:build-classpath",
           "-Dmdep.includeScope=runtime", f"-Dmdep.outputFile={tmp}"]
    try:
        done = subprocess.run(cmd, capture_output=True, text=True, timeout=timeout_s, check=False)
    except subprocess.TimeoutExpired:
        raise JvmError(f"Maven did not resolve {name} within {timeout_s:.0f}s") from None
    if done.returncode != 0 or not tmp.exists():
        tail = "\n".join((done.stdout + done.stderr).strip().splitlines()[-15:])
        raise JvmError(f"Maven could not resolve {name} ({', '.join(artifacts)}):\n{tail}")
    os.replace(tmp, listing)
    return [Path(p) for p in listing.read_text().split(os.pathsep) if p]
