"""DARE (drop and rescale, arXiv 2311.03099): mergekit's ``dare_linear`` and ``dare_ties``.

Each agent's task vector keeps element i with probability ``density`` (drop rate p = 1 - density):
kept where ``counter_rng.uniform(stream_key(seed, agent, tensor), i) < float32(density)``, so the
draws are a pure function of (seed, agent, tensor name, element index). Survivors are rescaled:

- ``rescale="l1"`` (the default, mergekit's ``rescale: true``): per tensor and agent, survivors are
  multiplied by ``float32(sum |tau| / sum |tau kept|)``, both sums exact (``DareL1Sums``) and
  divided in float64; factor 1 where either sum is below 1e-7 (mergekit's ``RescaleNorm.l1``).
  This needs one extra read of the inputs (a statistics pass, cached in the index).
- ``rescale="inverse"``: survivors times ``float32(1 / density)`` = 1 / (1 - p), as in the DARE
  paper. A single read.
- ``rescale="none"`` (mergekit's ``rescale: false``): survivors as they are.

Then generalized task arithmetic (``ramstream.backends.numba.gta``) with the agents' weights:
``dare_linear`` sums the weighted deltas, ``dare_ties`` keeps those that agree with the sign
elected by summed mass. ``normalize`` (default off, as mergekit) divides by the summed weights;
``lambda`` (default 1) scales the result. A density of 1 keeps an agent's task vector whole
and unscaled. Weights default to 1 (mergekit requires them), density to 1 and seed to 0.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any, Literal

import numpy as np

from ramstream.backends.base import Consensus
from ramstream.backends.rng import random_keys
from ramstream.methods import options
from ramstream.methods import tensor_settings as ts
from ramstream.methods.base import MethodSpec, Prepared, refuse_unknown
from ramstream.methods.gta import (
    RandomDrop,
    check_weighting,
    gta_prepared,
    parse_weighting,
    uniform_report,
    weight_report,
)
from ramstream.methods.options import OptionError
from ramstream.statistics.context import StatsContext
from ramstream.statistics.exact_sums import DareL1Sums, tensor_sums

Rescale = Literal["l1", "inverse", "none"]
L1_EPS = 1e-7
DARE_OPTIONS = {"weights", "density", "lambda", "normalize", "seed", "rescale"}


@dataclass(frozen=True)
class DareParams:
    weights: tuple[ts.Setting, ...]
    density: tuple[ts.Setting, ...]
    lam: ts.Setting = 1.0
    normalize: bool = False
    seed: int = 0
    rescale: Rescale = "l1"

    def to_dict(self) -> dict[str, Any]:
        return {
            "weights": [ts.to_json(w) for w in self.weights],
            "density": [ts.to_json(d) for d in self.density],
            "lambda": ts.to_json(self.lam),
            "normalize": self.normalize,
            "seed": self.seed,
            "rescale": self.rescale,
        }


def _rescale(value: Any) -> Rescale:
    if value is True:
        return "l1"
    if value is False:
        return "none"
    if value in ("l1", "inverse", "none"):
        return value  # type: ignore[no-any-return]
    raise OptionError("rescale", f"must be l1, inverse or none, got {value!r}")


def dare_spec(name: str, consensus: Consensus) -> MethodSpec:
    def parse(given: Mapping[str, Any], n_agents: int) -> DareParams:
        refuse_unknown(name, given, DARE_OPTIONS)
        density = ts.per_agent("density", given.get("density", 1.0), n_agents)
        ts.in_range("density", density, 0.0, 1.0, low_open=True)
        weights, lam = parse_weighting(given, n_agents)
        return DareParams(
            weights=weights,
            density=density,
            lam=lam,
            normalize=options.boolean("normalize", given.get("normalize", False)),
            seed=options.seed("seed", given.get("seed", 0)),
            rescale=_rescale(given.get("rescale", "l1")),
        )

    def prepare(params: DareParams, ctx: StatsContext) -> Prepared:
        names = list(ctx.family.base.tensors)
        n_agents = len(params.weights)
        keys = np.array([random_keys(params.seed, n_agents, name) for name in names], np.uint64).reshape(
            len(names), n_agents
        )
        density = ts.per_tensor64(params.density, names)
        return gta_prepared(
            {**weight_report(params.weights), **uniform_report("density", params.density)},
            ts.per_tensor(params.weights, names),
            dare_scales(params, ctx, density),
            ts.resolve(params.lam, names).astype(np.float32),
            consensus=consensus,
            normalize=params.normalize,
            drop=RandomDrop(keys, density.astype(np.float32)),
        )

    summary = "DARE: random drop + rescale, then " + ("TIES sign election" if consensus == "sum" else "weighted sum")

    def check(params: DareParams, names: Sequence[str]) -> None:
        check_weighting(params.weights, params.lam, names)
        ts.check(params.density, names)

    return MethodSpec(name, summary, parse, prepare, check=check)


def dare_scales(params: DareParams, ctx: StatsContext, density: np.ndarray) -> np.ndarray:
    """The float32 rescale factor of each tensor's (rows) surviving elements per agent (columns),
    from the float64 densities (tensors, N)."""
    whole = density >= 1.0
    if params.rescale == "none" or whole.all():
        return np.ones(density.shape, np.float32)
    if params.rescale == "inverse":
        return np.ascontiguousarray((1.0 / density).astype(np.float32))
    density32 = density.astype(np.float32)
    uniform = ts.uniform(params.density)
    stat = (
        DareL1Sums(params.seed, tuple(float(d) for d in density32[0]), ctx.allow_nonfinite)
        if uniform is not None and len(density32)
        else DareL1Sums(params.seed, (), ctx.allow_nonfinite, _by_name(ctx, density32))
    )
    sums = tensor_sums(ctx, stat)  # (tensors, N, 2)
    return l1_factors(sums[..., 0], sums[..., 1], whole)


def _by_name(ctx: StatsContext, density32: np.ndarray) -> tuple[tuple[str, tuple[float, ...]], ...]:
    return tuple(
        (name, tuple(float(d) for d in row)) for name, row in zip(ctx.family.base.tensors, density32, strict=True)
    )


def l1_factors(before: np.ndarray, after: np.ndarray, whole: np.ndarray) -> np.ndarray:
    """float32(before / after) computed in float64; 1 where either is below 1e-7 or density is 1
    (``whole``, (tensors, N))."""
    with np.errstate(divide="ignore", invalid="ignore"):
        ratio = before / after
    tiny = (before < L1_EPS) | (after < L1_EPS) | whole
    return np.ascontiguousarray(np.where(tiny, 1.0, ratio).astype(np.float32))


DARE_LINEAR = dare_spec("dare_linear", "none")
DARE_TIES = dare_spec("dare_ties", "sum")
