"""Model stock (arXiv 2403.19522), as mergekit's ``model_stock`` with ``filter_wise: false``.

Per tensor, from exact sums over the agents' task vectors (``Gram``, float64):

    cos_ab = clamp(<tau_a, tau_b> / max(|tau_a| |tau_b|, 1e-6), -1, 1)      for each pair a < b
    cos    = mean of cos_ab over the pairs (summed in pair order)
    t      = N cos / (1 + (N - 1) cos), or 0 where |1 + (N - 1) cos| < 1e-6

then ``merged = theta_0 + float32(t) * mean_t(tau_t)`` in float32 through the generalized task
arithmetic kernel (weights 1, normalized: the sum of the task vectors in agent order divided by
N). mergekit writes ``t * mean(theta) + (1 - t) * theta_0``, equal in exact arithmetic; the task
vector form rounds once less and returns the base exactly where t = 0 or every agent equals it.
Needs at least 2 agents (mergekit: 3 models with the base). One statistics pass, then the merge.
"""

from __future__ import annotations

import math
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

import numpy as np

from ramstream.errors import ConfigError
from ramstream.methods.base import MethodSpec, Prepared, refuse_unknown
from ramstream.methods.gta import gta_prepared
from ramstream.statistics.context import StatsContext
from ramstream.statistics.exact_sums import Gram, pairs, tensor_sums


@dataclass(frozen=True)
class ModelStockParams:
    def to_dict(self) -> dict[str, Any]:
        return {"filter_wise": False}


def parse_model_stock(given: Mapping[str, Any], n_agents: int) -> ModelStockParams:
    refuse_unknown("model_stock", given, {"filter_wise"})
    if given.get("filter_wise", False) is not False:
        raise ConfigError("--filter-wise is not supported by ramstream's model_stock (one t per tensor only)")
    return ModelStockParams()


def interpolation(gram: np.ndarray, n_agents: int) -> float:
    """model stock's t (float64) of one tensor from its sums tau_a . tau_b (``pairs`` order)."""
    index = {pair: k for k, pair in enumerate(pairs(n_agents))}
    norms = [math.sqrt(gram[index[(a, a)]]) for a in range(n_agents)]
    cosines = []
    for a in range(n_agents):
        for b in range(a + 1, n_agents):
            product = max(norms[a] * norms[b], 1e-6)
            cosines.append(min(max(gram[index[(a, b)]] / product, -1.0), 1.0))
    cos = sum(cosines) / len(cosines)
    denominator = 1 + (n_agents - 1) * cos
    return 0.0 if abs(denominator) < 1e-6 else n_agents * cos / denominator


def prepare_model_stock(params: ModelStockParams, ctx: StatsContext) -> Prepared:
    n_agents = len(ctx.family.agents)
    grams = tensor_sums(ctx, Gram(allow_nonfinite=ctx.allow_nonfinite))
    t = np.array([interpolation(g, n_agents) for g in grams], np.float64).astype(np.float32)
    return gta_prepared({}, np.ones(n_agents, np.float32), np.ones((len(t), n_agents), np.float32), t, normalize=True)


MODEL_STOCK = MethodSpec(
    "model_stock",
    "theta0 + t * mean task vector, t from the angle between the agents' task vectors",
    parse_model_stock,
    prepare_model_stock,
    min_agents=2,
)
