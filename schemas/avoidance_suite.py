"""Great Expectations suites that gate every avoidance publication.

Four suites over four pandas frames built by ``pipeline.publish.gate.validation_frames``:

- ``avoidance_recommendations``: the candidate list (keys, actions, avoid-until in the future and
  within ``max_avoid_s``, expiry, the share cap per cluster, evidence ranges);
- ``avoidance_snapshot``: one row about the input (present, and fresh enough);
- ``avoidance_episodes`` / ``avoidance_health``: the current input rows the policy read.

Checks a single column cannot express (share cap, freshness, avoid-until relative to the decision)
are computed columns of the frames, then expected here. great_expectations is imported on call:
it takes seconds, and DAG parsing or ``faultwatch --help`` must not pay for it.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any, Protocol

if TYPE_CHECKING:  # pragma: no cover
    from great_expectations import ExpectationSuite

# An input row stamped this far in the future means a clock problem upstream, not fresh data.
MAX_CLOCK_SKEW_MS = 60_000
REASON_CODES = ("open_episode", "probation", "hysteresis", "share_cap")

RECOMMENDATIONS = "avoidance_recommendations"
SNAPSHOT = "avoidance_snapshot"
EPISODES = "avoidance_episodes"
HEALTH = "avoidance_health"
SUITES = (RECOMMENDATIONS, SNAPSHOT, EPISODES, HEALTH)


class SuitePolicy(Protocol):
    """The policy settings the suites read (``pipeline.config.PolicyConfig`` has them; schemas
    sits below pipeline, so it names only what it needs)."""

    @property
    def version(self) -> str: ...
    @property
    def max_avoid_s(self) -> float: ...
    @property
    def expiry_s(self) -> float: ...
    @property
    def max_input_age_s(self) -> float: ...


def _not_null(gxe: Any, *columns: str) -> list[Any]:
    return [gxe.ExpectColumnValuesToNotBeNull(column=c) for c in columns]


def recommendation_expectations(cfg: SuitePolicy) -> list[Any]:
    import great_expectations.expectations as gxe

    max_avoid_ms = round(cfg.max_avoid_s * 1000)
    expiry_ms = round(cfg.expiry_s * 1000)
    return [
        *_not_null(gxe, "cluster", "broker_name", "action", "reason", "policy_version", "avoid_until_ms",
                   "expires_ms", "decided_ms"),
        gxe.ExpectColumnValuesToBeInSet(column="action", value_set=["avoid", "keep_available"]),
        gxe.ExpectCompoundColumnsToBeUnique(column_list=["cluster", "broker_name"]),
        gxe.ExpectColumnValuesToMatchRegex(column="reason", regex=rf"^(?:{'|'.join(REASON_CODES)}): "),
        gxe.ExpectColumnValuesToBeInSet(column="policy_version", value_set=[cfg.version]),
        # avoid rows only (null for keep_available): strictly in the future, never beyond the cap.
        gxe.ExpectColumnValuesToBeBetween(column="avoid_ahead_ms", min_value=1, max_value=max_avoid_ms),
        gxe.ExpectColumnValuesToBeBetween(column="expires_ahead_ms", min_value=1, max_value=expiry_ms),
        gxe.ExpectColumnPairValuesAToBeGreaterThanB(
            column_A="cluster_max_avoid", column_B="cluster_avoided", or_equal=True
        ),
        gxe.ExpectColumnValuesToBeBetween(column="failure_rate", min_value=0, max_value=1),
        gxe.ExpectColumnValuesToBeBetween(column="producers_avoiding", min_value=0),
        gxe.ExpectColumnValuesToBeBetween(column="p99_latency_ms", min_value=0),
    ]


def snapshot_expectations(cfg: SuitePolicy) -> list[Any]:
    import great_expectations.expectations as gxe

    return [
        gxe.ExpectTableRowCountToEqual(value=1),
        gxe.ExpectColumnValuesToNotBeNull(column="freshest_ms"),
        gxe.ExpectColumnValuesToBeBetween(
            column="input_age_ms", min_value=-MAX_CLOCK_SKEW_MS, max_value=round(cfg.max_input_age_s * 1000)
        ),
    ]


def episode_expectations(cfg: SuitePolicy) -> list[Any]:
    import great_expectations.expectations as gxe

    return [
        *_not_null(gxe, "episode_id", "cluster", "broker_name", "opened_ms", "state", "updated_ms"),
        gxe.ExpectColumnValuesToBeUnique(column="episode_id"),
        gxe.ExpectColumnValuesToBeInSet(column="state", value_set=["suspected", "open", "closed"]),
        gxe.ExpectColumnValuesToBeInSet(column="close_consistent", value_set=[True]),
        gxe.ExpectColumnValuesToBeBetween(column="opened_ahead_ms", max_value=MAX_CLOCK_SKEW_MS),
        gxe.ExpectColumnValuesToBeBetween(column="sends", min_value=0),
        gxe.ExpectColumnPairValuesAToBeGreaterThanB(column_A="sends", column_B="failures", or_equal=True),
    ]


def health_expectations(cfg: SuitePolicy) -> list[Any]:
    import great_expectations.expectations as gxe

    return [
        *_not_null(gxe, "cluster", "broker_name", "minute_ms"),
        gxe.ExpectCompoundColumnsToBeUnique(column_list=["cluster", "broker_name"]),
        gxe.ExpectColumnValuesToBeBetween(column="failure_rate", min_value=0, max_value=1),
        gxe.ExpectColumnValuesToBeBetween(column="failures", min_value=0),
        gxe.ExpectColumnPairValuesAToBeGreaterThanB(column_A="sends", column_B="failures", or_equal=True),
        gxe.ExpectColumnValuesToBeBetween(column="latency_p99_ms", min_value=0),
    ]


_BUILDERS = {
    RECOMMENDATIONS: recommendation_expectations,
    SNAPSHOT: snapshot_expectations,
    EPISODES: episode_expectations,
    HEALTH: health_expectations,
}


def build_suites(cfg: SuitePolicy) -> dict[str, ExpectationSuite]:
    """The four suites for policy ``cfg`` (thresholds come from the configuration)."""
    import great_expectations as gx

    return {name: gx.ExpectationSuite(name=name, expectations=build(cfg)) for name, build in _BUILDERS.items()}
