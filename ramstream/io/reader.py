"""Block views over memory-mapped safetensors, with the pages released after each block.

A mapped page counts in RSS while it is resident in this process's page table, so each block's
ranges are dropped with ``madvise(MADV_DONTNEED)`` once the kernel is done (the data stays in
the OS page cache; only this process's mapping is released). The next block is announced with
``MADV_WILLNEED`` so the kernel can read ahead while we compute. Views are read-only numpy arrays
of the raw carrier (``uint16`` for BF16/F16); nothing is ever loaded whole.
"""

from __future__ import annotations

import mmap
from pathlib import Path

import numpy as np

from ramstream.errors import CorruptFileError
from ramstream.format.checkpoint import TensorRef
from ramstream.format.dtypes import FLOAT_CODES, ITEMSIZE, RAW_CARRIER

PAGE = mmap.PAGESIZE


class MappedFiles:
    """One read-only map per input file, opened lazily and closed together."""

    def __init__(self) -> None:
        self._maps: dict[Path, mmap.mmap] = {}

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

    def _advise(self, ref: TensorRef, start: int, stop: int, advice: int) -> None:
        size = ITEMSIZE[ref.entry.dtype]
        lo = ref.entry.offset + start * size
        hi = ref.entry.offset + stop * size
        lo_page = lo - lo % PAGE
        mm = self._map(ref.file)
        length = min(hi, len(mm)) - lo_page
        if length > 0:
            mm.madvise(advice, lo_page, length)

    def release(self, ref: TensorRef, start: int, stop: int) -> None:
        """Drop this process's pages of elements ``[start, stop)`` (the page cache keeps them)."""
        self._advise(ref, start, stop, mmap.MADV_DONTNEED)

    def prefetch(self, ref: TensorRef, start: int, stop: int) -> None:
        """Ask the OS to read elements ``[start, stop)`` ahead, without mapping them yet."""
        self._advise(ref, start, stop, mmap.MADV_WILLNEED)

    def close(self) -> None:
        for mm in self._maps.values():
            try:
                mm.close()
            except BufferError:  # a view is still alive; the map closes when it is collected
                pass
        self._maps.clear()

    def __enter__(self) -> MappedFiles:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()
