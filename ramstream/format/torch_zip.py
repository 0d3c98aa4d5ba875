"""Read a PyTorch checkpoint (``torch.save``'s zip format) without torch and without loading it.

The archive holds ``<prefix>/data.pkl``, a pickle of the state dict whose tensors point at
storages by key, and one member ``<prefix>/data/<key>`` per storage, stored uncompressed. The
pickle is read by an unpickler that admits only torch's tensor-rebuild functions, its storage
types and ``OrderedDict``, each replaced by a stand-in that records what it was given: nothing
in the file runs, and a pickle that asks for anything else (``os.system``, ``builtins.eval``)
is refused. Each tensor becomes a ``TensorEntry`` whose offset is the absolute position of its
first element in the archive (member data start + storage offset × item size), so the block
readers stream it like a safetensors tensor. Tensors may share a storage (their entries then
overlap, read-only); a compressed member, a non-contiguous tensor, big-endian data and the
legacy (pre-1.6, non-zip) format are refused by name.
"""

from __future__ import annotations

import io
import math
import os
import pickle
import struct
import zipfile
from collections import OrderedDict
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from ramstream.errors import CorruptFileError, InputError
from ramstream.format.dtypes import ITEMSIZE
from ramstream.format.regular import open_regular
from ramstream.format.safetensors_header import MAX_HEADER_BYTES, TensorEntry

ZIP_MAGIC = b"PK\x03\x04"
_LOCAL_HEADER = struct.Struct("<4s22xHH")  # signature, (fields we skip), name length, extra length

# torch's storage type names (``torch.BFloat16Storage``...) as safetensors dtypes.
STORAGE_DTYPES: dict[str, str] = {
    "BFloat16Storage": "BF16",
    "HalfStorage": "F16",
    "FloatStorage": "F32",
    "DoubleStorage": "F64",
    "ByteStorage": "U8",
    "CharStorage": "I8",
    "ShortStorage": "I16",
    "IntStorage": "I32",
    "LongStorage": "I64",
    "BoolStorage": "BOOL",
    "Float8_e4m3fnStorage": "F8_E4M3",
    "Float8_e5m2Storage": "F8_E5M2",
}


class UnsafePickleError(CorruptFileError):
    """A checkpoint's pickle that asks for a global beyond torch's tensor rebuilding."""


@dataclass(frozen=True)
class TorchZipHeader:
    """What ramstream knows of one ``.bin`` file: its tensors (absolute offsets), the pickle's
    bytes (fingerprinted like a safetensors header) and the file size."""

    path: Path
    tensors: tuple[TensorEntry, ...]
    header_bytes: bytes
    file_size: int


@dataclass(frozen=True, slots=True)
class _StorageType:
    dtype: str


@dataclass(frozen=True, slots=True)
class _Storage:
    key: str
    dtype: str
    numel: int


@dataclass(frozen=True, slots=True)
class _Tensor:
    storage: _Storage
    offset: int
    shape: tuple[int, ...]
    stride: tuple[int, ...]


def _rebuild_tensor(storage: Any, offset: Any, size: Any, stride: Any, *_rest: Any) -> _Tensor:
    """Stands in for ``torch._utils._rebuild_tensor_v2``: records where the tensor lies."""
    if not isinstance(storage, _Storage) or not _is_size(offset):
        raise pickle.UnpicklingError("a tensor without a storage")
    if not isinstance(size, tuple) or not isinstance(stride, tuple) or len(size) != len(stride):
        raise pickle.UnpicklingError("a tensor with an invalid size or stride")
    if not all(_is_size(d) for d in (*size, *stride)):
        raise pickle.UnpicklingError("a tensor with an invalid size or stride")
    return _Tensor(storage, offset, size, stride)


def _rebuild_parameter(data: Any, *_rest: Any) -> Any:
    """Stands in for ``torch._utils._rebuild_parameter``: a parameter is its tensor."""
    return data


_ALLOWED: dict[tuple[str, str], Callable[..., Any] | _StorageType | type] = {
    ("torch._utils", "_rebuild_tensor_v2"): _rebuild_tensor,
    ("torch._utils", "_rebuild_parameter"): _rebuild_parameter,
    ("collections", "OrderedDict"): OrderedDict,
    **{("torch", name): _StorageType(dtype) for name, dtype in STORAGE_DTYPES.items()},
}


class _RestrictedUnpickler(pickle.Unpickler):
    """Resolves only the globals of ``_ALLOWED``, to stand-ins; storages become ``_Storage`` records."""

    def find_class(self, module: str, name: str) -> Any:
        allowed = _ALLOWED.get((module, name))
        if allowed is None:
            raise _Refused(f"{module}.{name}")
        return allowed

    def persistent_load(self, pid: Any) -> _Storage:
        if (
            isinstance(pid, tuple)
            and len(pid) == 5
            and pid[0] == "storage"
            and isinstance(pid[1], _StorageType)
            and isinstance(pid[2], str)
            and _is_size(pid[4])
        ):
            return _Storage(pid[2], pid[1].dtype, pid[4])
        raise pickle.UnpicklingError("a persistent id that is not a tensor storage")


class _Refused(Exception):
    """A global outside ``_ALLOWED`` (carries its dotted name)."""


def read_archive(path: Path) -> TorchZipHeader:
    """The tensors of the PyTorch zip checkpoint at ``path``; raise naming the file (and tensor)."""
    try:
        fd = open_regular(path)
    except OSError as exc:
        raise CorruptFileError(f"{path}: cannot read ({exc.strerror})") from exc
    with os.fdopen(fd, "rb") as f:
        try:
            size = os.fstat(fd).st_size
            _refuse_legacy(path, os.pread(fd, 4, 0))
            with zipfile.ZipFile(f) as archive:
                return _read(path, f, archive, size)
        except (zipfile.BadZipFile, zipfile.LargeZipFile, EOFError, struct.error, NotImplementedError) as exc:
            raise CorruptFileError(
                f"{path}: not a valid PyTorch zip checkpoint ({exc}); re-download or re-save it"
            ) from exc
        except OSError as exc:
            raise CorruptFileError(f"{path}: cannot read ({exc.strerror or exc})") from exc


def _refuse_legacy(path: Path, start: bytes) -> None:
    if start == ZIP_MAGIC:
        return
    if start[:1] == b"\x80":  # a bare pickle: torch's format before 1.6 (_use_new_zipfile_serialization=False)
        raise InputError(
            f"{path}: is a PyTorch checkpoint in the legacy (non-zip) format, which ramstream does not read; convert "
            f"it with: python -c \"import torch; torch.save(torch.load('{path}', weights_only=True), '{path}')\""
        )
    raise CorruptFileError(f"{path}: not a PyTorch zip checkpoint nor safetensors; re-download or re-save it")


def _read(path: Path, f: io.BufferedReader, archive: zipfile.ZipFile, size: int) -> TorchZipHeader:
    pickles = [i for i in archive.infolist() if i.filename.endswith("/data.pkl") and i.filename.count("/") == 1]
    if len(pickles) != 1:
        raise CorruptFileError(f"{path}: a zip file but not a PyTorch checkpoint (no single <name>/data.pkl)")
    prefix = pickles[0].filename[: -len("data.pkl")]
    if pickles[0].file_size > MAX_HEADER_BYTES:
        raise CorruptFileError(f"{path}: its pickle claims {pickles[0].file_size} bytes (cap {MAX_HEADER_BYTES})")
    members = {i.filename: i for i in archive.infolist()}
    order = members.get(prefix + "byteorder")
    if order is not None and archive.read(order).strip() != b"little":
        raise InputError(f"{path}: holds big-endian tensors; re-save it on a little-endian machine")
    raw = archive.read(pickles[0])
    state = _unpickle(path, raw)
    starts: dict[str, tuple[int, int]] = {}
    entries = []
    for name, tensor in state.items():
        storage = tensor.storage
        if storage.key not in starts:
            starts[storage.key] = _member_data(path, f, members.get(f"{prefix}data/{storage.key}"), storage, size)
        entries.append(_entry(path, name, tensor, starts[storage.key]))
    return TorchZipHeader(Path(path), tuple(entries), raw, size)


def _unpickle(path: Path, raw: bytes) -> dict[str, _Tensor]:
    try:
        state = _RestrictedUnpickler(io.BytesIO(raw)).load()
    except _Refused as exc:
        raise UnsafePickleError(
            f"{path}: its pickle asks for {exc}, which a checkpoint of tensors never needs; refused without running "
            "anything (the file may be malicious: do not torch.load it)"
        ) from None
    except (pickle.UnpicklingError, EOFError, ValueError, TypeError, AttributeError, IndexError, KeyError) as exc:
        raise CorruptFileError(f"{path}: its pickle cannot be read ({exc}); re-download or re-save it") from None
    except RecursionError:
        raise CorruptFileError(f"{path}: its pickle is nested too deeply; re-download or re-save it") from None
    if not isinstance(state, dict):
        raise InputError(
            f"{path}: holds a {type(state).__name__}, not a state dict of tensors; save model.state_dict()"
        )
    for name, value in state.items():
        if not isinstance(name, str) or not isinstance(value, _Tensor):
            raise InputError(f"{path}: entry {name!r} is not a tensor; ramstream reads state dicts of tensors only")
    return state


def _member_data(
    path: Path, f: io.BufferedReader, info: zipfile.ZipInfo | None, storage: _Storage, size: int
) -> tuple[int, int]:
    """Where a storage's member's data starts in the file, and its length; it must be stored as is."""
    if info is None:
        raise CorruptFileError(
            f"{path}: storage {storage.key!r} is missing from the archive; re-download or re-save it"
        )
    if info.compress_type != zipfile.ZIP_STORED or info.flag_bits & 0x1:
        raise InputError(
            f"{path}: storage member {info.filename} is compressed or encrypted, so it cannot be read in place; "
            "re-save the checkpoint with torch.save (which stores members uncompressed)"
        )
    f.seek(info.header_offset)
    signature, name_len, extra_len = _LOCAL_HEADER.unpack(f.read(_LOCAL_HEADER.size))
    if signature != ZIP_MAGIC:
        raise CorruptFileError(f"{path}: member {info.filename} has a damaged local header; re-download or re-save it")
    start = info.header_offset + _LOCAL_HEADER.size + name_len + extra_len
    if start + info.file_size > size or storage.numel * ITEMSIZE[storage.dtype] > info.file_size:
        raise CorruptFileError(f"{path}: storage {storage.key!r} is truncated; re-download or re-save it")
    return start, info.file_size


def _entry(path: Path, name: str, tensor: _Tensor, member: tuple[int, int]) -> TensorEntry:
    itemsize = ITEMSIZE[tensor.storage.dtype]
    numel = math.prod(tensor.shape)
    if numel and tensor.offset + numel > tensor.storage.numel:
        raise CorruptFileError(f"{path}: tensor {name!r} runs past the end of its storage; re-download or re-save it")
    if numel > 1 and tensor.stride != contiguous_strides(tensor.shape, tensor.stride):
        raise InputError(
            f"{path}: tensor {name!r} is stored non-contiguous (stride {list(tensor.stride)} for shape "
            f"{list(tensor.shape)}); save a state dict of .contiguous() tensors"
        )
    start, _length = member
    return TensorEntry(name, tensor.storage.dtype, tensor.shape, start + tensor.offset * itemsize, numel * itemsize)


def contiguous_strides(shape: tuple[int, ...], given: tuple[int, ...]) -> tuple[int, ...]:
    """Row-major strides of ``shape``; a dimension of size 1 keeps ``given``'s (any stride is contiguous there)."""
    strides = []
    step = 1
    for dim, stride in zip(reversed(shape), reversed(given), strict=True):
        strides.append(stride if dim == 1 else step)
        step *= dim
    return tuple(reversed(strides))


def _is_size(value: object) -> bool:
    return isinstance(value, int) and not isinstance(value, bool) and value >= 0
