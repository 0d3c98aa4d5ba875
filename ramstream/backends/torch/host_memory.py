"""Host buffers that results are downloaded straight into: the caller's own result buffers (a
merge pass's output staging), allocated by the backend so that a tile's result goes device → host
into its final place, not into a ring slot and then copied there (a copy of every output byte on
the host, measured at 16 % of the streamed path's host time).

On CUDA such a buffer is plain memory registered with the driver (``cudaHostRegister``: pinned,
so the copy is asynchronous, and exactly its size, where torch's pinned allocator rounds up to a
power of two), unregistered when the last view of it is gone. ``HostBuffers`` remembers where its
live buffers are, so that the output ring asks, per result, whether its destination is one.
"""

from __future__ import annotations

import threading
import weakref
from collections.abc import Callable

import numpy as np

Register = Callable[[int, int], bool]  # (address, bytes) -> registered
Unregister = Callable[[int], None]


class HostBuffers:
    """Buffers handed out by ``allocate``, each known (``holds``) while any view of it lives."""

    def __init__(self, register: Register | None = None, unregister: Unregister | None = None) -> None:
        self._register, self._unregister = register, unregister
        self._live: dict[int, int] = {}  # start address -> end address
        self._lock = threading.Lock()  # buffers are allocated and freed on several threads

    def allocate(self, nbytes: int) -> np.ndarray:
        """A uint8 buffer of ``nbytes``; plain memory where it cannot be registered, and then not
        one of these buffers (results reach it through a slot)."""
        raw = np.empty(max(nbytes, 1), np.uint8)
        start = raw.ctypes.data
        if self._register is not None and not self._register(start, raw.nbytes):
            return raw[:nbytes]
        with self._lock:
            self._live[start] = start + raw.nbytes
        # at exit the process's memory goes with it, CUDA's context perhaps first
        weakref.finalize(raw, self._release, start).atexit = False
        return raw[:nbytes]

    def holds(self, array: np.ndarray) -> bool:
        """Whether every byte of ``array`` (C-contiguous) lies in one live buffer."""
        if not array.flags.c_contiguous:
            return False
        first = array.ctypes.data
        last = first + array.nbytes
        with self._lock:
            return any(start <= first and last <= end for start, end in self._live.items())

    def _release(self, start: int) -> None:
        with self._lock:
            self._live.pop(start, None)
        if self._unregister is not None:
            self._unregister(start)
