"""Arcee Fusion, as mergekit 0.1.5's ``arcee_fusion``: the base, taking the agent's change only
where it matters most.

The base and exactly one agent, no parameters. Per tensor, with a = f32(base), b = f32(agent)
and d = b - a (float32):

    importance = f32(|d|) * f32(KL_row)      KL_row: see ``statistics/fusion.py``
    threshold  = median + 1.5 * (q3 - q1)     of the tensor's importances, in float32
    merged     = a + d * m,   m = 1 where importance >= threshold, else 0

q1, median and q3 are the elements of ascending rank floor(q (n - 1)), q = 0.25, 0.5, 0.75, of
all the tensor's n importances: mergekit's exact branch (it sorts a random sample of 1e6 when a
tensor is larger; ramstream is exact there too, and deterministic). They are found out of core,
as TIES's top-k: the high halves of the importances' bit patterns (``ImportanceHigh``) place each
rank in a bin, the low halves of the three target bins (``ImportanceLow``) give the exact bits;
only values are needed (the mask compares values), so ties need no order. Two passes over the
inputs, cached in the index, then the merge.

Where the transcendental part is computed. mergekit computes the softmaxes and the KL in float32
with torch's vectorised exp/log; the backends' exp/log differ from torch's and from each other in
the last bit, so none of them computes it: the KL of each row is computed once per read of the
row, on the host, with numpy in float64, rounded to float32 (``statistics/fusion.py``), and
handed to every backend with the block. Every backend then does the same two float32 operations
(|d|, times the KL) and one comparison: the same bits on every backend, block size and thread
count. The float64 KL is the exact one rounded once; mergekit's float32 sum carries a relative
error of up to ~1e-4 for nearly equal rows, so an element whose importance lies that close to the
threshold may fall on the other side of it (docs/methods.md, parity).

Merge blocks hold whole dim-0 slices (``row_aligned``: whole rows of the last dimension); the
statistics' blocks read the rows they touch whole (``BlockArrays.span``).
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

import numpy as np

from ramstream.backends.base import Backend
from ramstream.blocks import BlockArrays
from ramstream.errors import ConfigError
from ramstream.methods.base import MethodSpec, Prepared, refuse_unknown
from ramstream.plan import Block
from ramstream.statistics.base import BlockStatistic
from ramstream.statistics.context import StatsContext
from ramstream.statistics.fusion import ImportanceHigh, ImportanceLow, row_scale
from ramstream.statistics.magnitude import tensor_totals

N_QUANTILES = 3  # q1, median, q3


@dataclass(frozen=True)
class ArceeFusionParams:
    def to_dict(self) -> dict[str, Any]:
        return {}


def parse_arcee_fusion(given: Mapping[str, Any], n_agents: int) -> ArceeFusionParams:
    refuse_unknown("arcee_fusion", given, set())
    if n_agents != 1:
        raise ConfigError(f"arcee_fusion merges the base and ONE agent; got {n_agents} agents")
    return ArceeFusionParams()


def quantile_ranks(n: int) -> tuple[int, int, int]:
    """floor(q (n - 1)) for q = 0.25, 0.5, 0.75, in integers (mergekit's float32 product is exact for
    the n <= 1e6 it sorts whole)."""
    return (n - 1) // 4, (n - 1) // 2, 3 * (n - 1) // 4


def thresholds(ctx: StatsContext) -> np.ndarray:
    """float32 (tensors,): median + 1.5 * (q3 - q1) of each tensor's importances (0 where a tensor
    has no blocks); two histogram passes, cached in the index."""
    plan = ctx.plan
    targets = np.full((len(plan.tensors), N_QUANTILES), -1, np.int32)
    inner = np.zeros((len(plan.tensors), N_QUANTILES), np.int64)  # rank within the target bin
    high = ImportanceHigh()
    ctx.compute(high)
    for ti, hist in tensor_totals(ctx, high):
        for c, rank in enumerate(quantile_ranks(plan.tensors[ti].numel)):
            targets[ti, c], below = _locate(hist, rank)
            inner[ti, c] = rank - below
    bits = np.zeros(targets.shape, np.uint32)
    low = ImportanceLow(targets)
    ctx.compute(low)
    for ti, hist in tensor_totals(ctx, low):
        for c in range(N_QUANTILES):
            low_half, _ = _locate(hist[c], int(inner[ti, c]))
            bits[ti, c] = (int(targets[ti, c]) << 16) | low_half
    q1, median, q3 = bits.view(np.float32).T
    return median + np.float32(1.5) * (q3 - q1)  # float32, one rounding per operation, as mergekit's torch


def _locate(hist: np.ndarray, rank: int) -> tuple[int, int]:
    """The bin holding the element of ascending ``rank`` (0-based), and how many lie in lower bins."""
    cum = np.cumsum(hist, dtype=np.int64)
    b = int(np.searchsorted(cum, rank, side="right"))
    return b, int(cum[b] - hist[b])


def prepare_arcee_fusion(params: ArceeFusionParams, ctx: StatsContext) -> Prepared:
    threshold = thresholds(ctx)
    tensors = ctx.plan.tensors

    def merge_block(arrays: BlockArrays, block: Block, out: np.ndarray, out_code: int, backend: Backend) -> int:
        rows = row_scale(arrays, tensors[block.tensor])
        return backend.merge_fusion(arrays, rows, threshold[block.tensor], out, out_code)

    return Prepared(merge_block)


def statistics_ahead(params: ArceeFusionParams, ctx: StatsContext) -> tuple[BlockStatistic, ...]:
    """The high histogram depends on nothing but the inputs: a sweep gathers it with the others'."""
    return (ImportanceHigh(),)


ARCEE_FUSION = MethodSpec(
    "arcee_fusion",
    "the base, taking the agent's change where |change| x row KL is an outlier (mergekit's arcee_fusion)",
    parse_arcee_fusion,
    prepare_arcee_fusion,
    row_aligned=True,
    accepts_nonfinite=False,
    statistics_ahead=statistics_ahead,
)
