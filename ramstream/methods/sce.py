"""SCE (select, calculate, erase; arXiv 2408.07990), as mergekit 0.1.5's ``sce``.

Per tensor, with tau_t = f32(agent_t) - f32(base) over N agents:

1. select (``select_topk`` < 1): var = the population variance of the tau_t per element
   (``Backend.variance``: torch's CPU ``var(unbiased=False)`` to the bit); with nz the elements
   whose var is not 0, k = int(float32(nz) * float32(select_topk)) (torch's float32 product);
   every agent keeps the k elements of largest var and has tau = 0 elsewhere. Ranks are exact
   (``methods/trim.py`` with the ``VARIANCE`` key); of the elements equal to the k-th largest
   var, those of lowest index are kept (mergekit's ``torch.topk`` leaves that order open).
   select_topk >= 1 keeps everything, 0 nothing.
2. calculate: w_t = mean over the tensor of the kept tau_t^2 (exact sums, rounded to float32
   once), divided by their float32 sum in agent order (1/N each where that sum is below 1e-6).
3. erase: the majority sign is + where the sum of the kept tau is >= 0; agent t counts where
   its kept tau has that sign (0 never counts).
4. merged = base + sum_t(tau_t * w_t * c_t) / max(sum_t(w_t * c_t), 1e-6), in float32
   (``Backend.merge_sce``).

Statistics: with 0 < select_topk < 1 the variance's histograms and tie boundaries (up to three
passes, cached in the index), then the sums of squares of the kept elements (one pass); with
select_topk >= 1 only the sums of squares; with 0 none.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np

from ramstream.backends.base import ALL, Backend, Cuts
from ramstream.backends.base import SceParams as SceRecord
from ramstream.backends.exact_sum import finish
from ramstream.blocks import BlockArrays
from ramstream.methods import tensor_settings as ts
from ramstream.methods import trim
from ramstream.methods.base import MethodSpec, Prepared, refuse_unknown
from ramstream.plan import Block
from ramstream.statistics.context import StatsContext
from ramstream.statistics.magnitude import digest, tensor_totals
from ramstream.statistics.variance import KeptSquares, kept_by_cut, key_bits

MIN_WEIGHT_SUM = 1e-6  # below it, mergekit weighs the agents equally


@dataclass(frozen=True)
class SceParams:
    select_topk: ts.Setting  # a number, or a value per tensor (gradients and filters)

    def to_dict(self) -> dict[str, Any]:
        return {"select_topk": ts.to_json(self.select_topk)}


def parse_sce(given: Mapping[str, Any], n_agents: int) -> SceParams:
    refuse_unknown("sce", given, {"select_topk"})
    topk = ts.parse("select_topk", given.get("select_topk", 1.0))
    ts.in_range("select_topk", (topk,), 0.0, 1.0)
    return SceParams(topk)


def top_k(select_topk: np.ndarray) -> trim.CutCounts:
    """The dropped lower set among nz nonzero variances: nz - k, k as mergekit's float32 product
    (``select_topk``: float64 per tensor)."""

    def counts(nonzero: int, tensor: int) -> np.ndarray:
        k = int(np.float32(np.float32(nonzero) * np.float32(select_topk[tensor])))
        return np.array([[nonzero - min(max(k, 0), nonzero)]], np.int64)

    return counts


def _fixed_cuts(keep_all: bool) -> Cuts:
    """Everything (an empty dropped set) or nothing (every variance dropped)."""
    value = np.array([[0 if keep_all else ALL, ALL]], np.uint32)
    return Cuts(value, np.zeros((1, 2, 2), np.int64))


def sce_weights(ctx: StatsContext, stat: KeptSquares) -> np.ndarray:
    """float32 (tensors, N): mergekit's sce_weight from exact sums of the kept tau^2."""
    n_agents = len(ctx.family.agents)
    ctx.compute(stat)
    weights = np.full((len(ctx.plan.tensors), n_agents), np.float32(1.0) / np.float32(n_agents), np.float32)
    for ti, total in tensor_totals(ctx, stat):
        numel = ctx.plan.tensors[ti].numel
        means = np.array([finish(total[t, 1]) / numel for t in range(n_agents)], np.float64).astype(np.float32)
        weights[ti] = normalised(means)
    return weights


def normalised(means: np.ndarray) -> np.ndarray:
    """float32 weights from the float32 means: divided by their float32 sum, or 1/N each."""
    total = np.float32(0.0)
    for m in means:
        total = np.float32(total + m)
    if abs(float(total)) < MIN_WEIGHT_SUM:
        return np.full(len(means), np.float32(1.0) / np.float32(len(means)), np.float32)
    return (means / total).astype(np.float32)


def prepare_sce(params: SceParams, ctx: StatsContext) -> Prepared:
    n_agents = len(ctx.family.agents)
    topk = ts.resolve(params.select_topk, [t.name for t in ctx.plan.tensors])
    nothing, everything = _fixed_cuts(keep_all=False), _fixed_cuts(keep_all=True)
    if (topk <= 0).all():
        weights = np.full((len(ctx.family.base.tensors), n_agents), np.float32(1.0) / np.float32(n_agents))
        return _prepared(weights, lambda block: nothing)
    if (topk >= 1).all():

        def keep_all(arrays: BlockArrays, block: Block, backend: Backend) -> np.ndarray:
            return np.ones(arrays.size, bool)

        return _prepared(sce_weights(ctx, KeptSquares("all", keep_all)), lambda block: everything)
    solved = trim.solve(ctx, top_k(topk), 1, "tensor", lower_takes_first=False, key=trim.VARIANCE)

    def cuts(block: Block) -> Cuts:
        """A tensor's own select_topk: everything (>= 1), nothing (<= 0) or its solved cut."""
        t = topk[block.tensor]
        return everything if t >= 1 else nothing if t <= 0 else solved.cuts(block)

    def keep(arrays: BlockArrays, block: Block, backend: Backend) -> np.ndarray:
        t = topk[block.tensor]
        if t >= 1 or t <= 0:
            return np.full(arrays.size, t >= 1, bool)
        chosen = solved.cuts(block)
        return kept_by_cut(key_bits(arrays, backend), chosen.value[0], chosen.range[0])

    uniform = ts.uniform((params.select_topk,)) is not None
    what = solved.digest() if uniform else digest(solved.digest(), topk.astype(np.float64))
    stat = KeptSquares(digest(what, "variance"), keep)
    weights = sce_weights(ctx, stat)
    weights[topk <= 0] = np.float32(1.0) / np.float32(n_agents)
    return _prepared(weights, cuts)


def check_sce(params: SceParams, names: Sequence[str]) -> None:
    ts.check([params.select_topk], names)


def _prepared(weights: np.ndarray, cuts_of: Callable[[Block], Cuts]) -> Prepared:
    def merge_block(arrays: BlockArrays, block: Block, out: np.ndarray, out_code: int, backend: Backend) -> int:
        return backend.merge_sce(arrays, SceRecord(weights[block.tensor], cuts_of(block)), out, out_code)

    return Prepared(merge_block)


SCE = MethodSpec(
    "sce",
    "SCE: keep the select_topk highest-variance elements, weigh agents by their squared mass, erase minority signs",
    parse_sce,
    prepare_sce,
    accepts_nonfinite=False,
    check=check_sce,
)
