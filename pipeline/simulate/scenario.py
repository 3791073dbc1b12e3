"""Simulator scenarios: frozen dataclasses loaded from TOML and validated before anything runs.

A scenario file (``conf/scenarios/*.toml``) describes brokers, their fault schedule, producer
fleets, consumer groups and consumer events; the dataclasses below list every key and its default.
Loading refuses an unknown key, a value of the wrong type, an unknown name (fault kind, strategy,
client version, broker) or a parameter that does not belong to a fault kind, naming the key
(``faults[1].mode``), so a typo fails at start rather than silently simulating something else.
"""

from __future__ import annotations

import dataclasses
import sys
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Literal

if sys.version_info >= (3, 11):
    import tomllib
else:  # pragma: no cover
    import tomli as tomllib

from pipeline import typedload
from pipeline.config import DEFAULTS_DIR
from schemas.errors import FaultwatchError

# 2026-01-01T00:00:00Z: a fixed start keeps runs byte-for-byte reproducible.
DEFAULT_EPOCH_MS = 1_767_225_600_000
SCENARIO_DIR = DEFAULTS_DIR / "scenarios"

FaultKind = Literal["outage", "latency_spike", "flow_control", "slow_disk"]
OutageMode = Literal["refused", "timeout"]
BusyResponse = Literal["TIMEOUT_CLEAN_QUEUE", "PCBUSY_CLEAN_QUEUE"]
ConsumeFromWhere = Literal["CONSUME_FROM_LAST_OFFSET", "CONSUME_FROM_FIRST_OFFSET", "CONSUME_FROM_TIMESTAMP"]
ConsumerEventKind = Literal["crash", "join", "leave", "rate"]


class ScenarioError(FaultwatchError, ValueError):
    """A scenario problem; the message names the file and the offending key."""


@dataclass(frozen=True)
class BrokerSpec:
    """A broker (master) serving every topic of its cluster with ``queues`` write queues."""

    name: str
    cluster: str = "DefaultCluster"
    queues: int = 4
    latency_median_ms: float = 2.0
    latency_p99_ms: float = 20.0


@dataclass(frozen=True)
class FaultSpec:
    """One entry of a broker's fault schedule; the broker recovers at ``start_s + duration_s``.

    Parameters by kind: outage takes ``mode``; latency_spike ``latency_ms`` (median during the
    spike), ``latency_p99_ms`` and ``share``; flow_control ``share`` (of sends rejected),
    ``latency_ms`` and ``response``; slow_disk ``share`` (of stored sends answered
    FLUSH_DISK_TIMEOUT) and ``latency_ms``.
    """

    broker: str
    kind: FaultKind
    start_s: float
    duration_s: float | None = None
    mode: OutageMode | None = None
    share: float | None = None
    latency_ms: float | None = None
    latency_p99_ms: float | None = None
    response: BusyResponse | None = None


_FAULT_PARAMS: Mapping[str, frozenset[str]] = {
    "outage": frozenset({"mode"}),
    "latency_spike": frozenset({"latency_ms", "latency_p99_ms", "share"}),
    "flow_control": frozenset({"share", "latency_ms", "response"}),
    "slow_disk": frozenset({"share", "latency_ms"}),
}


@dataclass(frozen=True)
class ProducerSpec:
    """``count`` producer instances of one group: one sync sending thread each."""

    group: str
    count: int = 1
    cluster: str | None = None
    topic: str = "TopicTest"
    client_version: str = "5.3.3"
    fault_tolerance: bool = False
    rate_per_s: float = 10.0
    retries: int = 2
    send_timeout_ms: int = 3000
    detector_enabled: bool = False
    retry_another_broker_when_not_store_ok: bool = False
    report_fault_args: bool = True
    report_fault_enable: bool = True
    start_s: float = 0.0
    stop_s: float | None = None


@dataclass(frozen=True)
class ConsumerGroupSpec:
    """A CLUSTERING push consumer group and the admin poller that reports its progress."""

    group: str
    cluster: str | None = None
    topic: str = "TopicTest"
    strategy: str = "AVG"
    instances: int = 2
    rate_per_s: float = 1000.0
    progress_interval_s: float = 5.0
    commit_interval_s: float = 5.0
    membership_interval_s: float = 30.0
    rebalance_delay_s: float = 1.0
    session_timeout_s: float = 120.0
    consume_from_where: ConsumeFromWhere = "CONSUME_FROM_LAST_OFFSET"
    consume_timestamp_s: float = 0.0


@dataclass(frozen=True)
class ConsumerEventSpec:
    """A membership or speed change of a group at ``at_s``.

    crash: instances stop at once and stay registered for ``session_timeout_s``; leave: a clean
    shutdown (offsets committed, unregistered at once); join: new instances; rate: new per-instance
    consumption rate. ``instances`` names instance indexes; otherwise the newest alive ones.
    """

    group: str
    at_s: float
    kind: ConsumerEventKind
    count: int = 1
    instances: tuple[int, ...] | None = None
    rate_per_s: float | None = None


@dataclass(frozen=True)
class Scenario:
    name: str
    brokers: tuple[BrokerSpec, ...]
    description: str = ""
    seed: int = 1
    duration_s: float = 120.0
    tick_ms: int = 100
    epoch_ms: int = DEFAULT_EPOCH_MS
    faults: tuple[FaultSpec, ...] = ()
    producers: tuple[ProducerSpec, ...] = ()
    consumers: tuple[ConsumerGroupSpec, ...] = ()
    consumer_events: tuple[ConsumerEventSpec, ...] = ()

    def clusters(self) -> list[str]:
        return list(dict.fromkeys(b.cluster for b in self.brokers))

    def replace(self, **changes: Any) -> Scenario:
        """A copy with top-level fields replaced, validated again."""
        out = dataclasses.replace(self, **changes)
        validate(out)
        return out


def scenario_path(name_or_file: str) -> Path:
    """A file path as given, or ``<name>.toml`` in the scenario folders."""
    path = Path(name_or_file)
    if path.suffix == ".toml" or path.exists():
        if not path.exists():
            raise ScenarioError(f"scenario file not found: {path}")
        return path
    candidate = SCENARIO_DIR / f"{name_or_file}.toml"
    if candidate.exists():
        return candidate
    raise ScenarioError(f"unknown scenario {name_or_file!r}; known: {available_scenarios()}")


def available_scenarios() -> list[str]:
    return sorted(p.stem for p in SCENARIO_DIR.glob("*.toml"))


def load_scenario(name_or_file: str) -> Scenario:
    """Load and validate a scenario by name (shipped ``conf/scenarios/<name>.toml``) or file path."""
    path = scenario_path(name_or_file)
    try:
        raw = tomllib.loads(path.read_text(encoding="utf-8"))
    except tomllib.TOMLDecodeError as exc:
        raise ScenarioError(f"{path}: not valid TOML: {exc}") from None
    raw.setdefault("name", path.stem)
    try:
        return scenario_from_dict(raw)
    except ScenarioError as exc:
        raise ScenarioError(f"{path}: {exc}") from None


def scenario_from_dict(raw: Mapping[str, Any]) -> Scenario:
    scenario = _build(Scenario, raw, "")
    validate(scenario)
    return scenario


def _build(cls: type, raw: Any, prefix: str) -> Any:
    if not isinstance(raw, Mapping):
        raise ScenarioError(f"scenario: expected a table, got {type(raw).__name__}")
    return typedload.build(cls, raw, prefix, ScenarioError)


def validate(s: Scenario) -> None:
    """Cross-field rules: names resolve, numbers are in range, parameters fit their fault kind."""
    _check(s.duration_s > 0, "duration_s", "must be > 0")
    _check(s.tick_ms > 0, "tick_ms", "must be > 0")
    _check(s.epoch_ms >= 1_000_000_000_000, "epoch_ms", "must be a Unix time in milliseconds")
    _check(len(s.brokers) > 0, "brokers", "at least one broker is required")
    names = [b.name for b in s.brokers]
    for i, b in enumerate(s.brokers):
        _check(b.name not in names[:i], f"brokers[{i}].name", f"duplicate broker {b.name!r}")
        _check(b.queues > 0, f"brokers[{i}].queues", "must be > 0")
        _check(b.latency_median_ms > 0, f"brokers[{i}].latency_median_ms", "must be > 0")
        _check(b.latency_p99_ms >= b.latency_median_ms, f"brokers[{i}].latency_p99_ms", "must be >= the median")
    for i, f in enumerate(s.faults):
        _validate_fault(f"faults[{i}]", f, names)
    groups = {}
    for i, p in enumerate(s.producers):
        _validate_producer(f"producers[{i}]", p, s)
    for i, c in enumerate(s.consumers):
        key = f"consumers[{i}]"
        _check(c.group not in groups, f"{key}.group", f"duplicate consumer group {c.group!r}")
        groups[c.group] = c
        _validate_consumer(key, c, s)
    for i, e in enumerate(s.consumer_events):
        _validate_consumer_event(f"consumer_events[{i}]", e, groups)


def _validate_fault(key: str, f: FaultSpec, brokers: list[str]) -> None:
    _check(f.broker in brokers, f"{key}.broker", f"unknown broker {f.broker!r}; known: {brokers}")
    _check(f.start_s >= 0, f"{key}.start_s", "must be >= 0")
    _check(f.duration_s is None or f.duration_s > 0, f"{key}.duration_s", "must be > 0")
    allowed = _FAULT_PARAMS[f.kind]
    for param in ("mode", "share", "latency_ms", "latency_p99_ms", "response"):
        if getattr(f, param) is not None and param not in allowed:
            raise ScenarioError(f"{key}.{param}: not a parameter of kind {f.kind!r}; its parameters: {sorted(allowed)}")
    _check(f.share is None or 0 < f.share <= 1, f"{key}.share", "must be in (0, 1]")
    _check(f.latency_ms is None or f.latency_ms >= 0, f"{key}.latency_ms", "must be >= 0")
    if f.latency_p99_ms is not None:
        _check(f.latency_p99_ms >= (f.latency_ms or 0), f"{key}.latency_p99_ms", "must be >= latency_ms")
    if f.kind == "latency_spike":
        _check(f.latency_ms is not None, f"{key}.latency_ms", "is required for a latency_spike")


def _validate_producer(key: str, p: ProducerSpec, s: Scenario) -> None:
    from pipeline.rocketmq.generation import generation_for_client_version

    _cluster_of(key, p.cluster, s)
    _check(p.count > 0, f"{key}.count", "must be > 0")
    _check(p.rate_per_s > 0, f"{key}.rate_per_s", "must be > 0")
    _check(0 <= p.retries <= 100, f"{key}.retries", "must be in [0, 100]")
    _check(p.send_timeout_ms > 0, f"{key}.send_timeout_ms", "must be > 0")
    _check(p.start_s >= 0, f"{key}.start_s", "must be >= 0")
    _check(p.stop_s is None or p.stop_s > p.start_s, f"{key}.stop_s", "must be after start_s")
    try:
        generation_for_client_version(p.client_version)
    except ValueError as exc:
        raise ScenarioError(f"{key}.client_version: {exc}") from None


def _validate_consumer(key: str, c: ConsumerGroupSpec, s: Scenario) -> None:
    from pipeline.rocketmq.allocate import canonical_strategy_name

    _cluster_of(key, c.cluster, s)
    try:
        canonical_strategy_name(c.strategy)
    except ValueError as exc:
        raise ScenarioError(f"{key}.strategy: {exc}") from None
    _check(c.strategy not in ("CONFIG", "MACHINE_ROOM", "MACHINE_ROOM_NEARBY"), f"{key}.strategy",
           "needs per-queue options the simulator does not model; use AVG, AVG_BY_CIRCLE or CONSISTENT_HASH")
    _check(c.instances >= 0, f"{key}.instances", "must be >= 0")
    _check(c.rate_per_s >= 0, f"{key}.rate_per_s", "must be >= 0")
    for name in ("progress_interval_s", "commit_interval_s", "membership_interval_s", "session_timeout_s"):
        _check(getattr(c, name) > 0, f"{key}.{name}", "must be > 0")
    _check(c.rebalance_delay_s >= 0, f"{key}.rebalance_delay_s", "must be >= 0")


def _validate_consumer_event(key: str, e: ConsumerEventSpec, groups: Mapping[str, ConsumerGroupSpec]) -> None:
    _check(e.group in groups, f"{key}.group", f"unknown consumer group {e.group!r}; known: {sorted(groups)}")
    _check(e.at_s >= 0, f"{key}.at_s", "must be >= 0")
    _check(e.count > 0, f"{key}.count", "must be > 0")
    if e.kind == "rate":
        _check(e.rate_per_s is not None and e.rate_per_s >= 0, f"{key}.rate_per_s", "a rate event needs rate_per_s >= 0")
    else:
        _check(e.rate_per_s is None, f"{key}.rate_per_s", f"not a parameter of kind {e.kind!r}")
    if e.kind == "join":
        _check(e.instances is None, f"{key}.instances", "join creates new instances; use count")
    for idx in e.instances or ():
        _check(idx >= 0, f"{key}.instances", "instance indexes must be >= 0")


def _cluster_of(key: str, cluster: str | None, s: Scenario) -> str:
    clusters = s.clusters()
    if cluster is None:
        _check(len(clusters) == 1, f"{key}.cluster", f"is required when there are several clusters: {clusters}")
        return clusters[0]
    _check(cluster in clusters, f"{key}.cluster", f"unknown cluster {cluster!r}; known: {clusters}")
    return cluster


def cluster_of(cluster: str | None, s: Scenario) -> str:
    """The cluster a producer or group uses: the named one, or the scenario's only cluster."""
    return _cluster_of("cluster", cluster, s)


def _check(ok: bool, key: str, message: str) -> None:
    if not ok:
        raise ScenarioError(f"{key}: {message}")
