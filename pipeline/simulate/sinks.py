"""Where simulated events go: memory (tests), JSON-lines files, or Kafka.

Every sink takes positional rows of one event kind (``write(kind, rows)``) and turns them into the
event dataclasses of :mod:`schemas.events`; bytes always come from ``event.to_json()`` and keys from
``event.key()``, so the three sinks carry byte-identical events. :meth:`Sink.write_events` accepts
event objects too (handy for tests that hand-craft events). The memory sink keeps rows and builds
objects on demand, so generating into memory costs no per-event object. The Kafka sink compresses its
record batches with zstd unless told otherwise, as producers in production do: the events are JSON
and shrink ~13x, so the broker stores and serves that much less (docs/performance.md, section 24).
"""

from __future__ import annotations

import dataclasses
from collections.abc import Iterable, Sequence
from pathlib import Path
from typing import IO, TYPE_CHECKING, Any

from schemas.errors import FaultwatchError
from schemas.events import ConsumerProgress, Event, GroupMembership, SendResult

if TYPE_CHECKING:  # pragma: no cover
    from typing_extensions import Self

EVENT_CLASSES: dict[str, type] = {
    "send_result": SendResult,
    "consumer_progress": ConsumerProgress,
    "group_membership": GroupMembership,
}
KINDS = tuple(EVENT_CLASSES)
# Codecs of the Kafka sink's record batches ("none": uncompressed); kafka-python names them so.
COMPRESSIONS = ("zstd", "gzip", "none")


class SinkError(FaultwatchError, RuntimeError):
    """Events could not be delivered; the message says where and why."""


def _field_names(kind: str) -> list[str]:
    return [f.name for f in dataclasses.fields(EVENT_CLASSES[kind])]


class Sink:
    """Base class: subclasses implement :meth:`write`; flush/close default to nothing.

    ``keeps_rows`` says the sink holds on to the rows it is given (the memory sink does):
    an unpaced simulation then keeps them out of the garbage collector's walks.
    """

    keeps_rows = False

    def write(self, kind: str, rows: Sequence[Sequence[Any]]) -> None:  # pragma: no cover - abstract
        raise NotImplementedError

    def write_events(self, events: Iterable[Event]) -> None:
        for event in events:
            names = _field_names(event.kind)
            self.write(event.kind, [[getattr(event, n) for n in names]])

    def flush(self) -> None:
        pass

    def close(self) -> None:
        self.flush()

    def __enter__(self) -> Self:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()


def to_events(kind: str, rows: Iterable[Sequence[Any]]) -> list[Any]:
    cls = EVENT_CLASSES[kind]
    return [cls(*row) for row in rows]


class MemorySink(Sink):
    """Keeps every row in memory; :meth:`events` gives the event objects, :meth:`json_lines` the bytes."""

    keeps_rows = True

    def __init__(self) -> None:
        self.rows: dict[str, list[Sequence[Any]]] = {kind: [] for kind in KINDS}

    def write(self, kind: str, rows: Sequence[Sequence[Any]]) -> None:
        self.rows[kind].extend(rows)

    def events(self, kind: str) -> list[Any]:
        return to_events(kind, self.rows[kind])

    def json_lines(self, kind: str) -> bytes:
        return b"".join(e.to_json() + b"\n" for e in self.events(kind))

    def count(self, kind: str | None = None) -> int:
        return len(self.rows[kind]) if kind else sum(len(r) for r in self.rows.values())


class JsonLinesSink(Sink):
    """One ``<kind>.jsonl`` file per event kind in ``folder`` (created; existing files are replaced)."""

    def __init__(self, folder: str | Path) -> None:
        self.folder = Path(folder)
        self.folder.mkdir(parents=True, exist_ok=True)
        self._files: dict[str, IO[bytes]] = {}

    def path(self, kind: str) -> Path:
        return self.folder / f"{kind}.jsonl"

    def write(self, kind: str, rows: Sequence[Sequence[Any]]) -> None:
        f = self._files.get(kind)
        if f is None:
            f = self._files[kind] = open(self.path(kind), "wb")  # noqa: SIM115 - closed in close()
        cls = EVENT_CLASSES[kind]
        f.write(b"".join(cls(*row).to_json() + b"\n" for row in rows))

    def flush(self) -> None:
        for f in self._files.values():
            f.flush()

    def close(self) -> None:
        for f in self._files.values():
            f.close()
        self._files.clear()


class KafkaSink(Sink):
    """Batched kafka-python producer; topic per kind from ``cfg.topics``, key = ``event.key()``.

    Delivery failures surface as :class:`SinkError` at the next check (every ``check_every``
    records, at :meth:`flush` and at :meth:`close`), naming the topic and the broker's error.
    ``compression`` is one of :data:`COMPRESSIONS`.
    """

    def __init__(
        self,
        cfg: Any,
        *,
        linger_ms: int = 20,
        batch_size: int = 256 * 1024,
        check_every: int = 20_000,
        compression: str = "zstd",
        producer_options: dict[str, Any] | None = None,
    ) -> None:
        self.topics: dict[str, str] = cfg.topics.event_topics()
        self.bootstrap = cfg.kafka.bootstrap_servers
        options = dict(cfg.kafka.client_options())
        options.update(linger_ms=linger_ms, batch_size=batch_size, acks=1, enable_idempotence=False,
                       compression_type=_codec(compression))
        options.update(producer_options or {})
        self._producer = _connect(options, cfg.kafka.connect_timeout_s)
        self._pending: list[Any] = []
        self._check_every = check_every
        self.sent = 0

    def write(self, kind: str, rows: Sequence[Sequence[Any]]) -> None:
        cls, topic = EVENT_CLASSES[kind], self.topics[kind]
        send, pending = self._producer.send, self._pending
        try:
            for row in rows:
                event = cls(*row)
                pending.append(send(topic, key=event.key(), value=event.to_json()))
        except Exception as exc:
            raise SinkError(f"cannot send to Kafka topic {topic!r} at {self.bootstrap}: {exc!r}") from exc
        self.sent += len(rows)
        if len(pending) >= self._check_every:
            self._check()

    def _check(self) -> None:
        """Raise on the first failed delivery; keep futures still in flight."""
        still: list[Any] = []
        for future in self._pending:
            if not future.is_done:
                still.append(future)
            elif future.failed():
                self._pending = []
                raise SinkError(f"Kafka delivery to {self.bootstrap} failed: {future.exception!r}")
        self._pending = still

    def flush(self) -> None:
        try:
            self._producer.flush()
        except Exception as exc:
            raise SinkError(f"Kafka flush to {self.bootstrap} failed: {exc!r}") from exc
        self._check()

    def close(self) -> None:
        try:
            self.flush()
        finally:
            self._producer.close()


def _codec(compression: str) -> str | None:
    """kafka-python's ``compression_type`` for ``compression``, or a clear error."""
    from kafka.codec import has_gzip, has_zstd

    if compression not in COMPRESSIONS:
        raise SinkError(f"unknown compression {compression!r}; use one of {', '.join(COMPRESSIONS)}")
    if compression == "none":
        return None
    if not {"zstd": has_zstd, "gzip": has_gzip}[compression]():
        raise SinkError(f"compression {compression!r} needs a library this Python lacks; use 'none' or another codec")
    return compression


def _connect(options: dict[str, Any], timeout_s: float) -> Any:
    """A KafkaProducer; an unreachable cluster is retried for ``timeout_s``, then fails clearly."""
    from kafka import KafkaProducer
    from kafka.errors import KafkaError

    options = {"bootstrap_timeout_ms": int(timeout_s * 1000), **options}
    try:
        return KafkaProducer(**options)
    except KafkaError as exc:
        raise SinkError(f"no Kafka broker reachable at {options['bootstrap_servers']} within {timeout_s}s: {exc}") from exc
