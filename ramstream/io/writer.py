"""The output shards: a layout computed up front, then blocks written at fixed offsets.

Every tensor's place in every shard is known before the first block is merged, so the headers are
written first and any block can be written, in any order, with ``pwrite``; a restarted merge simply
writes the blocks its journal lacks. Shards are written under ``<out>/.ramstream/`` and renamed to
their final names only once every block is in.

A batch's blocks are staged as runs (blocks that lie back to back in one shard, as a batch of expert
tensors does), each written with one call, and every shard a batch touched is synced once
(``write_runs``), not once per block. A run staged by :meth:`ShardWriter.staging_runs` sits at the
same offset modulo 4096 (``io.direct.ALIGN``) in memory as in the file, so its aligned middle goes
to the disk with ``O_DIRECT`` (no copy into the page cache, which on a 7B merge is gigabytes of
memcpy and of fresh pages); the unaligned head and tail, and every write where the file system
refuses ``O_DIRECT`` (tmpfs, some network file systems), go through the page cache as before.
"""

from __future__ import annotations

import os
import threading
from collections.abc import Sequence
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
class Run:
    """Bytes ``[offset, offset + nbytes)`` of shard ``shard`` (absolute offsets).

    ``congruent``: staged at its file offset modulo ``ALIGN`` (its middle can go with ``O_DIRECT``);
    False for a run whose elements would then be misaligned in memory (a file offset that is not a
    multiple of their size): staged at an ``ALIGN`` boundary and written through the page cache."""

    shard: int
    offset: int
    nbytes: int
    congruent: bool = True


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
        (view,) = self.staging_runs(slot, [self.run_of(tensor, byte_start, count * itemsize, itemsize)])
        return view.view(dtype)

    def run_of(self, tensor: str, byte_start: int, nbytes: int, itemsize: int = 1) -> Run:
        """Where ``nbytes`` bytes from byte ``byte_start`` of ``tensor``'s data go; elements of
        ``itemsize`` bytes at a file offset that is not a multiple of it could not be aligned in
        memory there, so such a run is not staged congruent (it goes through the page cache)."""
        place = self.layout.placements[tensor]
        offset = place.offset + byte_start
        return Run(place.shard, offset, nbytes, congruent=offset % itemsize == 0)

    def staging_runs(self, slot: int, runs: list[Run], allocate: direct_io.Allocate | None = None) -> list[np.ndarray]:
        """Reusable byte buffers (one allocation per ``slot``, from ``allocate`` where given: the
        backend's host memory, which its results reach without a copy) for ``runs``, each placed
        at its file offset modulo ``ALIGN`` so that :meth:`write_runs` sends its middle with
        ``O_DIRECT``."""
        align = direct_io.ALIGN
        spans, total = [], 0
        for run in runs:
            total += ((run.offset if run.congruent else 0) - total) % align
            spans.append((total, run.nbytes))
            total += run.nbytes
        self._staging[slot], whole = direct_io.aligned_view(self._staging.get(slot), total, allocate=allocate)
        return [whole[start : start + n] for start, n in spans]

    def write(self, tensor: str, byte_start: int, data: memoryview | bytes | np.ndarray) -> None:
        """Write ``data`` at byte ``byte_start`` of ``tensor``'s data, durably."""
        view = memoryview(data).cast("B")  # type: ignore[arg-type]
        self.write_runs([(self.run_of(tensor, byte_start, len(view)), data)])

    def write_runs(self, runs: Sequence[tuple[Run, memoryview | bytes | np.ndarray]]) -> None:
        """Write each run's data, then make them durable: one data sync per shard touched."""
        touched: dict[int, list[Run]] = {}
        for run, data in runs:
            self._write_run(run, data)
            touched.setdefault(run.shard, []).append(run)
        for shard, written in touched.items():
            fd = self._fds[shard]
            try:
                os_hints.sync_data(fd)
            except OSError as exc:
                raise self._failed(shard, exc) from exc
            # Durable, so the (now clean) pages may go: the next writes reuse them instead of
            # growing the page cache (on a VM whose memory is backed lazily, touching fresh
            # pages was the slowest part of a merge).
            for run in written:
                os_hints.drop_cached(fd, run.offset, run.nbytes)

    def _write_run(self, run: Run, data: memoryview | bytes | np.ndarray) -> None:
        fd = self._fds[run.shard]
        offset = run.offset
        view = memoryview(data).cast("B")  # type: ignore[arg-type]
        try:
            with self._lock:
                direct = self._direct_fds[run.shard]
            if direct is not None and len(view) >= DIRECT_MIN and isinstance(data, np.ndarray):
                head = (-offset) % direct_io.ALIGN
                body = (len(view) - head) // direct_io.ALIGN * direct_io.ALIGN
                if (data.ctypes.data + head) % direct_io.ALIGN == 0 and body > 0:
                    if self._write_direct(run.shard, direct, view[head : head + body], offset + head):
                        direct_io.pwrite_all(fd, view[:head], offset)
                        direct_io.pwrite_all(fd, view[head + body :], offset + head + body)
                        return
            direct_io.pwrite_all(fd, view, offset)
        except OSError as exc:
            raise self._failed(run.shard, exc) from exc

    def _failed(self, shard: int, exc: OSError) -> OutputError:
        return OutputError(
            f"{self.directory / self.layout.names[shard]}: writing the merged tensors failed ({exc.strerror}); "
            "free space and rerun the same command to resume"
        )

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
