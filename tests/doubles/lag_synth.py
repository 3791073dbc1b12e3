"""Small builders of lag events, and a vectorised synthetic fleet for benchmarks.

The builders return the ``schemas.events`` dataclasses, so tests can send the very same events to
Kafka, to a file stream or straight into :func:`pipeline.lag.step`. :func:`fleet_batches` makes
frames directly with numpy, because a benchmark of 200,000 progress events per batch must not
measure the cost of creating Python objects.
"""

from __future__ import annotations

from collections.abc import Iterator, Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np
import pandas as pd
import pyarrow as pa

from pipeline.lag.events import MEMBERSHIP, PROGRESS, SEND, normalize_events
from schemas.events import ConsumerProgress, GroupMembership, SendResult

CLUSTER = "c1"


def send(
    ts: int,
    qid: int,
    offset: int | None,
    topic: str = "T",
    broker: str = "b1",
    cluster: str = CLUSTER,
    status: str = "SEND_OK",
    client: str = "p-1",
) -> SendResult:
    return SendResult(
        event_id=f"{client}:{topic}:{broker}:{qid}:{offset}:{ts}",
        ts_ms=ts,
        cluster=cluster,
        producer_group="PG",
        client_id=client,
        client_version="4.9.8",
        topic=topic,
        broker_name=broker,
        queue_id=qid,
        status=status,
        latency_ms=3,
        error=None if offset is not None else "RemotingTimeoutException",
        queue_offset=offset,
        attempt=0,
    )


def progress(
    ts: int,
    qid: int,
    offset: int,
    group: str = "G",
    topic: str = "T",
    broker: str = "b1",
    client: str | None = None,
    broker_offset: int | None = None,
    last_ts: int | None = None,
    cluster: str = CLUSTER,
) -> ConsumerProgress:
    return ConsumerProgress(ts, cluster, group, topic, broker, qid, offset, broker_offset, client, last_ts)


def membership(
    ts: int,
    cids: Sequence[str],
    group: str = "G",
    topic: str = "T",
    strategy: str = "AVG",
    cluster: str = CLUSTER,
) -> GroupMembership:
    return GroupMembership(ts, cluster, group, topic, tuple(cids), strategy)


@dataclass(frozen=True)
class Fleet:
    """``groups`` consumer groups; every ``groups_per_topic`` of them share a topic of
    ``brokers x queues_per_broker`` queues (so each group has that many queues).

    Every ``interval_ms`` each (group, queue) reports progress and each queue gets ``sends`` new
    messages; consumers stay ``behind`` messages back, so lags and time lags are non-trivial.
    """

    groups: int = 200
    groups_per_topic: int = 4
    brokers: int = 4
    queues_per_broker: int = 250
    interval_ms: int = 5_000
    sends: int = 1
    behind: int = 3
    consumers: int = 8
    start_ms: int = 1_700_000_000_000
    cluster: str = CLUSTER

    @property
    def queues(self) -> int:
        return self.brokers * self.queues_per_broker

    def layout(self) -> pd.DataFrame:
        """One row per (group, queue)."""
        g = np.repeat(np.arange(self.groups), self.queues)
        q = np.tile(np.arange(self.queues), self.groups)
        return pd.DataFrame(
            {
                "consumer_group": np.char.add("G", g.astype(str)).astype(object),
                "topic": np.char.add("T", (g // self.groups_per_topic).astype(str)).astype(object),
                "broker_name": np.char.add("b", (q // self.queues_per_broker).astype(str)).astype(object),
                "queue_id": (q % self.queues_per_broker).astype(np.int64),
            }
        )


def fleet_batches(
    fleet: Fleet, intervals: int, with_sends: bool = True, splits: int = 1
) -> Iterator[tuple[int, pd.DataFrame]]:
    """(now_ms, normalised events) per batch; each interval is cut into ``splits`` batches, each
    with its share of the pairs' progress and the queues' sends. Membership comes first."""
    pairs = fleet.layout()
    queues = pairs.drop_duplicates(["topic", "broker_name", "queue_id"], ignore_index=True)
    rng = np.random.default_rng(7)
    step_ms = fleet.interval_ms // splits
    for b in range(intervals):
        head = (b + 1) * fleet.sends
        for j in range(splits):
            now = fleet.start_ms + b * fleet.interval_ms + (j + 1) * step_ms
            mine = pairs[np.arange(len(pairs)) % splits == j]
            mq = queues[np.arange(len(queues)) % splits == j]
            parts = []
            if b == 0 and j == 0:
                groups = pairs.drop_duplicates("consumer_group")
                parts.append(
                    pd.DataFrame(
                        {
                            "kind": MEMBERSHIP,
                            "ts_ms": fleet.start_ms,
                            "cluster": fleet.cluster,
                            "consumer_group": groups["consumer_group"].to_numpy(),
                            "topic": groups["topic"].to_numpy(),
                            "client_ids": [
                                tuple(f"10.0.0.{i}@{g}" for i in range(fleet.consumers))
                                for g in groups["consumer_group"]
                            ],
                            "strategy": "AVG",
                        }
                    )
                )
            if with_sends:
                k = np.repeat(np.arange(fleet.sends), len(mq))
                parts.append(
                    pd.concat([mq] * fleet.sends, ignore_index=True)
                    .drop(columns="consumer_group")
                    .assign(
                        kind=SEND,
                        cluster=fleet.cluster,
                        ts_ms=now - step_ms + (k + 1) * (step_ms // (fleet.sends + 1)),
                        queue_offset=b * fleet.sends + k,
                        send_status="SEND_OK",
                    )
                )
            jitter = rng.integers(0, step_ms // 2, len(mine))
            parts.append(
                mine.assign(
                    kind=PROGRESS,
                    cluster=fleet.cluster,
                    ts_ms=now - jitter,
                    consumer_offset=max(head - fleet.behind, 0),
                    broker_offset=head,
                    client_id=None,
                )
            )
            frame = pd.concat(parts, ignore_index=True)
            frame["src_offset"] = np.arange(len(frame))
            yield now, normalize_events(frame)


def bronze_rows(frame: pd.DataFrame, topics: dict[str, str] | None = None) -> pa.Table:
    """Normalised events as routed bronze rows (``_table`` + bronze columns), as the Kafka reader
    produces them: for file-stream tests and benchmarks that do without Kafka."""
    from schemas.fields import arrow_schema
    from schemas.tables import BRONZE_TABLE_FOR_EVENT, ROUTE_COLUMN, routed_fields

    tables = [t.name for t in BRONZE_TABLE_FOR_EVENT.values()] + ["quarantine"]
    schema = arrow_schema(routed_fields(tables))
    kind = frame["kind"].to_numpy()
    topics = topics or {k: f"rmq.{k}" for k in BRONZE_TABLE_FOR_EVENT}
    nulls = {
        "queue_offset": -1,
        "broker_offset": -1,
        "last_timestamp_ms": -1,
        "consumer_offset": -2,
        "queue_id": -1,
    }
    columns: dict[str, Any] = {
        ROUTE_COLUMN: np.array([BRONZE_TABLE_FOR_EVENT[k].name for k in kind], dtype=object),
        "schema_version": np.ones(len(frame), dtype=np.int64),
        "event_id": frame["src_offset"].astype(str).to_numpy(dtype=object),
        "status": frame["send_status"].to_numpy(dtype=object),
        "kafka_topic": np.array([topics[k] for k in kind], dtype=object),
        "kafka_partition": np.where(frame["src_partition"] >= 0, frame["src_partition"], 0),
        "kafka_offset": frame["src_offset"].to_numpy(),
        "kafka_ts_ms": frame["ts_ms"].to_numpy(),
        "event_date": pd.to_datetime(frame["ts_ms"], unit="ms")
        .dt.strftime("%Y-%m-%d")
        .to_numpy(dtype=object),
        "client_ids": [None if v is None else list(v) for v in frame["client_ids"]],
    }
    for name in (
        "ts_ms",
        "cluster",
        "topic",
        "broker_name",
        "consumer_group",
        "client_id",
        "strategy",
        "queue_id",
        "queue_offset",
        "consumer_offset",
        "broker_offset",
        "last_timestamp_ms",
    ):
        values = frame[name].to_numpy()
        if name in nulls:
            values = pd.array(values, dtype="Int64").to_numpy(dtype=object, na_value=None)
            values[frame[name].to_numpy() == nulls[name]] = None
        columns[name] = values
    arrays = []
    for f in schema:
        if f.name in columns:
            arrays.append(pa.array(columns[f.name], type=f.type, from_pandas=True))
        else:
            arrays.append(pa.nulls(len(frame), f.type))
    return pa.Table.from_arrays(arrays, schema=schema)
