"""Freed memory kept for reuse in the processes that run the Kafka reader tasks (glibc only).

Every fetch goes through buffers of megabytes: kafka-python's response frame and record bytes,
their joins and copies, numpy arrays. glibc hands such a buffer back to the kernel when it is
freed (above its mmap threshold, or when the free top of an arena passes its trim threshold,
and kafka-python's IO thread has an arena of its own), so the next fetch gets fresh pages again,
and each fresh page costs the kernel a page fault and a zero-fill: more CPU than the copies
themselves. :func:`keep_freed_memory` fixes both thresholds once per process, so those buffers
come from memory the process already holds. The price: each arena may keep up to ``TRIM`` of
freed memory. Where there is no glibc ``mallopt`` it does nothing.
"""

from __future__ import annotations

import ctypes
import logging

log = logging.getLogger(__name__)

MMAP = 32 << 20  # blocks up to this size come from the heap (glibc allows at most 32 MiB here)
TRIM = 64 << 20  # an arena keeps up to this much freed memory at its top
_M_TRIM_THRESHOLD, _M_MMAP_THRESHOLD = -1, -3  # glibc's mallopt parameters
_done: list[bool] = []


def keep_freed_memory() -> bool:
    """Set glibc's mmap and trim thresholds (once per process); False where that is not possible."""
    if not _done:
        try:
            mallopt = ctypes.CDLL(None).mallopt
            _done.append(mallopt(_M_MMAP_THRESHOLD, MMAP) == 1 and mallopt(_M_TRIM_THRESHOLD, TRIM) == 1)
        except (AttributeError, OSError):  # not glibc
            _done.append(False)
        if not _done[0]:
            log.info("no glibc mallopt here: freed fetch buffers go back to the system (more page faults)")
    return _done[0]
