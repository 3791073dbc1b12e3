"""Consumer-group lag for RocketMQ: per-queue lag and time lag, ownership, Burrow-style group status.

Pure numpy/pandas over whole batches (no pyspark, kafka or airflow): ``streaming/lag_query.py`` is a
thin Spark shim over :func:`step`, and tests and benchmarks call :func:`step` directly.
"""

from pipeline.lag.events import events_frame, normalize_events
from pipeline.lag.model import Status, topic_kind
from pipeline.lag.registry import LagState
from pipeline.lag.state import LagOutput, initial_state, is_empty, step

__all__ = [
    "LagOutput",
    "LagState",
    "Status",
    "events_frame",
    "initial_state",
    "is_empty",
    "normalize_events",
    "step",
    "topic_kind",
]
