"""Read a PyTorch checkpoint (``torch.save``'s zip format) without torch and without loading it.

The archive holds one folder: ``<folder>/data.pkl``, a pickle of the state dict whose tensors
point at storages by key (read by ``torch_pickle``), and one member ``<folder>/data/<key>`` per
storage, stored uncompressed. Each tensor becomes a ``TensorEntry`` whose offset is the absolute
position of its first element in the archive (member data start + offset × item size), so the
block readers stream it like a safetensors tensor; tensors may share a storage (their entries
then overlap, read-only).

An archive is read as ``torch.load`` reads it, or refused by name; no tensor's bytes come from
anywhere but its own member:

- a member name held twice, members whose data overlap each other or the central directory, a
  local header that names another member: refused (zipfile, torch and ramstream could each read
  other bytes);
- a storage's member holds exactly the bytes its first reference declares (torch checks the
  same); a key that later tensors reuse is that first storage, whatever they declare (as in
  ``torch.load``), and every tensor lies within it;
- what is read whole is capped: ``byteorder`` (``little``; ``big`` and anything else are named
  as they are), ``version``, ``.storage_alignment`` and ``.data/serialization_id`` (checked as
  ``torch.load`` checks them) at ``MAX_RECORD_BYTES``, and the pickle at ``MAX_PICKLE_BYTES``,
  stored as ``torch.save`` stores it, so it is never inflated from a smaller file. A file
  ramstream reads is one that ``torch.load(map_location="cpu")`` reads, to the same tensors;
- a compressed storage member, a non-contiguous tensor, big-endian data, dtypes and tensor kinds
  ramstream does not read, and the legacy (pre-1.6, non-zip) format are refused by name.
"""

from __future__ import annotations

import math
import os
import re
import shlex
import struct
import zipfile
import zlib
from dataclasses import dataclass
from pathlib import Path

from ramstream.errors import CorruptFileError, InputError, UnsupportedDtypeError, shown
from ramstream.format.dtypes import ITEMSIZE
from ramstream.format.regular import open_regular
from ramstream.format.safetensors_header import TensorEntry
from ramstream.format.torch_pickle import MAX_PICKLE_BYTES, Tensor, UnsafePickleError, Unsupported, load_state

__all__ = ["MAX_PICKLE_BYTES", "ZIP_MAGIC", "TorchZipHeader", "UnsafePickleError", "read_archive"]

ZIP_MAGIC = b"PK\x03\x04"
_LOCAL_HEADER = struct.Struct("<4s22xHH")  # signature, (fields we skip), name length, extra length
MAX_RECORD_BYTES = 64  # byteorder, version, .storage_alignment, .data/serialization_id (40 digits)
_VERSIONS = range(1, 11)  # the archive format versions torch.load reads (caffe2/serialize/versions.h)
_UTF8_NAME = 0x800


@dataclass(frozen=True)
class TorchZipHeader:
    """What ramstream knows of one ``.bin`` file: its tensors (absolute offsets), the pickle's
    bytes (fingerprinted like a safetensors header) and the file size."""

    path: Path
    tensors: tuple[TensorEntry, ...]
    header_bytes: bytes
    file_size: int


@dataclass(frozen=True, slots=True)
class _Member:
    """A member of the archive and where its data starts in the file (after its local header)."""

    info: zipfile.ZipInfo
    start: int

    @property
    def length(self) -> int:
        return self.info.compress_size

    @property
    def stored(self) -> bool:
        return self.info.compress_type == zipfile.ZIP_STORED and not self.info.flag_bits & 0x1


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
                return _read(path, fd, archive, size)
        except (
            zipfile.BadZipFile,
            zipfile.LargeZipFile,
            zlib.error,
            UnicodeDecodeError,
            EOFError,
            struct.error,
            NotImplementedError,
        ) as exc:
            raise CorruptFileError(
                f"{path}: not a valid PyTorch zip checkpoint ({exc}); re-download or re-save it"
            ) from exc
        except OSError as exc:
            raise CorruptFileError(f"{path}: cannot read ({exc.strerror or exc})") from exc


def _refuse_legacy(path: Path, start: bytes) -> None:
    if start == ZIP_MAGIC:
        return
    if start[:1] == b"\x80":  # a bare pickle: torch's format before 1.6 (_use_new_zipfile_serialization=False)
        code = f"import torch; torch.save(torch.load({str(path)!r}, weights_only=True), {str(path)!r})"
        raise InputError(
            f"{path}: is a PyTorch checkpoint in the legacy (non-zip) format, which ramstream does not read; "
            f"convert it with: python -c {shlex.quote(code)}"
        )
    raise CorruptFileError(f"{path}: not a PyTorch zip checkpoint nor safetensors; re-download or re-save it")


def _read(path: Path, fd: int, archive: zipfile.ZipFile, size: int) -> TorchZipHeader:
    infos = archive.infolist()
    _refuse_duplicates(path, infos)
    folder = _folder(path, infos)
    members = _members(path, fd, infos, archive.start_dir)
    _check_byteorder(path, archive, members.get(folder + "byteorder"))
    raw = _read_pickle(path, archive, members[folder + "data.pkl"])
    state = load_state(path, raw)
    _check_records(path, archive, members, folder)
    entries = tuple(_entry(path, name, value, folder, members) for name, value in state.items())
    return TorchZipHeader(Path(path), entries, raw, size)


def _refuse_duplicates(path: Path, infos: list[zipfile.ZipInfo]) -> None:
    seen: set[str] = set()
    for info in infos:
        if info.filename in seen:
            raise CorruptFileError(
                f"{path}: holds two members named {info.filename!r}, which readers resolve differently; "
                "re-download or re-save it"
            )
        seen.add(info.filename)


def _folder(path: Path, infos: list[zipfile.ZipInfo]) -> str:
    """The one folder of the archive (torch reads every record in the first member's folder)."""
    folder = infos[0].filename.partition("/")[0] + "/" if infos else "/"
    names = {info.filename for info in infos}
    if folder + "data.pkl" not in names or not all(name.startswith(folder) for name in names):
        raise CorruptFileError(f"{path}: a zip file but not a PyTorch checkpoint (not one folder holding data.pkl)")
    return folder


def _members(path: Path, fd: int, infos: list[zipfile.ZipInfo], directory: int) -> dict[str, _Member]:
    """Every member with the start of its data, read from its local header; their data must lie
    apart from each other and before the central directory (which starts at ``directory``)."""
    members = {}
    for info in infos:
        if not 0 <= info.header_offset <= directory - _LOCAL_HEADER.size:
            raise CorruptFileError(
                f"{path}: member {shown(info.filename)} lies outside the archive; re-download or re-save it"
            )
        signature, name_len, extra_len = _LOCAL_HEADER.unpack(os.pread(fd, _LOCAL_HEADER.size, info.header_offset))
        name = os.pread(fd, name_len, info.header_offset + _LOCAL_HEADER.size)
        if signature != ZIP_MAGIC or name.decode("utf-8" if info.flag_bits & _UTF8_NAME else "cp437") != (
            info.orig_filename
        ):
            raise CorruptFileError(
                f"{path}: member {shown(info.filename)} has a damaged local header; re-download or re-save it"
            )
        members[info.filename] = _Member(info, info.header_offset + _LOCAL_HEADER.size + name_len + extra_len)
    ordered = sorted(members.values(), key=lambda m: m.info.header_offset)
    for member, after in zip(ordered, [*ordered[1:], None], strict=True):
        limit = directory if after is None else after.info.header_offset
        if member.start + member.length > limit:
            other = "the central directory" if after is None else f"member {shown(after.info.filename)}"
            raise CorruptFileError(
                f"{path}: member {shown(member.info.filename)} overlaps {other}; re-download or re-save it"
            )
    return members


def _check_byteorder(path: Path, archive: zipfile.ZipFile, member: _Member | None) -> None:
    """``little`` (or no record: torch then reads little-endian); ``big`` and anything else refused."""
    value = _record(path, archive, member, "byteorder")
    if value == b"big":
        raise InputError(f"{path}: holds big-endian tensors; re-save it on a little-endian machine")
    if value not in (None, b"little"):
        raise CorruptFileError(
            f"{path}: its byteorder record says {value!r}, neither 'little' nor 'big'; re-download or re-save it"
        )


def _check_records(path: Path, archive: zipfile.ZipFile, members: dict[str, _Member], folder: str) -> None:
    """The records ``torch.load`` checks besides the pickle and the byteorder, checked as it checks
    them, used or not: the archive format version (1 to 10, read as C++ ``stoull`` reads it), the
    storage alignment (a Python integer) and the serialization id (UTF-8 text)."""
    member = members.get(folder + ".data/version") or members.get(folder + "version")
    version = _record(path, archive, member, "version")
    if version is None:
        raise CorruptFileError(
            f"{path}: has no version record, which torch.save always writes; re-download or re-save it"
        )
    number = re.match(rb"\s*\+?(\d+)", version)
    if number is None:
        raise CorruptFileError(f"{path}: its version record says {version!r}, not a number; re-download or re-save it")
    if int(number[1]) not in _VERSIONS:
        raise InputError(
            f"{path}: its archive format version is {int(number[1])}; ramstream, like torch.load, reads versions "
            f"{_VERSIONS.start} to {_VERSIONS.stop - 1}: re-save it with torch.save"
        )
    alignment = _record(path, archive, members.get(folder + ".storage_alignment"), ".storage_alignment")
    if alignment is not None and not _is_integer(alignment):
        raise CorruptFileError(
            f"{path}: its .storage_alignment record says {alignment!r}, not a number; re-download or re-save it"
        )
    identity = _record(path, archive, members.get(folder + ".data/serialization_id"), ".data/serialization_id")
    if identity is not None and not _is_text(identity):
        raise CorruptFileError(
            f"{path}: its .data/serialization_id record says {identity!r}, not text; re-download or re-save it"
        )


def _is_integer(raw: bytes) -> bool:
    try:
        int(raw)
    except ValueError:
        return False
    return True


def _is_text(raw: bytes) -> bool:
    try:
        raw.decode()
    except UnicodeDecodeError:
        return False
    return True


def _record(path: Path, archive: zipfile.ZipFile, member: _Member | None, what: str) -> bytes | None:
    """A small record read whole (None when absent); one longer than ``MAX_RECORD_BYTES`` is refused unread."""
    if member is None:
        return None
    if member.info.flag_bits & 0x1:
        raise CorruptFileError(f"{path}: its {what} record is encrypted; re-download or re-save it")
    if member.info.file_size > MAX_RECORD_BYTES:
        raise CorruptFileError(
            f"{path}: its {what} record is {member.info.file_size} bytes, too long for a {what}; "
            "re-download or re-save it"
        )
    with archive.open(member.info) as record:
        return record.read(MAX_RECORD_BYTES + 1)


def _read_pickle(path: Path, archive: zipfile.ZipFile, member: _Member) -> bytes:
    info = member.info
    if not member.stored:
        raise InputError(
            f"{path}: its pickle {shown(info.filename)} is compressed or encrypted, which torch.save never writes; "
            "re-save the checkpoint with torch.save"
        )
    if info.file_size > MAX_PICKLE_BYTES or info.file_size != info.compress_size:
        raise CorruptFileError(
            f"{path}: its pickle claims {info.file_size} bytes (cap {MAX_PICKLE_BYTES}); re-download or re-save it"
        )
    return archive.read(info)


def _entry(path: Path, name: str, value: Tensor | Unsupported, folder: str, members: dict[str, _Member]) -> TensorEntry:
    if isinstance(value, Unsupported):
        raise InputError(
            f"{path}: entry {name!r} is {value.what}, which ramstream does not read; save a state dict of plain tensors"
        )
    dtype, storage_dtype = _dtypes(path, name, value)
    member = _storage_member(path, name, value, members.get(f"{folder}data/{value.storage.key}"))
    nbytes = value.storage.numel * ITEMSIZE[storage_dtype]
    if nbytes != member.length:
        raise CorruptFileError(
            f"{path}: storage {value.storage.key!r} holds {member.length} bytes but tensor {name!r} declares "
            f"{nbytes}; re-download or re-save it"
        )
    itemsize = ITEMSIZE[dtype]
    numel = math.prod(value.shape)
    begin = value.offset * itemsize if numel else 0
    if begin + numel * itemsize > nbytes:
        raise CorruptFileError(f"{path}: tensor {name!r} runs past the end of its storage; re-download or re-save it")
    if numel > 1 and value.stride != contiguous_strides(value.shape, value.stride):
        raise InputError(
            f"{path}: tensor {name!r} is stored non-contiguous (stride {list(value.stride)} for shape "
            f"{list(value.shape)}); save a state dict of .contiguous() tensors"
        )
    return TensorEntry(name, dtype, value.shape, member.start + begin, numel * itemsize)


def _dtypes(path: Path, name: str, value: Tensor) -> tuple[str, str]:
    """The safetensors dtypes of a tensor and of its storage; those ramstream does not read are refused by name."""
    dtype, storage_dtype = value.dtype.dtype, value.storage.dtype.dtype
    if dtype is None or storage_dtype is None:
        torch_name = value.dtype.torch_name if dtype is None else value.storage.dtype.torch_name
        raise UnsupportedDtypeError(
            f"{path}: tensor {name!r} has dtype torch.{torch_name}, which ramstream does not read; "
            "convert the checkpoint to bf16, f16 or f32"
        )
    return dtype, storage_dtype


def _storage_member(path: Path, name: str, tensor: Tensor, member: _Member | None) -> _Member:
    if member is None:
        raise CorruptFileError(
            f"{path}: storage {tensor.storage.key!r} of tensor {name!r} is missing from the archive; "
            "re-download or re-save it"
        )
    if not member.stored:
        raise InputError(
            f"{path}: storage member {shown(member.info.filename)} is compressed or encrypted, so it cannot be read in "
            "place; re-save the checkpoint with torch.save (which stores members uncompressed)"
        )
    return member


def contiguous_strides(shape: tuple[int, ...], given: tuple[int, ...]) -> tuple[int, ...]:
    """Row-major strides of ``shape``; a dimension of size 1 keeps ``given``'s (any stride is contiguous there)."""
    strides = []
    step = 1
    for dim, stride in zip(reversed(shape), reversed(given), strict=True):
        strides.append(stride if dim == 1 else step)
        step *= dim
    return tuple(reversed(strides))
