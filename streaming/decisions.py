"""The cluster decisions of the combined query, run in its sink on the driver.

The fault state is keyed per (cluster, shard of its brokers); the episode rules compare all the
cluster's brokers, so each key's step writes its brokers' grid points and
:func:`pipeline.faults.cluster.cluster_step` decides per cluster on them, here, once per
micro-batch: a few rows per broker instead of every event through one task. Its state (JSON, small)
is saved in the checkpoint per batch id BEFORE the Delta commits: a batch replayed after a crash
starts again from the state of the batch before it and writes the same rows, which the commits then
skip as a replay. The state saved last stays in memory too, so the next batch does not read it back.
"""

from __future__ import annotations

import os
from pathlib import Path
from typing import Any

import orjson
import pyarrow as pa

from pipeline import objstore
from pipeline.config import Config
from pipeline.faults.cluster import ClusterState, cluster_step, from_json, loads, to_json
from streaming.delta_sink import DataFile, write_table_files

FOLDER = "faultwatch-decisions"
KEEP = 100  # state files kept (a replay needs only the one before its batch)
POINTS, CLOCK = "_points", "_clock"


class ClusterDecisions:
    """``driver_step`` of the combined query's sink: extras in, episode files out."""

    def __init__(self, cfg: Config, checkpoint: str, file_tag: str) -> None:
        self.cfg = cfg
        self.root = cfg.storage.root
        # a local Path (its calls are the fast path), or the URI on object storage
        self.folder: Any = objstore.join(checkpoint, FOLDER) if objstore.is_remote(checkpoint) else Path(checkpoint) / FOLDER
        self.file_tag = file_tag
        self._saved: tuple[int, dict[str, ClusterState], int] | None = None  # (batch id, states, settle)

    def __getstate__(self) -> dict[str, Any]:
        """Without the saved state: the sink's write function, which Spark ships to every write
        task, holds this object, and the state is for the driver only."""
        return {**self.__dict__, "_saved": None}

    def _load(self, batch_id: int) -> tuple[dict[str, ClusterState], int]:
        """The state after the newest batch before ``batch_id`` (and its settle point)."""
        if self._saved is not None and self._saved[0] == batch_id - 1:
            return dict(self._saved[1]), self._saved[2]
        if isinstance(self.folder, str):  # on object storage
            return self._load_remote(batch_id)
        if not self.folder.exists():
            return {}, 0
        ids = sorted(int(p.stem) for p in self.folder.glob("*.json") if p.stem.isdigit() and int(p.stem) < batch_id)
        if not ids:
            return {}, 0
        doc = orjson.loads((self.folder / f"{ids[-1]}.json").read_bytes())
        clusters = doc["clusters"]  # a JSON text inside the document before 2026-11-26
        return loads(clusters) if isinstance(clusters, str) else from_json(clusters), int(doc["settle_ms"])

    def _load_remote(self, batch_id: int) -> tuple[dict[str, ClusterState], int]:
        names = [n.removesuffix(".json") for n in objstore.list_names(str(self.folder)) if n.endswith(".json")]
        ids = sorted(int(n) for n in names if n.isdigit() and int(n) < batch_id)
        if not ids:
            return {}, 0
        doc = orjson.loads(objstore.read_text(objstore.join(str(self.folder), f"{ids[-1]}.json")))
        return from_json(doc["clusters"]), int(doc["settle_ms"])

    def _save(self, batch_id: int, states: dict[str, ClusterState], settle: int) -> None:
        doc = orjson.dumps({"clusters": to_json(states), "settle_ms": settle}, option=orjson.OPT_SORT_KEYS)
        if isinstance(self.folder, str):  # on object storage
            objstore.write_text(objstore.join(self.folder, f"{batch_id}.json"), doc.decode())
            objstore.remove(objstore.join(self.folder, f"{batch_id - KEEP}.json"))
            self._saved = (batch_id, dict(states), settle)
            return
        self.folder.mkdir(parents=True, exist_ok=True)
        tmp = self.folder / f".{batch_id}.json.tmp"
        tmp.write_bytes(doc)
        os.replace(tmp, self.folder / f"{batch_id}.json")
        (self.folder / f"{batch_id - KEEP}.json").unlink(missing_ok=True)
        self._saved = (batch_id, dict(states), settle)

    def __call__(self, batch_id: int, extras: list[tuple[str, int, bytes]]) -> list[DataFile]:
        states, settle = self._load(batch_id)
        rows: list[dict[str, Any]] = []
        for name, value, payload in extras:
            if name == CLOCK:
                settle = max(settle, value)
            elif name == POINTS:
                rows += pa.ipc.open_stream(pa.py_buffer(payload)).read_all().to_pylist()
        by_cluster: dict[str, list[dict[str, Any]]] = {}
        for row in rows:
            by_cluster.setdefault(row["cluster"], []).append(row)
        episodes: list[dict[str, Any]] = []
        for cluster in sorted(set(states) | set(by_cluster)):
            state = states.get(cluster) or ClusterState(cluster)
            states[cluster], out = cluster_step(state, by_cluster.get(cluster, []), settle, self.cfg.faults)
            episodes += out
        self._save(batch_id, states, settle)
        if not episodes:
            return []
        from pipeline.faults.concern import with_settled
        from schemas.tables import table

        live = "broker_fault_episodes_live"
        data = pa.Table.from_pylist(episodes, schema=table(live).arrow_schema())
        prefix = f"part-{self.file_tag}-b{batch_id}-decided"
        files = []
        for name, rows in with_settled({live: data}).items():
            files += write_table_files(self.root, name, rows, lambda i: f"{prefix}-{i}")
        return files
