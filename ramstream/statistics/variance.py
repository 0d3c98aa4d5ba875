"""SCE's statistics: exact ranks of the per-element variance of the task vectors over the agents,
and the sums of squares its weights come from.

The key is ``Backend.variance`` (float32, >= 0, the same bytes on every backend): its bit
patterns order as its values, so the magnitude machinery (``methods/trim.py``) ranks it as it
ranks |tau|, with one row shared by every agent. Histograms and tie positions are counted here,
with numpy, from the block's key:

- ``VarHighHistogram`` (``stats/var_hi16_v1``, int32 (1, HIGH_BINS + 1) per block): elements per
  high half of the key's bits, and in the last slot those whose key is exactly 0 (mergekit's
  ``count_nonzero(var)`` leaves them out of k);
- ``VarLowHistogram`` (``stats/var_lo16_v1-<digest>``, int32 (1, C, LOW_BINS)): the low halves of
  the elements whose high half is a cut's target;
- ``VarTieBoundary`` (``stats/var_tie_boundary_v1-<digest>``): ``TieBoundary`` over the key;
- ``KeptSquares`` (``stats/sce_sq_v1-<digest>``, int64 (N, 2, BINS + 1)): exact sums of tau * tau
  over all elements and over the kept ones (``Backend.abs_sums`` with squares).
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field

import numpy as np

from ramstream.backends.base import HIGH_BINS, LOW_BINS, NONFINITE_BIN, Backend, KeepArray, nth_set
from ramstream.backends.exact_sum import BINS
from ramstream.blocks import BlockArrays
from ramstream.errors import NonFiniteWeightError
from ramstream.plan import Block, TensorPlan
from ramstream.statistics.base import Found
from ramstream.statistics.magnitude import TieBoundary, digest, refused_nonfinite


def key_bits(arrays: BlockArrays, backend: Backend) -> np.ndarray:
    """uint32 (n,): the bit patterns of the block's variance key."""
    return backend.variance(arrays).view(np.uint32)


@dataclass(frozen=True)
class VarHighHistogram:
    @property
    def key(self) -> str:
        return "var_hi16_v1"

    def shape(self, n_agents: int) -> tuple[int, ...]:
        return (1, HIGH_BINS + 1)

    @property
    def dtype(self) -> str:
        return "int32"

    def compute(self, arrays: BlockArrays, block: Block, tensor: TensorPlan, backend: Backend) -> np.ndarray:
        bits = key_bits(arrays, backend)
        out = np.zeros((1, HIGH_BINS + 1), np.int32)
        out[0, :HIGH_BINS] = np.bincount(bits >> 16, minlength=HIGH_BINS)[:HIGH_BINS]
        out[0, HIGH_BINS] = np.count_nonzero(bits == 0)
        if out[0, NONFINITE_BIN:HIGH_BINS].any() or (bits >> 16 >= HIGH_BINS).any():
            bad = arrays.first_nonfinite_tau()
            if bad >= 0:
                raise arrays.nonfinite_error(bad)
            raise NonFiniteWeightError(
                f"tensor {tensor.name!r}: the variance of the agents' task vectors overflows float32; "
                "fix the checkpoints"
            )
        return out


@dataclass(frozen=True, eq=False)
class VarLowHistogram:
    targets: np.ndarray  # int32 (tensors, 1, C): target high half per tensor and cut; -1: none

    @property
    def key(self) -> str:
        return f"var_lo16_v1-{digest(self.targets)}"

    def shape(self, n_agents: int) -> tuple[int, ...]:
        return (1, self.targets.shape[2], LOW_BINS)

    @property
    def dtype(self) -> str:
        return "int32"

    def compute(self, arrays: BlockArrays, block: Block, tensor: TensorPlan, backend: Backend) -> np.ndarray:
        targets = self.targets[block.tensor, 0]
        out = np.zeros((1, len(targets), LOW_BINS), np.int32)
        if targets.max(initial=-1) < 0:
            return out
        bits = key_bits(arrays, backend)
        for c, target in enumerate(targets):
            if target >= 0:
                out[0, c] = np.bincount(bits[(bits >> 16) == target] & 0xFFFF, minlength=LOW_BINS)
        return out


@dataclass(frozen=True, eq=False)
class VarTieBoundary(TieBoundary):
    @property
    def key(self) -> str:
        return f"var_tie_boundary_v1-{self.cuts}"

    def find(
        self, arrays: BlockArrays, backend: Backend, rows: np.ndarray, values: np.ndarray, needs: np.ndarray
    ) -> np.ndarray:
        bits = key_bits(arrays, backend)  # one key for all agents: computed once for every query
        return np.array(
            [nth_set(bits == value, int(need)) for value, need in zip(values, needs, strict=True)], np.int64
        )


def kept_by_cut(bits: np.ndarray, value: np.ndarray, ranges: np.ndarray) -> np.ndarray:
    """bool (n,): the key ``bits`` in cut 1's lower set and not in cut 0's (one row of ``Cuts``:
    ``value`` (2,), ``ranges`` (2, 2) in block positions), as the merge kernels decide it."""
    position = np.arange(len(bits))

    def lower(j: int) -> np.ndarray:
        a, e = ranges[j]
        return (bits < value[j]) | ((bits == value[j]) & (position >= a) & (position < e))

    return lower(1) & ~lower(0)


# keep(arrays, block, backend) -> bool (n,): the elements SCE keeps in the block
SharedKeep = Callable[[BlockArrays, Block, Backend], np.ndarray]


@dataclass(frozen=True)
class KeptSquares:
    selection: str  # digest of everything the keep depends on
    keep: SharedKeep = field(compare=False)

    @property
    def key(self) -> str:
        return f"sce_sq_v1-{self.selection}"

    def shape(self, n_agents: int) -> tuple[int, ...]:
        return (n_agents, 2, BINS + 1)

    @property
    def dtype(self) -> str:
        return "int64"

    def compute(self, arrays: BlockArrays, block: Block, tensor: TensorPlan, backend: Backend) -> np.ndarray:
        return self.compute_later(arrays, block, tensor, backend)({})

    def compute_later(
        self, arrays: BlockArrays, block: Block, tensor: TensorPlan, backend: Backend
    ) -> Callable[[Found], np.ndarray]:
        kept = self.keep(arrays, block, backend).astype(np.uint8)
        mask = np.ascontiguousarray(np.broadcast_to(kept, (arrays.n_agents, arrays.size)))
        result = backend.abs_sums(arrays, KeepArray(mask), squares=True)
        return lambda found: refused_nonfinite(result, found, arrays)
