"""The per-cluster JSON files: an older list never replaces a newer one, whoever writes last."""

from __future__ import annotations

import json
from pathlib import Path

from pipeline.publish.sinks import write_cluster_files


def _list(cycle: int, decided_ms: int) -> bytes:
    return json.dumps({"cluster": "c1", "cycle_id": str(cycle), "decided_ms": decided_ms, "avoid": []}).encode()


def test_a_cluster_file_is_replaced_only_by_a_newer_list(tmp_path: Path) -> None:
    file = tmp_path / "c1.json"
    assert write_cluster_files(str(tmp_path), [("c1", _list(200, 2_000))]) == [file]
    assert write_cluster_files(str(tmp_path), [("c1", _list(100, 1_000))]) == []  # a late, older cycle
    assert write_cluster_files(str(tmp_path), [("c1", _list(200, 2_000))]) == []  # the same list again
    assert file.read_bytes() == _list(200, 2_000)
    assert write_cluster_files(str(tmp_path), [("c1", _list(300, 3_000))]) == [file]
    assert file.read_bytes() == _list(300, 3_000)
    assert sorted(p.name for p in tmp_path.iterdir()) == ["c1.json"]  # no temp file left behind
