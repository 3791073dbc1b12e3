"""Offsets the job has not read yet that Kafka no longer holds: found, named, fatal or recorded.

A job that was down longer than a topic's retention, a topic deleted and re-created, a broker that came
back without its data: each leaves a partition whose next offset to read is no longer there. Reading
on from whatever is left would lose those events without a trace, so the driver compares every
partition's next offset with the range Kafka holds before each micro-batch (:func:`find_gaps`). With
``kafka.fail_on_data_loss`` (the default) the query stops with :class:`DataLossError`; without it
each gap rides in the batch's end offsets (:func:`gap_entries`, so a replayed batch records the same
gap) and becomes one quarantine row with reason ``data_loss``.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass

from schemas.errors import FaultwatchError

REASON = "data_loss"
# Offset-dict entries carrying a gap start with this, followed by "topic/partition" (see kafka_source.META).
PREFIX = "_lost:"
DELETED = "deleted"  # below the partition's first offset: retention or delete-records removed them
RESET = "reset"  # past the partition's end: the topic was re-created or a broker lost its data

_CAUSES = {
    DELETED: "deleted by retention or delete-records before the job read them",
    RESET: "gone: the partition now ends before them (topic re-created, or a broker came back without its data)",
}


class DataLossError(FaultwatchError, RuntimeError):
    """Offsets the job has not read are gone from Kafka, and ``kafka.fail_on_data_loss`` is true."""


@dataclass(frozen=True)
class Gap:
    """Offsets ``first`` to ``last`` (inclusive) of a partition, lost; reading resumes at ``resume``."""

    key: str  # "topic/partition"
    first: int
    last: int
    resume: int
    cause: str  # DELETED or RESET
    detected_ms: int

    def describe(self) -> str:
        return (f"{self.key} offsets {self.first}-{self.last} {_CAUSES[self.cause]}; "
                f"reading resumes at offset {self.resume}")


def find_gaps(positions: Mapping[str, int], beginnings: Mapping[str, int], ends: Mapping[str, int],
              now_ms: int) -> list[Gap]:
    """The partitions whose next offset to read (``positions``) lies outside what Kafka holds
    (``beginnings`` to ``ends``); a partition Kafka no longer lists is left out (nothing to resume)."""
    gaps = []
    for key, pos in sorted(positions.items()):
        if key not in beginnings or key not in ends:
            continue
        begin, end = int(beginnings[key]), int(ends[key])
        if pos < begin:
            gaps.append(Gap(key, pos, begin - 1, begin, DELETED, now_ms))
        elif pos > end:
            gaps.append(Gap(key, end, pos - 1, begin, RESET, now_ms))
    return gaps


def fatal_message(gaps: list[Gap]) -> str:
    lost = "; ".join(g.describe() for g in gaps)
    return (f"unread offsets are gone from Kafka: {lost}. To go on from the oldest offsets left, each gap "
            "recorded as a quarantine row (reason data_loss), set kafka.fail_on_data_loss = false and "
            "restart; to avoid it, keep the topics' retention longer than the job may be down")


def gap_entries(gaps: list[Gap]) -> dict[str, list[int | str]]:
    """Gaps as offset-dict entries (JSON values), to ride in a micro-batch's end offsets."""
    return {f"{PREFIX}{g.key}": [g.first, g.last, g.resume, g.cause, g.detected_ms] for g in gaps}


def gaps_in(offsets: Mapping[str, object]) -> dict[str, Gap]:
    """The gaps an offset dict carries, by "topic/partition"."""
    out = {}
    for name, value in offsets.items():
        if name.startswith(PREFIX) and isinstance(value, list):
            key = name[len(PREFIX):]
            first, last, resume, cause, detected = value
            out[key] = Gap(key, int(first), int(last), int(resume), str(cause), int(detected))
    return out
