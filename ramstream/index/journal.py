"""Which blocks of a pass are done: one byte per block, each in its own Zarr chunk.

A block is marked only after its data has been written (zarr's local store writes each chunk
to a temporary file and renames it into place), so a kill loses at most the blocks in flight.

The journal also keeps the current run's throughput (attribute ``rate``: bytes and seconds of
this run so far), rewritten at most every ``RATE_EVERY`` seconds and at the end, so that
``ramstream status`` can give an ETA during and after an interrupted pass.
"""

from __future__ import annotations

import threading
import time
from collections.abc import Coroutine
from typing import Any

import numpy as np
import zarr
from zarr.codecs import Crc32cCodec
from zarr.core.chunk_key_encodings import DefaultChunkKeyEncoding

from ramstream.errors import StoreCorruptError
from ramstream.index.guard import store_io

RATE_EVERY = 2.0  # seconds between two throughput records of a running pass
# Chunk files named ``c.<i>.<j>`` side by side, not ``c/<i>/<j>``: per-block arrays would
# otherwise create a directory per block, and creating inodes was a fifth of a probe's CPU.
FLAT_KEYS = DefaultChunkKeyEncoding(separator=".")
RATE_ATTR = "rate"
_ADVICE = "the store is damaged, delete it and run the command again"


def _where(group: zarr.Group) -> object:
    return getattr(group.store, "root", group.store)


class Journal:
    def __init__(self, array: zarr.Array) -> None:
        self._array = array
        self._rate_noted = time.monotonic()
        self._rate_bytes = 0
        self._rate_lock = threading.Lock()  # write-behind threads record rates concurrently
        self.where = getattr(array.store, "root", array.store)

    @classmethod
    def create(cls, group: zarr.Group, name: str, n_blocks: int) -> Journal:
        array = group.create_array(
            name,
            shape=(max(n_blocks, 1),),
            chunks=(1,),
            dtype="uint8",
            fill_value=0,
            compressors=Crc32cCodec(),
            chunk_key_encoding=FLAT_KEYS,
        )
        return cls(array)

    @classmethod
    def open(cls, group: zarr.Group, name: str, size: int | None = None) -> Journal:
        """The journal ``name`` of ``group``; one that is missing, not a byte per item or (given
        ``size``) of another length is damage, named as such rather than misread."""
        array = group.get(name)
        if not isinstance(array, zarr.Array) or array.ndim != 1 or array.dtype != np.uint8:
            raise StoreCorruptError(f"{_where(group)}: its journal {name!r} is missing or damaged; {_ADVICE}")
        if size is not None and array.shape[0] != max(size, 1):
            raise StoreCorruptError(
                f"{_where(group)}: its journal {name!r} holds {array.shape[0]} marks, not {max(size, 1)}; {_ADVICE}"
            )
        return cls(array)

    @property
    def size(self) -> int:
        return int(self._array.shape[0])

    def done(self, n_blocks: int) -> np.ndarray:
        """A boolean per block."""
        if n_blocks == 0:
            return np.zeros(0, dtype=bool)
        with store_io(self.where, f"reading the journal {self._array.path!r}"):
            return np.asarray(self._array[:n_blocks]) != 0

    def mark(self, block: int) -> None:
        with store_io(self.where, f"marking block {block} done in the journal {self._array.path!r}"):
            self._array[block] = 1

    def marking(self, block: int) -> Coroutine[Any, Any, None]:
        """``mark`` as a coroutine, for callers that await it after their own writes."""
        return self._array.async_array.setitem(block, 1)

    def record_rate(self, nbytes: int, seconds: float, *, final: bool = False, where: str = "") -> None:
        """Keep this run's throughput (input bytes done and seconds spent so far): at most every
        ``RATE_EVERY`` seconds, and always when ``final``. A run that did nothing keeps the last
        run's record. ``where``: the backend and device that computed ("torch on cuda:0"), if known."""
        with self._rate_lock:
            now = time.monotonic()
            stale = nbytes <= self._rate_bytes  # a block persisted out of order by another thread
            if nbytes <= 0 or (not final and (stale or now - self._rate_noted < RATE_EVERY)):
                return
            self._rate_noted, self._rate_bytes = now, nbytes
            with store_io(self.where, "recording the throughput"):
                self._array.attrs[RATE_ATTR] = {
                    "bytes": int(nbytes),
                    "seconds": float(seconds),
                    "recorded_at": time.time(),
                    "final": final,
                    **({"where": where} if where else {}),
                }

    def rate(self) -> dict[str, Any] | None:
        """The last throughput record (``bytes``, ``seconds``, ``recorded_at``, ``final``), if any."""
        record = self._array.attrs.get(RATE_ATTR)
        return dict(record) if isinstance(record, dict) else None
