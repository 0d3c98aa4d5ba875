"""Write-behind: a block's writes run on one background thread while the next block computes.

The kernels release the GIL, so persisting block ``i`` (output ``pwrite`` + ``fdatasync``, index
chunks, the journal mark) overlaps with the kernel of block ``i + 1``. Items run one at a time,
in submission order, so a journal mark still follows its block's data; at most ``depth`` items
are pending (bounding the buffers held for them). A failure in the thread is raised, unchanged,
in the caller at its next ``submit`` or ``drain``; ``close`` cancels what has not started and
waits for the item in flight, so nothing writes after the pass returns or raises.
"""

from __future__ import annotations

from collections import deque
from collections.abc import Callable
from concurrent.futures import Future, ThreadPoolExecutor
from types import TracebackType


class WriteBehind:
    def __init__(self, depth: int = 1) -> None:
        if depth < 1:
            raise ValueError("depth must be >= 1")
        self.depth = depth
        self._pool = ThreadPoolExecutor(max_workers=1, thread_name_prefix="ramstream-write")
        self._pending: deque[Future[None]] = deque()

    def submit(self, fn: Callable[[], None]) -> None:
        """Queue ``fn``; first wait while ``depth`` items are pending (raising their errors)."""
        while len(self._pending) >= self.depth:
            self._pending.popleft().result()
        self._pending.append(self._pool.submit(fn))

    def drain(self) -> None:
        """Wait for every pending item; raise the first failure."""
        while self._pending:
            self._pending.popleft().result()

    def close(self) -> None:
        self._pool.shutdown(wait=True, cancel_futures=True)
        self._pending.clear()

    def __enter__(self) -> WriteBehind:
        return self

    def __exit__(self, kind: type[BaseException] | None, exc: BaseException | None, tb: TracebackType | None) -> None:
        try:
            if kind is None:
                self.drain()
        finally:
            self.close()
