"""Refusing outputs that cannot fit on their disk, before any pass reads a byte.

A merge finds out that its disk is full at the last shard, hours in; a sweep writes K models, so
it is K times likelier to. What each output still needs is known up front: its shards' sizes
(the layout) and the base's copied files, less what its partial shards already hold (they are
sparse files, so a resumed merge counts only the blocks written). Outputs are grouped by file
system, and each group's need is compared with the space free there.
"""

from __future__ import annotations

import os
import shutil
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path

from ramstream.errors import OutputError
from ramstream.io.writer import ShardLayout


@dataclass(frozen=True)
class OutputNeed:
    out: Path
    nbytes: int  # bytes still to be written there


def output_need(out: Path, work: Path, layout: ShardLayout, copied: Sequence[Path]) -> OutputNeed:
    """The bytes ``out`` still needs: its shards and copied files, less what ``work`` holds."""
    total = sum(layout.sizes) + sum(_size(p) for p in copied)
    shards = zip(layout.names, layout.sizes, strict=True)
    written = sum(min(_allocated(work / f"{name}.partial"), size) for name, size in shards)
    return OutputNeed(out, max(0, total - written))


def check_free_space(needs: Sequence[OutputNeed], what: str) -> None:
    """Refuse, naming the bytes, when the outputs on one file system need more than it has free.

    ``what`` names the outputs in the message ("the merged model", "6 candidates")."""
    by_device: dict[int, tuple[Path, int]] = {}
    for need in needs:
        anchor = _existing(need.out)
        device = os.stat(anchor).st_dev
        _, total = by_device.get(device, (anchor, 0))
        by_device[device] = (anchor, total + need.nbytes)
    # The directory the user named: the output, or the sweep's directory holding the candidates.
    where = needs[0].out if len(needs) == 1 else Path(os.path.commonpath([n.out for n in needs]))
    for anchor, nbytes in by_device.values():
        free = shutil.disk_usage(anchor).free
        if nbytes > free:
            raise OutputError(
                f"{where}: writing {what} needs {_gib(nbytes)} ({nbytes} bytes) on this disk, which has "
                f"{_gib(free)} free; free space or choose another --out"
            )


def _existing(path: Path) -> Path:
    """``path`` or its nearest existing parent (an output is created only once it is checked)."""
    for candidate in (path, *path.absolute().parents):
        if candidate.exists():
            return candidate
    return Path("/")


def _size(path: Path) -> int:
    try:
        return path.stat().st_size
    except OSError:
        return 0


def _allocated(path: Path) -> int:
    try:
        return path.stat().st_blocks * 512
    except OSError:
        return 0


def _gib(nbytes: int) -> str:
    return f"{nbytes / (1 << 30):.2f} GiB"
