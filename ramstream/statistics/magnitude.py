"""Statistics for magnitude-based sparsification (TIES, breadcrumbs, DELLA), exact and out of core.

- ``AbsHighHistogram`` (``stats/abs_hi16_v1``, int32 (N, 32768) per block): per agent, how many
  elements of the block have each high half of the float32 bit pattern of |tau|.
- ``AbsLowHistogram`` (``stats/abs_lo16_v1-<digest>``, int32 (N, C, 65536) per block): per agent
  and cut, the low halves of the elements whose high half is the cut's target bin. The digest is
  that of the targets (tensors, N, C), which the high histogram decided.
- ``TieBoundary`` (``stats/tie_boundary_v1-<digest>``, int64 (N, C) per block): where each cut's
  first group of ties (``methods/trim.py``) ends, 1 + the tensor position of its last tie, in the
  one block where it ends (0 in the others): with it, a merge knows every block's tie ranges
  without scanning for them. The digest is that of the solved cuts.
- ``KeptL1`` (``stats/<name>_l1_v1-<digest>``, int64 (N, 2, BINS + 1) per block): exact sums of
  |tau| and of |tau| over the kept elements, for L1 norm-matching rescales. The selector decides
  what is kept; the digest names everything the selection depends on.

Partials are integers or exact accumulators, so per-tensor totals never depend on the block size,
the thread count or the resume point. Histograms are read back a few blocks at a time
(``tensor_totals``), never for the whole model at once.
"""

from __future__ import annotations

import hashlib
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field

import numpy as np

from ramstream.backends.base import HIGH_BINS, LOW_BINS, NONFINITE_BIN, Backend, ExactSums, KeepArray
from ramstream.backends.exact_sum import BINS
from ramstream.backends.landing import landed
from ramstream.blocks import BlockArrays
from ramstream.errors import NonFiniteWeightError
from ramstream.plan import Block, TensorPlan
from ramstream.statistics.base import BlockStatistic, Found
from ramstream.statistics.context import StatsContext


def digest(*arrays: np.ndarray | bytes | str) -> str:
    """A short stable digest of arrays (dtype, shape and bytes), bytes and strings."""
    h = hashlib.sha256()
    for a in arrays:
        if isinstance(a, np.ndarray):
            h.update(f"{a.dtype.str}{a.shape}".encode())
            h.update(np.ascontiguousarray(a).tobytes())
        else:
            h.update(a.encode() if isinstance(a, str) else a)
        h.update(b"\x00")
    return h.hexdigest()[:20]


@dataclass(frozen=True)
class AbsHighHistogram:
    @property
    def key(self) -> str:
        return "abs_hi16_v1"

    def shape(self, n_agents: int) -> tuple[int, ...]:
        return (n_agents, HIGH_BINS)

    @property
    def dtype(self) -> str:
        return "int32"

    def compute(self, arrays: BlockArrays, block: Block, tensor: TensorPlan, backend: Backend) -> np.ndarray:
        return self.compute_later(arrays, block, tensor, backend)({})

    def compute_later(
        self, arrays: BlockArrays, block: Block, tensor: TensorPlan, backend: Backend
    ) -> Callable[[Found], np.ndarray]:
        histogram = backend.abs_high_histogram(arrays)

        def checked(found: Found) -> np.ndarray:
            if histogram[:, NONFINITE_BIN:].any():  # a NaN/Inf |tau|: name the weight, or the difference
                bad = arrays.first_nonfinite_tau()
                if bad >= 0:
                    raise arrays.nonfinite_error(bad)
            return histogram

        return checked


@dataclass(frozen=True, eq=False)
class AbsLowHistogram:
    targets: np.ndarray  # int32 (tensors, N, C): target high half per tensor, agent and cut; -1: none

    @property
    def key(self) -> str:
        return f"abs_lo16_v1-{digest(self.targets)}"

    def shape(self, n_agents: int) -> tuple[int, ...]:
        return (n_agents, self.targets.shape[2], LOW_BINS)

    @property
    def dtype(self) -> str:
        return "int32"

    def compute(self, arrays: BlockArrays, block: Block, tensor: TensorPlan, backend: Backend) -> np.ndarray:
        return self.compute_later(arrays, block, tensor, backend)({})

    def compute_later(
        self, arrays: BlockArrays, block: Block, tensor: TensorPlan, backend: Backend
    ) -> Callable[[Found], np.ndarray]:
        histogram = backend.abs_low_histogram(arrays, self.targets[block.tensor])
        return lambda found: histogram


@dataclass(frozen=True, eq=False)
class TieBoundary:
    """The cuts' tie boundaries (see the module docstring). ``straddle[tensor, t, c]`` is the
    index block (start, stop, ties before it) where cut c of agent t's first group ends, and
    ``value`` / ``first`` the cut's value and the size of its first group."""

    cuts: str  # digest of the solved cuts
    value: np.ndarray = field(compare=False)  # uint32 (tensors, N, C)
    first: np.ndarray = field(compare=False)  # int64 (tensors, N, C)
    straddle: np.ndarray = field(compare=False)  # int64 (tensors, N, C, 3)

    @property
    def key(self) -> str:
        return f"tie_boundary_v1-{self.cuts}"

    def shape(self, n_agents: int) -> tuple[int, ...]:
        return (self.value.shape[1], self.value.shape[2])

    @property
    def dtype(self) -> str:
        return "int64"

    def compute(self, arrays: BlockArrays, block: Block, tensor: TensorPlan, backend: Backend) -> np.ndarray:
        return self.compute_later(arrays, block, tensor, backend)({})

    def compute_later(
        self, arrays: BlockArrays, block: Block, tensor: TensorPlan, backend: Backend
    ) -> Callable[[Found], np.ndarray]:
        """Every cut that ends in this block searched for in one backend call (each input read
        once), answered once it has landed."""
        cuts = [
            (int(t), int(c))
            for t, c in zip(*np.nonzero(self.straddle[block.tensor, :, :, 1] == block.stop), strict=True)
            if tuple(self.straddle[block.tensor, t, c, :2]) == (block.start, block.stop)
        ]
        rows = np.array([t for t, _ in cuts], np.int64)
        values = np.array([self.value[block.tensor, t, c] for t, c in cuts], np.int64)
        needs = np.array(
            [self.first[block.tensor, t, c] - self.straddle[block.tensor, t, c, 2] for t, c in cuts], np.int64
        )
        positions = self.find(arrays, backend, rows, values, needs) if cuts else np.zeros(0, np.int64)

        def partial(found: Found) -> np.ndarray:
            out = np.zeros((self.value.shape[1], self.value.shape[2]), np.int64)
            for (t, c), position in zip(cuts, positions, strict=True):
                out[t, c] = block.start + int(position) + 1
            return out

        return partial

    def find(
        self, arrays: BlockArrays, backend: Backend, rows: np.ndarray, values: np.ndarray, needs: np.ndarray
    ) -> np.ndarray:
        """Per query, the block position of the ``need``-th element of row ``row`` whose key bits
        are ``value`` (filled once the call has landed)."""
        return backend.find_ties(arrays, rows, values, needs)


# selector(arrays, block, tensor, backend) -> (N, block.size) array, nonzero where kept
Selector = Callable[[BlockArrays, Block, TensorPlan, Backend], np.ndarray]


@dataclass(frozen=True)
class KeptL1:
    name: str
    selection: str  # digest of everything the selector depends on
    selector: Selector = field(compare=False)

    @property
    def key(self) -> str:
        return f"{self.name}_l1_v1-{self.selection}"

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
        result = backend.abs_sums(arrays, KeepArray(self.selector(arrays, block, tensor, backend)))
        return lambda found: refused_nonfinite(result, found, arrays)


def tensor_pieces(ctx: StatsContext, stat: BlockStatistic) -> Iterator[tuple[int, int, np.ndarray]]:
    """``(tensor, its first block here, the partials of its consecutive blocks)`` in block order, a
    window of ``StatsContext.walk`` at a time: a tensor whose blocks span windows comes in several
    pieces, and a piece is valid until the next (the walk reuses its buffer)."""
    plan = ctx.plan
    for first, partials in ctx.walk(stat):
        b, stop = first, first + len(partials)
        while b < stop:
            end = min(plan.blocks_of(plan.blocks[b].tensor).stop, stop)
            yield plan.blocks[b].tensor, b, partials[b - first : end - first]
            b = end


def tensor_totals(ctx: StatsContext, stat: BlockStatistic, dtype: type = np.int64) -> Iterator[tuple[int, np.ndarray]]:
    """``(tensor, sum of its blocks' partials)`` for every tensor with blocks, in tensor order,
    reading the partials a bounded number of blocks at a time (``tensor_pieces``; the statistic
    must be computed)."""
    pending: tuple[int, np.ndarray] | None = None  # the tensor being summed, and its sum so far
    for t, _, piece in tensor_pieces(ctx, stat):
        part = piece.sum(axis=0, dtype=dtype)
        if pending is not None and pending[0] == t:
            pending[1][...] += part
        else:
            if pending is not None:
                yield pending
            pending = (t, part)
    if pending is not None:
        yield pending


def block_values(ctx: StatsContext, stat: BlockStatistic, pick: Callable[[int, np.ndarray], np.ndarray]) -> np.ndarray:
    """``pick(block index, partial)`` for every block, reading partials a bounded batch at a time."""
    out: list[np.ndarray] = []
    for first, partials in ctx.walk(stat):
        out.extend(np.array(pick(first + k, partials[k])) for k in range(len(partials)))  # the window is reused
    return np.array(out)


def refused_nonfinite(result: ExactSums, found: Found, arrays: BlockArrays, allow: bool = False) -> np.ndarray:
    """The sums of a (maybe deferred) ``result``; its NaN/Inf task vector element refused, naming
    the weight or the overflowing difference (with ``allow``, the kernels counted it as 0)."""
    first = landed(result.first_nonfinite, found, result.first_nonfinite)
    if first >= 0 and not allow:
        raise arrays.nonfinite_error(first)
    return result.sums


def check_finite(tensor: TensorPlan, high: np.ndarray, agents: tuple[str, ...]) -> None:
    """Refuse a tensor whose |tau| high-half histogram (N, HIGH_BINS) counts an Inf or a NaN (the
    histogram's blocks refuse one by name as they are computed; this catches partials stored
    before they did)."""
    bad = np.flatnonzero(high[:, NONFINITE_BIN:].sum(axis=1))
    if len(bad):
        raise NonFiniteWeightError(
            f"tensor {tensor.name!r}: the task vector of agent {agents[int(bad[0])]} holds NaN or Inf (a NaN/Inf "
            "weight, or finite weights whose difference overflows float32); fix the checkpoint"
        )
