"""The contract of a merge method.

A method is a frozen spec: a name, how it parses and validates its parameters, and how it
prepares: it asks a ``StatsContext`` for the statistics it needs (none, RAM's overlap counts,
|tau| histograms, exact sums...), turns them into constants, and returns the function that
merges one block by calling the backend it is given (never a kernel). The merge pass knows
nothing else about methods.
"""

from __future__ import annotations

from collections.abc import Callable, Hashable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any, Protocol

import numpy as np

from ramstream.backends.base import Backend
from ramstream.blocks import BlockArrays
from ramstream.plan import Block
from ramstream.statistics.base import BlockStatistic
from ramstream.statistics.context import StatsContext


class MethodParams(Protocol):
    def to_dict(self) -> dict[str, Any]: ...


# merge_block(arrays, block, out, out_code, backend): write the merged block into ``out`` (the
# raw carrier of format ``out_code``), computing through ``backend``; return the block position
# of the first NaN/Inf input, or -1 (the merge reads every input anyway: no second read to check).
BlockMerger = Callable[[BlockArrays, Block, np.ndarray, int, Backend], int]


# merge_many(arrays, block, owns, outs, out_code, backend): merge the block into every ``outs[k]``
# (one read of the inputs), output k with its own argument ``owns[k]``; the first NaN/Inf input.
ManyMerger = Callable[[BlockArrays, Block, Sequence[Any], Sequence[np.ndarray], int, Backend], int]


@dataclass(frozen=True)
class Fused:
    """How a merge joins others of its ``group`` in one backend call per block: a sweep's
    candidates that differ only in an argument of one kernel (RAM+ for several r: only the
    lambdas) read each block once for all of them. Output k is exactly what its own call writes."""

    group: Hashable  # outputs whose groups are equal merge together
    own: Any  # this output's argument (RAM: its lambdas per tensor and agent)
    merge_many: ManyMerger = field(compare=False)


@dataclass(frozen=True)
class Prepared:
    """A method ready to merge: its block function and per-agent values worth reporting (and how
    it fuses with others, when it can)."""

    merge_block: BlockMerger
    per_agent: dict[str, tuple[float, ...]] = field(default_factory=dict)
    fused: Fused | None = None


@dataclass(frozen=True)
class MethodSpec:
    name: str
    summary: str
    # parse(options the user gave, number of agents) -> validated parameters (ConfigError otherwise)
    parse: Callable[[Mapping[str, Any], int], MethodParams]
    prepare: Callable[[Any, StatsContext], Prepared]
    # True when blocks must hold whole rows (methods that rank elements within a row)
    row_aligned: bool = False
    min_agents: int = 1
    # False for methods whose statistics cannot tell a NaN/Inf task vector from a large one
    # (magnitude ranks): --allow-nonfinite is refused for them rather than half-honoured.
    accepts_nonfinite: bool = True
    # False for methods that merge the weights themselves, not task vectors (linear): a merged
    # NaN/Inf is then never blamed on a task vector that overflows float32.
    task_vectors: bool = True
    # statistics_ahead(params, ctx) -> statistics ``prepare`` will compute that can be known before
    # it runs, asking the context only what ``prepare`` would: a sweep computes its candidates'
    # together, in one pass, rather than a pass per candidate. None where there are none.
    statistics_ahead: Callable[[Any, StatsContext], tuple[BlockStatistic, ...]] | None = None
    # check(params, tensor names) -> None: refuse, before any work, parameters the model's tensors
    # contradict (a filter matching no tensor).
    check: Callable[[Any, Sequence[str]], None] | None = None


def refuse_unknown(method: str, options: Mapping[str, Any], allowed: set[str]) -> None:
    """Options a method would ignore are refused by name, never silently dropped."""
    extra = sorted(set(options) - allowed)
    if extra:
        from ramstream.methods.options import UnknownOptions

        raise UnknownOptions(method, tuple(extra), tuple(sorted(allowed)))
