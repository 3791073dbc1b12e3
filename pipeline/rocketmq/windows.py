"""Avoidance windows: the maximal intervals in which ``isAvailable(broker)`` is false.

A window is half-open, ``[start_ms, end_ms)``: it opens when an update leaves the broker's
avoid-until time after the update's own timestamp, and ``end_ms`` is that avoid-until time, the
moment the client would pick the broker again. Availability is a function of time: a probe at ``t``
sees every event with ``ts <= t``, so events sharing one timestamp act as one group (a window that
opens and closes within one millisecond is never reported; windows meeting at ``T`` are one).

Streaming (per producer x broker, events in micro-batches, ordered by (ts, seq) within a producer):

- :func:`step_broker` applies one event. The changes it reports belong to the *previous* timestamp
  group, which is complete only once a later timestamp (or the watermark) shows up, so changes are
  reported one timestamp late; that is what makes them final rather than retractable.
- :func:`advance_broker` is called when the watermark moves (no event with ``ts < watermark`` will
  arrive). It settles the pending group and closes windows whose ``end_ms < watermark``: a window's
  end is known in advance, so it closes by time passing without any event. In 4.9 a later fast
  success can still cut an open window short ("closed" with ``end_ms`` = that event's ts); in 5 a
  later event can only extend it. :func:`wakeup_ms` tells a processor which watermark to wait for.
- :func:`flush_broker` settles the pending group at the end of a bounded input; windows still open
  then are reported by :func:`derive_windows` with their known ``end_ms``.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any, Literal, NamedTuple

from pipeline.rocketmq.fault import FaultItem, Generation, duration_for, next_start

ChangeKind = Literal["opened", "extended", "shortened", "closed"]


@dataclass(frozen=True)
class Window:
    """One avoidance window of one producer for one broker.

    ``trigger_index`` is the event (index into the producer's events) whose update opened it, with
    that event's ``latency_ms`` and ``isolation``; ``last_index`` is the last event that changed
    ``end_ms`` (the trigger itself when nothing did).
    """

    broker: str
    start_ms: int
    end_ms: int
    trigger_index: int
    last_index: int
    latency_ms: int
    isolation: bool


@dataclass(frozen=True)
class WindowChange:
    """A window after a change: "opened", "extended" (including a merge), "shortened" (4.9 only,
    still open) or "closed" (final)."""

    kind: ChangeKind
    window: Window


class FaultEvent(NamedTuple):
    """One send attempt's update, as the fault rules need it."""

    ts_ms: int
    broker: str
    latency_ms: int
    isolation: bool
    reachable: bool = True


def as_event(obj: Any) -> FaultEvent:
    """Accept a :class:`FaultEvent`, a mapping, an object with attributes, or a plain tuple."""
    if isinstance(obj, FaultEvent):
        return obj
    if isinstance(obj, Mapping):
        return FaultEvent(
            obj["ts_ms"], obj["broker"], obj["latency_ms"], obj["isolation"], obj.get("reachable", True)
        )
    if isinstance(obj, tuple):
        return FaultEvent(*obj)
    return FaultEvent(obj.ts_ms, obj.broker, obj.latency_ms, obj.isolation, getattr(obj, "reachable", True))


@dataclass(frozen=True)
class BrokerTrack:
    """Streaming state of one producer x broker: the fault item, the window and the pending group.

    ``group_ts`` is the timestamp of events already applied to ``item`` but not yet turned into
    window changes; ``changer`` is the last of them that changed the avoid-until time (index,
    latency, isolation). A window open at ``group_ts`` always ends at the avoid-until time before the
    group, so nothing else needs remembering.
    """

    broker: str
    item: FaultItem | None = None
    window: Window | None = None
    group_ts: int | None = None
    changer: tuple[int, int, bool] | None = None

    def as_row(self) -> dict[str, Any]:
        """Flat primitive fields (None where absent), e.g. for a Spark state schema."""
        item, window, changer = self.item, self.window, self.changer
        return {
            "broker": self.broker,
            "item_latency": item.current_latency if item else None,
            "item_start": item.start_timestamp if item else None,
            "item_reachable": item.reachable if item else None,
            **{f"window_{k}": getattr(window, k) if window else None for k in _WINDOW_FIELDS},
            "group_ts": self.group_ts,
            "changer_index": changer[0] if changer else None,
            "changer_latency": changer[1] if changer else None,
            "changer_isolation": changer[2] if changer else None,
        }

    @classmethod
    def from_row(cls, row: Mapping[str, Any]) -> BrokerTrack:
        """Inverse of :meth:`as_row`."""
        broker = row["broker"]
        item = None
        if row["item_start"] is not None:
            item = FaultItem(broker, row["item_latency"], row["item_start"], bool(row["item_reachable"]))
        window = None
        if row["window_start_ms"] is not None:
            window = Window(broker, *(row[f"window_{k}"] for k in _WINDOW_FIELDS[1:]))
        changer = None
        if row["changer_index"] is not None:
            changer = (row["changer_index"], row["changer_latency"], bool(row["changer_isolation"]))
        return cls(broker, item, window, row["group_ts"], changer)


_WINDOW_FIELDS = ("broker", "start_ms", "end_ms", "trigger_index", "last_index", "latency_ms", "isolation")


def _settle(track: BrokerTrack, changes: list[WindowChange]) -> BrokerTrack:
    """Turn the pending timestamp group into window changes."""
    ts = track.group_ts
    if ts is None:
        return track
    window = track.window
    after = track.item.start_timestamp if track.item is not None else None
    unavailable = after is not None and after > ts
    changer = track.changer
    if window is not None:
        if unavailable:
            if after != window.end_ms:
                assert changer is not None and after is not None
                kind: ChangeKind = "extended" if after > window.end_ms else "shortened"
                window = _replace(window, end_ms=after, last_index=changer[0])
                changes.append(WindowChange(kind, window))
        else:
            if window.end_ms > ts:  # cut short by this group's update (4.9)
                assert changer is not None
                window = _replace(window, end_ms=ts, last_index=changer[0])
            changes.append(WindowChange("closed", window))
            window = None
    elif unavailable:
        assert changer is not None and after is not None
        index, latency, isolation = changer
        window = Window(track.broker, ts, after, index, index, latency, isolation)
        changes.append(WindowChange("opened", window))
    return BrokerTrack(track.broker, track.item, window)


def _replace(window: Window, *, end_ms: int, last_index: int) -> Window:
    return Window(
        window.broker,
        window.start_ms,
        end_ms,
        window.trigger_index,
        last_index,
        window.latency_ms,
        window.isolation,
    )


def step_broker(
    gen: Generation, track: BrokerTrack, event: FaultEvent, index: int
) -> tuple[BrokerTrack, list[WindowChange]]:
    """Apply one event of this broker; report the changes that became final because of it."""
    if event.broker != track.broker:
        raise ValueError(f"event {index} is for broker {event.broker!r}, not {track.broker!r}")
    ts = event.ts_ms
    changes: list[WindowChange] = []
    if track.group_ts is not None and ts != track.group_ts:
        if ts < track.group_ts:
            raise ValueError(
                f"event {index} for broker {track.broker!r} at ts {ts} is older than {track.group_ts}; "
                "events must be ordered by timestamp"
            )
        track = _settle(track, changes)
    window = track.window
    if window is not None and window.end_ms < ts:
        changes.append(WindowChange("closed", window))
        window = None
    duration = duration_for(gen, event.latency_ms, event.isolation)
    old = track.item
    old_start = None if old is None else old.start_timestamp
    start = next_start(gen, old_start, duration, ts)
    item = FaultItem(
        track.broker, event.latency_ms, start, bool(event.reachable) if gen.windows_only_grow else True
    )
    changer = track.changer
    if old is None or start != old_start:
        changer = (index, event.latency_ms, bool(event.isolation))
    return BrokerTrack(track.broker, item, window, ts, changer), changes


def advance_broker(track: BrokerTrack, watermark_ms: int) -> tuple[BrokerTrack, list[WindowChange]]:
    """Time has passed: no event with ``ts < watermark_ms`` can still arrive for this broker."""
    changes: list[WindowChange] = []
    if track.group_ts is not None and track.group_ts < watermark_ms:
        track = _settle(track, changes)
    window = track.window
    if window is not None and track.group_ts is None and window.end_ms < watermark_ms:
        changes.append(WindowChange("closed", window))
        track = BrokerTrack(track.broker, track.item)
    return track, changes


def flush_broker(track: BrokerTrack) -> tuple[BrokerTrack, list[WindowChange]]:
    """End of a bounded input: settle the pending group; an open window stays open."""
    changes: list[WindowChange] = []
    return _settle(track, changes), changes


def wakeup_ms(track: BrokerTrack) -> int | None:
    """The smallest watermark at which :func:`advance_broker` would report something, if any."""
    if track.group_ts is not None:
        return track.group_ts + 1
    if track.window is not None:
        return track.window.end_ms + 1
    return None


ProducerTracks = Mapping[str, BrokerTrack]


def step_windows(
    gen: Generation, tracks: ProducerTracks, event: Any, index: int
) -> tuple[dict[str, BrokerTrack], list[WindowChange]]:
    """:func:`step_broker` for a whole producer, keeping one track per broker."""
    ev = as_event(event)
    updated = dict(tracks)
    track = updated.get(ev.broker) or BrokerTrack(ev.broker)
    updated[ev.broker], changes = step_broker(gen, track, ev, index)
    return updated, changes


def advance_windows(
    tracks: ProducerTracks, watermark_ms: int
) -> tuple[dict[str, BrokerTrack], list[WindowChange]]:
    """:func:`advance_broker` for every broker of a producer."""
    updated: dict[str, BrokerTrack] = {}
    changes: list[WindowChange] = []
    for broker, track in tracks.items():
        updated[broker], more = advance_broker(track, watermark_ms)
        changes.extend(more)
    return updated, changes


def open_windows(tracks: ProducerTracks) -> list[Window]:
    """Windows that are open (not final) in the given tracks, by trigger index."""
    return sorted((t.window for t in tracks.values() if t.window is not None), key=_trigger)


def _trigger(window: Window) -> int:
    return window.trigger_index


def derive_windows(gen: Generation, events: Iterable[Any]) -> list[Window]:
    """All avoidance windows of one producer's ordered send results, by trigger index.

    Windows still open after the last event are included with their known ``end_ms``. Assumes
    ``sendLatencyFaultEnable`` is on: with it off (the Java default) no broker is ever avoided.
    """
    tracks: dict[str, BrokerTrack] = {}
    done: list[Window] = []
    for index, raw in enumerate(events):
        ev = raw if type(raw) is FaultEvent else as_event(raw)
        track = tracks.get(ev.broker)
        if track is None:
            track = BrokerTrack(ev.broker)
        track, changes = step_broker(gen, track, ev, index)
        tracks[ev.broker] = track
        for change in changes:
            if change.kind == "closed":
                done.append(change.window)
    for track in tracks.values():
        track, changes = flush_broker(track)
        done.extend(c.window for c in changes if c.kind == "closed")
        if track.window is not None:
            done.append(track.window)
    done.sort(key=_trigger)
    return done


def windows_by_broker(windows: Sequence[Window]) -> dict[str, list[Window]]:
    """Group windows per broker, keeping their order."""
    grouped: dict[str, list[Window]] = {}
    for window in windows:
        grouped.setdefault(window.broker, []).append(window)
    return grouped
