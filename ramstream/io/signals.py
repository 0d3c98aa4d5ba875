"""SIGTERM as an interruption: what ``timeout``, batch schedulers and ``docker stop`` send is
turned into an exception while a block runs, so that the code it interrupts stops as for Ctrl-C
(its ``finally`` clauses run, nothing is left half-written) instead of the process dying."""

from __future__ import annotations

import signal
import threading
from collections.abc import Iterator
from contextlib import contextmanager
from types import FrameType


@contextmanager
def sigterm_raises(interruption: type[BaseException]) -> Iterator[None]:
    """While the block runs, SIGTERM raises ``interruption`` once: a second SIGTERM while the
    first is handled is ignored (SIGKILL still stops the process). The handler it replaced is
    put back after. Outside the main thread, where no handler can be set, nothing changes."""
    if threading.current_thread() is not threading.main_thread():
        yield
        return
    raised: list[int] = []

    def stop(signum: int, frame: FrameType | None) -> None:
        if not raised:
            raised.append(signum)
            raise interruption

    previous = signal.signal(signal.SIGTERM, stop)
    try:
        yield
    finally:
        signal.signal(signal.SIGTERM, signal.SIG_DFL if previous is None else previous)
