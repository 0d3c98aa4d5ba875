"""The inputs' files, open for two kinds of reader; nothing is ever loaded whole.

The spine kernels (probe, RAM merge) read their own tiles with ``pread`` from the descriptors
handed out here (``ramstream/backends/numba/sources.py``). The other kernels get block views over
memory-mapped safetensors, with the pages released after each block: a mapped page counts in
RSS while it is resident in this process's page table, so each block's ranges are dropped with
``madvise(MADV_DONTNEED)`` once the kernel is done (the data stays in the OS page cache; only
this process's mapping is released). The next block is announced with ``POSIX_FADV_WILLNEED``
so the OS can read ahead while we compute. Views are read-only numpy arrays of the raw carrier
(``uint16`` for BF16/F16).
"""

from __future__ import annotations

import mmap
import os
from pathlib import Path

import numpy as np

from ramstream.errors import CorruptFileError
from ramstream.format.checkpoint import TensorRef
from ramstream.format.dtypes import FLOAT_CODES, ITEMSIZE, RAW_CARRIER
from ramstream.io import os_hints

PAGE = mmap.PAGESIZE


class InputFiles:
    """A read-only descriptor and a read-only map per input file, opened lazily, closed together."""

    def __init__(self) -> None:
        self._maps: dict[Path, mmap.mmap] = {}
        self._fds: dict[Path, int] = {}

    def descriptor(self, path: Path) -> int:
        fd = self._fds.get(path)
        if fd is None:
            try:
                fd = os.open(path, os.O_RDONLY | os.O_CLOEXEC)
            except OSError as exc:
                raise CorruptFileError(f"{path}: cannot open the file ({exc})") from exc
            self._fds[path] = fd
        return fd

    def _map(self, path: Path) -> mmap.mmap:
        mm = self._maps.get(path)
        if mm is None:
            try:
                with open(path, "rb") as f:
                    mm = mmap.mmap(f.fileno(), 0, access=mmap.ACCESS_READ)
            except (OSError, ValueError) as exc:
                raise CorruptFileError(f"{path}: cannot map the file ({exc})") from exc
            self._maps[path] = mm
        return mm

    def float_view(self, ref: TensorRef, start: int, stop: int) -> np.ndarray:
        """Elements ``[start, stop)`` of a float tensor as its raw carrier (read-only, no copy)."""
        dtype = np.dtype(RAW_CARRIER[FLOAT_CODES[ref.entry.dtype]])
        mm = self._map(ref.file)
        offset = ref.entry.offset + start * dtype.itemsize
        view = np.frombuffer(mm, dtype=dtype, count=stop - start, offset=offset)
        if not view.flags.aligned:  # only for files whose header length breaks alignment
            view = view.copy()
            view.setflags(write=False)
        return view

    def byte_range(self, ref: TensorRef, start: int, stop: int) -> memoryview:
        """Bytes ``[start, stop)`` of any tensor (for copying non-float tensors)."""
        mm = self._map(ref.file)
        return memoryview(mm)[ref.entry.offset + start : ref.entry.offset + stop]

    def release(self, ref: TensorRef, start: int, stop: int) -> None:
        """Drop this process's pages of elements ``[start, stop)`` (the page cache keeps them)."""
        size = ITEMSIZE[ref.entry.dtype]
        self.release_bytes(ref.file, ref.entry.offset + start * size, ref.entry.offset + stop * size)

    def release_bytes(self, path: Path, lo: int, hi: int) -> None:
        """Drop this process's mapped pages of bytes ``[lo, hi)`` of ``path``."""
        lo_page = lo - lo % PAGE
        mm = self._map(path)
        length = min(hi, len(mm)) - lo_page
        if length > 0:
            mm.madvise(mmap.MADV_DONTNEED, lo_page, length)

    def prefetch_bytes(self, path: Path, lo: int, hi: int) -> None:
        """Ask the OS to read bytes ``[lo, hi)`` of ``path`` ahead (into its cache; nothing is
        mapped), unless the range's last byte is cached already: on a warm cache the hint only
        walks cached pages (0.14 s of a 6 GB probe), and one byte is the cheapest sign of a warm
        range (a range cached only in part is still read, by the OS's own read-ahead)."""
        fd = self.descriptor(path)
        if hi <= lo or os_hints.is_cached(fd, hi - 1):
            return
        os_hints.read_ahead(fd, lo, hi - lo)

    def close(self) -> None:
        for mm in self._maps.values():
            try:
                mm.close()
            except BufferError:  # a view is still alive; the map closes when it is collected
                pass
        self._maps.clear()
        for fd in self._fds.values():
            os.close(fd)
        self._fds.clear()

    def __enter__(self) -> InputFiles:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()
