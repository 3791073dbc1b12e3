"""Replay RocketMQ rule cases: the differential-test vectors' ``input`` objects in, ``expected`` out.

``faultwatch replay faults --version 4.9.8 < cases.jsonl`` answers each line with exactly the shape
the Java oracle produced, so our rules can be diffed against the real client on any new input.
``faultwatch replay lag [--rules burrow|faultwatch]`` answers queue and group lag cases with Burrow's
verdicts (:mod:`pipeline.lag.replay` describes the lines). A bad line is answered with an error
object naming the line and the problem, and the run goes on: bad input is output, not a crash. Also
runnable as ``python -m pipeline.replay faults --version 5.3.3``.
"""

from __future__ import annotations

import argparse
import json
import sys
from collections.abc import Iterable, Mapping
from typing import Any, TextIO

from pipeline.lag.replay import LagCaseError, replay_lag_case
from pipeline.lag.status import RULE_SETS
from pipeline.rocketmq.allocate import AllocResult, MessageQueue, allocate, rebalance
from pipeline.rocketmq.fault import (
    GEN_5,
    FaultState,
    apply_update,
    generation_for_client_version,
    get_generation,
    is_available,
    pick_candidates,
    rank_49,
    rank_has_ties,
)
from schemas.errors import FaultwatchError

KINDS = ("faults", "alloc", "lag")


class CaseError(FaultwatchError, ValueError):
    """An input case that cannot be replayed; the message names the offending field."""


def _field(
    obj: Mapping[str, Any], key: str, kind: type | tuple[type, ...], where: str, **default: Any
) -> Any:
    if key not in obj:
        if "default" in default:
            return default["default"]
        raise CaseError(f"{where}{key}: missing")
    value = obj[key]
    ok = isinstance(value, kind) and not (kind is int and isinstance(value, bool))
    if not ok:
        names = kind.__name__ if isinstance(kind, type) else "/".join(k.__name__ for k in kind)
        raise CaseError(f"{where}{key}: expected {names}, got {value!r}")
    return value


def _int_list(obj: Mapping[str, Any], key: str) -> list[int] | None:
    value = obj.get(key)
    if value is None:
        return None
    if not isinstance(value, list) or not all(isinstance(v, int) and not isinstance(v, bool) for v in value):
        raise CaseError(f"{key}: expected a list of integers, got {value!r}")
    return value


def _parse_events(case: Mapping[str, Any]) -> list[tuple[int, str, int, bool, bool]]:
    raw = _field(case, "events", list, "")
    events: list[tuple[int, str, int, bool, bool]] = []
    for i, ev in enumerate(raw):
        where = f"events[{i}]."
        if not isinstance(ev, Mapping):
            raise CaseError(f"events[{i}]: expected an object, got {ev!r}")
        ts = _field(ev, "ts_ms", int, where)
        if events and ts < events[-1][0]:
            raise CaseError(f"{where}ts_ms: {ts} is before the previous event's {events[-1][0]}")
        events.append(
            (
                ts,
                _field(ev, "broker", str, where),
                _field(ev, "latency_ms", int, where),
                _field(ev, "isolation", bool, where),
                _field(ev, "reachable", bool, where, default=True),
            )
        )
    return events


def replay_fault_case(input_obj: Mapping[str, Any], version: str) -> dict[str, Any]:
    """The oracle's ``expected`` object for one fault case under client ``version``."""
    if not isinstance(input_obj, Mapping):
        raise CaseError(f"a case must be a JSON object, got {type(input_obj).__name__}")
    try:
        gen_name = generation_for_client_version(version)
        gen = get_generation(
            gen_name, _int_list(input_obj, "latency_max"), _int_list(input_obj, "not_available_duration")
        )
    except CaseError:
        raise
    except ValueError as exc:
        raise CaseError(str(exc)) from None
    events = _parse_events(input_obj)
    probes = _field(input_obj, "probes", list, "")
    for j, p in enumerate(probes):
        if not isinstance(p, int) or isinstance(p, bool):
            raise CaseError(f"probes[{j}]: expected int, got {p!r}")
        if j and p < probes[j - 1]:
            raise CaseError(f"probes[{j}]: {p} is before the previous probe {probes[j - 1]}")
    enabled = _field(input_obj, "send_latency_fault_enable", bool, "", default=True)
    is5 = gen.name == GEN_5

    def brokers(state: FaultState, now: int) -> list[dict[str, Any]]:
        out = []
        for item in state.sorted_items():
            row = {
                "broker": item.broker,
                "start_timestamp": item.start_timestamp,
                "current_latency": item.current_latency,
                "available_at_ts": is_available(gen, state, item.broker, now),
            }
            if is5:
                row["reachable"] = item.reachable
            out.append(row)
        return out

    state = FaultState()
    states = []
    out_events = []
    for i, (ts, broker, latency, isolation, reachable) in enumerate(events):
        duration: int | None = None
        if enabled:
            state, duration = apply_update(gen, state, broker, latency, isolation, reachable, ts)
        states.append(state)
        row: dict[str, Any] = {
            "i": i,
            "ts_ms": ts,
            "broker": broker,
            "latency_ms": latency,
            "isolation": isolation,
        }
        if is5:
            row["reachable"] = reachable
        row.update({"duration_ms": duration, "brokers": brokers(state, ts)})
        out_events.append(row)

    out_probes = []
    applied = 0
    for p in probes:
        while applied < len(events) and events[applied][0] <= p:
            applied += 1
        seen = states[applied - 1] if applied else FaultState()
        row = {
            "ts_ms": p,
            "events_applied": applied,
            "brokers": brokers(seen, p),
            "available_brokers": [b for b in sorted(seen.items) if is_available(gen, seen, b, p)],
        }
        if not is5:
            row["rank"] = rank_49(seen, p)
            row["rank_has_ties"] = rank_has_ties(seen, p)
        row["pick_candidates"] = pick_candidates(gen, seen, p)
        out_probes.append(row)
    return {"events": out_events, "probes": out_probes}


_ALLOC_OPTIONS = {
    "CONSISTENT_HASH": ("virtual_node_cnt",),
    "CONFIG": ("config_mq_list",),
    "MACHINE_ROOM": ("consumer_idcs",),
    "MACHINE_ROOM_NEARBY": ("inner_strategy", "inner_virtual_node_cnt", "broker_rooms", "consumer_rooms"),
}


def _queues(value: Any, key: str) -> list[MessageQueue]:
    if not isinstance(value, list):
        raise CaseError(f"{key}: expected a list, got {value!r}")
    try:
        return [MessageQueue.from_json(q) for q in value]
    except TypeError as exc:
        raise CaseError(f"{key}: {exc}") from None


def _alloc_options(case: Mapping[str, Any], strategy: str) -> dict[str, Any]:
    from pipeline.rocketmq.allocate import canonical_strategy_name

    options = {k: case[k] for k in _ALLOC_OPTIONS.get(canonical_strategy_name(strategy), ()) if k in case}
    if options.get("config_mq_list") is not None:
        options["config_mq_list"] = _queues(options["config_mq_list"], "config_mq_list")
    for key in ("virtual_node_cnt", "inner_virtual_node_cnt"):
        if key in options:
            _field(options, key, int, "")
    for key in ("broker_rooms", "consumer_rooms"):
        if options.get(key) is not None and not isinstance(options[key], Mapping):
            raise CaseError(f"{key}: expected an object, got {options[key]!r}")
    idcs = options.get("consumer_idcs")
    if idcs is not None and not (isinstance(idcs, list) and all(isinstance(i, str) for i in idcs)):
        raise CaseError(f"consumer_idcs: expected a list of strings or null, got {idcs!r}")
    return options


def replay_alloc_case(input_obj: Mapping[str, Any]) -> dict[str, Any]:
    """The oracle's ``expected`` object (``as_given`` and ``rebalance``) for one allocation case."""
    if not isinstance(input_obj, Mapping):
        raise CaseError(f"a case must be a JSON object, got {type(input_obj).__name__}")
    strategy = _field(input_obj, "strategy", str, "")
    group = _field(input_obj, "consumer_group", str, "")
    current = _field(input_obj, "current_cid", str, "")
    mq_all = _queues(_field(input_obj, "mq_all", list, ""), "mq_all")
    cid_all = _field(input_obj, "cid_all", list, "")
    if not all(isinstance(c, str) for c in cid_all):
        raise CaseError(f"cid_all: expected a list of strings, got {cid_all!r}")
    try:
        options = _alloc_options(input_obj, strategy)
        as_given = allocate(strategy, group, current, mq_all, cid_all, **options)
        rb = rebalance(strategy, group, mq_all, cid_all, current_cid=current, **options)
    except CaseError:
        raise
    except ValueError as exc:
        raise CaseError(str(exc)) from None
    current_result = rb.current or AllocResult([])
    return {
        "as_given": as_given.to_json(),
        "rebalance": {
            "mq_all_sorted": [mq.to_json() for mq in rb.mq_all_sorted],
            "cid_all_sorted": rb.cid_all_sorted,
            **current_result.to_json(),
            "ownership_by_cid": {cid: res.to_json() for cid, res in rb.ownership_by_cid.items()},
        },
    }


def replay_line(
    kind: str, version: str | None, line: str, line_no: int, rules: str = "burrow"
) -> dict[str, Any]:
    """One output object for one input line: the expected shape, or ``{"line", "error"}``
    (with the case's ``case_id``, or ``id`` for lag cases, when it has one)."""
    case_id = None
    id_key = "id" if kind == "lag" else "case_id"
    try:
        obj = json.loads(line)
        if isinstance(obj, Mapping) and isinstance(obj.get("input"), Mapping):
            obj = obj["input"]  # a whole vector line: replay its input
        if isinstance(obj, Mapping):
            case_id = obj.get(id_key)
        if kind == "lag":
            return replay_lag_case(obj, rules)
        if kind == "faults":
            if version is None:
                raise CaseError("--version is required for fault cases")
            return replay_fault_case(obj, version)
        return replay_alloc_case(obj)
    except json.JSONDecodeError as exc:
        problem = f"invalid JSON: {exc}"
    except (CaseError, LagCaseError) as exc:
        problem = str(exc)
    error: dict[str, Any] = {"line": line_no, "error": problem}
    if case_id is not None:
        error[id_key] = case_id
    return error


def run_replay(
    kind: str, version: str | None, stdin: Iterable[str], stdout: TextIO, rules: str = "burrow"
) -> int:
    """Stream cases from ``stdin`` to ``stdout``, one JSON line each; 1 if any line was bad.

    Blank lines are skipped (they carry no case); line numbers count every input line from 1.
    """
    if kind not in KINDS:
        raise ValueError(f"unknown replay kind {kind!r}; valid: {list(KINDS)}")
    if rules not in RULE_SETS:
        raise ValueError(f"unknown lag rule set {rules!r}; valid names: {list(RULE_SETS)}")
    if kind == "faults":
        if version is None:
            raise ValueError("--version is required for fault cases (e.g. 4.9.8 or 5.3.3)")
        generation_for_client_version(version)  # a bad version is a usage error, not a bad line
    status = 0
    for line_no, line in enumerate(stdin, start=1):
        if not line.strip():
            continue
        out = replay_line(kind, version, line, line_no, rules)
        if "error" in out and "line" in out:
            status = 1
        stdout.write(json.dumps(out) + "\n")
        stdout.flush()
    return status


def add_arguments(parser: argparse.ArgumentParser) -> None:
    """The replay arguments, shared by ``faultwatch replay`` and ``python -m pipeline.replay``."""
    parser.add_argument(
        "kind",
        choices=KINDS,
        help="faults: latency fault cases; alloc: allocation cases; lag: queue and group lag status cases",
    )
    parser.add_argument(
        "--version",
        help="Java client version the fault cases are replayed as, e.g. 4.9.8 or 5.3.3 "
        "(required for faults; allocation is the same in both)",
    )
    parser.add_argument(
        "--rules",
        default="burrow",
        help=f"lag cases: the rule set, one of {list(RULE_SETS)} (default burrow)",
    )


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m pipeline.replay", description=__doc__.splitlines()[0])
    add_arguments(parser)
    args = parser.parse_args(argv)
    try:
        return run_replay(args.kind, args.version, sys.stdin, sys.stdout, args.rules)
    except ValueError as exc:
        parser.error(str(exc))
        return 2  # pragma: no cover - parser.error exits


if __name__ == "__main__":  # pragma: no cover
    sys.exit(main())
