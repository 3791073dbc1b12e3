"""Reading the Java oracle's vectors and comparing results with them the way their README says.

The vectors are JSON lines ``{case_id, oracle, input, expected}``. One part of ``expected`` is not
meaningful: when ``rank_has_ties`` is true, the order of tied items in 4.9's ``rank`` (and so
``pick_candidates``) came from ``ConcurrentHashMap`` iteration. :func:`comparable_fault_expected`
rewrites those two fields into a form that keeps everything that *is* meaningful (the set of
brokers, the sequence of sort keys), so whole objects can be compared with ``==``.
"""

from __future__ import annotations

import copy
import json
from collections.abc import Iterator, Mapping
from pathlib import Path
from typing import Any

FAULT_FILES = {"4.9.8": "faults-4.9.8.jsonl", "5.3.3": "faults-5.3.3.jsonl"}
ALLOC_FILE = "alloc.jsonl"


def read_jsonl(path: Path) -> Iterator[dict[str, Any]]:
    """Each non-blank line of a JSON-lines file, parsed."""
    with path.open(encoding="utf-8") as handle:
        for line in handle:
            if line.strip():
                yield json.loads(line)


def _rank_key(broker: Mapping[str, Any]) -> list[Any]:
    """4.9 ``FaultItem.compareTo`` order at the probe: available first, latency, avoid-until."""
    return [not broker["available_at_ts"], broker["current_latency"], broker["start_timestamp"]]


def comparable_fault_expected(expected: Mapping[str, Any]) -> dict[str, Any]:
    """A copy of a fault ``expected`` object with tie-dependent fields made order-insensitive.

    Under ``rank_has_ties``, ``rank`` becomes ``{"set": sorted names, "keys": sort keys in rank
    order}`` and ``pick_candidates`` becomes ``{"keys": sort keys}``: which of two tied brokers comes
    first is arbitrary, but how many candidates there are and how good they are is not.
    """
    out = copy.deepcopy(dict(expected))
    for probe in out.get("probes", []):
        if not probe.get("rank_has_ties"):
            continue
        keys = {b["broker"]: _rank_key(b) for b in probe["brokers"]}
        probe["rank"] = {"set": sorted(probe["rank"]), "keys": [keys[b] for b in probe["rank"]]}
        probe["pick_candidates"] = {"keys": [keys[b] for b in probe["pick_candidates"]]}
    return out
