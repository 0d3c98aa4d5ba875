"""Find the tensors of a checkpoint: a Hugging Face directory (single or sharded) or one file."""

from __future__ import annotations

import json
import os
import stat
from collections.abc import Iterable
from dataclasses import dataclass
from pathlib import Path

from ramstream.errors import CorruptFileError, InputError
from ramstream.format.regular import kind_of
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
    mode = _mode(path)
    if stat.S_ISREG(mode):
        files, directory, name = [path], None, path.stem
    elif stat.S_ISDIR(mode):
        files, directory, name = _files_of_directory(path), path, path.name
    else:
        raise InputError(f"{path}: is {kind_of(mode)}, not a .safetensors file or a model directory; check the path")
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


def _mode(path: Path) -> int:
    """``path``'s file type, following symlinks; a missing path or a name the system refuses
    (too long, a symlink loop) is one ``InputError``."""
    try:
        return path.stat().st_mode
    except FileNotFoundError:
        raise InputError(f"{path}: no such file or directory") from None
    except OSError as exc:
        raise InputError(f"{path}: cannot be used ({exc.strerror}); check the path") from exc


def _files_of_directory(path: Path) -> list[Path]:
    try:
        return _find_files(path)
    except OSError as exc:  # a shard name too long for the file system, a symlink loop...
        raise InputError(f"{exc.filename or path}: cannot be used ({exc.strerror}); check the path") from exc


def _find_files(path: Path) -> list[Path]:
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
        return _distinct_files(path / s for s in shards)
    if (path / SINGLE_FILE).is_file():
        return [path / SINGLE_FILE]
    candidates = sorted(path.glob("*.safetensors"))
    if len(candidates) == 1:
        return candidates
    if not candidates:
        raise InputError(f"{path}: no model.safetensors, shard index or .safetensors file in this directory")
    raise InputError(f"{path}: several .safetensors files but no {SHARD_INDEX}; point at one file instead")


def _distinct_files(paths: Iterable[Path]) -> list[Path]:
    """Shards in order, each file once however the shard index spells it (``a``, ``./a``,
    ``sub/../a``, a link to it): a file listed twice must not read as a tensor in two files."""
    seen: set[tuple[int, int]] = set()
    files = []
    for p in paths:
        st = os.stat(p)
        if (st.st_dev, st.st_ino) not in seen:
            seen.add((st.st_dev, st.st_ino))
            files.append(p)
    return files
