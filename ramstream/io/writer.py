"""The output shards: a layout computed up front, then blocks written at fixed offsets.

Every tensor's place in every shard is known before the first block is merged, so the
headers are written first and any block can be written, in any order, with ``pwrite``; a
restarted merge simply writes the blocks its journal lacks. Shards are written under
``<out>/.ramstream/`` and renamed to their final names only once every block is in.
"""

from __future__ import annotations

import json
import os
from dataclasses import dataclass
from pathlib import Path

import numpy as np

from ramstream.errors import OutputError

HEADER_ALIGN = 8


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


def plan_shards(tensors: list[tuple[str, str, tuple[int, ...], int]], shard_size: int) -> ShardLayout:
    """Assign ``(name, dtype, shape, nbytes)`` tensors, in order, to shards of at most ``shard_size``."""
    groups: list[list[tuple[str, str, tuple[int, ...], int]]] = [[]]
    used = 0
    for item in tensors:
        if groups[-1] and used + item[3] > shard_size:
            groups.append([])
            used = 0
        groups[-1].append(item)
        used += item[3]
    count = len(groups)
    names = tuple(f"model-{i + 1:05d}-of-{count:05d}.safetensors" for i in range(count))
    headers, sizes, placements = [], [], {}
    for shard, group in enumerate(groups):
        doc: dict[str, object] = {"__metadata__": {"format": "pt"}}
        offset = 0
        for name, dtype, shape, nbytes in group:
            doc[name] = {"dtype": dtype, "shape": list(shape), "data_offsets": [offset, offset + nbytes]}
            offset += nbytes
        raw = json.dumps(doc, separators=(",", ":")).encode()
        raw += b" " * (-len(raw) % HEADER_ALIGN)
        header = len(raw).to_bytes(8, "little") + raw
        data_start = len(header)
        for name, dtype, _shape, nbytes in group:
            start = doc[name]["data_offsets"][0]  # type: ignore[index]
            placements[name] = Placement(shard, data_start + start, dtype, nbytes)
        headers.append(header)
        sizes.append(data_start + offset)
    return ShardLayout(names, tuple(headers), tuple(sizes), placements)


class ShardWriter:
    """Open (or reopen, on resume) the partial shard files and write blocks at their offsets."""

    def __init__(self, layout: ShardLayout, directory: Path) -> None:
        self.layout = layout
        self.directory = directory
        self._fds: list[int] = []
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

    def partial_path(self, name: str) -> Path:
        return self.directory / f"{name}.partial"

    def write(self, tensor: str, byte_start: int, data: memoryview | bytes | np.ndarray) -> None:
        """Write ``data`` at byte ``byte_start`` of ``tensor``'s data."""
        place = self.layout.placements[tensor]
        fd = self._fds[place.shard]
        offset = place.offset + byte_start
        view = memoryview(data).cast("B")  # type: ignore[arg-type]
        start, length = offset, len(view)
        try:
            while view:
                written = os.pwrite(fd, view, offset)
                view = view[written:]
                offset += written
            # Make the block durable, then let its (now clean) pages go: the journal may mark it
            # done, and the next block's writes reuse those pages instead of growing the page
            # cache (on a VM whose memory is backed lazily, touching fresh pages was the slowest
            # part of a merge).
            os.fdatasync(fd)
            os.posix_fadvise(fd, start, length, os.POSIX_FADV_DONTNEED)
        except OSError as exc:
            name = self.layout.names[place.shard]
            raise OutputError(
                f"{self.directory / name}: writing tensor {tensor!r} failed ({exc.strerror}); "
                "free space and rerun the same command to resume"
            ) from exc

    def sync(self) -> None:
        for fd in self._fds:
            os.fsync(fd)

    def close(self) -> None:
        for fd in self._fds:
            os.close(fd)
        self._fds.clear()
