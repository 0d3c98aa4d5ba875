"""Zarr's local store, with every write durable before it returns, and large chunks' pages dropped.

A block is marked done in a journal only after its data is durable, and the mark must never
outlive that data, even across a power loss (not only a killed process): so every value — chunk,
metadata, journal byte — is written like zarr's own (a temporary file, then a rename) but with
``fdatasync`` before the rename and an ``fsync`` of the directory after it. On this machine that
costs ~0.5 ms per small chunk, against a block's ~100 ms of compute, and it runs on the
write-behind threads.

A probe writes hundreds of MB of masks. Left in the page cache, every chunk would need fresh
pages (the slowest part of a probe on a VM whose memory is backed lazily: ~0.2 GB/s against
~1.5 GB/s for recycled ones). Chunks of at least ``DROP_AT`` bytes are therefore written with
``O_DIRECT`` (their aligned body) and their pages released once written: the page cache stays flat.

Zarr reads a chunk that is not there as the array's fill value. The index's data arrays (masks
and statistics) are read only where their journal says a chunk was written, so there a missing
chunk is damage (a file deleted, or lost by a disk), never zeros: :class:`IndexLocalStore`
refuses it, naming the array, on every read path. Journals stay lenient: an unmarked item has
no chunk. An index written by an earlier ramstream (``probe_again`` set: it lacks the attribute
that says every chunk is written) may lack chunks of zeros that zarr skipped; there the refusal
says so and gives the commands that probe it again, rather than calling the index damaged.
"""

from __future__ import annotations

import asyncio
import errno
import os
import re
import uuid
from collections.abc import Iterable
from pathlib import Path

import numpy as np
import zarr
from zarr.abc.store import ByteRequest
from zarr.core.buffer import Buffer, BufferPrototype
from zarr.storage import LocalStore

from ramstream.errors import StoreCorruptError
from ramstream.io import direct, os_hints

DROP_AT = 256 * 1024


def _put_durable(path: Path, value: Buffer) -> None:
    """A temporary file (a large value's aligned body written with ``O_DIRECT``, the rest through
    the page cache), synced, renamed into place, and the rename synced."""
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_suffix(f".{uuid.uuid4().hex}.partial")
    data = value.as_numpy_array().view(np.uint8).reshape(-1)
    large = len(data) >= DROP_AT
    try:
        fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o644)
        try:
            done = _write_body_direct(tmp, data) if large else 0
            direct.pwrite_all(fd, data[done:], done)
            os_hints.sync_data(fd)
            if large:
                os_hints.drop_cached(fd)
        finally:
            os.close(fd)
        tmp.replace(path)
    except BaseException:
        tmp.unlink(missing_ok=True)
        raise
    _sync_directory(path.parent)


def _sync_directory(directory: Path) -> None:
    """Make a rename in ``directory`` durable (where the file system allows opening it)."""
    try:
        fd = os.open(directory, os.O_RDONLY | os.O_DIRECTORY)
    except OSError:
        return
    try:
        os.fsync(fd)
    except OSError as exc:
        if exc.errno not in (errno.EINVAL, errno.ENOTSUP):  # a file system without directory sync
            raise
    finally:
        os.close(fd)


def _write_body_direct(path: Path, data: np.ndarray) -> int:
    """Write the largest aligned prefix of ``data`` with ``O_DIRECT``; the bytes written (0 where
    the file system refuses it)."""
    body = len(data) // direct.ALIGN * direct.ALIGN
    fd = direct.open_direct(path) if body else None
    if fd is None:
        return 0
    try:
        scratch = direct.aligned_scratch(body)
        scratch[:] = data[:body]
        direct.pwrite_all(fd, scratch, 0)
    except OSError as exc:
        if not direct.refused(exc):
            raise
        return 0
    finally:
        os.close(fd)
    return body


class DurableLocalStore(LocalStore):
    async def set(self, key: str, value: Buffer) -> None:
        if not self._is_open:
            await self._open()
        self._check_writable()
        await asyncio.to_thread(_put_durable, self.root / key, value)


# A chunk key of zarr v3 (``c.0.1`` or ``c/0/1``, ``c`` for a 0-d array) and the array it is of.
_CHUNK_KEY = re.compile(r"(?P<array>.+)/c(?:[./]\d+)*")


class IndexLocalStore(DurableLocalStore):
    """The index's store: a chunk of a data array (``masks``, ``stats/*``) that is read and not
    there is refused (:class:`StoreCorruptError`, naming the array), never read as fill values."""

    REQUIRED = re.compile(r"masks|stats/[^/]+")
    # Set on opening an index written by an earlier ramstream, which skipped chunks of zeros: the
    # commands that probe it again.
    probe_again: str | None = None

    async def get(
        self, key: str, prototype: BufferPrototype | None = None, byte_range: ByteRequest | None = None
    ) -> Buffer | None:
        value = await super().get(key, prototype, byte_range)
        if value is None:
            self._refuse_missing(key)
        return value

    async def get_partial_values(
        self, prototype: BufferPrototype, key_ranges: Iterable[tuple[str, ByteRequest | None]]
    ) -> list[Buffer | None]:
        wanted = list(key_ranges)
        values = await super().get_partial_values(prototype, wanted)
        for (key, _), value in zip(wanted, values, strict=True):
            if value is None:
                self._refuse_missing(key)
        return values

    def _refuse_missing(self, key: str) -> None:
        chunk = _CHUNK_KEY.fullmatch(key)
        if chunk is None or not self.REQUIRED.fullmatch(chunk["array"]):
            return
        lacks = f"{self.root}: the index array {chunk['array']!r} lacks its chunk {key[len(chunk['array']) + 1 :]!r}"
        if self.probe_again is not None:
            raise StoreCorruptError(
                f"{lacks}; this index was written by an earlier ramstream, which left out chunks whose values are "
                f"all zero, so the missing chunk cannot be told from a lost one: probe again into a new index "
                f"({self.probe_again}), then run the command again"
            )
        raise StoreCorruptError(
            f"{lacks}, which the index records as written (deleted, or lost by the disk); delete the index and run "
            "the command again"
        )


def open_group(path: Path, mode: str, *, index: bool = False, **kwargs: object) -> zarr.Group:
    """``zarr.open_group`` over a :class:`DurableLocalStore` (read-only for mode ``r``); an
    :class:`IndexLocalStore` for an ``index``."""
    kind = IndexLocalStore if index else DurableLocalStore
    store = kind(path, read_only=mode == "r")
    return zarr.open_group(store=store, mode=mode, zarr_format=3, **kwargs)  # type: ignore[arg-type]
