"""Hand-built PyTorch zip checkpoints, for tests of files that lie.

A pickle is written through Python's own pickler with torch's globals named (``Global``), not
imported, and storages as the persistent ids ``torch.save`` writes; ``write_archive`` lays it
out as ``torch.save`` does (one folder, ``data.pkl``, ``byteorder``, ``data/<key>``, ``version``)
with ``zipfile``. Nothing here needs torch.
"""

from __future__ import annotations

import pickle
import struct
import warnings
import zipfile
from collections import OrderedDict
from collections.abc import Iterable
from dataclasses import dataclass
from pathlib import Path


@dataclass(frozen=True)
class Global:
    """A global as a pickle names it (``torch._utils._rebuild_tensor_v2``)."""

    dotted: str

    def __call__(self, *args: object) -> object:
        raise TypeError("a named global, not to be called")


@dataclass(frozen=True)
class Call:
    """Pickles as ``func(*args)``."""

    func: Global
    args: tuple[object, ...]

    def __reduce__(self) -> tuple[object, tuple[object, ...]]:
        return self.func, self.args


@dataclass(frozen=True)
class StorageRef:
    """A storage as ``torch.save`` refers to it: ``('storage', type, key, location, numel)``."""

    key: str
    type: str = "torch.FloatStorage"
    numel: int = 0


class _Writer(pickle._Pickler):  # the pure-Python pickler lets a global be written by name
    def persistent_id(self, obj: object) -> object:
        if isinstance(obj, StorageRef):
            return ("storage", Global(obj.type), obj.key, "cpu", obj.numel)
        return None

    def save(self, obj: object, save_persistent_id: bool = True) -> None:
        if isinstance(obj, Global):
            module, name = obj.dotted.rsplit(".", 1)
            self.write(pickle.GLOBAL + f"{module}\n{name}\n".encode())
            return
        super().save(obj, save_persistent_id)


def tensor(
    key: str,
    numel: int,
    shape: tuple[int, ...],
    *,
    storage: str = "torch.FloatStorage",
    offset: int = 0,
    stride: tuple[int, ...] | None = None,
) -> Call:
    """A tensor as ``torch.save`` pickles it: ``_rebuild_tensor_v2`` of a storage reference."""
    stride = stride if stride is not None else _contiguous(shape)
    ref = StorageRef(key, storage, numel)
    return Call(Global("torch._utils._rebuild_tensor_v2"), (ref, offset, shape, stride, False, OrderedDict()))


def dumps(state: object, protocol: int = 2) -> bytes:
    buffer = _Buffer()
    _Writer(buffer, protocol).dump(state)
    return bytes(buffer)


class _Buffer(bytearray):
    def write(self, data: bytes) -> int:
        self.extend(data)
        return len(data)


def write_archive(
    path: Path,
    pickled: bytes,
    members: Iterable[tuple[str, bytes]] = (),
    *,
    byteorder: bytes | None = b"little",
    version: bytes | None = b"3\n",
    folder: str = "archive",
) -> Path:
    """A zip laid out as ``torch.save``'s: ``members`` are ``(name in the folder, bytes)``, in order,
    a name may come twice."""
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", UserWarning)  # zipfile warns of a duplicate name
        with zipfile.ZipFile(path, "w") as archive:
            archive.writestr(f"{folder}/data.pkl", pickled)
            if byteorder is not None:
                archive.writestr(f"{folder}/byteorder", byteorder)
            for name, data in members:
                archive.writestr(f"{folder}/{name}", data)
            if version is not None:
                archive.writestr(f"{folder}/version", version)
    return path


def members_of(path: Path) -> list[tuple[str, bytes]]:
    """The members of a zip, in order, as ``(name, bytes)``."""
    with zipfile.ZipFile(path) as archive:
        return [(info.filename, archive.read(info)) for info in archive.infolist()]


def rezip(path: Path, members: Iterable[tuple[str, bytes]], compressed: Iterable[str] = ()) -> Path:
    """A zip of ``members`` (full names, in order; a name may come twice), stored unless named in ``compressed``."""
    deflated = set(compressed)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", UserWarning)
        with zipfile.ZipFile(path, "w") as archive:
            for name, data in members:
                kind = zipfile.ZIP_DEFLATED if name in deflated else zipfile.ZIP_STORED
                archive.writestr(name, data, compress_type=kind)
    return path


def _contiguous(shape: tuple[int, ...]) -> tuple[int, ...]:
    strides, step = [], 1
    for dim in reversed(shape):
        strides.append(step)
        step *= dim
    return tuple(reversed(strides))


def patch_central(
    path: Path, name: str, *, size: int | None = None, offset: int | None = None, flags: int | None = None
) -> None:
    """Rewrite the central directory entries named ``name`` of the zip at ``path``, in place: their
    sizes (compressed and not), the offset of their local header or their flag bits. The CRC is
    left as it was."""
    data = bytearray(path.read_bytes())
    with zipfile.ZipFile(path) as archive:
        pos = archive.start_dir
    while data[pos : pos + 4] == b"PK\x01\x02":
        name_len, extra_len, comment_len = struct.unpack_from("<HHH", data, pos + 28)
        if data[pos + 46 : pos + 46 + name_len].decode() == name:
            if size is not None:
                struct.pack_into("<II", data, pos + 20, size, size)
            if offset is not None:
                struct.pack_into("<I", data, pos + 42, offset)
            if flags is not None:
                struct.pack_into("<H", data, pos + 8, flags)
        pos += 46 + name_len + extra_len + comment_len
    path.write_bytes(data)
