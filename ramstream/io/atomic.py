"""Atomic small-file writes: write ``<path>.<uuid>.partial``, flush, fsync, then rename over."""

from __future__ import annotations

import os
import uuid
from pathlib import Path


def atomic_write_bytes(path: Path, data: bytes, tmp_dir: Path | None = None) -> None:
    """Replace ``path`` with ``data`` in one step; the temporary file lives in ``tmp_dir``
    (same filesystem) when given, so a kill never leaves debris beside ``path``."""
    tmp = (tmp_dir or path.parent) / f"{path.name}.{uuid.uuid4().hex}.partial"
    try:
        with open(tmp, "wb") as f:
            f.write(data)
            f.flush()
            os.fsync(f.fileno())
        os.replace(tmp, path)
    finally:
        if tmp.exists():
            tmp.unlink()


def atomic_write_text(path: Path, text: str, tmp_dir: Path | None = None) -> None:
    atomic_write_bytes(path, text.encode("utf-8"), tmp_dir)


def fsync_directory(path: Path) -> None:
    """Make renames inside ``path`` durable."""
    fd = os.open(path, os.O_RDONLY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)
