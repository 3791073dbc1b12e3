"""Live per-broker fault state: producer windows, broker episodes and health, as pure functions.

``step(state, events, watermark_ms, cfg)`` advances one cluster's state (or, with ``points``, one
broker's) by one micro-batch and returns the rows to append; :func:`cluster.cluster_step` decides
a cluster's episodes over its brokers' grid points. :mod:`streaming.combined_query` and
:mod:`streaming.faults_query` are the Spark shims around them. Every RocketMQ rule comes from
:mod:`pipeline.rocketmq`; nothing here imports Spark or Kafka.
"""

from pipeline.faults.codec import (
    STATE_DDL,
    STATE_VERSION,
    decode_fleet,
    decode_state,
    encode_fleet,
    encode_state,
)
from pipeline.faults.events import (
    EVENT_COLUMNS,
    EVENT_SCHEMA,
    error_class,
    from_arrow_table,
    from_frame,
    from_send_results,
    processing_order,
)
from pipeline.faults.fleet import FleetState, fleet_step, next_watermark
from pipeline.faults.state import FaultOutputs, FaultState, initial_state, is_empty, stats_of, step

__all__ = [
    "EVENT_COLUMNS",
    "EVENT_SCHEMA",
    "STATE_DDL",
    "STATE_VERSION",
    "FaultOutputs",
    "FaultState",
    "FleetState",
    "decode_fleet",
    "decode_state",
    "encode_fleet",
    "encode_state",
    "error_class",
    "fleet_step",
    "from_arrow_table",
    "from_frame",
    "from_send_results",
    "initial_state",
    "is_empty",
    "next_watermark",
    "processing_order",
    "stats_of",
    "step",
]
