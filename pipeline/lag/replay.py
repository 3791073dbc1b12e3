"""Lag status cases for audits: one queue (or one group of queues) per JSON object, Burrow's verdict out.

A queue case is Burrow's ``ConsumerPartition`` at one instant::

    {"id": "q1", "commits": [[offset, ts_ms, lag], ...], "current_lag": 200, "now_ms": 600000,
     "window_size": 5, "allowed_lag": 0, "broker_offsets": [5200]}

``commits`` oldest first (``lag`` null when unknown), ``broker_offsets`` oldest first as Burrow keeps
them; ``allowed_lag``, ``broker_offsets`` and ``minimum_complete`` are optional, and so are
``min_commits`` and ``caught_up_grace_ms`` (rule set "faultwatch" only). A null ``current_lag`` is
UNKNOWN. The answer is ``{"id", "status", "complete"}``.

A group case is ``{"id": "g", "group": [queue cases]}``; its queues inherit the group's
``now_ms``, ``window_size`` and rule knobs when they leave them out. The answer is Burrow's group
verdict ``{"id", "status", "complete", "maxlag_id", "total_lag", "partitions"}``; ``"group": []`` is
a group without queues (OK, complete 0) and ``"group": null`` an unknown one (NOTFOUND).

The same functions as the streaming job judge each case (:mod:`pipeline.lag.status`,
:mod:`pipeline.lag.groups`); a malformed case raises :class:`LagCaseError` naming the field.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

import numpy as np

from pipeline.lag.groups import burrow_group_status, group_complete, maxlag_rows
from pipeline.lag.model import GROUP_STATUS_NAMES, UNKNOWN, GroupStatus, Status
from pipeline.lag.status import RuleParams, complete, evaluate
from pipeline.lag.window import Windows
from schemas.errors import FaultwatchError

I64 = np.int64
INT64_MAX = 2**63 - 1
MAX_WINDOW = 100_000  # Burrow's intervals are a handful; this only keeps a typo from exhausting memory
INHERITED = ("now_ms", "window_size", "allowed_lag", "minimum_complete", "min_commits", "caught_up_grace_ms")
DEFAULTS = RuleParams()


class LagCaseError(FaultwatchError, ValueError):
    """A lag case that cannot be judged; the message names the offending field."""


def _share(value: Any) -> float:
    """A float32 share as Burrow prints it (0.1, not 0.10000000149011612)."""
    return float(str(np.float32(value)))


def _int(value: Any, where: str, low: int = 0) -> int:
    if not isinstance(value, int) or isinstance(value, bool):
        raise LagCaseError(f"{where}: expected an integer, got {value!r}")
    if not low <= value <= INT64_MAX:
        raise LagCaseError(f"{where}: {value} is outside [{low}, 2^63 - 1]")
    return value


def _get(case: Mapping[str, Any], key: str, where: str) -> Any:
    if key not in case:
        raise LagCaseError(f"{where}{key}: missing")
    return case[key]


def _commit(value: Any, where: str) -> tuple[int, int, int]:
    """(ts_ms, offset, lag) from ``[offset, ts_ms, lag]``, the order of Windows.from_lists."""
    if not isinstance(value, list) or len(value) != 3:
        raise LagCaseError(f"{where}: expected [offset, ts_ms, lag], got {value!r}")
    offset = _int(value[0], f"{where}[0] (offset)")
    ts = _int(value[1], f"{where}[1] (ts_ms)")
    lag = UNKNOWN if value[2] is None else _int(value[2], f"{where}[2] (lag)")
    return ts, offset, lag


def _params(case: Mapping[str, Any], rules: str, where: str) -> RuleParams:
    share = case.get("minimum_complete", DEFAULTS.minimum_complete)
    if not isinstance(share, (int, float)) or isinstance(share, bool) or not 0 <= share <= 1:
        raise LagCaseError(f"{where}minimum_complete: expected a number between 0 and 1, got {share!r}")
    return RuleParams(
        rules=rules,
        allowed_lag=_int(case.get("allowed_lag", DEFAULTS.allowed_lag), f"{where}allowed_lag"),
        minimum_complete=float(share),
        min_commits=_int(case.get("min_commits", DEFAULTS.min_commits), f"{where}min_commits"),
        caught_up_grace_ms=_int(
            case.get("caught_up_grace_ms", DEFAULTS.caught_up_grace_ms), f"{where}caught_up_grace_ms"
        ),
    )


def judge_queue(case: Any, rules: str, where: str = "") -> dict[str, Any]:
    """``{"id", "status", "complete", "current_lag"}`` of one queue case."""
    if not isinstance(case, Mapping):
        raise LagCaseError(f"{where or 'case'}: expected a JSON object, got {type(case).__name__}")
    case_id = _get(case, "id", where)
    size = _int(_get(case, "window_size", where), f"{where}window_size", low=1)
    if size > MAX_WINDOW:
        raise LagCaseError(f"{where}window_size: {size} is above {MAX_WINDOW}")
    raw = _get(case, "commits", where)
    if not isinstance(raw, list):
        raise LagCaseError(f"{where}commits: expected a list, got {raw!r}")
    if len(raw) > size:
        raise LagCaseError(f"{where}commits: {len(raw)} commits do not fit window_size {size}")
    commits = [_commit(c, f"{where}commits[{i}]") for i, c in enumerate(raw)]
    current = _get(case, "current_lag", where)
    current_lag = UNKNOWN if current is None else _int(current, f"{where}current_lag")
    now = _int(_get(case, "now_ms", where), f"{where}now_ms")
    brokers = case.get("broker_offsets", [])
    if not isinstance(brokers, list):
        raise LagCaseError(f"{where}broker_offsets: expected a list, got {brokers!r}")
    low = min((_int(b, f"{where}broker_offsets[{i}]") for i, b in enumerate(brokers)), default=UNKNOWN)
    w = Windows.from_lists([commits], size)
    status = evaluate(w, np.array([current_lag], dtype=I64), now, low, _params(case, rules, where))
    return {
        "id": case_id,
        "status": Status(int(status[0])).name,
        "complete": _share(complete(w)[0]),
        "current_lag": current_lag,
    }


def judge_group(case: Mapping[str, Any], rules: str) -> dict[str, Any]:
    """Burrow's ``evaluateConsumerStatus`` over a group case's queues."""
    case_id, queues = _get(case, "id", ""), case["group"]
    if queues is None:  # Burrow's answer for a group its storage does not know
        status = GROUP_STATUS_NAMES[GroupStatus.NOTFOUND]
        return {
            "id": case_id,
            "status": status,
            "complete": 1.0,
            "maxlag_id": None,
            "total_lag": 0,
            "partitions": [],
        }
    if not isinstance(queues, list):
        raise LagCaseError(f"group: expected a list of queue cases or null, got {queues!r}")
    inherited = {k: case[k] for k in INHERITED if k in case}
    parts = []
    for i, q in enumerate(queues):
        if not isinstance(q, Mapping):
            raise LagCaseError(f"group[{i}]: expected a JSON object, got {type(q).__name__}")
        parts.append(judge_queue({**inherited, **q}, rules, f"group[{i}]."))
    codes = np.zeros(len(parts), dtype=I64)
    groups, known = np.zeros(1, dtype=I64), np.ones(1, dtype=bool)
    status = np.array([Status[p["status"]] for p in parts], dtype=np.int8)
    lags = np.array([p["current_lag"] for p in parts], dtype=I64)
    level = burrow_group_status(codes, status, groups, known)[0]
    share = group_complete(codes, np.array([p["complete"] for p in parts], dtype=np.float32), groups, known)[
        0
    ]
    top = int(maxlag_rows(codes, lags, groups)[0])
    return {
        "id": case_id,
        "status": GROUP_STATUS_NAMES[level],
        "complete": _share(share),
        "maxlag_id": parts[top]["id"] if top >= 0 else None,
        "total_lag": int(lags[lags != UNKNOWN].sum()),
        "partitions": [{k: p[k] for k in ("id", "status", "complete")} for p in parts],
    }


def replay_lag_case(case: Any, rules: str = "burrow") -> dict[str, Any]:
    """The answer to one queue or group case under the rule set ``rules``."""
    if not isinstance(case, Mapping):
        raise LagCaseError(f"a case must be a JSON object, got {type(case).__name__}")
    if "group" in case:
        return judge_group(case, rules)
    out = judge_queue(case, rules)
    return {k: out[k] for k in ("id", "status", "complete")}
