"""Cheap fingerprints of inputs: size, mtime and a digest of each file's header.

They key the index cache and guard a reused index against other inputs, without reading data.
"""

from __future__ import annotations

import hashlib
import json
import os

from ramstream.format.checkpoint import Checkpoint


def checkpoint_fingerprint(checkpoint: Checkpoint) -> dict[str, object]:
    """A JSON-able record of every file of ``checkpoint`` (path, size, mtime, header digest)."""
    files = []
    for header in checkpoint.headers:
        stat = os.stat(header.path)
        files.append(
            {
                "file": header.path.name,
                "size": stat.st_size,
                "mtime_ns": stat.st_mtime_ns,
                "header_sha256": hashlib.sha256(header.header_bytes).hexdigest(),
            }
        )
    return {"name": checkpoint.name, "path": str(checkpoint.path), "files": files}


def content_key(fingerprints: list[dict[str, object]], extra: dict[str, object]) -> str:
    """A short stable digest of the inputs' contents (ignoring paths) plus ``extra`` settings."""
    strip = [{"files": fp["files"]} for fp in fingerprints]
    blob = json.dumps({"inputs": strip, **extra}, sort_keys=True).encode()
    return hashlib.sha256(blob).hexdigest()[:20]
