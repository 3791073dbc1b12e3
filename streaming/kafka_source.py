"""Kafka as a Spark streaming source, through Spark's Python Data Source API and kafka-python.

The JVM Kafka connector cannot be installed here (no Maven), so this reader does its job: one Spark
partition per Kafka partition, offsets in the Spark checkpoint, at most ``max_rows`` records per
micro-batch, ``availableNow``, new partitions picked up. Records are unpacked by
:mod:`streaming.kafka_records` and decoded in the reader (:mod:`streaming.decode`). In write mode
(``write_root``) each task writes its bronze Parquet itself and emits only its file list plus the
events a stateful step reads, cut per state key (:mod:`streaming.feeds`). With ``event_time`` each
offset carries the batch's settle point (:func:`settle_point`), so cutting a backlog into batches
makes no on-time event late. Partition ends come from Kafka's ListOffsets answer once a probe has
shown the broker answers it right (Apache Kafka does), else from fetch responses (high watermarks, or
last stable offsets under read_committed): Tansu's ListOffsets answer is short when the last batch
holds several records. Offsets that are gone are found before each batch (:mod:`streaming.kafka_gaps`).
"""

from __future__ import annotations

import dataclasses
import itertools
import json
import logging
import time
from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from pyspark.sql.datasource import DataSource, DataSourceReader, DataSourceStreamReader, InputPartition
from pyspark.sql.streaming.datasource import (
    ReadAllAvailable,
    ReadLimit,
    ReadMaxRows,
    SupportsTriggerAvailableNow,
)

from pipeline.config import Config
from schemas.errors import FaultwatchError
from schemas.fields import spark_schema
from schemas.tables import BRONZE_TABLE_FOR_EVENT, routed_fields
from streaming.daemon import quiet_pyspark_daemon
from streaming.kafka_gaps import DataLossError, Gap, fatal_message, find_gaps, gap_entries, gaps_in

if TYPE_CHECKING:  # pragma: no cover
    from pyspark.sql import DataFrame, SparkSession

log = logging.getLogger(__name__)

# The data source's planner processes import this module to unpickle it (streaming/daemon.py).
quiet_pyspark_daemon()

SOURCE_NAME = "faultwatch_kafka"
# Spark redacts option values whose key matches spark.redaction.regex ("secret|password|token|...").
SECRET_OPTION = "kafka.secret.client_options"


class KafkaUnavailableError(FaultwatchError, RuntimeError):
    """Kafka could not be reached within ``kafka.connect_timeout_s``."""


class UndecodableBatchError(FaultwatchError, RuntimeError):
    """A fetched record batch could not be unpacked (a codec not installed, corrupt bytes)."""


def poll_or_explain(consumer: Any, where: str, **poll: Any) -> Any:
    """``consumer.poll(**poll)``, with a batch that cannot be unpacked reported by topic, partition
    and offset (each assigned partition's position, when the poll reads several): such a batch
    stops the query (its records cannot be read, so neither quarantined) rather than being skipped."""
    from kafka.errors import (
        KafkaConnectionError,
        KafkaTimeoutError,
        OffsetOutOfRangeError,
        UnsupportedCodecError,
    )

    try:
        return consumer.poll(**poll)
    except OffsetOutOfRangeError as exc:
        at = ", ".join(f"{tp.topic}/{tp.partition}" for tp in sorted(consumer.assignment()))
        raise DataLossError(
            f"offsets of {at} were deleted while the job read them ({where}): {exc}; the query stops "
            "(the next run finds the gap and, with kafka.fail_on_data_loss = false, records it)"
        ) from exc
    except (KafkaConnectionError, KafkaTimeoutError):
        raise
    except Exception as exc:  # codec missing, CRC mismatch, bad framing, a decompressor's own error
        hint = ("install the codec's package (kafka-python's extras lz4, snappy and zstd, which "
                "faultwatch depends on) into the Python of every Spark worker"
                if isinstance(exc, UnsupportedCodecError)
                else "the batch is corrupt or in a format this client cannot read")
        at = ", ".join(f"{tp.topic}/{tp.partition} at or after offset {consumer.position(tp)}"
                       for tp in sorted(consumer.assignment()))
        raise UndecodableBatchError(
            f"cannot unpack a record batch of {at} ({where}): {type(exc).__name__}: {exc}; {hint}"
        ) from exc


@dataclass(frozen=True)
class TopicPartitionRange(InputPartition):
    topic: str
    partition: int
    kind: str
    start: int
    end: int
    settle_ms: int = 0  # the micro-batch's event-time settle point (see ``settle_point``)
    gap: tuple[int, int, str, int] | None = None  # offsets lost before ``start``: (first, last, cause, when)


@dataclass(frozen=True)
class RangeGroup(InputPartition):
    """Several small ranges read by one task, one after the other."""

    ranges: tuple[TopicPartitionRange, ...]


def _records_of(part: InputPartition) -> int:
    ranges = part.ranges if isinstance(part, RangeGroup) else (part,)
    return sum(r.end - r.start for r in ranges if isinstance(r, TopicPartitionRange))


def pack_ranges(ranges: Sequence[TopicPartitionRange], pack_rows: int, min_tasks: int = 1) -> list[InputPartition]:
    """Consecutive ranges of fewer than ``pack_rows`` records in all go to one task (0: never).

    A task costs ~0.1 s here whatever it reads; a 1 s micro-batch of a few thousand events spread
    over every partition would otherwise spend more time starting tasks than reading. But fewer
    tasks than ``min_tasks`` (the cores) would leave cores idle while one task reads everything:
    then the ranges are dealt to ``min_tasks`` tasks of about equal size instead.
    """
    out: list[InputPartition] = []
    group: list[TopicPartitionRange] = []
    rows = 0
    for r in ranges:
        n = r.end - r.start
        if group and rows + n > pack_rows:
            out.append(group[0] if len(group) == 1 else RangeGroup(tuple(group)))
            group, rows = [], 0
        group.append(r)
        rows += n
    if group:
        out.append(group[0] if len(group) == 1 else RangeGroup(tuple(group)))
    tasks = min(min_tasks, len(ranges))
    return _dealt(ranges, tasks) if len(out) < tasks else out


def _dealt(ranges: Sequence[TopicPartitionRange], tasks: int) -> list[InputPartition]:
    """The ranges in ``tasks`` groups of about equal records: largest first, each to the group
    holding the fewest so far; a group keeps its ranges in their given order."""
    groups: list[list[int]] = [[] for _ in range(tasks)]
    load = [0] * tasks
    for i in sorted(range(len(ranges)), key=lambda i: -(ranges[i].end - ranges[i].start)):
        g = load.index(min(load))
        groups[g].append(i)
        load[g] += ranges[i].end - ranges[i].start
    parts = [[ranges[i] for i in sorted(g)] for g in groups if g]
    return [p[0] if len(p) == 1 else RangeGroup(tuple(p)) for p in parts]


def output_tables(kinds: Sequence[str]) -> list[str]:
    return [BRONZE_TABLE_FOR_EVENT[k].name for k in kinds] + ["quarantine"]


def _key(topic: str, partition: int) -> str:
    return f"{topic}/{partition}"


# Offset entries that are not Kafka partitions start with this (see ``settle_point``).
META = "_"
SETTLE = "_settle_ms"


def partition_offsets(offsets: dict) -> dict:
    """The Kafka partitions of an offset dict, without its meta entries."""
    return {k: v for k, v in offsets.items() if not k.startswith(META)}


def settle_point(
    start: dict, end: dict, latest: dict, ts_at: Callable[[list[tuple[str, int, bool]]], dict],
    delay_ms: int, ceiling_ms: int,
) -> int:
    """The event time up to which the micro-batch ``start -> end`` settles windows, minutes and grid points.

    Each partition is read in event-time order (roughly: producers' clocks and jitter), but a
    backlog is cut into micro-batches by offsets, so after a batch the partitions stand at
    different event times. The settle point follows the slowest partition that still has records
    to read: the event time of its next unread record minus ``delay_ms``. Only when every
    partition is read to ``latest`` does it follow the newest record read, as a plain watermark
    would. So an event is late (at or before the previous batch's settle point) only if it is
    older than ``delay_ms`` at its own partition's pace, however the backlog was cut. Never
    decreases; never passes ``ceiling_ms`` (the batch time plus the allowed clock skew, minus the
    delay), so one producer clock far ahead cannot settle the future.
    ``ts_at([(key, offset, exact)])`` gives the event time of the record at ``offset`` (``exact``),
    or of the first record at or after it with a readable time; ``None`` when there is none.
    """
    previous = int(start.get(SETTLE, 0))
    behind, caught_up = [], []
    for key, stop in partition_offsets(end).items():
        begin = int(start.get(key, 0))
        if stop < int(latest.get(key, stop)):
            behind.append((key, int(stop), False))  # its next unread record
        elif stop > begin:
            caught_up.append((key, int(stop) - 1, True))  # the last record this batch reads
    times = ts_at(behind + caught_up)
    if behind:
        slowest = [times.get((k, o)) for k, o, _ in behind]
        if any(t is None for t in slowest):  # a partition's position is unknown: do not move
            return previous
        point = min(int(t) for t in slowest if t is not None) - delay_ms
    else:
        newest = [int(t) for t in (times.get((k, o)) for k, o, _ in caught_up) if t is not None]
        if not newest:
            return previous
        point = max(newest) - delay_ms
    return max(previous, min(point, ceiling_ms))


def _split_key(key: str) -> tuple[str, int]:
    topic, _, part = key.rpartition("/")
    return topic, int(part)


class KafkaEventSource(DataSource):
    @classmethod
    def name(cls) -> str:
        return SOURCE_NAME

    def schema(self) -> Any:  # a StructType
        if self.options.get("feeds"):
            return KEYED_CHUNK_SCHEMA
        if self.options.get("chunked") == "true":
            return CHUNK_SCHEMA
        kinds = list(json.loads(self.options["topics"]).values())
        return spark_schema(routed_fields(output_tables(list(dict.fromkeys(kinds)))))

    def streamReader(self, schema: Any) -> KafkaEventReader:
        return KafkaEventReader(dict(self.options))


class PlannerWarmup(DataSource):
    """A source of no rows. Reading it once makes Spark start the Python process that plans data
    source reads and import this module there; the process is kept for reuse, so the Kafka query's
    first micro-batch does not wait for it (see :func:`streaming.job.warm_python_workers`)."""

    @classmethod
    def name(cls) -> str:
        return "faultwatch_warmup"

    def schema(self) -> str:
        return "id long"

    def reader(self, schema: Any) -> DataSourceReader:
        return _NoRows()


class _NoRows(DataSourceReader):
    def read(self, partition: Any) -> Iterator[Any]:
        return iter(())


def _client_options(options: dict[str, str]) -> dict[str, Any]:
    """The kafka-python settings of every consumer the source makes (connection, security, isolation)."""
    return {**json.loads(options.get(SECRET_OPTION, "{}")),
            "isolation_level": options.get("isolation_level", "read_committed")}


def _make_consumer(options: dict[str, str], **extra: Any) -> Any:
    """A group-less KafkaConsumer, retried until ``connect_timeout_s`` with backoff (each attempt's
    bootstrap bounded by the time left: kafka-python's own bound is 30 s). A position out of the
    partition's range resets to its beginning unless ``extra`` says otherwise."""
    from kafka import KafkaConsumer
    from kafka.errors import KafkaError

    timeout_s = float(options.get("connect_timeout_s", "30"))
    deadline = time.monotonic() + timeout_s
    delay = 0.2
    while True:
        try:
            left_ms = max(100, int((deadline - time.monotonic()) * 1000))
            return KafkaConsumer(
                group_id=None,
                enable_auto_commit=False,
                **{"auto_offset_reset": "earliest", "bootstrap_timeout_ms": left_ms, **_client_options(options), **extra},
            )
        except KafkaError as exc:
            if time.monotonic() + delay > deadline:
                servers = ",".join(_client_options(options).get("bootstrap_servers", []))
                raise KafkaUnavailableError(
                    f"Kafka at {servers} unreachable for {timeout_s:.0f}s ({type(exc).__name__}: {exc}); "
                    "check kafka.bootstrap_servers and that the cluster is up"
                ) from None
            log.warning("Kafka not reachable yet (%s); retrying in %.1fs", type(exc).__name__, delay)
            time.sleep(delay)
            delay = min(delay * 2, 5.0)


# What one driver poll may return while it looks for the partitions' ends (see _end_offsets).
DRAIN_RECORDS = 100_000
# Look-ups of the ends that may probe ListOffsets before the ends always come from fetches, and
# the longest one probe waits for its fetches.
PROBES, PROBE_WAIT_S = 3, 1.0


class KafkaEventReader(DataSourceStreamReader, SupportsTriggerAvailableNow):
    def __init__(self, options: dict[str, str]) -> None:
        self.options = options
        self.topics: dict[str, str] = json.loads(options["topics"])  # topic -> event kind
        self.max_rows = int(options.get("max_rows", "0"))
        self._consumer: Any = None
        self._stable: dict[Any, int] | None = None  # last stable offsets from fetch responses
        self.committed_only = _client_options(options)["isolation_level"] == "read_committed"
        self._target: dict[str, int] | None = None  # availableNow: never read past this
        self._ends: dict[str, int] = {}  # the last end offsets learnt, per "topic/partition"
        self.end_polls = 0  # the polls the last look-up of the ends took
        # Whether ListOffsets answers true ends here (None: not known), and how many more look-ups may
        # probe it (option end_offsets = "fetch": none, the ends always come from fetches).
        self.listing_exact: bool | None = None
        self._probes_left = PROBES if options.get("end_offsets", "auto") == "auto" else 0
        self._missing_warned: set[str] = set()
        # With ``event_time``, every offset also carries the batch's settle point (``SETTLE``).
        self.event_time = options.get("event_time") == "true"
        self.delay_ms = int(options.get("watermark_delay_ms", "30000"))
        self.skew_ms = int(options.get("future_skew_ms", "300000"))
        self.fail_on_data_loss = options.get("fail_on_data_loss", "true") == "true"

    # -- driver side -------------------------------------------------------------------------
    def _driver_consumer(self) -> Any:
        if self._consumer is None:
            from streaming.kafka_records import install as install_fast_records
            from streaming.kafka_records import track_stable_offsets

            self._consumer = _make_consumer(self.options, fetch_max_wait_ms=10, max_partition_fetch_bytes=1)
            # settle_point's look-ups seek into the middle of record batches, and everything before
            # the offset is unpacked too: ~0.3 s per micro-batch with kafka-python's own loop.
            install_fast_records(self._consumer)
            self._stable = track_stable_offsets(self._consumer)
        return self._consumer

    def _ask(self, what: str, call: Any, *args: Any) -> Any:
        """``call(*args)``, a driver request to Kafka, retried with backoff through an outage (a
        broker restarting) until ``kafka.connect_timeout_s``; then a KafkaUnavailableError naming it.
        kafka-python gives up on one request after ``request_timeout_ms`` (30 s), sooner than that."""
        from kafka.errors import KafkaConnectionError, KafkaTimeoutError

        timeout_s = float(self.options.get("connect_timeout_s", "30"))
        deadline = time.monotonic() + timeout_s
        delay = 0.2
        while True:
            try:
                return call(*args)
            # KeyError: kafka-python leaves a partition whose leader its metadata does not know (a topic
            # just deleted or re-created) out of its answer, and then fails looking it up.
            except (KafkaConnectionError, KafkaTimeoutError, KeyError) as exc:
                if time.monotonic() + delay > deadline:
                    raise KafkaUnavailableError(
                        f"Kafka did not answer the {what} request for {timeout_s:.0f}s "
                        f"({type(exc).__name__}: {exc}); check that the cluster is up "
                        "(kafka.connect_timeout_s bounds the wait)"
                    ) from None
                log.warning("Kafka did not answer the %s request (%s); retrying in %.1fs",
                            what, type(exc).__name__, delay)
                time.sleep(delay)
                delay = min(delay * 2, 5.0)

    def _partitions_now(self) -> list[tuple[str, int]]:
        consumer = self._driver_consumer()
        self._ask("topic metadata", consumer.topics)  # refreshes metadata, so new partitions show up
        out: list[tuple[str, int]] = []
        for topic in self.topics:
            parts = consumer.partitions_for_topic(topic)
            if not parts:
                if topic not in self._missing_warned:
                    log.warning("topic %r does not exist (yet); reading nothing from it", topic)
                    self._missing_warned.add(topic)
                continue
            out.extend((topic, p) for p in sorted(parts))
        return out

    def _end_offsets(self) -> dict[str, int]:
        """The true end of every partition: Kafka's ListOffsets answer where the broker has shown it
        answers right (:meth:`_probe_listing`), else fetch high watermarks (see module docstring)."""
        from kafka import TopicPartition

        consumer = self._driver_consumer()
        tps = [TopicPartition(t, p) for t, p in self._partitions_now()]
        if not tps:
            return {}
        listed = self._ask("end offsets", consumer.end_offsets, tps)
        if self.listing_exact is None and self._probes_left > 0:
            self._probes_left -= 1
            self.listing_exact = self._probe_listing(consumer, tps, listed)
        if self.listing_exact:  # (under read_committed ListOffsets answers the last stable offsets)
            ends, polls = dict(listed), 0
        else:
            ends, polls = self._ends_from_fetches(consumer, tps, listed)
        out = {_key(tp.topic, tp.partition): int(ends[tp]) for tp in tps}
        self._ends = out
        self.end_polls = polls
        return out

    def _ends_from_fetches(self, consumer: Any, tps: list[Any], listed: dict[Any, int]) -> tuple[dict[Any, int], int]:
        """Each partition's end from the high watermarks (or last stable offsets) of fetches from
        where ListOffsets says it ends, and the polls that took: exact whatever ListOffsets answers."""
        consumer.assign(tps)
        for tp in tps:
            consumer.seek(tp, max(listed[tp], self._known_end(tp)))
        before = {tp: consumer.highwater(tp) for tp in tps}
        deadline = time.monotonic() + float(self.options.get("connect_timeout_s", "30"))
        polls = 0
        while True:
            # Records that arrived since the listing come back and are dropped, all at once: a
            # partition with fetched records still buffered is left out of the next fetch, so
            # taking them one per poll kept its high watermark from renewing for dozens of polls.
            poll_or_explain(consumer, "end offset look-up", timeout_ms=50, max_records=DRAIN_RECORDS)
            polls += 1
            ends = {tp: consumer.highwater(tp) for tp in tps}
            known = all(hw is not None and hw >= listed[tp] for tp, hw in ends.items())
            # A high watermark equal to the previous one may be stale: allow one more fetch round.
            if known and (polls >= 2 or all(ends[tp] != before[tp] for tp in tps)):
                break
            if time.monotonic() > deadline:
                raise KafkaUnavailableError("Kafka did not answer fetches for the partitions' end offsets")
        if self.committed_only:  # read_committed reads up to the last stable offset, not the high watermark
            stable = self._stable if self._stable is not None else listed  # (ListOffsets answers it too)
            ends = {tp: min(hw, stable.get(tp, hw)) for tp, hw in ends.items()}
        return ends, polls

    def _probe_listing(self, consumer: Any, tps: list[Any], listed: dict[Any, int]) -> bool | None:
        """Whether this broker's ListOffsets answers each partition's true end: True, False, or
        None while no partition shows it either way (asked again at the next look-up).

        A fetch of at most one byte from offset end - 2 (end: the listed one) returns the one record
        batch holding it. Batches never change once written, so records in it at or past the listed
        end prove the answer short (Tansu's, after a batch of several records); the records end - 2
        and end - 1 as the whole rest of one batch prove it right where a short answer would show.
        Anything else (single-record or control batches, compacted offsets, a partition listed as
        holding one record, whose batch is then fetched from 0) proves nothing."""
        probed = [tp for tp in tps if listed[tp] >= 1]
        if not probed:
            return None
        consumer.assign(probed)
        for tp in probed:
            consumer.seek(tp, max(0, listed[tp] - 2))
        seen: dict[Any, list[int]] = {}
        deadline = time.monotonic() + PROBE_WAIT_S
        while len(seen) < len(probed) and time.monotonic() < deadline:
            polled = poll_or_explain(consumer, "ListOffsets probe", timeout_ms=100, max_records=DRAIN_RECORDS)
            for tp, records in polled.items():
                seen.setdefault(tp, [rec.offset for rec in records])
        if any(max(offsets, default=-1) >= listed[tp] for tp, offsets in seen.items()):
            verdict: bool | None = False
        elif any(offsets == [listed[tp] - 2, listed[tp] - 1] for tp, offsets in seen.items()):
            verdict = True
        else:
            verdict = None
        log.info("ListOffsets probe over %d partitions: %s", len(probed),
                 {True: "exact, ends from ListOffsets", False: "short, ends from fetches",
                  None: "inconclusive, ends from fetches"}[verdict])
        return verdict

    def _known_end(self, tp: Any) -> int:
        return self._ends.get(_key(tp.topic, tp.partition), 0)

    def _beginnings(self, keys: Sequence[str]) -> dict[str, int]:
        """Each partition's oldest offset Kafka still holds."""
        from kafka import TopicPartition

        if not keys:
            return {}
        tps = [TopicPartition(*_split_key(k)) for k in keys]
        found = self._ask("beginning offsets", self._driver_consumer().beginning_offsets, tps)
        return {_key(tp.topic, tp.partition): int(found[tp]) for tp in tps}

    def initialOffset(self) -> dict:
        """Where a query without a checkpoint starts (``kafka.starting_offsets``): each partition's
        oldest offset left, its end, or its first record at or after a time (its end if none)."""
        keys = [_key(t, p) for t, p in self._partitions_now()]
        how = self.options.get("starting_offsets", "earliest")
        if how == "earliest":
            return self._beginnings(keys)
        ends = self._end_offsets()
        if how == "latest":
            return {k: ends[k] for k in keys if k in ends}
        return self._offsets_at(keys, int(how), ends)

    def _offsets_at(self, keys: Sequence[str], ts_ms: int, ends: dict[str, int]) -> dict:
        from kafka import TopicPartition

        tps = {k: TopicPartition(*_split_key(k)) for k in keys if k in ends}
        found = self._ask("offsets by time", self._driver_consumer().offsets_for_times,
                          {tp: ts_ms for tp in tps.values()})
        return {k: int(found[tp].offset) if found.get(tp) is not None else ends[k] for k, tp in tps.items()}

    def _gaps(self, parts: dict, ends: dict[str, int]) -> list[Gap]:
        """Unread offsets that are gone (see :mod:`streaming.kafka_gaps`): fatal, or returned to record."""
        known = [k for k in parts if k in ends]
        gaps = find_gaps({k: int(parts[k]) for k in known}, self._beginnings(known), ends, int(time.time() * 1000))
        if gaps and self.fail_on_data_loss:
            raise DataLossError(fatal_message(gaps))
        for gap in gaps:
            log.error("data loss (kafka.fail_on_data_loss = false, recorded in quarantine): %s", gap.describe())
        return gaps

    def prepareForTriggerAvailableNow(self) -> None:
        self._target = self._end_offsets()

    def getDefaultReadLimit(self) -> ReadLimit:
        return ReadMaxRows(self.max_rows) if self.max_rows > 0 else ReadAllAvailable()

    def latestOffset(self, start: dict, limit: ReadLimit) -> dict:
        # availableNow reads up to the ends learnt when the run began. Kafka offsets only grow, so
        # asking Kafka again (two fetch rounds, ~0.3 s per micro-batch here) cannot lower them. (A
        # topic deleted and re-created during a --once run is not handled, here or elsewhere.)
        ends = self._end_offsets() if self._target is None else self._target
        parts = partition_offsets(start)
        parts.update(self._beginnings([k for k in ends if k not in parts]))  # new partitions: from their start
        gaps = self._gaps(parts, ends)
        parts.update({g.key: g.resume for g in gaps})
        end = dict(parts)
        for k, v in ends.items():
            end[k] = max(v, parts.get(k, 0))
        if isinstance(limit, ReadMaxRows):
            end = _cap_rows(parts, end, int(limit.max_rows))
        if end == parts and not gaps:
            return start  # nothing new: the same offset, so Spark runs no batch
        end.update(gap_entries(gaps))
        if self.event_time:
            ceiling = int(time.time() * 1000) + self.skew_ms - self.delay_ms
            end[SETTLE] = settle_point(start, end, ends, self._event_times, self.delay_ms, ceiling)
        return end

    def _event_times(self, wanted: list[tuple[str, int, bool]]) -> dict:
        """{(key, offset): ts_ms or None} for ``settle_point``: one fetch round for all partitions."""
        from kafka import TopicPartition

        if not wanted:
            return {}
        consumer = self._driver_consumer()
        tps = {key: TopicPartition(*_split_key(key)) for key, _, _ in wanted}
        consumer.assign(list(tps.values()))
        todo = {}
        for key, offset, exact in wanted:
            consumer.seek(tps[key], offset)
            todo[tps[key]] = (key, offset, exact)
        found: dict = {}
        deadline = time.monotonic() + float(self.options.get("connect_timeout_s", "30"))
        while todo and time.monotonic() < deadline:
            polled = poll_or_explain(consumer, "event-time look-up", timeout_ms=100, max_records=1000)
            for tp, records in polled.items():
                if tp not in todo:
                    continue
                key, offset, exact = todo[tp]
                for rec in records:
                    ts = event_ts(rec.value)
                    if exact or ts is not None:
                        found[(key, offset)] = ts if (not exact or rec.offset == offset) else None
                        del todo[tp]
                        break
                if tp in todo and consumer.position(tp) >= self._ends.get(key, 0) > 0:
                    found[(key, offset)] = None  # no readable event time up to the end
                    del todo[tp]
                if tp not in todo and self._ends.get(key, 0) > offset:
                    # answered: what was fetched beyond the answer is dropped unread (a position
                    # past it makes the consumer discard it), and further fetches of it are empty
                    consumer.seek(tp, self._ends[key])
        if todo:  # the settle point then stays where it was: say so, or event time seems to stall unexplained
            log.warning("the event-time look-up got no record from %s within %.0fs; the settle point "
                        "does not move past them this micro-batch (a broker that answers fetches slowly?)",
                        ", ".join(sorted(key for key, _, _ in todo.values())),
                        float(self.options.get("connect_timeout_s", "30")))
        return found

    def reportLatestOffset(self) -> dict | None:
        return self._ends or None

    def partitions(self, start: dict, end: dict) -> Sequence[InputPartition]:
        """One task per topic-partition, or several over offset sub-ranges when it holds more than
        ``split_rows`` records: keys (broker names) hash unevenly, and one long task would keep
        the other cores idle while it runs. Spark starts tasks in this order: the longest come
        first, so that the last ones to run are short and no core waits long for the stage's end."""
        split = int(self.options.get("split_rows", "0"))
        settle = int(end.get(SETTLE, 0))
        gaps = gaps_in(end)
        out = []
        for key, stop in sorted(partition_offsets(end).items()):
            gap = gaps.get(key)
            begin = gap.resume if gap else int(start.get(key, 0))
            topic, part = _split_key(key)
            if gap:  # the first range of the partition carries it, even when there is nothing to read
                lo, hi = split_range(begin, max(begin, int(stop)), split)[0]
                out.append(TopicPartitionRange(topic, part, self.topics[topic], lo, hi, settle,
                                               (gap.first, gap.last, gap.cause, gap.detected_ms)))
                begin = hi
            if stop > begin:
                for lo, hi in split_range(begin, int(stop), split):
                    out.append(TopicPartitionRange(topic, part, self.topics[topic], lo, hi, settle))
        packed = pack_ranges(out, int(self.options.get("pack_rows", "0")), int(self.options.get("min_tasks", "1")))
        return sorted(packed, key=lambda p: -_records_of(p))

    def commit(self, end: dict) -> None:
        pass  # offsets live in the Spark checkpoint

    def stop(self) -> None:
        if self._consumer is not None:
            self._consumer.close()
            self._consumer = None

    # -- executor side -----------------------------------------------------------------------
    def read(self, partition: InputPartition) -> Iterator[Any]:
        ranges = partition.ranges if isinstance(partition, RangeGroup) else (partition,)
        tables = output_tables(list(dict.fromkeys(self.topics.values())))
        chunked = self.options.get("chunked") == "true"
        write_root = self.options.get("write_root")
        if write_root:
            yield from self._read_and_write(ranges, tables, write_root)
            return
        for part in ranges:
            assert isinstance(part, TopicPartitionRange)
            decoder = _decoder(self.options, part.kind, tables)
            batches = (decoder.decode(part.topic, part.partition, records) for records in _fetch_range(self.options, part))
            for batch in itertools.chain(_gap_rows(decoder, part), batches):
                yield to_chunks(batch) if chunked else batch

    def _read_and_write(self, ranges: Sequence[Any], tables: list[str], root: str) -> Iterator[Any]:
        """Write mode: this task writes its rows as Parquet into the tables' folders itself and
        yields one ``WRITTEN`` chunk row listing the files (the sink commits them), plus chunks of
        the ``feed_tables`` for a stateful step downstream (only ``feed_columns``, the
        ``feed_dictionary`` ones dictionary-encoded: less to shuffle). File names come from the
        offset range, so a replayed batch (same ranges) finds and reuses its files instead of
        writing them twice."""
        import pyarrow as pa

        from streaming.delta_sink import WRITTEN, write_table_files

        feed = set(json.loads(self.options.get("feed_tables", "[]")))
        slim = _feed_shape(json.loads(self.options.get("feed_columns", "null")),
                           set(json.loads(self.options.get("feed_dictionary", "[]"))))
        keyed = _keyed_feeds(self.options)
        tag = self.options.get("write_tag", "")
        files: list[dict[str, Any]] = []
        records_read = 0
        settle = 0
        for part in ranges:
            assert isinstance(part, TopicPartitionRange)
            settle = max(settle, part.settle_ms)
            decoder = _decoder(self.options, part.kind, tables)
            parts: dict[str, list[Any]] = {}
            for name, rows in itertools.chain.from_iterable(by_table(b).items() for b in _gap_rows(decoder, part)):
                parts.setdefault(name, []).append(rows)
            for records in _fetch_range(self.options, part):
                records_read += len(records)
                split = by_table(decoder.decode(part.topic, part.partition, records))
                for name, rows in split.items():
                    parts.setdefault(name, []).append(rows)
                if keyed is not None:
                    pieces = keyed.per_fetch({name: pa.Table.from_batches([rows]) for name, rows in split.items()})
                    if pieces:
                        yield _keyed_chunks(pieces, part.settle_ms)
                    continue
                fed = {name: slim(rows) for name, rows in split.items() if name in feed}
                if fed:
                    yield _chunks_of(fed)
            if keyed is not None:
                pieces = keyed.per_range({name: pa.Table.from_batches(b) for name, b in parts.items()})
                if pieces:
                    yield _keyed_chunks(pieces, part.settle_ms)
            stem = f"part-{tag}-{part.topic}-{part.partition}-{part.start}-{part.end}"
            for name, batches in sorted(parts.items()):
                rows = pa.Table.from_batches(batches)
                written = write_table_files(root, name, rows, lambda i, stem=stem: f"{stem}-{i}",  # type: ignore[misc]
                                            keep_existing=True)  # (mypy cannot type a lambda's default argument)
                files.extend(dataclasses.asdict(f) for f in written)
        listing = {"_table": [WRITTEN], "rows": [records_read], "arrow": [json.dumps(files).encode()]}
        if keyed is not None:
            from streaming.feeds import WRITTEN_KEY

            listing = {"_key": [WRITTEN_KEY], **listing, SETTLE: [settle]}
            yield pa.RecordBatch.from_pydict(listing, schema=_keyed_arrow_schema())
            return
        yield pa.RecordBatch.from_pydict(listing, schema=_chunk_arrow_schema())


def _gap_rows(decoder: Any, part: TopicPartitionRange) -> list[Any]:
    """The quarantine row recording the offsets lost before ``part`` (none if it carries no gap)."""
    if part.gap is None:
        return []
    first, last, cause, when = part.gap
    gap = Gap(_key(part.topic, part.partition), first, last, part.start, cause, when)
    return [decoder.gap_row(part.topic, part.partition, first, when, gap.describe())]


def _decoder(options: dict[str, str], kind: str, tables: list[str]) -> Any:
    from streaming.decode import BatchDecoder

    return BatchDecoder(kind, tables=tables, max_event_bytes=int(options.get("max_event_bytes", "65536")),
                        max_future_skew_ms=int(options.get("max_future_skew_ms", "300000")))


Pieces = list[tuple[str, str, Any]]  # (state key, table, rows)


@dataclass(frozen=True)
class KeyedFeeds:
    """How a task cuts its rows into keyed pieces (option ``feeds``). The lag feed cuts each fetch;
    the fault feed cuts a range's send results once, at its end, from the batches kept for its
    Parquet files anyway: a few large pieces per range (one per cluster and shard) rather than as
    many small ones per fetch, each to serialize, shuffle and read; the same rows per key."""

    per_fetch: Callable[[dict[str, Any]], Pieces]
    per_range: Callable[[dict[str, Any]], Pieces]


def _keyed_feeds(options: dict[str, str]) -> KeyedFeeds | None:
    """With option ``feeds`` (concern names), the functions cutting a task's tables into keyed pieces."""
    names = json.loads(options.get("feeds", "[]"))
    if not names:
        return None
    from streaming.feeds import fault_feed, lag_feed

    columns = json.loads(options.get("feed_columns", "null"))
    shards = int(options.get("lag_shards", "1"))
    fault_shards = int(options.get("fault_shards", "1"))

    def lag(tables: dict[str, Any]) -> Pieces:
        return lag_feed(tables, shards) if "lag" in names else []

    def faults(tables: dict[str, Any]) -> Pieces:
        if "faults" in names and "send_results" in tables:  # one chunk: every piece shares its dictionaries
            return fault_feed(tables["send_results"].combine_chunks(), columns, fault_shards)
        return []

    return KeyedFeeds(per_fetch=lag, per_range=faults)


def _keyed_chunks(pieces: Pieces, settle_ms: int) -> Any:
    import pyarrow as pa

    keys, names, counts, payloads = [], [], [], []
    from streaming.feeds import ipc_bytes

    for key, name, rows in pieces:
        keys.append(key)
        names.append(name)
        counts.append(rows.num_rows)
        payloads.append(ipc_bytes(rows))
    return pa.RecordBatch.from_pydict(
        {"_key": keys, "_table": names, "rows": counts, "arrow": payloads, SETTLE: [settle_ms] * len(keys)},
        schema=_keyed_arrow_schema(),
    )


def _keyed_arrow_schema() -> Any:
    import pyarrow as pa

    return pa.schema([("_key", pa.string()), ("_table", pa.string()), ("rows", pa.int64()),
                      ("arrow", pa.binary()), (SETTLE, pa.int64())])


# Bronze never needs Spark to look inside an event, so it can carry events as Arrow IPC chunks: one
# Spark row per table and fetch (a few thousand events) instead of one per event. Measured on this
# machine, the JVM's per-cell conversions of the 39-column routed rows cost ~5x the Kafka read;
# with chunks Spark still owns offsets, checkpoints and the exactly-once commits.
CHUNK_SCHEMA = "_table string, rows long, arrow binary"
# With keyed feeds (option ``feeds``), each chunk also names the state key it belongs to and the
# micro-batch's settle point (see ``settle_point``).
KEYED_CHUNK_SCHEMA = f"_key string, {CHUNK_SCHEMA}, {SETTLE} long"


def _feed_shape(columns: list[str] | None, dictionary: set[str]) -> Callable[[Any], Any]:
    """What a feed chunk keeps of a table's rows: ``columns`` (all if None), ``dictionary`` ones
    dictionary-encoded (a broker or client id repeated on many rows is then sent once per chunk)."""
    import pyarrow.compute as pc

    def shape(rows: Any) -> Any:
        if columns is not None:
            rows = rows.select(columns)
        if dictionary:
            names = rows.schema.names
            arrays = [pc.dictionary_encode(rows.column(i)) if name in dictionary else rows.column(i)
                      for i, name in enumerate(names)]
            rows = type(rows).from_arrays(arrays, names=names)
        return rows

    return shape


def by_table(batch: Any) -> dict[str, Any]:
    """A routed batch split into each table's rows, with that table's columns and Arrow schema."""
    import pyarrow.compute as pc

    from schemas.tables import ROUTE_COLUMN, table

    routes = batch.column(ROUTE_COLUMN)
    names = pc.unique(routes).to_pylist()
    out = {}
    for name in names:
        spec = table(name)
        rows = batch if len(names) == 1 else batch.filter(pc.equal(routes, name))  # one table, as a rule
        out[name] = rows.select(spec.columns).cast(spec.arrow_schema())
    return out


def to_chunks(batch: Any) -> Any:
    """A routed batch as one row per table: (table name, row count, Arrow IPC stream bytes)."""
    return _chunks_of(by_table(batch))


def _chunks_of(parts: dict[str, Any]) -> Any:
    import pyarrow as pa

    names, counts, payloads = [], [], []
    from streaming.feeds import ipc_bytes

    for name, part in parts.items():
        names.append(name)
        counts.append(part.num_rows)
        payloads.append(ipc_bytes(part))
    return pa.RecordBatch.from_pydict({"_table": names, "rows": counts, "arrow": payloads}, schema=_chunk_arrow_schema())


def _chunk_arrow_schema() -> Any:
    import pyarrow as pa

    return pa.schema([("_table", pa.string()), ("rows", pa.int64()), ("arrow", pa.binary())])


def split_range(begin: int, end: int, max_rows: int) -> list[tuple[int, int]]:
    """[begin, end) cut into equal pieces of at most ``max_rows`` (0: no cut)."""
    n = end - begin
    if max_rows <= 0 or n <= max_rows:
        return [(begin, end)]
    pieces = -(-n // max_rows)
    bounds = [begin + n * i // pieces for i in range(pieces + 1)]
    return list(itertools.pairwise(bounds))


def event_ts(value: bytes | None) -> int | None:
    """An event's ``ts_ms`` if the record holds a JSON object with a plausible one, else None."""
    import orjson

    from schemas.fields import MAX_TS_MS, MIN_TS_MS

    try:
        ts = orjson.loads(value).get("ts_ms") if value else None
    except (orjson.JSONDecodeError, AttributeError):
        return None
    return ts if isinstance(ts, int) and not isinstance(ts, bool) and MIN_TS_MS <= ts < MAX_TS_MS else None


def _cap_rows(start: dict, end: dict, max_rows: int) -> dict:
    """Admit at most ``max_rows`` records, shared in proportion to each partition's backlog."""
    backlog = {k: end[k] - start.get(k, 0) for k in end if end[k] > start.get(k, 0)}
    total = sum(backlog.values())
    if total <= max_rows or max_rows <= 0:
        return end
    capped = dict(end)
    for k, n in backlog.items():
        capped[k] = start.get(k, 0) + max(1, (n * max_rows) // total)
    return capped


# A worker process's consumers, one per (source, topic): Python workers are reused across tasks. A
# group-less consumer knows only the leaders of the topics it was assigned; moved to another topic
# it asked for metadata after its 100 ms idle back-off, ~90-140 ms per switch of a reader task
# (docs/performance.md, 2026-11-27 (20) and (21)).
_CONSUMERS: dict[tuple[str, str], Any] = {}


def consumer_key(options: dict[str, str], topic: str) -> tuple[str, str]:
    return options.get(SECRET_OPTION, "") + options.get("isolation_level", ""), topic


def _fetch_range(options: dict[str, str], part: TopicPartitionRange) -> Iterator[Any]:
    """Yield the records with offsets in [start, end) as :class:`~streaming.kafka_records.RecordColumns`,
    one per poll; fail loudly if Kafka stops answering."""
    from kafka import TopicPartition

    from streaming.heap import keep_freed_memory
    from streaming.kafka_records import RecordColumns, read_until
    from streaming.kafka_records import install as install_fast_records

    cache_key = consumer_key(options, part.topic)
    consumer = _CONSUMERS.get(cache_key)
    if consumer is None:
        keep_freed_memory()  # for the whole process: a worker process runs these tasks one after another
        consumer = _make_consumer(
            options,
            fetch_max_bytes=64 * 1024 * 1024,
            max_partition_fetch_bytes=16 * 1024 * 1024,
            fetch_max_wait_ms=100,
            auto_offset_reset="none",  # offsets gone under a planned range: an error, never a silent jump
        )
        install_fast_records(consumer, columns=True)  # if it cannot, polls return ConsumerRecords
        _CONSUMERS[cache_key] = consumer
    tp = TopicPartition(part.topic, part.partition)
    consumer.assign([tp])
    consumer.seek(tp, part.start)
    read_until(consumer, tp, part.end)  # a fetch response may reach far past the range: leave the rest packed
    stall_limit = float(options.get("connect_timeout_s", "30"))
    last_progress = time.monotonic()
    position = part.start
    while position < part.end:
        polled = poll_or_explain(consumer, f"reading [{part.start}, {part.end})", timeout_ms=500,
                                 max_records=1_000).get(tp, [])  # record batches, as a rule
        if polled:
            cols = RecordColumns.joined(polled) if isinstance(polled[0], RecordColumns) else RecordColumns.of(polled)
            position = cols.offsets[-1] + 1
            last_progress = time.monotonic()
            cols = cols.before(part.end)
            if len(cols):
                yield cols
        else:
            position = max(position, consumer.position(tp))
            if time.monotonic() - last_progress > stall_limit:
                raise KafkaUnavailableError(
                    f"Kafka stopped answering while reading {part.topic}/{part.partition} "
                    f"offsets [{part.start}, {part.end}) at {position}; the batch will be retried"
                )


def read_events(
    spark: SparkSession,
    cfg: Config,
    kinds: Sequence[str],
    name: str,
    chunked: bool = False,
    write_tag: str | None = None,
    feed_tables: Sequence[str] = (),
    feed_columns: Sequence[str] | None = None,
    feed_dictionary: Sequence[str] = (),
    feeds: Sequence[str] = (),
) -> DataFrame:
    """A streaming DataFrame of decoded events of ``kinds``: routed rows (see module docstring), or
    with ``chunked`` one row per Arrow IPC chunk of a table's rows (for :mod:`streaming.bronze`).

    With ``feeds`` (write mode only: concerns among ``faults`` and ``lag``), the rows are keyed
    chunks (``KEYED_CHUNK_SCHEMA``) and every offset carries the batch's settle point.
    """
    topics = {cfg.topics.event_topics()[k]: k for k in kinds}
    reader = (
        spark.readStream.format(register(spark, name))
        .option("topics", json.dumps(topics))
        .option("max_rows", str(cfg.stream.max_events_per_batch))
        .option("max_event_bytes", str(cfg.stream.max_event_bytes))
        .option("max_future_skew_ms", str(int(cfg.stream.max_future_skew_s * 1000)))
        .option("split_rows", str(cfg.stream.max_events_per_task))
        .option("pack_rows", str(cfg.stream.max_events_per_task // 10))
        .option("min_tasks", str(spark.sparkContext.defaultParallelism))
        .option("connect_timeout_s", str(cfg.kafka.connect_timeout_s))
        .option("fail_on_data_loss", "true" if cfg.kafka.fail_on_data_loss else "false")
        .option("starting_offsets", cfg.kafka.starting_position())
        .option("isolation_level", cfg.kafka.isolation_level)
        .option(SECRET_OPTION, json.dumps(cfg.kafka.client_options()))
        .option("query", name)
        .option("chunked", "true" if chunked else "false")
    )
    if write_tag is not None:
        reader = (
            reader.option("write_root", cfg.storage.root)
            .option("write_tag", write_tag)
            .option("feed_tables", json.dumps(list(feed_tables)))
            .option("feed_columns", json.dumps(None if feed_columns is None else list(feed_columns)))
            .option("feed_dictionary", json.dumps(list(feed_dictionary)))
        )
    if feeds:
        reader = (
            reader.option("feeds", json.dumps(list(feeds)))
            .option("lag_shards", str(cfg.lag.shards))
            .option("fault_shards", str(cfg.faults.shards))
            .option("event_time", "true")
            .option("watermark_delay_ms", str(int(cfg.stream.watermark_delay_s * 1000)))
            .option("future_skew_ms", str(int(cfg.stream.max_future_skew_s * 1000)))
        )
    return reader.load()


_REGISTERED: dict[tuple[int, str], str] = {}


def register(spark: SparkSession, query: str) -> str:
    """Register the source for one query under a name of its own, and return that name.

    Spark keeps one Python function per registered source, and starting a query updates that
    function's environment in place; two queries starting together on one registration could
    race while Spark serialises their first tasks. A registration per query shares nothing.
    """
    key = (id(spark), query)
    if key not in _REGISTERED:
        name = f"{SOURCE_NAME}_{''.join(c if c.isalnum() else '_' for c in query)}"
        source = type(f"KafkaEventSource_{len(_REGISTERED)}", (KafkaEventSource,),
                      {"name": classmethod(lambda cls, n=name: n), "__module__": __name__})
        spark.dataSource.register(source)
        _REGISTERED[key] = name
    return _REGISTERED[key]
