"""Find the tensors of a checkpoint: a Hugging Face directory (single or sharded), one file, or a
Hugging Face hub id resolved to its snapshot in the local cache.

Weights are safetensors or PyTorch ``.bin`` files (``torch.save``'s zip format, read in place by
``torch_zip``), told apart by their first bytes (a safetensors file named ``.bin`` is read as
safetensors); a directory holding both is read as safetensors, as ``from_pretrained`` does.
"""

from __future__ import annotations

import os
import stat
from collections.abc import Iterable
from dataclasses import dataclass, field, replace
from pathlib import Path

from ramstream.errors import AdapterError, ConfigError, CorruptFileError, InputError
from ramstream.format import torch_zip
from ramstream.format.hub import HubAccess, HubSource, Snapshot, is_repo_id, resolve_repo, snapshot_at
from ramstream.format.names import (
    ADAPTER_CONFIG,
    ADAPTER_WEIGHTS,
    BIN_FILE,
    BIN_INDEX,
    CONFIG_FILE,
    COPIED_FILES,
    SHARD_INDEX,
    SINGLE_FILE,
    shard_names,
)
from ramstream.format.regular import kind_of, open_regular
from ramstream.format.safetensors_header import SafetensorsHeader, TensorEntry, read_header
from ramstream.format.torch_zip import TorchZipHeader

TORCH_SUFFIXES = (".bin", ".pt", ".pth")

# One weights file as the rest of ramstream sees it: a path, tensors at absolute offsets, the
# bytes that describe them (fingerprinted) and the file size.
WeightsFile = SafetensorsHeader | TorchZipHeader


@dataclass(frozen=True)
class TensorRef:
    """A tensor and the file holding it."""

    file: Path
    entry: TensorEntry

    @property
    def name(self) -> str:
        return self.entry.name


@dataclass(frozen=True)
class DeltaRef:
    """A tensor given as its task vector rather than its weights (a LoRA agent, ``format.lora``):
    ``scale * (B @ A)`` in the tensor's layout, ``scale * (B @ A)^T`` when ``transposed``, with
    ``a`` = lora_A (r, in) and ``b`` = lora_B (out, r); zero where the adapter leaves the tensor
    alone (``a`` and ``b`` None). ``scale`` is a float32 value. ``blocks.lora`` computes it."""

    name: str
    shape: tuple[int, ...]
    a: TensorRef | None = None
    b: TensorRef | None = None
    scale: float = 0.0
    transposed: bool = False

    @property
    def rank(self) -> int:
        return 0 if self.a is None else self.a.entry.shape[0]


@dataclass(frozen=True)
class QuantRef:
    """A tensor stored quantized (``format.quantized``): its value is float32, element (i, j) of
    the 2-D ``weight`` (FP8) being ``f32(weight[i, j]) * f32(scale[i // block[0], j // block[1]])``.
    ``blocks.quantized`` computes it; the scale belongs to the weight and is never merged.

    ``layout`` "mxfp4" (gpt-oss's experts): ``weight`` is ``<name>_blocks`` (U8 [E, R, G, 16], two
    FP4 E2M1 values a byte, low nibble first), ``scale`` ``<name>_scales`` (U8 [E, R, G], one E8M0
    exponent per 32 values), and the tensor is their values transposed, [E, G * 32, R], as
    transformers dequantizes them: element (e, h, r) is ``fp4(blocks[e, r, h // 32, h % 32 // 2],
    nibble h % 2) * 2 ** (scales[e, r, h // 32] - 127)``; ``block`` is unused."""

    name: str
    weight: TensorRef
    scale: TensorRef
    block: tuple[int, int]  # rows, columns of the elements sharing one scale
    layout: str = "scaled"  # or "mxfp4"

    @property
    def shape(self) -> tuple[int, ...]:
        if self.layout == "mxfp4":
            experts, rows, groups, _ = self.weight.entry.shape
            return (experts, groups * 32, rows)
        return self.weight.entry.shape


@dataclass(frozen=True)
class QuantScheme:
    """How a checkpoint's ``config.json`` says its weights are quantized: ``method`` as its
    ``quant_method`` names it, a short ``summary`` for messages and the model card."""

    method: str
    summary: str


@dataclass(frozen=True)
class Checkpoint:
    """One model: its name, its directory (for config/tokenizer files), its tensors in order, and
    the hub repo and commit it was resolved from (None for a local path).

    A quantized checkpoint (``format.quantized``) keeps its quantized weights in ``tensors`` (their
    file's dtype, FP8) and describes them in ``quantized`` too; their scale tensors are in neither.

    A LoRA agent (``format.lora``) has its full tensors (``modules_to_save``) in ``tensors`` and
    every other merged tensor in ``deltas``, given as a task vector; ``described_by`` names the
    files besides the weights whose bytes define it (its ``adapter_config.json``: its scales)."""

    name: str
    path: Path
    directory: Path | None
    headers: tuple[WeightsFile, ...]
    tensors: dict[str, TensorRef]
    hub: HubSource | None = None
    deltas: dict[str, DeltaRef] = field(default_factory=dict)
    described_by: tuple[Path, ...] = ()
    quantized: dict[str, QuantRef] = field(default_factory=dict)  # tensors read dequantized (their scales apart)
    scheme: QuantScheme | None = None  # set when ``quantized`` is not empty
    # Static activation scales (``*.input_scale``): read by no method; written back, as they are,
    # beside an output in the checkpoint's own FP8 scheme, whose quantization_config names them.
    activation_scales: dict[str, TensorRef] = field(default_factory=dict)

    @property
    def files(self) -> tuple[Path, ...]:
        return tuple(h.path for h in self.headers)

    def dtype_of(self, name: str) -> str:
        """The dtype tensor ``name`` reaches the kernels in: its file's, or F32 for a task vector."""
        return "F32" if name in self.deltas else self.tensors[name].entry.dtype


def open_checkpoint(path: str | Path, hub: HubAccess | None = None) -> Checkpoint:
    """Read the headers of the checkpoint at ``path``; the data stays on disk. A ``path`` that
    does not exist but reads as ``org/name[@revision]`` is a hub id, resolved as ``hub`` says
    (default: huggingface_hub's cache, ``HF_HUB_CACHE`` / ``HF_HOME``). A path inside a Hugging
    Face cache is read as a snapshot: every file must lead inside its repo's cache folder."""
    text = str(path)
    snapshot: Snapshot | None
    if not os.path.lexists(text) and is_repo_id(text):
        snapshot = resolve_repo(text, hub or HubAccess())
        target, name = snapshot.folder, text
    else:
        target = Path(path)
        snapshot = snapshot_at(target if target.is_dir() else target.parent)
        name = None
    checkpoint = _open_path(target, snapshot)
    if snapshot is not None:
        checkpoint = replace(checkpoint, hub=snapshot.with_blobs(checkpoint.files))
    return checkpoint if name is None else replace(checkpoint, name=name)


def _open_path(path: Path, snapshot: Snapshot | None) -> Checkpoint:
    if snapshot is not None:
        snapshot.file(path)  # the file or the snapshot folder given leads inside the repo's folder
    mode = _mode(path)
    if stat.S_ISREG(mode):
        files, directory, name = [path], None, path.stem
    elif stat.S_ISDIR(mode):
        files, directory, name = _files_of_directory(path, snapshot), path, path.name
    else:
        raise InputError(f"{path}: is {kind_of(mode)}, not a weights file or a model directory; check the path")
    headers = tuple(read_weights_file(f) for f in files)
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


def read_weights_file(path: Path) -> WeightsFile:
    """The header of a safetensors file or the tensor table of a PyTorch zip checkpoint, told
    apart by their first bytes whatever the name: the zip signature, or a safetensors header
    (an 8-byte length, then ``{``). Other files named ``.bin``/``.pt``/``.pth`` go to the torch
    reader, which names the legacy format; the rest to the safetensors reader."""
    start = _first_bytes(path, 9)
    if start.startswith(torch_zip.ZIP_MAGIC):
        return torch_zip.read_archive(path)
    if path.suffix in TORCH_SUFFIXES and start[8:] != b"{":
        return torch_zip.read_archive(path)
    return read_header(path)


def _first_bytes(path: Path, count: int) -> bytes:
    """The first ``count`` bytes of a regular file (a FIFO or device is refused here, at once)."""
    try:
        fd = open_regular(path)
    except OSError:
        return b""  # the readers word the failure
    try:
        return os.pread(fd, count, 0)
    except OSError:
        return b""
    finally:
        os.close(fd)


def _mode(path: Path) -> int:
    """``path``'s file type, following symlinks; a missing path or a name the system refuses
    (too long, a symlink loop) is one ``InputError``."""
    try:
        return path.stat().st_mode
    except FileNotFoundError:
        raise InputError(f"{path}: no such file or directory") from None
    except OSError as exc:
        raise InputError(f"{path}: cannot be used ({exc.strerror}); check the path") from exc


def _files_of_directory(path: Path, snapshot: Snapshot | None) -> list[Path]:
    try:
        return _Directory(path, snapshot).weights_files()
    except OSError as exc:  # a shard name too long for the file system, a symlink loop...
        raise InputError(f"{exc.filename or path}: cannot be used ({exc.strerror}); check the path") from exc


@dataclass(frozen=True)
class _Directory:
    """A model directory; a cache snapshot's files must also lead inside its repo's folder."""

    path: Path
    snapshot: Snapshot | None

    def has(self, name: str) -> bool:
        """Whether the directory holds the file ``name`` (in a snapshot: as a link that leads
        inside the repo's folder to a file, or it is refused)."""
        if self.snapshot is None:
            return (self.path / name).is_file()
        return os.path.lexists(self.path / name) and self.snapshot.file(self.path / name).is_file()

    def weights_files(self) -> list[Path]:
        """The weights files, in ``from_pretrained``'s order of preference: safetensors (index,
        single file, the one ``.safetensors``), then ``.bin`` (index, single file). In a snapshot,
        the config and the files copied to the output are checked too: they are read later."""
        if self.snapshot is not None:  # read later (tied heads, the output's config and copies): checked now
            for name in (CONFIG_FILE, *COPIED_FILES):
                self.has(name)
        if self.has(ADAPTER_CONFIG):  # its adapter_model.safetensors would pass for a model's weights
            raise ConfigError(
                f"{self.path}: is a PEFT adapter ({ADAPTER_CONFIG}), not a model; give it as an AGENT from a local "
                "directory, after the BASE model it was trained from"
            )
        if self.has(SHARD_INDEX):
            return self.shards(SHARD_INDEX)
        if self.has(SINGLE_FILE):
            return [self.path / SINGLE_FILE]
        adapter = next((name for name in ADAPTER_WEIGHTS if self.has(name)), None)
        if adapter is not None:  # not a model missing its tensors: an adapter missing its config
            raise AdapterError(
                f"{self.path}: holds {adapter} but no {ADAPTER_CONFIG}: a PEFT adapter without its config (which "
                "gives its rank, alpha and targets); put the adapter_config.json it was saved with beside it"
            )
        candidates = sorted(p for p in self.path.glob("*.safetensors") if self.has(p.name))
        if len(candidates) > 1:
            raise InputError(f"{self.path}: several .safetensors files but no {SHARD_INDEX}; point at one file instead")
        if candidates:
            return candidates
        if self.has(BIN_INDEX):
            return self.shards(BIN_INDEX)
        if self.has(BIN_FILE):
            return [self.path / BIN_FILE]
        raise InputError(
            f"{self.path}: no model.safetensors, {BIN_FILE}, shard index or .safetensors file in this directory"
        )

    def shards(self, index_name: str) -> list[Path]:
        index = self.path / index_name
        shards = shard_names(index)
        if self.snapshot is not None:
            return _distinct_files(self.snapshot.file(self.path / s) for s in shards)
        missing = [s for s in shards if not (self.path / s).is_file()]
        if missing:
            raise InputError(f"{index}: lists shard {missing[0]} which is missing from {self.path}")
        return _distinct_files(self.path / s for s in shards)


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
