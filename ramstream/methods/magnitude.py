"""TIES, breadcrumbs and breadcrumbs with TIES: magnitude trimming, then generalized task arithmetic.

As mergekit 0.1.5 (``sparsify.magnitude`` / ``magnitude_outliers`` and
``GeneralizedTaskArithmeticMerge``), per agent t over a scope (each tensor, or with
``trim_scope="model"`` the whole model: the original TIES code):

- ``ties``: keep the k = max(1, int(density * n)) largest |tau| (n = elements of the scope;
  density >= 1 keeps all, density <= 0 none); sign election by summed mass (consensus ``sum``);
  normalize by default.
- ``breadcrumbs`` / ``breadcrumbs_ties``: with target = int(density * n), top = int(gamma * n) and
  bottom = max(0, n - target - top), keep the elements of ascending ranks [bottom, bottom + target)
  (density >= 1 keeps all); no consensus / consensus ``sum``; no normalization by default.

Ranks are exact and ties are broken by position (see ``ramstream.methods.trim`` and
docs/methods-magnitude.md): TIES keeps, of the elements equal to its threshold, those of lowest
index; breadcrumbs orders ties by index in the ascending order (a stable sort), so at its lower
boundary the lowest-index ties are dropped and at its upper boundary the lowest-index ties kept.
With ``rescale="l1"`` (``True``) the survivors of each tensor are scaled by sum|tau| / sum|tau kept|
(mergekit's L1 norm matching, exact sums; skipped when either is below 1e-7); the default is
``"none"`` (``False``), as mergekit.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any, Literal

import numpy as np

from ramstream.backends.base import Consensus
from ramstream.errors import ConfigError
from ramstream.methods import options, trim
from ramstream.methods import tensor_settings as ts
from ramstream.methods.base import MethodSpec, Prepared, refuse_unknown
from ramstream.methods.gta import check_weighting, gta_prepared, parse_weighting, uniform_report, weight_report
from ramstream.methods.options import OptionError
from ramstream.statistics.base import BlockStatistic
from ramstream.statistics.context import StatsContext

TrimScope = Literal["tensor", "model"]
Rescale = Literal["l1", "none"]


@dataclass(frozen=True)
class MagnitudeMethod:
    name: str
    summary: str
    outliers: bool  # breadcrumbs' window (with gamma) rather than TIES' top-k
    consensus: Literal["none", "sum"]
    normalize: bool  # mergekit's default


MAGNITUDE_METHODS = {
    m.name: m
    for m in (
        MagnitudeMethod(
            "ties", "TIES: keep the top-density |tau|, elect signs by summed mass, disjoint mean", False, "sum", True
        ),
        MagnitudeMethod(
            "breadcrumbs",
            "Model Breadcrumbs: drop the largest gamma and the smallest |tau|, then add",
            True,
            "none",
            False,
        ),
        MagnitudeMethod("breadcrumbs_ties", "Model Breadcrumbs with TIES sign election", True, "sum", False),
    )
}


@dataclass(frozen=True)
class MagnitudeParams:
    weights: tuple[ts.Setting, ...]
    density: tuple[ts.Setting, ...]
    gamma: tuple[ts.Setting, ...] | None  # breadcrumbs only
    lam: ts.Setting
    normalize: bool
    rescale: Rescale
    trim_scope: TrimScope

    def to_dict(self) -> dict[str, Any]:
        out: dict[str, Any] = {
            "weights": [ts.to_json(w) for w in self.weights],
            "density": [ts.to_json(d) for d in self.density],
        }
        if self.gamma is not None:
            out["gamma"] = [ts.to_json(g) for g in self.gamma]
        out["lambda"] = ts.to_json(self.lam)
        out["normalize"] = self.normalize
        out["rescale"] = self.rescale
        out["trim_scope"] = self.trim_scope
        return out


def parse_magnitude(method: MagnitudeMethod, given: Mapping[str, Any], n_agents: int) -> MagnitudeParams:
    allowed = {"weights", "density", "lambda", "normalize", "rescale", "trim_scope"}
    if method.outliers:
        allowed.add("gamma")
    refuse_unknown(method.name, given, allowed)
    density = ts.per_agent("density", given.get("density", 1.0), n_agents)
    ts.in_range("density", density, 0.0, 1.0)
    gamma = None
    if method.outliers:
        gamma = ts.per_agent("gamma", given.get("gamma", 0.01), n_agents)
        ts.in_range("gamma", gamma, 0.0, 1.0)
    weights, lam = parse_weighting(given, n_agents)
    scope = trim_scope(given.get("trim_scope", "tensor"))
    if scope == "model" and ts.uniform((*density, *(gamma or ()))) is None:
        raise ConfigError(
            "--trim-scope model ranks each agent over the whole model, with one density (and gamma) per "
            "agent: a value per tensor (a gradient or filter) needs --trim-scope tensor"
        )
    return MagnitudeParams(
        weights=weights,
        density=density,
        gamma=gamma,
        lam=lam,
        normalize=options.boolean("normalize", given.get("normalize", method.normalize)),
        rescale=rescale_choice(given.get("rescale", "none")),
        trim_scope=scope,
    )


def rescale_choice(value: Any) -> Rescale:
    if value is True or value == "l1":
        return "l1"
    if value is False or value == "none":
        return "none"
    raise OptionError("rescale", f"must be l1 or none (or true / false) with magnitude trimming, got {value!r}")


def trim_scope(value: Any) -> TrimScope:
    if value == "tensor":
        return "tensor"
    if value == "model":
        return "model"
    raise OptionError("trim_scope", f"must be tensor or model, got {value!r}")


def top_k_counts(density: np.ndarray) -> trim.CutCounts:
    """TIES: one cut per agent at n - k (the dropped lower set), k = max(1, int(density * n)), with
    ``density`` float64 (tensors, N): the tensor's own row (the model scope has one row's values)."""

    def counts(n: int, tensor: int) -> np.ndarray:
        out = np.empty((density.shape[1], 1), np.int64)
        for t, d in enumerate(density[tensor]):
            if d >= 1:
                out[t, 0] = 0
            elif d <= 0:
                out[t, 0] = n
            else:
                out[t, 0] = max(0, n - max(1, int(d * n)))
        return out

    return counts


def outlier_counts(density: np.ndarray, gamma: np.ndarray) -> trim.CutCounts:
    """Breadcrumbs: cuts at bottom and bottom + target (keep the ascending ranks between them)."""

    def counts(n: int, tensor: int) -> np.ndarray:
        out = np.empty((density.shape[1], 2), np.int64)
        for t, (d, g) in enumerate(zip(density[tensor], gamma[tensor], strict=True)):
            if d >= 1:
                out[t] = (0, n)
                continue
            target = int(d * n)
            bottom = max(0, n - target - int(g * n))
            out[t] = (bottom, bottom + target)
        return out

    return counts


def cut_counts(method: MagnitudeMethod, params: MagnitudeParams, names: Sequence[str]) -> tuple[trim.CutCounts, int]:
    """The method's cuts per agent: their counts in a scope of n elements, and how many."""
    density = ts.per_tensor64(params.density, names)
    if method.outliers:
        assert params.gamma is not None
        return outlier_counts(density, ts.per_tensor64(params.gamma, names)), 2
    return top_k_counts(density), 1


def refinement(method: MagnitudeMethod, params: MagnitudeParams, ctx: StatsContext) -> tuple[BlockStatistic, ...]:
    """The statistics ``prepare_magnitude`` will ask for, as far as they are known: the low
    histogram once the high one is, the tie boundaries once the low one is. A sweep computes
    every density's in one pass per stage."""
    counts, n_cuts = cut_counts(method, params, _names(ctx))
    placed = trim.place(ctx, counts, n_cuts, params.trim_scope)
    low = placed.low_histogram()
    if low is None:
        return ()
    ties = trim.tie_boundaries_ahead(ctx, placed, params.trim_scope, method.outliers)
    return (low,) if ties is None else (low, ties)


def prepare_magnitude(method: MagnitudeMethod, params: MagnitudeParams, ctx: StatsContext) -> Prepared:
    counts, n_cuts = cut_counts(method, params, _names(ctx))
    solved = trim.solve(ctx, counts, n_cuts, params.trim_scope, lower_takes_first=method.outliers)
    n_tensors, n_agents = len(ctx.plan.tensors), len(params.weights)
    if params.rescale == "l1":
        scale = solved.l1_factors(ctx, method.name)  # exactly 1 where an agent keeps everything
    else:
        scale = np.ones((n_tensors, n_agents), np.float32)
    names = [t.name for t in ctx.plan.tensors]
    consensus: Consensus = "sum" if method.consensus == "sum" else "none"
    normalize = params.normalize

    kept = kept_fraction(counts, n_cuts, ctx, params.trim_scope)
    per_agent = {**weight_report(params.weights), **uniform_report("density", params.density), "kept": kept}
    return gta_prepared(
        per_agent,
        ts.per_tensor(params.weights, names),
        scale,
        ts.resolve(params.lam, names).astype(np.float32),
        consensus=consensus,
        normalize=normalize,
        select=solved.selection(),
    )


def kept_fraction(counts: trim.CutCounts, n_cuts: int, ctx: StatsContext, scope: TrimScope) -> tuple[float, ...]:
    """The exact share of the model's merged elements each agent keeps."""
    sizes = {ti: t.numel for ti, t in enumerate(ctx.plan.tensors) if t.merged and t.numel}
    total = sum(sizes.values())
    if total == 0:
        return (0.0,) * len(ctx.family.agents)
    scopes = [(total, next(iter(sizes)))] if scope == "model" else [(n, ti) for ti, n in sizes.items()]
    kept = sum((c[:, 1] if n_cuts == 2 else n) - c[:, 0] for n, ti in scopes for c in [counts(n, ti)])
    return tuple(float(k) / total for k in np.atleast_1d(kept))


def _names(ctx: StatsContext) -> list[str]:
    return [t.name for t in ctx.plan.tensors]


def magnitude_spec(name: str) -> MethodSpec:
    method = MAGNITUDE_METHODS[name]

    def parse(given: Mapping[str, Any], n_agents: int) -> MagnitudeParams:
        return parse_magnitude(method, given, n_agents)

    def prepare(params: MagnitudeParams, ctx: StatsContext) -> Prepared:
        return prepare_magnitude(method, params, ctx)

    def ahead(params: MagnitudeParams, ctx: StatsContext) -> tuple[BlockStatistic, ...]:
        return refinement(method, params, ctx)

    def check(params: MagnitudeParams, names: Sequence[str]) -> None:
        check_weighting(params.weights, params.lam, names)
        ts.check([*params.density, *(params.gamma or ())], names)

    return MethodSpec(
        name, method.summary, parse, prepare, accepts_nonfinite=False, statistics_ahead=ahead, check=check
    )
