"""The index header: what an index was built from, read back strictly.

The header is the only record an index's readers (``inspect``, ``status``, a merge reusing the
probe) trust to size everything else: the plan, the arrays' shapes, the per-agent tables. A
header that another tool, an editor or a disk has altered must therefore fail here, in one
line naming the field, and never later as a ``KeyError`` deep in a table or, worse, as an
answer computed with the wrong number of agents or blocks. ``IndexHeader.from_dict`` checks
every field's type, range and the counts that must agree (one dtype and one input per role).
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Any

import numpy as np

from ramstream.config import BLOCK_QUANTUM
from ramstream.errors import IndexMismatchError
from ramstream.format.dtypes import ITEMSIZE
from ramstream.plan import TensorPlan
from ramstream.version import __version__

BASE_AS = ("f32", "bf16", "f16")  # a resolved --quantized-base-as (auto is resolved before an index is made)
MAX_BLOCK_ELEMS = 1 << 40  # far above any budget's block; a larger value is damage, not a setting


@dataclass(frozen=True)
class IndexHeader:
    """What the index was built from; compared field by field before an index is reused."""

    schema_version: int
    content_key: str
    eps: float
    block_elems: int
    base: str
    agents: tuple[str, ...]
    inputs: tuple[dict[str, Any], ...]
    tensors: tuple[TensorPlan, ...]
    ramstream_version: str = __version__
    quantized_base_as: str = "f32"  # what a quantized base was read as (an index written before: f32)

    def to_dict(self) -> dict[str, Any]:
        return {
            "schema_version": self.schema_version,
            "content_key": self.content_key,
            "eps": self.eps,
            "block_elems": self.block_elems,
            "base": self.base,
            "agents": list(self.agents),
            "inputs": list(self.inputs),
            "tensors": [{"name": t.name, "shape": list(t.shape), "dtypes": list(t.dtypes)} for t in self.tensors],
            "ramstream_version": self.ramstream_version,
            "quantized_base_as": self.quantized_base_as,
        }

    @classmethod
    def from_dict(cls, doc: Any) -> IndexHeader:
        """Parse a header; anything malformed raises ``IndexMismatchError`` naming the field."""
        try:
            return cls._from_dict(doc)
        except DamagedRecord as exc:
            raise IndexMismatchError(f"the index header is damaged: {exc}") from None

    @classmethod
    def _from_dict(cls, doc: Any) -> IndexHeader:
        if not isinstance(doc, dict):
            raise IndexMismatchError(f"the index header is damaged (a {type(doc).__name__}, not a mapping)")
        agents = _strings(doc, "agents")
        if not agents:
            raise _damaged("agents", "an empty list")
        roles = len(agents) + 1
        return cls(
            _integer(doc, "schema_version", 1, 1 << 31),
            _string(doc, "content_key"),
            _eps(doc),
            _integer(doc, "block_elems", BLOCK_QUANTUM, MAX_BLOCK_ELEMS),
            _string(doc, "base"),
            agents,
            read_inputs(doc, roles),
            _tensors(doc, roles),
            _string(doc, "ramstream_version") if "ramstream_version" in doc else "?",
            _base_as(doc),
        )


class DamagedRecord(ValueError):
    """A field of a stored record with the wrong type, range or count; the caller says whose."""

    def __init__(self, field: str, what: str) -> None:
        super().__init__(f"{field} is {what}")


def _damaged(field: str, what: str) -> DamagedRecord:
    return DamagedRecord(field, what)


def _field(doc: dict[str, Any], key: str) -> Any:
    if key not in doc:
        raise _damaged(key, "missing")
    return doc[key]


def _integer(doc: dict[str, Any], key: str, low: int, high: int, where: str = "") -> int:
    value = _field(doc, key)
    if isinstance(value, bool) or not isinstance(value, int) or not low <= value <= high:
        raise _damaged(where + key, f"{value!r:.40}, not an integer from {low} to {high}")
    return value


def _string(doc: dict[str, Any], key: str, where: str = "") -> str:
    value = _field(doc, key)
    if not isinstance(value, str):
        raise _damaged(where + key, f"a {type(value).__name__}, not a string")
    return value


def _strings(doc: dict[str, Any], key: str, where: str = "") -> tuple[str, ...]:
    value = _field(doc, key)
    if not isinstance(value, list) or not all(isinstance(v, str) for v in value):
        raise _damaged(where + key, f"{value!r:.40}, not a list of strings")
    return tuple(value)


def _list(doc: dict[str, Any], key: str, length: int | None = None) -> list[Any]:
    value = _field(doc, key)
    if not isinstance(value, list):
        raise _damaged(key, f"a {type(value).__name__}, not a list")
    if length is not None and len(value) != length:
        raise _damaged(key, f"a list of {len(value)}, not {length} (the base and each agent)")
    for k, item in enumerate(value):
        if not isinstance(item, dict):
            raise _damaged(f"{key}[{k}]", f"a {type(item).__name__}, not a mapping")
    return value


def _eps(doc: dict[str, Any]) -> float:
    value = _field(doc, "eps")
    if isinstance(value, bool) or not isinstance(value, int | float) or not math.isfinite(value) or value < 0:
        raise _damaged("eps", f"{value!r:.40}, not a finite number >= 0")
    return float(value)


def _base_as(doc: dict[str, Any]) -> str:
    if "quantized_base_as" not in doc:
        return "f32"  # written before the setting existed, when a quantized base was read as f32
    value = doc["quantized_base_as"]
    if value not in BASE_AS:
        raise _damaged("quantized_base_as", f"{value!r:.40}, not one of {', '.join(BASE_AS)}")
    return str(value)


def read_inputs(doc: dict[str, Any], roles: int) -> tuple[dict[str, Any], ...]:
    """``doc["inputs"]``: one fingerprint per role (base, then each agent), each checked for the
    fields readers use (``name``, ``path``, ``files[].size``); the merge record holds them too."""
    inputs = _list(doc, "inputs", roles)
    for k, entry in enumerate(inputs):
        where = f"inputs[{k}]."
        _string(entry, "name", where)
        _string(entry, "path", where)
        files = _field(entry, "files")
        if not isinstance(files, list) or not all(isinstance(f, dict) for f in files):
            raise _damaged(where + "files", f"{files!r:.40}, not a list of file records")
        for n, record in enumerate(files):
            _integer(record, "size", 0, 1 << 62, f"{where}files[{n}].")
    return tuple(inputs)


def _tensors(doc: dict[str, Any], roles: int) -> tuple[TensorPlan, ...]:
    tensors = []
    for k, entry in enumerate(_list(doc, "tensors")):
        where = f"tensors[{k}]."
        name = _string(entry, "name", where)
        shape = _field(entry, "shape")
        if not isinstance(shape, list) or not all(
            isinstance(d, int) and not isinstance(d, bool) and 0 <= d < 1 << 62 for d in shape
        ):
            raise _damaged(where + "shape", f"{shape!r:.40}, not a list of sizes")
        numel = math.prod(shape)
        if numel >= 1 << 62:
            raise _damaged(where + "shape", f"{shape!r:.40}, more elements than any tensor holds")
        dtypes = _strings(entry, "dtypes", where)
        if len(dtypes) != roles or not all(d in ITEMSIZE for d in dtypes):
            raise _damaged(where + "dtypes", f"{list(dtypes)!r:.60}, not {roles} known dtypes (base, then each agent)")
        tensors.append(TensorPlan(name, tuple(shape), int(np.int64(numel)), dtypes))
    if len({t.name for t in tensors}) != len(tensors):
        raise _damaged("tensors", "a list naming a tensor twice")
    return tuple(tensors)
