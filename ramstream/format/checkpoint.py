"""Find the tensors of a checkpoint: a Hugging Face directory (single or sharded) or one file."""

from __future__ import annotations

import json
from dataclasses import dataclass
from pathlib import Path

from ramstream.errors import CorruptFileError, InputError
from ramstream.format.safetensors_header import SafetensorsHeader, TensorEntry, read_header

SINGLE_FILE = "model.safetensors"
SHARD_INDEX = "model.safetensors.index.json"


@dataclass(frozen=True)
class TensorRef:
    """A tensor and the file holding it."""

    file: Path
    entry: TensorEntry

    @property
    def name(self) -> str:
        return self.entry.name


@dataclass(frozen=True)
class Checkpoint:
    """One model: its name, its directory (for config/tokenizer files) and its tensors in order."""

    name: str
    path: Path
    directory: Path | None
    headers: tuple[SafetensorsHeader, ...]
    tensors: dict[str, TensorRef]

    @property
    def files(self) -> tuple[Path, ...]:
        return tuple(h.path for h in self.headers)


def open_checkpoint(path: str | Path) -> Checkpoint:
    """Read the headers of the checkpoint at ``path``; the data stays on disk."""
    path = Path(path)
    if not path.exists():
        raise InputError(f"{path}: no such file or directory")
    if path.is_file():
        files, directory, name = [path], None, path.stem
    else:
        files, directory, name = _files_of_directory(path), path, path.name
    headers = tuple(read_header(f) for f in files)
    tensors: dict[str, TensorRef] = {}
    for header in headers:
        for entry in header.tensors:
            if entry.name in tensors:
                raise CorruptFileError(
                    f"{header.path}: tensor {entry.name!r} also appears in {tensors[entry.name].file}"
                )
            tensors[entry.name] = TensorRef(header.path, entry)
    if not tensors:
        raise InputError(f"{path}: holds no tensors")
    return Checkpoint(name, path.resolve(), directory, headers, tensors)


def _files_of_directory(path: Path) -> list[Path]:
    index = path / SHARD_INDEX
    if index.is_file():
        try:
            weight_map = json.loads(index.read_text())["weight_map"]
            shards = list(dict.fromkeys(weight_map.values()))
        except (OSError, ValueError, KeyError, TypeError, AttributeError) as exc:
            raise CorruptFileError(f"{index}: not a valid shard index ({exc})") from exc
        missing = [s for s in shards if not (path / s).is_file()]
        if missing:
            raise InputError(f"{index}: lists shard {missing[0]} which is missing from {path}")
        return [path / s for s in shards]
    if (path / SINGLE_FILE).is_file():
        return [path / SINGLE_FILE]
    candidates = sorted(path.glob("*.safetensors"))
    if len(candidates) == 1:
        return candidates
    if not candidates:
        raise InputError(f"{path}: no model.safetensors, shard index or .safetensors file in this directory")
    raise InputError(f"{path}: several .safetensors files but no {SHARD_INDEX}; point at one file instead")
