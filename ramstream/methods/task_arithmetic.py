"""Task arithmetic (arXiv 2212.04089), as mergekit's ``task_arithmetic``.

    merged = theta_0 + lambda * sum_t w_t tau_t                      (normalize off, the default)
    merged = theta_0 + lambda * sum_t w_t tau_t / sum_t w_t          (normalize; |sum w| < 1e-8 -> 1)

in float32 through the generalized task arithmetic kernel (``ramstream.backends.numba.gta``).
Weights default to 1 for every agent (mergekit requires them), lambda to 1.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

import numpy as np

from ramstream.methods import options
from ramstream.methods.base import MethodSpec, Prepared, refuse_unknown
from ramstream.methods.gta import gta_prepared
from ramstream.statistics.context import StatsContext


@dataclass(frozen=True)
class TaskArithmeticParams:
    weights: tuple[float, ...]
    lam: float = 1.0
    normalize: bool = False

    def to_dict(self) -> dict[str, Any]:
        return {"weights": list(self.weights), "lambda": self.lam, "normalize": self.normalize}


def parse_task_arithmetic(given: Mapping[str, Any], n_agents: int) -> TaskArithmeticParams:
    refuse_unknown("task_arithmetic", given, {"weights", "lambda", "normalize"})
    return TaskArithmeticParams(
        weights=options.per_agent("weights", given.get("weights", 1.0), n_agents),
        lam=options.number("lambda", given.get("lambda", 1.0)),
        normalize=options.boolean("normalize", given.get("normalize", False)),
    )


def prepare_task_arithmetic(params: TaskArithmeticParams, ctx: StatsContext) -> Prepared:
    n_tensors, n_agents = len(ctx.family.base.tensors), len(params.weights)
    return gta_prepared(
        {"weight": params.weights},
        np.array(params.weights, np.float32),
        np.ones((n_tensors, n_agents), np.float32),
        np.full(n_tensors, params.lam, np.float32),
        normalize=params.normalize,
    )


TASK_ARITHMETIC = MethodSpec(
    "task_arithmetic",
    "theta0 + lambda * sum of weighted task vectors",
    parse_task_arithmetic,
    prepare_task_arithmetic,
)
