"""The output shards: a layout computed up front, then blocks written at fixed offsets.

Every tensor's place in every shard is known before the first block is merged, so the
headers are written first and any block can be written, in any order, with ``pwrite``; a
restarted merge simply writes the blocks its journal lacks. Shards are written under
``<out>/.ramstream/`` and renamed to their final names only once every block is in.

A block staged in a buffer from :meth:`ShardWriter.staging` sits at the same offset modulo
4096 (``io.direct.ALIGN``) in memory as in the file, so its aligned middle goes to the disk with
``O_DIRECT`` (no copy into the page cache, which on a 7B merge is gigabytes of memcpy and of
fresh pages); the unaligned head and tail, and every write where the file system refuses
``O_DIRECT`` (tmpfs, some network file systems), go through the page cache as before.
"""

from __future__ import annotations

import os
import threading
from dataclasses import dataclass
from pathlib import Path

import numpy as np

from ramstream.errors import OutputError
from ramstream.io import direct as direct_io
from ramstream.io import os_hints

DIRECT_MIN = 1 << 20  # smaller writes are not worth a second path


@dataclass(frozen=True)
class Placement:
    shard: int
    offset: int  # absolute byte offset of the tensor's data in its shard file
    dtype: str
    nbytes: int


@dataclass(frozen=True)
class ShardLayout:
    names: tuple[str, ...]
    headers: tuple[bytes, ...]
    sizes: tuple[int, ...]
    placements: dict[str, Placement]

    def weight_map(self) -> dict[str, str]:
        return {name: self.names[p.shard] for name, p in self.placements.items()}


class ShardWriter:
    """Open (or reopen, on resume) the partial shard files and write blocks at their offsets."""

    def __init__(self, layout: ShardLayout, directory: Path) -> None:
        self.layout = layout
        self.directory = directory
        self._fds: list[int] = []
        self._direct_fds: list[int | None] = []
        self._refused_fds: list[int] = []
        self._staging: dict[int, np.ndarray] = {}
        self._lock = threading.Lock()  # guards _direct_fds and _refused_fds (write-behind threads)
        for name, header, size in zip(layout.names, layout.headers, layout.sizes, strict=True):
            path = self.partial_path(name)
            try:
                fd = os.open(path, os.O_RDWR | os.O_CREAT, 0o644)
                if os.fstat(fd).st_size != size:
                    os.ftruncate(fd, size)
                os.pwrite(fd, header, 0)
            except OSError as exc:
                raise OutputError(
                    f"{path}: cannot create the output shard ({exc.strerror}); free space and rerun the same command"
                ) from exc
            self._fds.append(fd)
            self._direct_fds.append(direct_io.open_direct(path))

    def partial_path(self, name: str) -> Path:
        return self.directory / f"{name}.partial"

    def staging(self, slot: int, tensor: str, byte_start: int, count: int, dtype: np.dtype) -> np.ndarray:
        """A reusable buffer (one per ``slot``) for ``count`` elements bound for ``tensor`` at
        ``byte_start``, placed so that :meth:`write` can send its aligned middle with ``O_DIRECT``."""
        itemsize = np.dtype(dtype).itemsize
        nbytes = count * itemsize
        shift = (self.layout.placements[tensor].offset + byte_start) % direct_io.ALIGN
        if shift % itemsize:
            shift = 0  # the elements could not be aligned in memory: this block goes buffered
        self._staging[slot], view = direct_io.aligned_view(self._staging.get(slot), nbytes, shift)
        return view.view(dtype)

    def write(self, tensor: str, byte_start: int, data: memoryview | bytes | np.ndarray) -> None:
        """Write ``data`` at byte ``byte_start`` of ``tensor``'s data, durably."""
        place = self.layout.placements[tensor]
        fd = self._fds[place.shard]
        offset = place.offset + byte_start
        view = memoryview(data).cast("B")  # type: ignore[arg-type]
        try:
            with self._lock:
                direct = self._direct_fds[place.shard]
            if direct is not None and len(view) >= DIRECT_MIN and isinstance(data, np.ndarray):
                head = (-offset) % direct_io.ALIGN
                body = (len(view) - head) // direct_io.ALIGN * direct_io.ALIGN
                if (data.ctypes.data + head) % direct_io.ALIGN == 0 and body > 0:
                    if self._write_direct(place.shard, direct, view[head : head + body], offset + head):
                        direct_io.pwrite_all(fd, view[:head], offset)
                        direct_io.pwrite_all(fd, view[head + body :], offset + head + body)
                        self._settle(fd, offset, len(view))
                        return
            direct_io.pwrite_all(fd, view, offset)
            self._settle(fd, offset, len(view))
        except OSError as exc:
            name = self.layout.names[place.shard]
            raise OutputError(
                f"{self.directory / name}: writing tensor {tensor!r} failed ({exc.strerror}); "
                "free space and rerun the same command to resume"
            ) from exc

    def _write_direct(self, shard: int, direct: int, view: memoryview, offset: int) -> bool:
        """Write ``view`` with ``O_DIRECT`` on ``direct`` (the descriptor the caller read once);
        False (and buffered from now on) if it is refused. Several write-behind threads get
        here at once: the switch to buffered writes happens under the lock, once."""
        try:
            direct_io.pwrite_all(direct, view, offset)
        except OSError as exc:
            if not direct_io.refused(exc):
                raise
            with self._lock:
                if self._direct_fds[shard] == direct:
                    # Not closed here: another thread may be using it (closed in close()).
                    self._refused_fds.append(direct)
                    self._direct_fds[shard] = None
            return False
        return True

    @staticmethod
    def _settle(fd: int, offset: int, length: int) -> None:
        # Make the block durable, then let its (now clean) pages go: the journal may mark it
        # done, and the next block's writes reuse those pages instead of growing the page
        # cache (on a VM whose memory is backed lazily, touching fresh pages was the slowest
        # part of a merge).
        os_hints.sync_data(fd)
        os_hints.drop_cached(fd, offset, length)

    def sync(self) -> None:
        for fd in self._fds:
            os.fsync(fd)

    def close(self) -> None:
        for fd in [*self._fds, *(d for d in self._direct_fds if d is not None), *set(self._refused_fds)]:
            os.close(fd)
        self._fds.clear()
        self._direct_fds.clear()
        self._refused_fds.clear()
        self._staging.clear()
