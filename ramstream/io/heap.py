"""The C heap's policy for large buffers: each its own mapping, handed back to the OS when freed.

glibc's default raises the size from which a buffer gets its own mapping to the largest one freed
so far (up to 32 MiB); past that, the blocks' buffers and the statistics' chunks come from the
heap's arenas, and what they free stays resident: a TIES merge of 385 small tensors under
``--memory 64MiB`` peaked 130 MiB higher (``tests/test_memory.py``). A fixed threshold keeps the
peak at what is in use. Other C libraries are left as they are.
"""

from __future__ import annotations

import ctypes
import sys

M_MMAP_THRESHOLD = -3  # glibc's mallopt parameter
THRESHOLD = 4 * 1024**2  # buffers from this size are mapped on their own

_applied = False


def map_large_buffers() -> None:
    """Set the threshold once per process (a no-op where the C library has no ``mallopt``)."""
    global _applied
    if _applied or not sys.platform.startswith("linux"):
        return
    _applied = True
    mallopt = getattr(ctypes.CDLL(None), "mallopt", None)
    if mallopt is not None:
        mallopt(M_MMAP_THRESHOLD, THRESHOLD)
