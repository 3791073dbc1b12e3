"""streaming.heap: glibc's thresholds set once per process, nothing done elsewhere."""

from __future__ import annotations

import ctypes

from streaming import heap


def test_thresholds_are_set_once_where_glibc_is(monkeypatch):
    calls = []

    class Libc:
        def mallopt(self, param, value):
            calls.append((param, value))
            return 1

    monkeypatch.setattr(heap, "_done", [])
    monkeypatch.setattr(ctypes, "CDLL", lambda name: Libc())
    assert heap.keep_freed_memory() and heap.keep_freed_memory()
    assert calls == [(-3, heap.MMAP), (-1, heap.TRIM)]


def test_nothing_happens_without_mallopt(monkeypatch):
    monkeypatch.setattr(heap, "_done", [])
    monkeypatch.setattr(ctypes, "CDLL", lambda name: object())
    assert heap.keep_freed_memory() is False


def test_a_refused_threshold_is_reported(monkeypatch):
    class Libc:
        def mallopt(self, param, value):
            return 0

    monkeypatch.setattr(heap, "_done", [])
    monkeypatch.setattr(ctypes, "CDLL", lambda name: Libc())
    assert heap.keep_freed_memory() is False
