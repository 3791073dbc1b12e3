"""The two generations of RocketMQ's producer latency fault tolerance, chosen by name.

RocketMQ changed the rules once, in 5.2.0: new latencyMax / notAvailableDuration tables, a shorter
isolation, and "windows only grow". Everything else in ``pipeline.rocketmq`` takes a
:class:`Generation` so one code path serves both, and a registry by name lets configuration pick one
and refuse a typo with the valid names listed.
"""

from __future__ import annotations

import re
from collections.abc import Mapping, Sequence
from dataclasses import dataclass

GEN_49 = "4.9"
GEN_5 = "5"

# MQFaultStrategy's defaults: latencyMax and notAvailableDuration of RocketMQ's Java client, 4.9.x
# (also 5.0.0-5.1.3) and 5.2.0 on.
_LATENCY_MAX_49 = (50, 100, 550, 1000, 2000, 3000, 15000)
_NOT_AVAILABLE_49 = (0, 0, 30000, 60000, 120000, 180000, 600000)
_LATENCY_MAX_5 = (50, 100, 550, 1800, 3000, 5000, 15000)
_NOT_AVAILABLE_5 = (0, 0, 2000, 5000, 6000, 10000, 30000)

# The latency an isolating failure is charged as: `computeNotAvailableDuration(isolation ? X : lat)`.
_ISOLATION_LATENCY = {GEN_49: 30000, GEN_5: 10000}


@dataclass(frozen=True)
class Generation:
    """One fault-tolerance generation with its (possibly user-set) duration tables.

    The tables are kept as given: Java scans them from the last index down without sorting, so an
    unsorted table set through ``setLatencyMax`` behaves differently from its sorted form, and the
    vectors include such tables.
    """

    name: str
    latency_max: tuple[int, ...]
    not_available_duration: tuple[int, ...]

    def __post_init__(self) -> None:
        object.__setattr__(self, "latency_max", tuple(self.latency_max))
        object.__setattr__(self, "not_available_duration", tuple(self.not_available_duration))
        if self.name not in _ISOLATION_LATENCY:
            raise ValueError(f"unknown fault generation {self.name!r}; valid: {sorted(_ISOLATION_LATENCY)}")
        if len(self.latency_max) != len(self.not_available_duration):
            # Java would throw ArrayIndexOutOfBounds for some latencies only; refuse it up front.
            raise ValueError(
                f"latency_max has {len(self.latency_max)} entries but not_available_duration has "
                f"{len(self.not_available_duration)}; they must be the same length"
            )
        for table in (self.latency_max, self.not_available_duration):
            if not all(isinstance(v, int) and not isinstance(v, bool) for v in table):
                raise ValueError(f"duration tables must hold integers, got {table!r}")

    @property
    def isolation_latency(self) -> int:
        """The latency an isolating failure is looked up as (30 s in 4.9, 10 s in 5)."""
        return _ISOLATION_LATENCY[self.name]

    @property
    def windows_only_grow(self) -> bool:
        """5.x updates the avoid-until time only when it moves later; 4.9 always overwrites it."""
        return self.name == GEN_5


GENERATIONS: Mapping[str, Generation] = {
    GEN_49: Generation(GEN_49, _LATENCY_MAX_49, _NOT_AVAILABLE_49),
    GEN_5: Generation(GEN_5, _LATENCY_MAX_5, _NOT_AVAILABLE_5),
}


def get_generation(
    name: str,
    latency_max: Sequence[int] | None = None,
    not_available_duration: Sequence[int] | None = None,
) -> Generation:
    """The named generation, optionally with tables replaced as ``setLatencyMax`` etc. would."""
    try:
        base = GENERATIONS[name]
    except KeyError:
        raise ValueError(f"unknown fault generation {name!r}; valid: {sorted(GENERATIONS)}") from None
    if latency_max is None and not_available_duration is None:
        return base
    return Generation(
        base.name,
        tuple(latency_max) if latency_max is not None else base.latency_max,
        tuple(not_available_duration) if not_available_duration is not None else base.not_available_duration,
    )


_VERSION_RE = re.compile(r"^\s*[vV]?(\d+)[._](\d+)(?:[._](\d+))?(?:[-.+_][0-9A-Za-z.\-_]*)?\s*$")


def generation_for_client_version(version: str) -> str:
    """The generation name for a Java client version string.

    4.x up to 5.1.3 -> "4.9"; 5.2.0 and later -> "5". 5.1.4 maps to "5": it already shipped the
    rewritten MQFaultStrategy (new tables, windows only grow, the reachable flag), but its
    ``isAvailable`` also required ``reachable`` (issue #7812, fixed in 5.2.0), so a broker that was
    marked unreachable stayed avoided until a detector marked it reachable again. That defect is not
    modelled: treat 5.1.4 results as a lower bound on its avoidance. Accepts "5.3.3", "V5_3_3" and
    suffixes such as "-SNAPSHOT"; anything else, or a version before 4.0, raises ValueError.
    """
    match = _VERSION_RE.match(version) if isinstance(version, str) else None
    if match is None:
        raise ValueError(
            f"cannot parse RocketMQ client version {version!r}; expected e.g. '4.9.8' or '5.3.3'"
        )
    major, minor, patch = int(match[1]), int(match[2]), int(match[3] or 0)
    if major < 4:
        raise ValueError(f"RocketMQ client version {version!r} predates 4.0 and is not modelled")
    if (major, minor, patch) <= (5, 1, 3):
        return GEN_49
    return GEN_5


def duration_for(gen: Generation, latency_ms: int, isolation: bool) -> int:
    """``computeNotAvailableDuration``: the first ``latency >= latencyMax[i]`` scanning down wins."""
    latency = gen.isolation_latency if isolation else latency_ms
    table = gen.latency_max
    for i in range(len(table) - 1, -1, -1):
        if latency >= table[i]:
            return gen.not_available_duration[i]
    return 0
