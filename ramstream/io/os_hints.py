"""The OS calls behind durability and page-cache hints, with a fallback where a platform lacks
one (macOS has no ``fdatasync``, ``posix_fadvise`` or ``RWF_NOWAIT``): a data sync becomes a full
``fsync``, a hint that cannot be given is skipped, and "is it cached?" answers no."""

from __future__ import annotations

import os

_FDATASYNC = getattr(os, "fdatasync", os.fsync)
_FADVISE = getattr(os, "posix_fadvise", None)
_PREADV = getattr(os, "preadv", None)
_NOWAIT = getattr(os, "RWF_NOWAIT", None)


def sync_data(fd: int) -> None:
    """The file's data (and the metadata needed to read it) on the disk."""
    _FDATASYNC(fd)


def drop_cached(fd: int, offset: int = 0, length: int = 0) -> None:
    """Let the OS drop clean cached pages of ``[offset, offset + length)`` (0: to the end)."""
    if _FADVISE is not None:
        _FADVISE(fd, offset, length, os.POSIX_FADV_DONTNEED)


def read_ahead(fd: int, offset: int, length: int) -> None:
    """Ask the OS to read ``[offset, offset + length)`` into its cache."""
    if _FADVISE is not None:
        _FADVISE(fd, offset, length, os.POSIX_FADV_WILLNEED)


def is_cached(fd: int, offset: int) -> bool:
    """Whether the byte at ``offset`` is in the page cache (a one-byte read that may not block)."""
    if _PREADV is None or _NOWAIT is None:
        return False
    try:
        return bool(_PREADV(fd, [bytearray(1)], offset, _NOWAIT) == 1)
    except OSError:  # EAGAIN: not cached; EOPNOTSUPP: cannot tell, so read ahead
        return False
