"""The pickle of a ``torch.save`` checkpoint (``data.pkl``), read without torch, without running
anything, in memory bounded by its size.

The pickle is the state dict; each tensor is a call of one of torch's rebuild functions on a
storage named by key (a persistent id), an offset, a size and a stride. It is read in two steps:

1. ``check_opcodes`` walks the opcodes with ``pickletools.genops`` (which reads no argument past
   the bytes that hold it) and refuses an opcode that ``torch.load(weights_only=True)`` does not
   read (``OPCODES``: what ``torch.save`` writes with its default protocol; no sets, 8-byte
   lengths, frames, buffers), a memo index beyond the number of values memoised so far (the C
   unpickler sizes its memo table by the index: five bytes could ask for gigabytes) and an
   integer beyond 64 bits (thousands of ints with one hash, multiples of 2**61 - 1, would make
   a dict quadratic). What remains builds at most about 80 bytes of objects per byte of pickle
   (300 KB of empty dicts: 23 MiB).
2. ``load_state`` runs the C unpickler with ``find_class`` resolving only the globals that
   ``torch.load(weights_only=True)`` allows, each to an inert stand-in: the rebuild functions
   that ramstream reads record a ``Tensor``; storage types and dtypes become ``DType`` records;
   ``OrderedDict`` is itself; everything else torch allows (complex, quantized or sparse
   tensors, parameters with attributes, ``torch.Size``...) becomes an ``Unsupported`` marker,
   named with its entry by the caller. Any other global is refused as unsafe. Storages are
   cached by key as ``torch.load`` caches them: the first reference of a key (with data)
   decides its dtype and size, later references get that storage whatever they declare.
   The stand-ins refuse ``BUILD``: they are shared by every load, so a pickle must not set
   their state.
"""

from __future__ import annotations

import io
import pickle
import pickletools
import warnings
from collections import OrderedDict
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any, TypeGuard

from ramstream.errors import CorruptFileError, InputError, shown

# A state dict pickle takes about 130 bytes per tensor (names of 60 characters), so 32 MiB is
# some 250 000 tensors in one file; unpickled, it costs about seven times its size.
MAX_PICKLE_BYTES = 32 * 2**20
MAX_DIMS = 64
_INT64 = 2**63
_UINT64 = 2**64

# What torch.load(weights_only=True) reads (torch/_weights_only_unpickler.py), which is what torch.save
# writes with its default pickle protocol (2), less EMPTY_SET (a set of 216 bytes for each byte).
OPCODES = frozenset(
    {
        "PROTO", "STOP", "MARK", "NONE", "NEWTRUE", "NEWFALSE", "BININT", "BININT1", "BININT2", "LONG1",
        "BINFLOAT", "BINUNICODE", "SHORT_BINSTRING", "EMPTY_TUPLE", "TUPLE", "TUPLE1", "TUPLE2", "TUPLE3",
        "EMPTY_LIST", "APPEND", "APPENDS", "EMPTY_DICT", "SETITEM", "SETITEMS",
        "BINPUT", "LONG_BINPUT", "BINGET", "LONG_BINGET", "GLOBAL", "REDUCE", "NEWOBJ", "BUILD", "BINPERSID",
    }
)  # fmt: skip
_PUTS = frozenset({"BINPUT", "LONG_BINPUT"})


class UnsafePickleError(CorruptFileError):
    """A checkpoint's pickle that asks for a global beyond what ``torch.load(weights_only=True)`` allows."""


class _Inert:
    """A stand-in the pickle may name or build; ``BUILD`` on it is refused (the globals are
    shared by every load, and a record must keep what its rebuild function checked)."""

    __slots__ = ()

    def __setstate__(self, state: object) -> None:
        raise pickle.UnpicklingError("a pickle that sets the state of a torch object")


@dataclass(frozen=True)
class DType(_Inert):
    """A torch dtype (``torch.float32``) or legacy storage type (``torch.FloatStorage``): its
    torch name and its safetensors name, None for a dtype that ramstream does not read."""

    torch_name: str
    dtype: str | None


@dataclass(frozen=True)
class StorageType(_Inert):
    """A storage type as a persistent id names it (``torch.FloatStorage``, ``torch.storage.UntypedStorage``)."""

    dtype: DType


@dataclass(frozen=True)
class Storage(_Inert):
    """A storage as its first reference declares it: the key of its member, its dtype and length."""

    key: str
    dtype: DType
    numel: int


@dataclass(frozen=True)
class Tensor(_Inert):
    """Where a tensor lies: ``offset`` and ``shape`` count elements of ``dtype`` in ``storage``."""

    storage: Storage
    dtype: DType
    offset: int
    shape: tuple[int, ...]
    stride: tuple[int, ...]


@dataclass(frozen=True)
class Unsupported(_Inert):
    """Known torch content that ramstream does not read; calling it (a rebuild) gives itself."""

    what: str

    def __call__(self, *_args: object) -> Unsupported:
        return self


@dataclass(frozen=True)
class _Call(_Inert):
    """A rebuild function the pickle may call, standing in for torch's."""

    func: Callable[..., object]

    def __call__(self, *args: object) -> object:
        return self.func(*args)


def _tensor(storage: object, dtype: object, offset: object, size: object, stride: object) -> Tensor:
    if not isinstance(storage, Storage) or not isinstance(dtype, DType) or not _is_size(offset):
        raise pickle.UnpicklingError("a tensor without a storage, a dtype or an offset")
    if not isinstance(size, tuple) or not isinstance(stride, tuple) or len(size) != len(stride):
        raise pickle.UnpicklingError("a tensor with an invalid size or stride")
    if len(size) > MAX_DIMS or not all(_is_size(d) for d in (*size, *stride)):
        raise pickle.UnpicklingError(f"a tensor with an invalid size or stride (or over {MAX_DIMS} dimensions)")
    return Tensor(storage, dtype, offset, size, stride)


def _rebuild_v2(storage: object, offset: object, size: object, stride: object, *_rest: object) -> Tensor:
    """``torch._utils._rebuild_tensor_v2`` (and ``_rebuild_tensor``): the storage's dtype."""
    return _tensor(storage, getattr(storage, "dtype", None), offset, size, stride)


def _rebuild_v3(storage: object, offset: object, size: object, stride: object, *rest: object) -> Tensor:
    """``torch._utils._rebuild_tensor_v3(storage, offset, size, stride, requires_grad, hooks, dtype,
    ...)``: the dtypes without a legacy storage type (uint16, float8...) over an untyped storage."""
    return _tensor(storage, rest[2] if len(rest) > 2 else None, offset, size, stride)


def _rebuild_parameter(data: object, *_rest: object) -> object:
    """``torch._utils._rebuild_parameter``: a parameter is its tensor."""
    if not isinstance(data, Tensor | Unsupported):
        raise pickle.UnpicklingError("a parameter without a tensor")
    return data


# torch dtypes by the name their pickle gives them, with the safetensors names of those ramstream reads.
_READ_DTYPES = {
    "float64": "F64", "float32": "F32", "float16": "F16", "bfloat16": "BF16",
    "int64": "I64", "int32": "I32", "int16": "I16", "int8": "I8", "uint8": "U8", "bool": "BOOL",
    "uint16": "U16", "uint32": "U32", "uint64": "U64", "float8_e4m3fn": "F8_E4M3", "float8_e5m2": "F8_E5M2",
}  # fmt: skip
_OTHER_DTYPES = (
    "complex32 complex64 complex128 float8_e4m3fnuz float8_e5m2fnuz float8_e8m0fnu float4_e2m1fn_x2 "
    "qint8 qint32 quint8 quint4x2 quint2x4 bits1x8 bits2x4 bits4x2 bits8 bits16 "
    + " ".join(f"int{n} uint{n}" for n in range(1, 8))
).split()
# torch's legacy storage types, by the dtype of their elements.
_STORAGES = {
    "DoubleStorage": "float64", "FloatStorage": "float32", "HalfStorage": "float16", "BFloat16Storage": "bfloat16",
    "LongStorage": "int64", "IntStorage": "int32", "ShortStorage": "int16", "CharStorage": "int8",
    "ByteStorage": "uint8", "BoolStorage": "bool", "ComplexDoubleStorage": "complex128",
    "ComplexFloatStorage": "complex64", "QInt8Storage": "qint8", "QInt32Storage": "qint32",
    "QUInt8Storage": "quint8", "QUInt4x2Storage": "quint4x2", "QUInt2x4Storage": "quint2x4",
}  # fmt: skip
_UNSUPPORTED_REBUILDS = {
    ("torch._utils", "_rebuild_parameter_with_state"): "a parameter saved with Python attributes",
    ("torch._tensor", "_rebuild_from_type_v2"): "a tensor with Python attributes or of a tensor subclass",
    ("torch._utils", "_rebuild_qtensor"): "a quantized tensor",
    ("torch._utils", "_rebuild_sparse_tensor"): "a sparse tensor",
    ("torch._utils", "_rebuild_nested_tensor"): "a nested tensor",
    ("torch._utils", "_rebuild_wrapper_subclass"): "a tensor subclass",
    ("torch._utils", "_rebuild_meta_tensor_no_storage"): "a tensor on the meta device (it holds no data)",
    ("torch._utils", "_rebuild_device_tensor_from_numpy"): "a tensor rebuilt from numpy for another device",
    ("torch._utils", "_rebuild_device_tensor_from_cpu_tensor"): "a tensor rebuilt for another device",
}
# Other globals torch.load(weights_only=True) allows: ordinary content that is not a plain tensor.
_OTHER_GLOBALS = [
    ("torch", "Size"), ("torch", "Tensor"), ("torch", "device"),
    ("torch.nn.parameter", "Parameter"), ("torch.serialization", "_get_layout"), ("torch.storage", "TypedStorage"),
    ("collections", "Counter"), ("_codecs", "encode"), ("builtins", "bytearray"), ("builtins", "set"),
    ("builtins", "complex"),
    *(("torch", q) for q in ("per_tensor_affine", "per_tensor_symmetric", "per_channel_affine",
                             "per_channel_symmetric", "per_channel_affine_float_qparams")),
    *((module, f"{kind}Tensor") for module in ("torch", "torch.cuda", "torch.sparse", "torch.cuda.sparse")
      for kind in ("BFloat16", "Bool", "Byte", "Char", "Double", "Float", "Half", "Int", "Long", "Short")),
]  # fmt: skip


def _globals() -> dict[tuple[str, str], object]:
    dtypes = {name: DType(name, _READ_DTYPES.get(name)) for name in [*_READ_DTYPES, *_OTHER_DTYPES]}
    found: dict[tuple[str, str], object] = {("collections", "OrderedDict"): OrderedDict}
    found |= {("torch", name): dtype for name, dtype in dtypes.items()}
    found |= {(m, name): StorageType(dtypes[of]) for name, of in _STORAGES.items() for m in ("torch", "torch.cuda")}
    found[("torch.storage", "UntypedStorage")] = StorageType(dtypes["uint8"])
    found |= {(m, n): Unsupported(f"a value built with {m}.{n}") for m, n in _OTHER_GLOBALS}
    found |= {(m, n): Unsupported(f"{what} ({m}.{n})") for (m, n), what in _UNSUPPORTED_REBUILDS.items()}
    found |= {("torch._utils", f): _Call(_rebuild_v2) for f in ("_rebuild_tensor", "_rebuild_tensor_v2")}
    found[("torch._utils", "_rebuild_tensor_v3")] = _Call(_rebuild_v3)
    found[("torch._utils", "_rebuild_parameter")] = _Call(_rebuild_parameter)
    return found


GLOBALS = _globals()


class _Refused(Exception):
    """A global outside ``GLOBALS`` (carries its dotted name)."""


class _Unpickler(pickle.Unpickler):
    """Resolves only ``GLOBALS``; storages are cached by key as ``torch.load`` caches them."""

    def __init__(self, raw: bytes) -> None:
        super().__init__(io.BytesIO(raw))
        self.storages: dict[str, Storage] = {}

    def find_class(self, module: str, name: str) -> Any:
        found = GLOBALS.get((module, name))
        if found is None:
            raise _Refused(shown(f"{module}.{name}"))
        return found

    def persistent_load(self, pid: Any) -> Storage:
        if not (
            isinstance(pid, tuple)
            and len(pid) == 5
            and pid[0] == "storage"
            and isinstance(pid[1], StorageType)
            and isinstance(pid[2], str)
            and _is_size(pid[4])
        ):
            raise pickle.UnpicklingError("a persistent id that is not a tensor storage")
        key = pid[2]
        if key in self.storages:
            return self.storages[key]
        storage = Storage(key, pid[1].dtype, pid[4])
        if storage.numel:  # torch keeps a storage only once it holds data
            self.storages[key] = storage
        return storage


def check_opcodes(raw: bytes) -> None:
    """Refuse, with ``pickle.UnpicklingError``, a pickle with an opcode outside ``OPCODES`` or
    claims that could make the C unpickler allocate far more than its size."""
    with warnings.catch_warnings():
        # pickletools decodes a text argument (GLOBAL's names) with escape_decode, which warns on a
        # malformed escape ("\ "): for a damaged file that is a refusal, not a warning.
        warnings.simplefilter("error")
        try:
            _check_opcodes(raw)
        except Warning as exc:
            raise pickle.UnpicklingError(f"a malformed text argument ({exc})") from None


def _check_opcodes(raw: bytes) -> None:
    puts = 0
    for opcode, arg, pos in pickletools.genops(raw):
        if opcode.name not in OPCODES:
            raise pickle.UnpicklingError(
                f"opcode {opcode.name} at byte {pos}, which torch.save's default pickle protocol never writes"
            )
        if opcode.name in _PUTS:
            if not isinstance(arg, int) or arg > puts:
                raise pickle.UnpicklingError(f"memo index {arg} at byte {pos} after {puts} memoised values")
            puts += 1
        elif opcode.name == "LONG1" and isinstance(arg, int) and not -_UINT64 < arg < _UINT64:
            raise pickle.UnpicklingError(f"an integer of {arg.bit_length()} bits at byte {pos}, beyond 64")


def load_state(path: Path, raw: bytes) -> dict[str, Tensor | Unsupported]:
    """The state dict pickled in ``raw`` (``path`` names the file in errors): entry name to
    ``Tensor``, or ``Unsupported`` for known torch content that ramstream does not read."""
    try:
        check_opcodes(raw)
        state = _Unpickler(raw).load()
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
        if not isinstance(name, str) or not isinstance(value, Tensor | Unsupported):
            raise InputError(f"{path}: entry {name!r} is not a tensor; ramstream reads state dicts of tensors only")
    return state


def _is_size(value: object) -> TypeGuard[int]:
    """A non-negative int64 (``bool`` is an ``int`` in Python, but not a size)."""
    return isinstance(value, int) and not isinstance(value, bool) and 0 <= value < _INT64
