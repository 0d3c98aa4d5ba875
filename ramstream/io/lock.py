"""One writer at a time for an index or an output directory (``flock`` on a lock file).

The kernel releases a ``flock`` when its process dies, even by SIGKILL, so a crashed run never
leaves a stale lock. The lock file holds the holder's pid for the message; it is removed by the
holder before it lets go, so a lock taken on a file no longer at the path does not count.
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
    fd = _acquire(lock_file, what, wait)
    try:
        try:
            os.ftruncate(fd, 0)
            os.pwrite(fd, str(os.getpid()).encode(), 0)
        except OSError:
            pass  # the pid is only for others' messages; a full disk must not stop the run here
        try:
            yield
        finally:
            try:
                os.unlink(lock_file)  # while still holding it: see ``_acquire``
            except OSError:
                pass
    finally:
        os.close(fd)  # closing releases the flock


def _acquire(lock_file: Path, what: str, wait: bool) -> int:
    """A descriptor holding the ``flock`` of the file now at ``lock_file``.

    The holder unlinks the file before it lets go, so a process that was waiting on the old
    file may get a lock on an unlinked inode while a third one locks a new file at the path: a
    lock counts only when the locked descriptor is still the file at the path; otherwise retry.
    """
    while True:
        fd = _open(lock_file)
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
            if _is_current(fd, lock_file):
                return fd
        except BaseException:
            os.close(fd)
            raise
        os.close(fd)


def _open(lock_file: Path) -> int:
    try:
        lock_file.parent.mkdir(parents=True, exist_ok=True)
        return os.open(lock_file, os.O_RDWR | os.O_CREAT | os.O_CLOEXEC, 0o644)
    except OSError as exc:
        raise OutputError(f"{lock_file}: cannot create the lock file ({exc.strerror})") from exc


def _is_current(fd: int, lock_file: Path) -> bool:
    """True when ``fd`` is the file at ``lock_file`` (not one unlinked by its last holder)."""
    try:
        st = os.stat(lock_file)
    except FileNotFoundError:
        return False
    mine = os.fstat(fd)
    return (st.st_dev, st.st_ino) == (mine.st_dev, mine.st_ino)
