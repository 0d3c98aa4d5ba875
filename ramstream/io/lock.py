"""One writer at a time for an index or an output directory (``flock`` on a lock file).

The kernel releases a ``flock`` when its process dies, even by SIGKILL, so a crashed run never
leaves a stale lock. The lock file holds the holder's pid for the message; it is removed by the
holder before it lets go.
"""

from __future__ import annotations

import fcntl
import os
import sys
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

from ramstream.errors import ConcurrentRunError, OutputError


@contextmanager
def hold(lock_file: Path, what: str, wait: bool) -> Iterator[None]:
    """Hold the lock on ``lock_file``; if another process has it, wait (saying so) or refuse."""
    try:
        lock_file.parent.mkdir(parents=True, exist_ok=True)
        fd = os.open(lock_file, os.O_RDWR | os.O_CREAT, 0o644)
    except OSError as exc:
        raise OutputError(f"{lock_file}: cannot create the lock file ({exc.strerror})") from exc
    try:
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            holder = os.pread(fd, 32, 0).decode(errors="replace").strip() or "?"
            if not wait:
                raise ConcurrentRunError(
                    f"{what}: another ramstream process (pid {holder}) is writing it; "
                    "wait for it to finish (or stop it), then rerun"
                ) from None
            print(f"waiting for another ramstream process (pid {holder}) to finish with {what}", file=sys.stderr)
            fcntl.flock(fd, fcntl.LOCK_EX)
        os.ftruncate(fd, 0)
        os.pwrite(fd, str(os.getpid()).encode(), 0)
        try:
            yield
        finally:
            try:
                os.unlink(lock_file)
            except OSError:
                pass
    finally:
        os.close(fd)  # closing releases the flock
