"""Writes that bypass the page cache (``O_DIRECT``), with the buffered fallback.

Copying gigabytes into the page cache costs CPU that the kernels need, and on a VM whose memory
is backed lazily every fresh page costs a host fault. ``O_DIRECT`` hands the disk our buffer
instead; it needs the file offset, the length and the buffer's address aligned to ``ALIGN``, and
some file systems (tmpfs, several network ones) refuse it, which callers learn from
:func:`open_direct` returning None or from ``EINVAL`` (:func:`refused`).
"""

from __future__ import annotations

import errno
import os
import threading
from collections.abc import Callable
from pathlib import Path

import numpy as np

ALIGN = 4096  # file offset, length and memory address of an O_DIRECT write
Allocate = Callable[[int], np.ndarray]  # bytes -> a new uint8 buffer


def open_direct(path: Path) -> int | None:
    """A write descriptor with ``O_DIRECT``, or None where the platform or file system has none."""
    flag = getattr(os, "O_DIRECT", 0)
    if not flag:
        return None
    try:
        return os.open(path, os.O_WRONLY | flag)
    except OSError:
        return None


def refused(exc: OSError) -> bool:
    """True when a direct write failed only because the file system will not do it."""
    return exc.errno == errno.EINVAL


def pwrite_all(fd: int, data: memoryview | np.ndarray, offset: int) -> None:
    """Write all of ``data`` (bytes, or a contiguous array's bytes) at ``offset``."""
    view = data if isinstance(data, memoryview) else memoryview(data).cast("B")  # type: ignore[arg-type]
    while view:
        written = os.pwrite(fd, view, offset)
        view = view[written:]
        offset += written


def aligned_view(
    raw: np.ndarray | None, nbytes: int, shift: int = 0, allocate: Allocate | None = None
) -> tuple[np.ndarray, np.ndarray]:
    """``(buffer, view)``: ``nbytes`` bytes of ``raw`` (or of a new buffer from ``allocate``, plain
    memory by default, when ``raw`` is None or too small) starting ``shift`` bytes (< ``ALIGN``)
    past an ``ALIGN`` boundary. Callers keep the buffer and pass it again, so its pages are
    touched once, not once per write."""
    if raw is None or raw.nbytes < nbytes + 2 * ALIGN:
        raw = (allocate or _plain)(nbytes + 2 * ALIGN)
    start = (-raw.ctypes.data) % ALIGN + shift
    return raw, raw[start : start + nbytes]


def _plain(nbytes: int) -> np.ndarray:
    return np.empty(nbytes, np.uint8)


_scratch = threading.local()


def aligned_scratch(nbytes: int) -> np.ndarray:
    """``nbytes`` of this thread's reusable ``ALIGN``-aligned byte buffer."""
    _scratch.raw, view = aligned_view(getattr(_scratch, "raw", None), nbytes)
    return view
