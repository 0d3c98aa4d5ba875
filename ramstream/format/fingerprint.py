"""Fingerprints of inputs: which file this is, and a digest of a few sampled ranges of its data.

They key the index cache and the "already merged" check, and guard a reused index against other
inputs, without reading everything. Name, size, mtime and header alone do not tell data apart:
fine-tunes of one base share names, sizes and headers, and equal mtimes are normal (reproducible
builds set them all to 1; ``tar``, ``cp -p``, ``rsync -a`` keep them). So each file also records
its identity (device, inode, ctime: ctime changes on every write, even when mtime is restored)
and a SHA-256 of ``SAMPLES`` ranges of ``SAMPLE_BYTES`` of every tensor (its start, middle and
end). Order matters: the key lists base, agent 1..N, so the same agents in another order differ.
A LoRA agent's ``adapter_config.json`` is digested whole: its alpha and ranks are its scales.
"""

from __future__ import annotations

import hashlib
import json
import mmap
import os
from collections.abc import Mapping
from pathlib import Path
from typing import Any

from ramstream.errors import InputError
from ramstream.format.checkpoint import Checkpoint, WeightsFile
from ramstream.format.regular import open_regular
from ramstream.format.safetensors_header import read_header

SAMPLES = 3
SAMPLE_BYTES = 4096


def checkpoint_fingerprint(checkpoint: Checkpoint) -> dict[str, object]:
    """A JSON-able record of every file of ``checkpoint`` (name, size, mtime, identity, digests),
    and the hub repo and commit it came from, if it did."""
    files = [_file_fingerprint(header) for header in checkpoint.headers]
    files += [_described_by(path) for path in checkpoint.described_by]
    hub = {"hub": checkpoint.hub.to_dict()} if checkpoint.hub is not None else {}
    return {"name": checkpoint.name, "path": str(checkpoint.path), "files": files, **hub}


def _file_fingerprint(header: WeightsFile) -> dict[str, object]:
    try:
        fd = open_regular(header.path)
    except OSError as exc:
        raise InputError(f"{header.path}: cannot read ({exc.strerror})") from exc
    try:
        stat = os.fstat(fd)
        sampled = _sampled_digest(fd, header)
    except OSError as exc:
        raise InputError(f"{header.path}: cannot read ({exc.strerror})") from exc
    finally:
        os.close(fd)
    return {
        "file": header.path.name,
        "size": stat.st_size,
        "mtime_ns": stat.st_mtime_ns,
        "identity": [stat.st_dev, stat.st_ino, stat.st_ctime_ns],
        "header_sha256": hashlib.sha256(header.header_bytes).hexdigest(),
        "data_sample_sha256": sampled,
    }


def _described_by(path: Path) -> dict[str, object]:
    """A small file whose every byte defines a checkpoint (a LoRA agent's ``adapter_config.json``:
    its scales), digested whole."""
    try:
        fd = open_regular(path)
        with os.fdopen(fd, "rb") as f:
            data = f.read()
    except OSError as exc:
        raise InputError(f"{path}: cannot read ({exc.strerror})") from exc
    return {"file": path.name, "size": len(data), "sha256": hashlib.sha256(data).hexdigest()}


def file_change(checkpoint: Path, recorded: Mapping[str, Any]) -> str | None:
    """How file ``recorded`` (an entry of ``checkpoint_fingerprint``'s ``files``) of the checkpoint
    at ``checkpoint`` differs now, said for a user (gone, resized, replaced, modified, rewritten);
    None when it is still the file fingerprinted."""
    name = recorded.get("file")
    if not isinstance(name, str) or not name or Path(name).name != name:
        return None
    path = checkpoint / name if checkpoint.is_dir() else checkpoint.parent / name
    try:
        stat = path.stat()
        whole = path.read_bytes() if "sha256" in recorded else None
    except FileNotFoundError:
        return f"{name} is gone"
    except OSError as exc:
        return f"{name} cannot be read: {exc.strerror}"
    if whole is not None:
        return None if hashlib.sha256(whole).hexdigest() == recorded["sha256"] else f"{name} was rewritten"
    if stat.st_size != recorded.get("size"):
        return f"{name} has another size"
    identity = recorded.get("identity")
    if isinstance(identity, list) and len(identity) == 3:
        if [stat.st_dev, stat.st_ino] != identity[:2]:
            return f"{name} was replaced by another file"
        if stat.st_ctime_ns != identity[2]:
            return f"{name} was modified"
    if stat.st_mtime_ns != recorded.get("mtime_ns"):
        return f"{name} was modified"
    return None


def written_fingerprint(path: Path) -> dict[str, object]:
    """What identifies the bytes of a file a merge wrote, and only them (no identity, no mtime: a
    resumed merge records what an uninterrupted one does): a safetensors file's size, header and
    sampled data, as for inputs; any other file's size and SHA-256, read in pieces.
    ``InputError``/``OSError`` when it cannot be read (gone, no longer safetensors)."""
    if path.suffix == ".safetensors":
        header = read_header(path)
        fingerprint = _file_fingerprint(header)
        return {k: fingerprint[k] for k in ("size", "header_sha256", "data_sample_sha256")}
    digest, size = hashlib.sha256(), 0
    fd = open_regular(path)
    with os.fdopen(fd, "rb") as f:
        while piece := f.read(1 << 20):
            digest.update(piece)
            size += len(piece)
    return {"size": size, "sha256": digest.hexdigest()}


def sample_ranges(offset: int, nbytes: int) -> list[tuple[int, int]]:
    """The byte ranges ``(start, stop)`` sampled from a tensor at ``offset``: the whole tensor
    when it is small, else ``SAMPLES`` ranges spread from its start to its end."""
    if nbytes <= SAMPLES * SAMPLE_BYTES:
        return [(offset, offset + nbytes)] if nbytes else []
    last = nbytes - SAMPLE_BYTES
    starts = [offset + last * k // (SAMPLES - 1) for k in range(SAMPLES)]
    return [(s, s + SAMPLE_BYTES) for s in starts]


def _sampled_digest(fd: int, header: WeightsFile) -> str:
    """SHA-256 of every tensor's sampled ranges, in header order, read through one read-only map
    of the file: no system call per tensor (an MoE checkpoint has tens of thousands)."""
    digest = hashlib.sha256()
    size = os.fstat(fd).st_size
    ranges = [r for entry in header.tensors for r in sample_ranges(entry.offset, entry.nbytes)]
    if not ranges:
        return digest.hexdigest()
    if max(stop for _, stop in ranges) > size:
        raise InputError(f"{header.path}: shorter than its header says; re-download or re-save it")
    with mmap.mmap(fd, 0, access=mmap.ACCESS_READ) as mm:
        view = memoryview(mm)
        try:
            for start, stop in ranges:
                digest.update(view[start:stop])
        finally:
            view.release()
    return digest.hexdigest()


def content_key(fingerprints: list[dict[str, object]], extra: dict[str, object]) -> str:
    """A short stable digest of the inputs (identity and contents, in order, not paths) plus ``extra``."""
    strip = [{"files": fp["files"]} for fp in fingerprints]
    blob = json.dumps({"inputs": strip, **extra}, sort_keys=True).encode()
    return hashlib.sha256(blob).hexdigest()[:20]
