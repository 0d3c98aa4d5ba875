"""Parse and validate a safetensors header without touching the tensor data.

The format: an 8-byte little-endian header length, a JSON object of
``name -> {dtype, shape, data_offsets}`` (plus optional ``__metadata__``), then the data.
Validation follows the reference implementation: a capped header size, known dtypes,
``numel * itemsize == end - begin`` without overflow, offsets contiguous from 0 with no gap or
overlap, and a data section that ends exactly at the end of the file.
"""

from __future__ import annotations

import json
import math
import os
import struct
from dataclasses import dataclass
from pathlib import Path

from ramstream.errors import CorruptFileError
from ramstream.format.dtypes import ITEMSIZE
from ramstream.format.regular import open_regular

MAX_HEADER_BYTES = 100_000_000


@dataclass(frozen=True)
class TensorEntry:
    """One tensor of a safetensors file: where its bytes are, relative to the file start."""

    name: str
    dtype: str
    shape: tuple[int, ...]
    offset: int
    nbytes: int

    @property
    def numel(self) -> int:
        return math.prod(self.shape)


# What a file that Git LFS has not fetched starts with: a pointer to the weights, ~130 bytes of text.
LFS_POINTER = b"version https://git-lfs.github.com/spec/"


@dataclass(frozen=True)
class SafetensorsHeader:
    path: Path
    tensors: tuple[TensorEntry, ...]
    metadata: dict[str, str]
    header_bytes: bytes
    file_size: int


def read_header(path: Path) -> SafetensorsHeader:
    """Read and validate the header of ``path``; raise ``CorruptFileError`` naming the file."""
    try:
        with os.fdopen(open_regular(path), "rb") as f:
            size = os.fstat(f.fileno()).st_size
            prefix = f.read(8)
            if len(prefix) < 8:
                raise CorruptFileError(f"{path}: file is {size} bytes, too short to be safetensors")
            (header_len,) = struct.unpack("<Q", prefix)
            if prefix == LFS_POINTER[:8] and (prefix + f.read(len(LFS_POINTER) - 8)) == LFS_POINTER:
                raise CorruptFileError(
                    f"{path}: a Git LFS pointer, not the weights (the repository was cloned without its LFS "
                    "files); run `git lfs pull` there, or download the file"
                )
            if header_len > MAX_HEADER_BYTES:
                raise CorruptFileError(
                    f"{path}: header claims {header_len} bytes (cap {MAX_HEADER_BYTES}); "
                    "the file is not safetensors or is corrupt"
                )
            if 8 + header_len > size:
                raise CorruptFileError(f"{path}: truncated inside the header; re-download or re-save it")
            raw = f.read(header_len)
    except OSError as exc:
        raise CorruptFileError(f"{path}: cannot read ({exc.strerror})") from exc
    return parse_header(path, raw, size)


def parse_header(path: Path, raw: bytes, file_size: int) -> SafetensorsHeader:
    """Validate the JSON header ``raw`` of a file of ``file_size`` bytes."""
    try:
        doc = json.loads(raw.decode("utf-8"), object_pairs_hook=_unique_keys)
    except _DuplicateKey as exc:
        raise CorruptFileError(
            f"{path}: header holds the key {exc} twice, which readers resolve differently; the file is corrupt"
        ) from None
    except (ValueError, RecursionError) as exc:  # bad UTF-8 or JSON, huge integers, absurd nesting
        raise CorruptFileError(f"{path}: header is not valid JSON ({exc}); the file is corrupt") from exc
    if not isinstance(doc, dict):
        raise CorruptFileError(f"{path}: header is not a JSON object")
    metadata = doc.pop("__metadata__", {})
    if not isinstance(metadata, dict) or not all(isinstance(v, str) for v in metadata.values()):
        raise CorruptFileError(f"{path}: __metadata__ is not an object of strings")
    data_start = 8 + len(raw)
    # One record per tensor, built once with its absolute offset: a 100 k-tensor MoE header
    # parses in a fraction of a second.
    entries = [_entry(path, name, spec, data_start) for name, spec in doc.items()]
    entries.sort(key=lambda e: (e.offset, e.offset + e.nbytes))
    expected = data_start
    for entry in entries:
        if entry.offset != expected:
            kind = "overlaps the previous tensor" if entry.offset < expected else "leaves a gap"
            raise CorruptFileError(f"{path}: tensor {entry.name!r} {kind} (offset {entry.offset - data_start})")
        expected = entry.offset + entry.nbytes
    if expected != file_size:
        what = "truncated" if expected > file_size else "has trailing bytes"
        raise CorruptFileError(
            f"{path}: file is {what} (header says {expected} bytes, file has {file_size}); re-download or re-save it"
        )
    return SafetensorsHeader(Path(path), tuple(entries), dict(metadata), raw, file_size)


class _DuplicateKey(Exception):
    """A JSON object that names a key twice (carries its repr): json keeps the last, others the first."""


def _unique_keys(pairs: list[tuple[str, object]]) -> dict[str, object]:
    doc: dict[str, object] = {}
    for key, value in pairs:
        if key in doc:
            raise _DuplicateKey(repr(key))
        doc[key] = value
    return doc


def _entry(path: Path, name: str, spec: object, data_start: int) -> TensorEntry:
    if not isinstance(spec, dict):
        raise CorruptFileError(f"{path}: tensor {name!r} has no dtype/shape/data_offsets object")
    dtype, shape, offsets = spec.get("dtype"), spec.get("shape"), spec.get("data_offsets")
    if not isinstance(dtype, str) or dtype not in ITEMSIZE:  # a list or an object is unhashable
        raise CorruptFileError(f"{path}: tensor {name!r} has unknown dtype {dtype!r}")
    if not isinstance(shape, list) or not all(_is_size(d) for d in shape):
        raise CorruptFileError(f"{path}: tensor {name!r} has an invalid shape {shape!r}")
    if (
        not isinstance(offsets, list)
        or len(offsets) != 2
        or not all(_is_size(o) for o in offsets)
        or offsets[1] < offsets[0]
    ):
        raise CorruptFileError(f"{path}: tensor {name!r} has invalid data_offsets {offsets!r}")
    nbytes = math.prod(shape) * ITEMSIZE[dtype]
    if nbytes != offsets[1] - offsets[0]:
        raise CorruptFileError(
            f"{path}: tensor {name!r} spans {offsets[1] - offsets[0]} bytes but {dtype}{shape} needs {nbytes}"
        )
    return TensorEntry(name, dtype, tuple(shape), data_start + offsets[0], nbytes)


def _is_size(value: object) -> bool:
    """A non-negative JSON integer (``bool`` is an ``int`` in Python, but not a size)."""
    return isinstance(value, int) and not isinstance(value, bool) and value >= 0
