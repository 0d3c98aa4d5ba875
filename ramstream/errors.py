"""The error hierarchy: everything a user can cause is a ``RamstreamError``.

The CLI prints these as one line and exits non-zero; anything else escaping is a bug.
Messages name the file (and tensor) and say what to do.
"""

from __future__ import annotations

import reprlib


class RamstreamError(Exception):
    """Base of every error ramstream raises on purpose."""


class InputError(RamstreamError):
    """A checkpoint path, file or header that cannot be used."""


class CorruptFileError(InputError):
    """A safetensors file whose header or size is inconsistent (truncated, garbage, overlapping)."""


class UnsupportedDtypeError(InputError):
    """A tensor dtype that the kernels cannot decode."""


class MismatchError(InputError):
    """Agents that do not match the base (missing tensor, other shape)."""


class AdapterError(InputError):
    """A PEFT adapter that cannot be merged as a LoRA agent (another PEFT type, DoRA, keys or
    shapes that do not fit the base, another base model)."""


class NonFiniteWeightError(InputError):
    """A NaN or Inf in a weight, which would poison every statistic."""


class TaskVectorOverflowError(InputError):
    """Finite weights whose difference (an agent minus the base) overflows float32."""


class NonFiniteOutputError(RamstreamError):
    """A merge that would write NaN/Inf where its inputs are finite (overflow, out of range)."""


class IndexMismatchError(RamstreamError):
    """An index built from other inputs, another epsilon or another schema."""


class OutputError(RamstreamError):
    """An output directory that holds something else, or cannot be written."""


class ConfigError(RamstreamError):
    """Options that are invalid or contradict each other."""


class DeviceError(RamstreamError):
    """The GPU failed: out of memory (other processes, or a budget too large), or a CUDA error."""


class MissingDependencyError(RamstreamError):
    """An optional dependency (matplotlib for plots, pandas for DataFrames) that is not installed."""


class EvaluationError(RamstreamError):
    """An evaluation that gave no score where one is needed (``demo --sweep``'s selection)."""


class StoreWriteError(RamstreamError):
    """The index or the merge journal could not be written (disk full, permissions)."""


class StoreCorruptError(RamstreamError):
    """A chunk of the index or journal failed its checksum or could not be decoded."""


class ConcurrentRunError(RamstreamError):
    """Another ramstream process is writing the same index or output directory."""


class ClusterError(RamstreamError):
    """A Dask cluster that cannot be reached, or could not finish a pass (its workers kept dying)."""


def shown(text: str) -> str:
    """``text`` (a name read from a file) as a one-line message shows it: as it is when printable,
    else its ``repr``, so a newline or a control character in it cannot break or forge the line."""
    return text if text.isprintable() else repr(text)


_EXCERPT = reprlib.Repr()  # keyword arguments only from Python 3.12
_EXCERPT.maxlevel, _EXCERPT.maxdict, _EXCERPT.maxstring, _EXCERPT.maxlong, _EXCERPT.maxother = 2, 3, 40, 40, 40
_EXCERPT.maxtuple = _EXCERPT.maxlist = _EXCERPT.maxset = _EXCERPT.maxfrozenset = _EXCERPT.maxdeque = 4


def excerpt(value: object, limit: int = 80) -> str:
    """A user's value as a message quotes it: a ``repr`` cut short at every level (a list's first
    items, a string's start) and at ``limit`` characters, in time bounded whatever the value holds
    (a config's value may be huge), on one line."""
    if isinstance(value, str):  # its start, as much as the limit allows
        value = value if len(value) <= limit else value[:limit] + "..."
        text = repr(value)
    else:
        text = _EXCERPT.repr(value)
    return shown(text if len(text) <= limit else text[: limit - 3] + "...")
