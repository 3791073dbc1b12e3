"""The refresh runs in a child process, so it never takes the request loop's CPU or GIL.

Reading the tables and rendering 10,000 series is a few hundred milliseconds of Python; in a
thread of the serving process it delayed requests by as much (the GIL). Here a spawned child (no
fork: deltalake must not be used after a fork) refreshes every ``serve.refresh_interval_s`` and
sends back a :class:`Published`: every answer already rendered to bytes (``/metrics``, the page,
each cluster's and each group's API documents) plus a names-only state for answers to unknown
paths and for ``/healthz``. The serving process only swaps it in.
"""

from __future__ import annotations

import gzip
import logging
import multiprocessing as mp
import os
import threading
import types
from collections.abc import Mapping
from dataclasses import dataclass
from multiprocessing.connection import Connection
from multiprocessing.reduction import ForkingPickler
from typing import Any

from pipeline.config import Config
from pipeline.serve import api
from pipeline.serve.metrics import RefreshStats
from pipeline.serve.page import render_page
from pipeline.serve.snapshot import Refresher, Snapshot, health
from pipeline.serve.state import Cluster, ServeState

log = logging.getLogger(__name__)


def _mappingproxy(values: dict[Any, Any]) -> types.MappingProxyType:
    return types.MappingProxyType(values)


def _reduce_mappingproxy(m: types.MappingProxyType) -> tuple[Any, tuple[dict[Any, Any]]]:
    return _mappingproxy, (dict(m),)


# A loaded config holds read-only mappings (spark.conf, lag.groups) that plain pickle refuses; the
# child process gets the config through multiprocessing's own pickler, so teach that one.
ForkingPickler.register(types.MappingProxyType, _reduce_mappingproxy)


@dataclass(frozen=True)
class Published:
    """What one refresh serves: rendered answers by request path, and a names-only state."""

    state: ServeState
    refresh: RefreshStats
    metrics: bytes
    metrics_gzip: bytes
    page: bytes
    answers: Mapping[str, api.Answer]


def _names_only(state: ServeState) -> ServeState:
    clusters = {name: Cluster(name, {}, {}, None) for name in state.clusters}
    return ServeState(state.now_ms, clusters, state.table_errors, state.newest_ms, (), (), state.avoidance_error,
                      state.avoidance_bad)


def api_paths(state: ServeState) -> dict[str, tuple[str, ...]]:
    """Request path -> (endpoint, cluster[, group]) for every resource that exists."""
    p = api.API_PREFIX
    out: dict[str, tuple[str, ...]] = {p: ("clusters",)}
    for name, cluster in state.clusters.items():
        c = f"{p}/{api.segment(name)}"
        out[c] = ("cluster", name)
        out[c + "/consumer"] = ("consumers", name)
        out[c + "/broker"] = ("brokers", name)
        out[c + "/avoidance"] = ("avoidance", name)
        for group in cluster.groups:
            out[f"{c}/consumer/{api.segment(group)}/status"] = ("status", name, group)
    return out


def answer(state: ServeState, path: str, route: tuple[str, ...], raw: Mapping[str, bytes]) -> api.Answer:
    kind, args = route[0], route[1:]
    if kind == "clusters":
        return api.clusters(state, path)
    if kind == "cluster":
        return api.cluster(state, path, *args)
    if kind == "consumers":
        return api.consumers(state, path, *args)
    if kind == "brokers":
        return api.brokers(state, path, *args)
    if kind == "avoidance":
        return api.avoidance(state, path, args[0], raw)
    return api.group_status(state, path, *args)


def publish(snapshot: Snapshot, cfg: Config) -> Published:
    """Render everything one snapshot serves."""
    state = snapshot.state
    answers = {path: answer(state, path, route, snapshot.avoidance_raw) for path, route in api_paths(state).items()}
    page = render_page(state, health(snapshot, cfg, state.now_ms), cfg.serve.page_refresh_s)
    # Prometheus asks for gzip: ~15x smaller, compressed once here instead of once per scrape.
    metrics_gzip = gzip.compress(snapshot.metrics, compresslevel=1)
    return Published(_names_only(state), snapshot.refresh, snapshot.metrics, metrics_gzip, page, answers)


def _child(cfg: Config, conn: Connection) -> None:
    """The refresh loop of the child process; ends when the parent says so or goes away.

    It runs at a lower CPU priority: on a busy machine the scheduler then serves requests first
    and the refresh takes what is left (a refresh a little late beats a request a little late).
    """
    if hasattr(os, "nice"):
        os.nice(10)
    refresher = Refresher(cfg)
    while True:
        try:
            message: Any = publish(refresher.refresh_once(), cfg)
        except Exception as exc:  # noqa: BLE001 - reported to the parent, retried next interval
            message = f"{type(exc).__name__}: {exc}"
        try:
            conn.send(message)
            if conn.poll(cfg.serve.refresh_interval_s):
                return  # any message from the parent means stop
        except (BrokenPipeError, EOFError, OSError):
            return


class RefreshWorker:
    """Runs :func:`_child` in a spawned process and keeps the latest :class:`Published` in ``snapshot``."""

    def __init__(self, cfg: Config) -> None:
        self.cfg = cfg
        self.snapshot: Published | None = None
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None
        self._proc: Any = None
        self._conn: Connection | None = None

    def start(self) -> None:
        self._thread = threading.Thread(target=self._supervise, name="faultwatch-serve-refresh", daemon=True)
        self._thread.start()

    def _spawn(self) -> Connection:
        ctx = mp.get_context("spawn")
        parent, child = ctx.Pipe()
        self._proc = ctx.Process(target=_child, args=(self.cfg, child), name="faultwatch-serve-refresh", daemon=True)
        self._proc.start()
        child.close()
        return parent

    def _supervise(self) -> None:
        while not self._stop.is_set():
            try:
                self._conn = conn = self._spawn()
            except Exception:
                log.exception("serve: cannot start the refresh process; trying again")
                self._stop.wait(5.0)
                continue
            try:
                while not self._stop.is_set():
                    message = conn.recv()
                    if isinstance(message, Published):
                        self.snapshot = message
                    else:
                        log.error("serve: refresh failed: %s", message)
            except (EOFError, OSError):
                if not self._stop.is_set():
                    log.error("serve: the refresh process ended (exit code %s); starting another",
                              self._proc.exitcode if self._proc else None)
                    self._stop.wait(1.0)
            finally:
                conn.close()

    def stop(self) -> None:
        self._stop.set()
        if self._conn is not None:
            try:
                self._conn.send("stop")
            except (OSError, ValueError):
                pass
        if self._proc is not None:
            self._proc.join(timeout=10)
            if self._proc.is_alive():
                self._proc.terminate()
                self._proc.join(timeout=10)
        if self._thread is not None:
            self._thread.join(timeout=10)

