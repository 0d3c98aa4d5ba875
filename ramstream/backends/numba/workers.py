"""The threads that run a kernel's parts: one serial, GIL-free call per thread.

Every kernel of this backend is a serial function of its part ``w`` of ``workers`` (a balanced
range of tiles, its own rows of partial results), compiled with ``nogil``; ``run_parts`` calls the
parts side by side on a pool of threads shared by the process, the first on the calling thread.
Why not ``prange``: Numba's parallel lowering made each kernel compile two to three times slower
(a user's first merge spent most of its time there), and a range per thread is all it did.
The split is the one ``prange`` had, so partial results, and the bytes, are the same.
"""

from __future__ import annotations

import os
import threading
from collections.abc import Callable
from concurrent.futures import Future, ThreadPoolExecutor, wait
from typing import Any

_lock = threading.Lock()
_pool: ThreadPoolExecutor | None = None
_pool_size = 0
# Called with (part, args) before every kernel call while set: ``prewarm`` waits there for a child
# compiling that kernel, ``tools/record_kernels.py`` records the kernels a method calls.
_before_call: Callable[[Callable[..., Any], tuple[Any, ...]], None] | None = None


def before_call(hook: Callable[[Callable[..., Any], tuple[Any, ...]], None] | None) -> None:
    """Set (None: clear) what runs before each kernel call, with the kernel and its arguments
    (``w`` and ``workers`` excepted)."""
    global _before_call
    _before_call = hook


def _threads(count: int) -> ThreadPoolExecutor:
    """The shared pool, grown to ``count`` threads if it is smaller."""
    global _pool, _pool_size
    with _lock:
        if _pool is None or _pool_size < count:
            old = _pool
            _pool = ThreadPoolExecutor(max_workers=count, thread_name_prefix="ramstream-numba")
            _pool_size = count
            if old is not None:
                old.shutdown(wait=False)
        return _pool


def _forget_pool() -> None:
    """A forked child has none of its parent's threads: it starts its own pool."""
    global _pool, _pool_size, _lock
    _pool, _pool_size, _lock = None, 0, threading.Lock()


os.register_at_fork(after_in_child=_forget_pool)


def run_parts(part: Callable[..., Any], workers: int, *args: Any) -> list[Any]:
    """``[part(*args, w, workers) for w in range(workers)]``, the parts on ``workers`` threads.

    Every part has finished when this returns or raises (none is left writing into the caller's
    arrays)."""
    if _before_call is not None:
        _before_call(part, args)
    if workers <= 1:
        return [part(*args, 0, 1)]
    pool = _threads(workers - 1)
    futures: list[Future[Any]] = [pool.submit(part, *args, w, workers) for w in range(1, workers)]
    try:
        first = part(*args, 0, workers)
    finally:
        wait(futures)
    return [first, *(f.result() for f in futures)]


def lowest(found: list[int]) -> int:
    """The smallest of the parts' positions that found something (>= 0), or -1."""
    hits = [int(f) for f in found if f >= 0]
    return min(hits) if hits else -1
