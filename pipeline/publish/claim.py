"""Who publishes a cycle: a conditional Delta commit (a ``claimed`` row) decided before anything is sent.

A publisher claims cycle N by appending a ``claimed`` row to ``publisher_cycles`` under the Delta
transaction (``<app_id>-claim``, N), on the table snapshot in which it read the last claim. Two
publishers that race commit against the same snapshot and delta-rs refuses the second
("concurrent transaction"), so exactly one wins; the loser reads again and skips. A claim holds the
cycle's decision, so whoever finishes a claim (its holder, a re-run after a crash, or the next cycle
once the lease ran out) publishes exactly that list. The claim carries a lease (from the wall clock
at the claim): its holder checks just before the send that the claim is still its own
(:func:`lost`) and sends nothing after ``lease_until_ms``; nobody else touches the cycle until
``TAKEOVER_MARGIN_MS`` later. A newer cycle is claimed only once the previous claim is finished or
abandoned, so lists reach Kafka and the files in cycle order.
"""

from __future__ import annotations

import json
import time
from dataclasses import dataclass
from typing import Any

import pyarrow as pa
import pyarrow.compute as pc

from pipeline.config import Config
from pipeline.deltaio import read_table
from pipeline.policy import Decision, decision_from_jsonable, to_jsonable
from pipeline.publish import crash, sinks
from schemas.tables import table

TABLE = "publisher_cycles"
STEP = "avoidance"
TAKEOVER_MARGIN_MS = 5_000  # after a lease ends, before another publisher finishes the cycle
FINAL = ("published", "failed")  # a claim with one of these rows is finished


def wall_ms() -> int:
    return int(time.time() * 1000)


def claim_app_id(cfg: Config) -> str:
    return f"{cfg.publish.app_id}-claim"


@dataclass(frozen=True)
class Claim:
    """A won cycle: what it publishes, and until when its holder may send."""

    cycle_number: int
    decided_ms: int
    freshest_ms: int | None
    lease_until_ms: int
    decision: Decision


def _claim_from_row(row: dict[str, Any]) -> Claim:
    body = json.loads(row["claim"])
    return Claim(row["cycle_number"], row["decided_ms"], row["input_freshest_ms"], row["lease_until_ms"],
                 decision_from_jsonable(body))


def read_claim(cfg: Config, number: int) -> Claim | None:
    """The newest claim of cycle ``number`` (a finished-then-failed cycle may be claimed again)."""
    rows = read_table(
        cfg.storage.root, TABLE,
        filter=(pc.field("cycle_number") == number) & (pc.field("step") == STEP) & (pc.field("status") == "claimed"),
    ).to_pylist()
    rows = [r for r in rows if r.get("claim")]
    if not rows:
        return None
    return _claim_from_row(max(rows, key=lambda r: r["lease_until_ms"] or 0))


def final_status(cfg: Config, number: int, lease_until_ms: int | None = None) -> str | None:
    """``published`` once cycle ``number`` is published; ``failed`` once the claim with this lease
    failed (a failed cycle may be claimed again, with a new lease); else None: still open."""
    rows = read_table(
        cfg.storage.root, TABLE, columns=["status", "lease_until_ms"],
        filter=(pc.field("cycle_number") == number) & (pc.field("step") == STEP) & pc.field("status").isin(list(FINAL)),
    ).to_pylist()
    if any(r["status"] == "published" for r in rows):
        return "published"
    if any(lease_until_ms is None or r["lease_until_ms"] == lease_until_ms for r in rows):
        return "failed"
    return None


def _snapshot(cfg: Config) -> tuple[Any, int | None]:
    """The table as one snapshot and the last claimed cycle in it (see :func:`sinks.open_table`)."""
    dt = sinks.open_table(cfg.storage.root, TABLE)
    version = dt.transaction_version(claim_app_id(cfg))
    return dt, None if version is None else int(version)


def last_claimed(cfg: Config) -> int | None:
    return _snapshot(cfg)[1]


def _commit_claim(cfg: Config, snapshot: Any, row: dict[str, Any], number: int) -> bool:
    """Append the claim row on ``snapshot``; False when another publisher committed first."""
    from deltalake import CommitProperties, Transaction, write_deltalake
    from deltalake.exceptions import CommitFailedError

    spec = table(TABLE)
    data = pa.Table.from_pylist([row], schema=spec.arrow_schema())
    try:
        write_deltalake(
            snapshot, data, mode="append", schema_mode="merge",
            commit_properties=CommitProperties(app_transactions=[Transaction(claim_app_id(cfg), number)]),
        )
    except CommitFailedError:
        return False
    return True


def claim_row(base: dict[str, Any], decision: Decision, lease_until_ms: int) -> dict[str, Any]:
    return {**base, "status": "claimed", "lease_until_ms": lease_until_ms,
            "claim": json.dumps(to_jsonable(decision), sort_keys=True)}


@dataclass(frozen=True)
class Verdict:
    """What :func:`acquire` found: a claim to publish, claims to finish first, or why not."""

    claim: Claim | None = None
    finish_first: Claim | None = None  # an abandoned older claim: finish it, then acquire again
    reason: str | None = None


def acquire(cfg: Config, number: int, base_row: dict[str, Any], decision: Decision, now_ms: int) -> Verdict:
    """Claim cycle ``number`` (one attempt on one snapshot); see the module docstring for the rules."""
    snapshot, last = _snapshot(cfg)
    crash.barrier("claim")
    # From the later of the cycle's time and the wall clock: a DAG's publish task claims well after
    # its load task read the time, and its lease must still cover the whole send.
    lease_until = max(now_ms, wall_ms()) + int(cfg.publish.send_timeout_s * 1000)
    if last is not None and last > number:
        return Verdict(reason=f"superseded: cycle {last}, after this one, is already claimed")
    if last is not None:
        held = read_claim(cfg, last)
        if held is not None and final_status(cfg, last, held.lease_until_ms) is None:
            if now_ms < held.lease_until_ms + TAKEOVER_MARGIN_MS:
                who = "this cycle" if last == number else f"cycle {last}"
                return Verdict(reason=(f"{who} is being published by another publisher (claim lease until "
                                       f"{held.lease_until_ms}); nothing sent, so no list goes out of order"))
            # abandoned (its holder crashed or hung): whoever claims it again finishes it with its own list
            row = claim_row({**base_row, "cycle_id": str(last), "cycle_number": last, "decided_ms": held.decided_ms,
                             "input_freshest_ms": held.freshest_ms}, held.decision, lease_until)
            if not _commit_claim(cfg, snapshot, row, last):
                return Verdict(reason=f"cycle {last}: another publisher took over its abandoned claim first")
            taken = Claim(last, held.decided_ms, held.freshest_ms, lease_until, held.decision)
            return Verdict(claim=taken) if last == number else Verdict(finish_first=taken)
        if last == number and held is not None and final_status(cfg, last, held.lease_until_ms) == "failed":
            again = Claim(number, held.decided_ms, held.freshest_ms, lease_until, held.decision)
            row = claim_row({**base_row, "decided_ms": held.decided_ms, "input_freshest_ms": held.freshest_ms},
                            held.decision, lease_until)
            if not _commit_claim(cfg, snapshot, row, number):
                return Verdict(reason="another publisher retried this failed cycle first")
            return Verdict(claim=again)
        if last == number:
            return Verdict(reason="already published")
    row = claim_row(base_row, decision, lease_until)
    if not _commit_claim(cfg, snapshot, row, number):
        return Verdict(reason="another publisher claimed this cycle first (a conditional Delta commit decides)")
    return Verdict(claim=Claim(number, base_row["decided_ms"], base_row["input_freshest_ms"], lease_until, decision))


def lost(cfg: Config, won: Claim) -> str | None:
    """Why the holder of ``won`` must not send (None: the claim is still its own, within its lease).

    Checked just before the Kafka send, so a holder delayed after its claim (a pause, a slow disk)
    never sends once a later cycle was claimed or another publisher took the cycle over.
    """
    last = last_claimed(cfg)
    this = f"cycle {won.cycle_number}"
    if last is not None and last > won.cycle_number:
        return f"superseded: cycle {last}, after this one, was claimed while {this} waited to send; nothing sent"
    newest = read_claim(cfg, won.cycle_number)
    if newest is not None and newest.lease_until_ms != won.lease_until_ms:
        return f"another publisher took over {this} (its claim lease until {newest.lease_until_ms}); nothing sent"
    if final_status(cfg, won.cycle_number) == "published":
        return f"{this} was published by another publisher meanwhile; nothing sent"
    return None
