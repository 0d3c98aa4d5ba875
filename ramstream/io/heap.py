"""The C heap's policy for large buffers, scaled to the run's memory budget.

glibc's default raises the size from which a buffer gets its own mapping to the largest one freed
so far (up to 32 MiB), and keeps up to twice that free at the top of each arena: under a small
budget what the blocks and the statistics' chunks freed stayed resident (a TIES merge of 385 small
tensors under ``--memory 64MiB`` peaked 110 MiB higher, ``tests/test_memory.py``). Fixed at an
eighth of the budget (1 to 32 MiB; twice that kept free), the heap holds a bounded part of the
budget beyond what is in use. From ``--memory 256MiB`` up that is glibc's own ceiling, so a large
budget keeps reusing its buffers as before; under a smaller one, buffers of 16 MiB (a statistic's
chunk) are mapped afresh each time, whose page faults cost system time (a cached TIES merge of a
MoE's 1 619 tensors under ``--memory 64MiB``: 237 MiB at 5-9 s, against 316 MiB at 3-4 s).
Other C libraries are left as they are.
"""

from __future__ import annotations

import ctypes
import sys

M_TRIM_THRESHOLD = -1  # glibc's mallopt parameters
M_MMAP_THRESHOLD = -3
MIB = 1024**2

_set: int | None = None  # the threshold set in this process


def threshold_for(budget: int) -> int:
    """The size from which a buffer is mapped on its own under a memory budget of ``budget`` bytes."""
    return min(32 * MIB, max(MIB, budget // 8))


def map_large_buffers(budget: int) -> None:
    """Set the thresholds for a run of ``budget`` bytes (a no-op where the C library has no
    ``mallopt``); a later run of the process sets its own."""
    global _set
    threshold = threshold_for(budget)
    if threshold == _set or not sys.platform.startswith("linux"):
        return
    _set = threshold
    mallopt = getattr(ctypes.CDLL(None), "mallopt", None)
    if mallopt is not None:
        mallopt(M_MMAP_THRESHOLD, threshold)
        mallopt(M_TRIM_THRESHOLD, 2 * threshold)
