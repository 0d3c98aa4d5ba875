"""Mutations of real weights files, and what reading one may give: the fuzz of the ``.bin`` reader
and of the safetensors header parser (``tests/test_fuzz_readers.py`` runs a bounded number of
examples, ``tools/fuzz_readers.py`` as many as asked).

A seed is a real file: a small state dict written by ``torch.save`` (bf16, f32, f16, int64 and
uint16 tensors, two names for one tensor, a row of it, a scalar, an empty tensor), or a small
safetensors file written by the ``safetensors`` package. A mutation edits its bytes (flip, put a
boundary integer, cut, insert, delete, copy a range), with positions drawn over the whole file
or the bytes that describe it (the pickle, the zip headers and central directory; the JSON
header); or, for a ``.bin``, edits its members and rebuilds the zip with ``zipfile``, so CRCs and
sizes agree and the edit reaches the pickle reader (edit the pickle or a storage, drop, repeat
or swap members).

The only allowed outcomes of reading a mutant (``outcome``): a ``RamstreamError`` of one line
naming the file, or tensors that are right: the seed's own, or exactly what the reference reader
gives for the mutant (``torch.load(map_location="cpu", weights_only=True)``, as ramstream reads
a storage whatever device it names; ``safetensors.deserialize``). Never another exception, never
other bytes; and the read allocates at most ``BUDGET`` bytes (traced by ``tracemalloc``, which
sees the C unpickler's and the JSON parser's allocations).
"""

from __future__ import annotations

import io
import tracemalloc
import warnings
import zipfile
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from pathlib import Path
from types import ModuleType
from typing import Any

from hypothesis import strategies as st

from ramstream.errors import RamstreamError
from ramstream.format.checkpoint import read_weights_file
from tests.torch_archives import rezip

BUDGET = 16 * 2**20

Read = dict[str, tuple[str, tuple[int, ...], bytes]]
Reference = Callable[[Path], "Read | Exception"]

_INTEGERS = [0, 1, 0x7F, 0x80, 0xFF, 0x7FFF, 0xFFFF, 2**25, 2**31 - 1, 2**31, 2**32 - 1, 2**40, 2**63 - 1, 2**64 - 1]
INTERESTING = sorted(
    {v.to_bytes(n, "little") for v in _INTEGERS for n in (1, 2, 4, 8) if v < 2 ** (8 * n)}, key=lambda b: (len(b), b)
)


@dataclass(frozen=True)
class Seed:
    """A real file to mutate: its name (the suffix picks nothing, the bytes do), its bytes, the
    positions of the bytes that describe its tensors, and its tensors as they were saved."""

    name: str
    data: bytes
    hot: tuple[int, ...]
    tensors: Read


def read(path: Path) -> Read:
    """Every tensor ramstream finds in ``path``: dtype, shape and the bytes at its offset."""
    header = read_weights_file(path)
    data = path.read_bytes()
    return {e.name: (e.dtype, e.shape, data[e.offset : e.offset + e.nbytes]) for e in header.tensors}


def outcome(path: Path, seed: Seed, reference: Reference) -> str:
    """Read the mutant at ``path``; fail unless the outcome is allowed. Returns its kind."""
    tracemalloc.start()
    try:
        got: Read | RamstreamError = read(path)
    except RamstreamError as exc:
        got = exc
    finally:
        peak = tracemalloc.get_traced_memory()[1]
        tracemalloc.stop()
    assert peak < BUDGET, f"reading a {path.stat().st_size}-byte file allocated {peak} bytes"
    if isinstance(got, RamstreamError):
        message = str(got)
        assert "\n" not in message and message.startswith(f"{path}: "), message
        return f"refused ({type(got).__name__})"
    if got == seed.tensors:
        return "read as saved"
    theirs = reference(path)
    assert got == theirs, f"ramstream read {_summary(got)}; the reference gives {_summary(theirs)}"
    return "read as the reference reads it"


def _summary(value: Read | Exception) -> str:
    if isinstance(value, Exception):
        return f"{type(value).__name__}: {value}"[:300]
    return repr({name: (dtype, shape, data[:16].hex()) for name, (dtype, shape, data) in value.items()})[:600]


# -- edits --------------------------------------------------------------------------------------

Edit = tuple[Any, ...]


def byte_edits(size: int, hot: Sequence[int] = ()) -> st.SearchStrategy[list[Edit]]:
    """One to three edits of a ``size``-byte string; positions are taken modulo the current length."""
    anywhere = st.integers(0, max(size - 1, 0))
    at = st.one_of(anywhere, st.sampled_from(hot)) if hot else anywhere
    edit = st.one_of(
        st.tuples(st.just("xor"), at, st.integers(1, 255)),
        st.tuples(st.just("put"), at, st.sampled_from(INTERESTING)),
        st.tuples(st.just("cut"), at),
        st.tuples(st.just("insert"), at, st.binary(min_size=1, max_size=16)),
        st.tuples(st.just("delete"), at, st.integers(1, 64)),
        st.tuples(st.just("copy"), at, at, st.integers(1, 64)),
    )
    return st.lists(edit, min_size=1, max_size=3)


def apply(data: bytes, edits: Sequence[Edit]) -> bytes:
    out = bytearray(data)
    for kind, at, *rest in edits:
        at %= max(len(out), 1)
        if kind == "xor" and out:
            out[at] ^= rest[0]
        elif kind == "put":
            out[at : at + len(rest[0])] = rest[0]
        elif kind == "cut":
            del out[at:]
        elif kind == "insert":
            out[at:at] = rest[0]
        elif kind == "delete":
            del out[at : at + rest[0]]
        elif kind == "copy":
            source = rest[0] % max(len(out), 1)
            out[at : at + rest[1]] = out[source : source + rest[1]]
    return bytes(out)


def member_edits() -> st.SearchStrategy[list[Edit]]:
    """One to three edits of a ``.bin``'s members (by index, modulo their number)."""
    index = st.integers(0, 15)
    edit = st.one_of(
        st.tuples(st.just("pickle"), byte_edits(2048)),
        st.tuples(st.just("member"), index, byte_edits(64)),
        st.tuples(st.just("drop"), index),
        st.tuples(st.just("twice"), index),
        st.tuples(st.just("swap"), index, index),
    )
    return st.lists(edit, min_size=1, max_size=3)


def apply_to_members(seed: Seed, edits: Sequence[Edit], path: Path) -> Path:
    """The seed's members edited, zipped again by ``zipfile`` at ``path``."""
    with zipfile.ZipFile(io.BytesIO(seed.data)) as archive:
        members = [(info.filename, archive.read(info)) for info in archive.infolist()]
    for kind, *args in edits:
        k = args[0] % len(members) if members and kind != "pickle" else 0
        if kind == "pickle":
            for i, (name, raw) in enumerate(members):
                if name.endswith("/data.pkl"):
                    members[i] = (name, apply(raw, args[0]))
        elif kind == "member" and members:
            members[k] = (members[k][0], apply(members[k][1], args[1]))
        elif kind == "drop" and members:
            del members[k]
        elif kind == "twice" and members:
            members.append(members[k])
        elif kind == "swap" and members:
            j = args[1] % len(members)
            members[k], members[j] = members[j], members[k]
    return rezip(path, members)


# -- seeds and references ---------------------------------------------------------------------


def bin_seed(torch: ModuleType) -> Seed:
    gen = torch.Generator().manual_seed(0)
    embed = torch.randn(5, 4, generator=gen).to(torch.bfloat16)
    state = {
        "embed.weight": embed,
        "lm_head.weight": embed,
        "row": embed[2],
        "norm.weight": torch.randn(4, generator=gen),
        "ids": torch.arange(3),
        "scale": torch.tensor(0.5, dtype=torch.float16),
        "empty": torch.zeros(0, 3),
        "counts": torch.arange(3).to(torch.uint16),
    }
    buffer = io.BytesIO()
    torch.save(state, buffer)
    data = buffer.getvalue()
    return Seed("model.bin", data, _zip_hot(data), _torch_state(torch, state))


def _zip_hot(data: bytes) -> tuple[int, ...]:
    """The pickle's bytes, every local header and the central directory to the end."""
    hot: list[int] = []
    with zipfile.ZipFile(io.BytesIO(data)) as archive:
        for info in archive.infolist():
            header = info.header_offset
            hot += range(header, header + 30 + len(info.filename))
            if info.filename.endswith("/data.pkl"):
                hot += range(header + 30, header + 30 + len(info.filename) + 64 + info.file_size)
        hot += range(archive.start_dir, len(data))
    return tuple(sorted(set(hot)))


_TORCH_DTYPES = {
    "float64": "F64", "float32": "F32", "float16": "F16", "bfloat16": "BF16", "int64": "I64", "int32": "I32",
    "int16": "I16", "int8": "I8", "uint8": "U8", "bool": "BOOL", "uint16": "U16", "uint32": "U32", "uint64": "U64",
    "float8_e4m3fn": "F8_E4M3", "float8_e5m2": "F8_E5M2",
}  # fmt: skip


def _torch_state(torch: ModuleType, state: dict[str, Any]) -> Read:
    got: Read = {}
    for name, value in state.items():
        if not isinstance(value, torch.Tensor):
            raise TypeError(f"{name} is a {type(value).__name__}")
        dtype = _TORCH_DTYPES.get(str(value.dtype).removeprefix("torch."), str(value.dtype))
        raw = value.detach().contiguous().reshape(-1).view(torch.uint8).numpy().tobytes() if value.numel() else b""
        got[name] = (dtype, tuple(value.shape), raw)
    return got


def torch_reference(torch: ModuleType) -> Reference:
    def load(path: Path) -> Read | Exception:
        try:
            with warnings.catch_warnings():
                warnings.simplefilter("ignore")
                return _torch_state(torch, torch.load(path, map_location="cpu", weights_only=True))
        except Exception as exc:  # whatever torch refuses
            return exc

    return load


def safetensors_seed() -> Seed:
    import numpy as np
    from safetensors.numpy import save

    rng = np.random.default_rng(0)
    arrays = {
        "embed.weight": rng.random((5, 4), dtype=np.float32).astype(np.float16),
        "norm.weight": rng.random(4, dtype=np.float32),
        "ids": np.arange(3, dtype=np.int64),
        "scale": np.array(0.5, dtype=np.float64),
        "empty": np.zeros((0, 3), dtype=np.float32),
        "mask": np.array([True, False, True]),
        "bytes": np.arange(5, dtype=np.uint8),
    }
    names = {"float16": "F16", "float32": "F32", "float64": "F64", "int64": "I64", "bool": "BOOL", "uint8": "U8"}
    data = save(arrays, metadata={"format": "pt"})
    header_end = 8 + int.from_bytes(data[:8], "little")
    tensors = {name: (names[str(a.dtype)], a.shape, a.tobytes()) for name, a in arrays.items()}
    return Seed("model.safetensors", data, tuple(range(header_end)), tensors)


def safetensors_reference(path: Path) -> Read | Exception:
    from safetensors import deserialize

    try:
        return {name: (t["dtype"], tuple(t["shape"]), bytes(t["data"])) for name, t in deserialize(path.read_bytes())}
    except Exception as exc:  # whatever the safetensors package refuses
        return exc
