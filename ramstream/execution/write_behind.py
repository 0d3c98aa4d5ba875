"""Write-behind: a block's writes run on background threads while the next block computes.

The kernels release the GIL, so persisting block ``i`` (output ``pwrite`` + ``fdatasync``, index
chunks, the journal mark) overlaps with the kernel of block ``i + 1``. Each item is one block's
whole persistence, its data then its journal mark, so a mark always follows its own data; items
of different blocks are independent and may run at once (``threads``: the writes spend most of
their time waiting for the disk or for a core, so two in flight hide each other's waits). At
most ``depth`` items are pending, bounding the buffers held for them: a pass needs ``depth + 1``
(one being filled). A failure in a thread is raised, unchanged, in the caller at its next
``submit`` or ``drain``; ``close`` cancels what has not started and waits for what is running,
so nothing writes after the pass returns or raises, and a kill loses at most ``depth`` blocks.
"""

from __future__ import annotations

from collections import deque
from collections.abc import Callable
from concurrent.futures import Future, ThreadPoolExecutor
from types import TracebackType


class WriteBehind:
    def __init__(self, depth: int = 2, threads: int | None = None) -> None:
        if depth < 1 or (threads is not None and threads < 1):
            raise ValueError("depth and threads must be >= 1")
        self.depth = depth
        self._pool = ThreadPoolExecutor(max_workers=threads or depth, thread_name_prefix="ramstream-write")
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
