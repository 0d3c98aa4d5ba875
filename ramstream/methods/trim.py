"""Exact magnitude trimming out of core: rank cuts of |tau| from two histogram passes.

A *cut* at count c of a scope (one tensor, or the whole model per agent) is its lower set: the
c smallest elements by |tau| (float32), ties at the boundary value V broken by position. With
the high-half histogram (``AbsHighHistogram``) the bin of the c-th smallest value is known; the
low-half histogram of that bin (``AbsLowHistogram``) gives V exactly and, per index block, how
many elements equal V. Which of the tied elements belong to the lower set is decided by
position: the tie order is the flat index within a tensor, and for the model scope tensors in
the order of their names. Either the *first* ties in that order belong to the lower set
(``lower_takes_first``: an ascending stable sort, as breadcrumbs') or the last ones (the kept
upper set takes the first ties: a descending stable sort, as TIES' top-k).

A method asks for one or two cuts per agent; an element is kept when it lies in cut 1's lower set
(everything when there is one cut) and not in cut 0's. Inside a block the ties of the lower set
are a range of positions, found from the per-block tie counts: only the one index block where the
boundary falls is scanned, once, for the tensor position where the first group ends
(``TieBoundary``, cached in the index); any merge block's range follows from it, so the result
never depends on the block split and a merge reads each input once.

Stage 1 (``place``: each cut's kind, target bin and rank in it) needs only the high histogram,
which depends on no parameter; it names the low histogram stage 2 needs, so a sweep can compute
every candidate's in one pass before any of them solves.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

import numpy as np

from ramstream.backends.base import ALL, HIGH_BINS, LOW_BINS, Backend, Cuts, KeepCuts
from ramstream.backends.exact_sum import finish
from ramstream.blocks import BlockArrays
from ramstream.methods.gta import Selection
from ramstream.plan import Block, TensorPlan
from ramstream.statistics.base import BlockStatistic
from ramstream.statistics.context import StatsContext
from ramstream.statistics.magnitude import (
    AbsHighHistogram,
    AbsLowHistogram,
    KeptL1,
    TieBoundary,
    block_values,
    check_finite,
    digest,
    tensor_pieces,
    tensor_totals,
)
from ramstream.statistics.variance import VarHighHistogram, VarLowHistogram, VarTieBoundary

REAL, EMPTY, FULL = 0, 1, 2  # a cut inside the scope; the empty lower set; the whole scope

# counts(n, tensor) -> int64 (N, C): the ascending counts of each agent's cuts in a scope of n
# elements: tensor ``tensor`` (with the tensor scope), or the whole model (any merged tensor's index)
CutCounts = Callable[[int, int], np.ndarray]


@dataclass(frozen=True)
class RankKey:
    """What a trim ranks: each agent's |tau| (``ABS``: TIES, breadcrumbs, DELLA), or one key shared
    by every agent (``VARIANCE``: SCE's variance of the task vectors), whose exact zeros the
    ranks skip: a cut's count c is counted among the nonzero keys, below them all."""

    high: BlockStatistic
    low: Callable[[np.ndarray], BlockStatistic]
    tie: Callable[[str, np.ndarray, np.ndarray, np.ndarray], TieBoundary]
    shared: bool  # one row; the high partial's last slot counts the zeros

    def rows(self, n_agents: int) -> int:
        return 1 if self.shared else n_agents

    def split(self, hist: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
        """A scope's high histogram (rows, HIGH_BINS) and the zeros its ranks skip (rows,)."""
        if self.shared:
            return hist[:, :HIGH_BINS], hist[:, HIGH_BINS]
        return hist, np.zeros(hist.shape[0], np.int64)


ABS = RankKey(AbsHighHistogram(), AbsLowHistogram, TieBoundary, False)
VARIANCE = RankKey(VarHighHistogram(), VarLowHistogram, VarTieBoundary, True)


@dataclass(frozen=True, eq=False)
class Trim:
    """The solved cuts: per tensor, agent and cut (arrays (tensors, N, C))."""

    kind: np.ndarray  # int8: REAL, EMPTY or FULL
    value: np.ndarray  # uint32: the bit pattern V of the boundary value
    ties: np.ndarray  # int64: elements of the tensor equal to V
    first: np.ndarray  # int64: how many of them, first in the tie order, form the "first" group
    straddle: np.ndarray  # int64 (..., 3): index block holding the last of the first group: start, stop, ties before
    boundary: np.ndarray  # int64: the ties of the first group are those at tensor positions below it
    lower_takes_first: bool

    @property
    def n_cuts(self) -> int:
        return int(self.kind.shape[2])

    def digest(self) -> str:
        flag = b"first" if self.lower_takes_first else b"last"
        return digest(self.kind, self.value, self.ties, self.first, self.straddle, flag)

    def cuts(self, block: Block) -> Cuts:
        """The block's cuts, in block positions (the backend decides membership from |tau|)."""
        n_agents = self.kind.shape[1]
        cut_v = np.empty((n_agents, 2), np.uint32)
        cut_range = np.zeros((n_agents, 2, 2), np.int64)
        cut_v[:, 1] = ALL  # one cut: everything above it
        for t in range(n_agents):
            for j in range(self.n_cuts):
                cut_v[t, j], cut_range[t, j] = self._cut(block, t, j)
        return Cuts(cut_v, cut_range)

    def keep(self, arrays: BlockArrays, block: Block, backend: Backend) -> np.ndarray:
        """uint8 (N, block.size): 1 where an agent keeps the element (for statistics; a merge
        takes ``selection``, evaluated inside its tiles)."""
        return backend.cut_keep(arrays, self.cuts(block))

    def selection(self) -> Selection:
        """The cuts as a merge evaluates them: one read of each input per block."""
        return Selection("cuts:" + self.digest(), lambda arrays, block, backend: KeepCuts(self.cuts(block)))

    def _cut(self, block: Block, t: int, j: int) -> tuple[int, tuple[int, int]]:
        at = (block.tensor, t, j)
        kind = self.kind[at]
        if kind == EMPTY:
            return 0, (0, 0)
        if kind == FULL:
            return int(ALL), (0, 0)
        limit = self._first_limit(block, at)
        return int(self.value[at]), ((0, limit) if self.lower_takes_first else (limit, block.size))

    def _first_limit(self, block: Block, at: tuple[int, int, int]) -> int:
        """The block position P such that the ties of the first group are those before P."""
        return int(min(max(int(self.boundary[at]) - block.start, 0), block.size))

    def l1_factors(self, ctx: StatsContext, name: str) -> np.ndarray:
        """float32 (tensors, N): mergekit's L1 norm matching, sum|tau| / sum|tau kept| per tensor
        and agent (1 where either sum is below 1e-7)."""
        stat = KeptL1(name, self.digest(), lambda arrays, block, tensor, backend: self.keep(arrays, block, backend))
        ctx.compute(stat)
        return l1_factors(ctx, stat)


def l1_factors(ctx: StatsContext, stat: KeptL1) -> np.ndarray:
    n_agents = len(ctx.family.agents)
    factors = np.ones((len(ctx.plan.tensors), n_agents), np.float32)
    for ti, total in tensor_totals(ctx, stat):
        for t in range(n_agents):
            before, after = finish(total[t, 0]), finish(total[t, 1])
            if before >= 1e-7 and after >= 1e-7:
                factors[ti, t] = np.float32(before / after)
    return factors


@dataclass(frozen=True, eq=False)
class Placement:
    """Stage 1, from the high histogram: per tensor, agent and cut (arrays (tensors, N, C)) its
    kind, its target high bin and its rank inside that bin."""

    kind: np.ndarray  # int8: REAL, EMPTY or FULL
    targets: np.ndarray  # int32: the target high half; -1 where the cut is not REAL
    rank: np.ndarray  # int64: position of the cut inside its target bin
    merged: list[int]  # the tensors with blocks
    key: RankKey = ABS

    def low_histogram(self) -> BlockStatistic | None:
        """Stage 2's statistic; None when no cut falls inside a scope (nothing to refine)."""
        return self.key.low(self.targets) if (self.kind == REAL).any() else None


def place(ctx: StatsContext, counts: CutCounts, n_cuts: int, scope: str, key: RankKey = ABS) -> Placement:
    """Stage 1: gather the high histogram (a pass, cached in the index) and place every cut in its bin."""
    plan = ctx.plan
    n_agents = key.rows(len(ctx.family.agents))
    shape = (len(plan.tensors), n_agents, n_cuts)
    kind = np.full(shape, EMPTY, np.int8)
    targets = np.full(shape, -1, np.int32)
    rank = np.zeros(shape, np.int64)
    merged = [ti for ti in range(len(plan.tensors)) if len(plan.blocks_of(ti))]

    ctx.compute(key.high)
    model_hist = np.zeros((n_agents, HIGH_BINS), np.int64)
    model_zeros = np.zeros(n_agents, np.int64)
    for ti, total in tensor_totals(ctx, key.high):
        hist, zeros = key.split(total)
        check_finite(plan.tensors[ti], hist, ctx.family.agent_names)
        if scope == "tensor":
            _place(kind, targets, rank, [ti], hist, _skipping(counts, plan.tensors[ti].numel, ti, zeros))
        else:
            model_hist += hist
            model_zeros += zeros
    if scope == "model":
        n = sum(plan.tensors[ti].numel for ti in merged)
        _place(kind, targets, rank, merged, model_hist, _skipping(counts, n, merged[0] if merged else 0, model_zeros))
    return Placement(kind, targets, rank, merged, key)


def _skipping(counts: CutCounts, n: int, tensor: int, zeros: np.ndarray) -> np.ndarray:
    """The cuts' counts among the n - zeros nonzero keys, moved above the zeros (the same for every row)."""
    skipped = int(zeros.max(initial=0))
    return counts(n - skipped, tensor) + zeros[:, None]


def solve(
    ctx: StatsContext, counts: CutCounts, n_cuts: int, scope: str, lower_takes_first: bool, key: RankKey = ABS
) -> Trim:
    """Gather the two histograms (two passes over the blocks, cached in the index), solve the cuts
    and find where their tie groups end (a third pass, over the blocks where they end)."""
    placed = place(ctx, counts, n_cuts, scope, key)
    kind, value, ties, first, straddle = _solved(ctx, placed, scope, lower_takes_first)
    boundary = np.where(first >= ties, _numel(ctx), 0).astype(np.int64)
    stat = _tie_statistic(kind, value, ties, first, straddle, lower_takes_first, key)
    if stat is not None:
        ctx.compute(stat)
        inside = _ends_inside(kind, ties, first)
        for ti, found in tensor_totals(ctx, stat):
            boundary[ti] = np.where(inside[ti], found, boundary[ti])
    return Trim(kind, value, ties, first, straddle, boundary, lower_takes_first)


def tie_boundaries_ahead(
    ctx: StatsContext, placed: Placement, scope: str, lower_takes_first: bool
) -> TieBoundary | None:
    """Stage 3's statistic, once stage 2's low histogram is in the index (None until then, or when
    no tie group ends inside a tensor): a sweep finds every candidate's tie boundaries in one pass."""
    low = placed.low_histogram()
    if low is None or not ctx.has(low):
        return None
    return _tie_statistic(*_solved(ctx, placed, scope, lower_takes_first), lower_takes_first, placed.key)


def _numel(ctx: StatsContext) -> np.ndarray:
    return np.array([t.numel for t in ctx.plan.tensors], np.int64)[:, None, None]


def _tie_statistic(
    kind: np.ndarray,
    value: np.ndarray,
    ties: np.ndarray,
    first: np.ndarray,
    straddle: np.ndarray,
    lower_takes_first: bool,
    key: RankKey,
) -> TieBoundary | None:
    """Where the tie groups that end inside a tensor end: the tensor position below which its
    ties form the group, found by scanning the one index block where it ends (cached)."""
    if not _ends_inside(kind, ties, first).any():
        return None
    flag = b"first" if lower_takes_first else b"last"
    return key.tie(digest(kind, value, ties, first, straddle, flag), value, first, straddle)


def _ends_inside(kind: np.ndarray, ties: np.ndarray, first: np.ndarray) -> np.ndarray:
    """Where a cut's first group of ties ends inside its tensor (neither none nor all of them)."""
    return (kind == REAL) & (first > 0) & (first < ties)


def _solved(
    ctx: StatsContext, placed: Placement, scope: str, lower_takes_first: bool
) -> tuple[np.ndarray, np.ndarray, np.ndarray, np.ndarray, np.ndarray]:
    """The cuts from stage 1's placement and the low histogram: kind, value, ties, first group and
    straddle per tensor, agent and cut."""
    n_cuts = placed.kind.shape[2]
    kind, targets, rank, merged = placed.kind, placed.targets, placed.rank, placed.merged
    plan = ctx.plan
    n_agents = kind.shape[1]
    shape = kind.shape
    value = np.zeros(shape, np.uint32)
    lower = np.zeros(shape, np.int64)  # ties in the lower set: per tensor (tensor scope) or per agent
    ties = np.zeros(shape, np.int64)
    per_block = np.zeros((len(plan.blocks), n_agents, n_cuts), np.int64)
    low = placed.low_histogram()
    if low is not None:
        ctx.compute(low)
        block_tensor = np.array([b.tensor for b in plan.blocks], np.int64)
        if scope == "tensor":
            per_block = _refined_in_one_walk(ctx, low, placed, value, lower)
        else:
            model_low = np.zeros((n_agents, n_cuts, LOW_BINS), np.int64)
            for _, hist in tensor_totals(ctx, low):
                model_low += hist
            _refine(kind, targets, rank, value, lower, merged, model_low)
            lows = (value & 0xFFFF).astype(np.int64)
            per_block = block_values(
                ctx, low, lambda b, p: np.take_along_axis(p, lows[block_tensor[b]][..., None], 2)[..., 0]
            )
        per_block = per_block.reshape(len(plan.blocks), n_agents, n_cuts) * (kind[block_tensor] == REAL)
        for ti in merged:
            blocks = plan.blocks_of(ti)
            ties[ti] = per_block[blocks.start : blocks.stop].sum(axis=0)
    first = _first_group(plan.tensors, merged, kind, ties, lower, scope, lower_takes_first)
    straddle = _straddles(ctx, merged, per_block, first, ties)
    return kind, value, ties, first, straddle


def _refined_in_one_walk(
    ctx: StatsContext, low: BlockStatistic, placed: Placement, value: np.ndarray, lower: np.ndarray
) -> np.ndarray:
    """Stage 2 in tensor scope, from one read of the low histogram (a model's worth of (N, C,
    65536) partials: for a MoE's thousands of small tensors, hundreds of chunks): each tensor's
    cuts refined once its last block is read, then its blocks' counts at the cut's low bin,
    ``(blocks, N, C)``, picked from the same window; a tensor whose blocks began in an earlier
    window has those read again, alone."""
    plan = ctx.plan
    picked = np.zeros((len(plan.blocks), *placed.kind.shape[1:]), np.int64)

    def pick(partials: np.ndarray, lows: np.ndarray) -> np.ndarray:
        return np.take_along_axis(partials, lows[None, ..., None], 3)[..., 0]

    total = np.zeros(0, np.int64)  # the tensor's sum over the blocks read so far
    for t, b, piece in tensor_pieces(ctx, low):
        blocks = plan.blocks_of(t)
        part = piece.sum(axis=0, dtype=np.int64)
        total = part if b == blocks.start else total + part
        end = b + len(piece)
        if end == blocks.stop:  # its last block: refine its cuts, pick its blocks' counts
            _refine(placed.kind, placed.targets, placed.rank, value, lower, [t], total)
            lows = (value[t] & 0xFFFF).astype(np.int64)
            picked[b:end] = pick(piece, lows)
            if blocks.start < b:  # it began in an earlier window: those blocks read again, a unit at a time
                for first, partials in ctx.in_units(low, range(blocks.start, b)):
                    picked[first : first + len(partials)] = pick(partials, lows)
    return picked


def _locate(hist: np.ndarray, c: int) -> tuple[int, int]:
    """The bin holding the element of ascending rank c (0-based), and how many lie in lower bins."""
    cum = np.cumsum(hist, dtype=np.int64)
    b = int(np.searchsorted(cum, c, side="right"))
    return b, int(cum[b] - hist[b])


def _place(
    kind: np.ndarray, targets: np.ndarray, rank: np.ndarray, tensors: list[int], hist: np.ndarray, c: np.ndarray
) -> None:
    """Stage 1 for one scope: each cut's target high bin and its rank inside that bin."""
    n = int(hist[0].sum())
    for t in range(c.shape[0]):
        for j in range(c.shape[1]):
            count = int(c[t, j])
            if count <= 0 or count >= n:
                kind[tensors, t, j] = EMPTY if count <= 0 else FULL
                continue
            b, below = _locate(hist[t], count)
            kind[tensors, t, j] = REAL
            targets[tensors, t, j] = b
            rank[tensors, t, j] = count - below


def _refine(
    kind: np.ndarray,
    targets: np.ndarray,
    rank: np.ndarray,
    value: np.ndarray,
    lower: np.ndarray,
    tensors: list[int],
    hist: np.ndarray,
) -> None:
    """Stage 2 for one scope: the exact boundary value and how many of its ties the lower set takes."""
    ti = tensors[0]
    for t in range(hist.shape[0]):
        for j in range(hist.shape[1]):
            if kind[ti, t, j] != REAL:
                continue
            b, below = _locate(hist[t, j], int(rank[ti, t, j]))
            value[tensors, t, j] = (int(targets[ti, t, j]) << 16) | b
            lower[tensors, t, j] = int(rank[ti, t, j]) - below


def _first_group(
    tensors: tuple[TensorPlan, ...],
    merged: list[int],
    kind: np.ndarray,
    ties: np.ndarray,
    lower: np.ndarray,
    scope: str,
    lower_takes_first: bool,
) -> np.ndarray:
    """Per tensor, how many of its ties (first by index) form the first group of the tie order."""
    first = np.zeros_like(ties)
    if scope == "tensor":
        first[merged] = lower[merged] if lower_takes_first else ties[merged] - lower[merged]
    else:
        order = sorted(merged, key=lambda ti: tensors[ti].name)
        # lower[ti] is the same for every tensor: the model's ties in the lower set, per agent and cut
        total = ties[order].sum(axis=0)
        remaining = (lower[order[0]] if lower_takes_first else total - lower[order[0]]).copy() if order else 0
        for ti in order:
            first[ti] = np.clip(remaining, 0, ties[ti])
            remaining = remaining - first[ti]
    return np.where(kind == REAL, first, 0)


def _straddles(
    ctx: StatsContext, merged: list[int], per_block: np.ndarray, first: np.ndarray, ties: np.ndarray
) -> np.ndarray:
    """For cuts whose first group ends inside a tensor: the index block where it ends."""
    plan = ctx.plan
    out = np.zeros((*first.shape, 3), np.int64)
    for ti in merged:
        blocks = plan.blocks_of(ti)
        cum = np.cumsum(per_block[blocks.start : blocks.stop], axis=0)  # ties up to and including each block
        for t in range(first.shape[1]):
            for j in range(first.shape[2]):
                f = int(first[ti, t, j])
                if 0 < f < ties[ti, t, j]:
                    k = int(np.searchsorted(cum[:, t, j], f, side="left"))
                    b = plan.blocks[blocks.start + k]
                    out[ti, t, j] = (b.start, b.stop, int(cum[k, t, j] - per_block[blocks.start + k, t, j]))
    return out
