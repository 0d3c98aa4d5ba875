"""Zarr's local store, with large chunks made durable and their pages dropped once written.

A probe writes hundreds of MB of masks. Left in the page cache, every chunk would need fresh
pages (the slowest part of a probe on a VM whose memory is backed lazily: ~0.2 GB/s against
~1.5 GB/s for recycled ones) and would be written back at the kernel's leisure. Chunks of at
least ``DROP_AT`` bytes are therefore written like zarr's own (temporary file, then rename) but
with ``fdatasync`` before the rename and the file's pages released after it: the page cache stays
flat, and a mask chunk is on disk before the journal can mark its block. Small chunks (counts,
journal bytes, metadata) keep zarr's plain write: syncing each would cost a disk round trip.
"""

from __future__ import annotations

import asyncio
import os
import uuid
from pathlib import Path

import numpy as np
import zarr
from zarr.core.buffer import Buffer
from zarr.storage import LocalStore

from ramstream.io import direct, os_hints

DROP_AT = 256 * 1024


def _put_durable(path: Path, value: Buffer) -> None:
    """A temporary file, its aligned body written with ``O_DIRECT`` (the tail through the page
    cache), synced, then renamed into place."""
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_suffix(f".{uuid.uuid4().hex}.partial")
    data = value.as_numpy_array().view(np.uint8).reshape(-1)
    try:
        fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o644)
        try:
            done = _write_body_direct(tmp, data)
            direct.pwrite_all(fd, data[done:], done)
            os_hints.sync_data(fd)
            os_hints.drop_cached(fd)
        finally:
            os.close(fd)
        tmp.replace(path)
    except BaseException:
        tmp.unlink(missing_ok=True)
        raise


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
        if len(value) < DROP_AT:
            await super().set(key, value)
            return
        if not self._is_open:
            await self._open()
        self._check_writable()
        await asyncio.to_thread(_put_durable, self.root / key, value)


def open_group(path: Path, mode: str, **kwargs: object) -> zarr.Group:
    """``zarr.open_group`` over a :class:`DurableLocalStore` (read-only for mode ``r``)."""
    store = DurableLocalStore(path, read_only=mode == "r")
    return zarr.open_group(store=store, mode=mode, zarr_format=3, **kwargs)  # type: ignore[arg-type]
