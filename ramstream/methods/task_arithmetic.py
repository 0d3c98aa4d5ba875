"""Task arithmetic (arXiv 2212.04089), as mergekit's ``task_arithmetic``.

    merged = theta_0 + lambda * sum_t w_t tau_t                      (normalize off, the default)
    merged = theta_0 + lambda * sum_t w_t tau_t / sum_t w_t          (normalize; |sum w| < 1e-8 -> 1)

in float32 through the generalized task arithmetic kernel (``ramstream.backends.numba.gta``).
Weights default to 1 for every agent (mergekit requires them), lambda to 1; both may vary per
tensor (gradients and filters, ``methods.tensor_settings``).
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np

from ramstream.methods import options
from ramstream.methods import tensor_settings as ts
from ramstream.methods.base import MethodSpec, Prepared, refuse_unknown
from ramstream.methods.gta import check_weighting, gta_prepared, parse_weighting, weight_report, weighting_json
from ramstream.statistics.context import StatsContext


@dataclass(frozen=True)
class TaskArithmeticParams:
    weights: tuple[ts.Setting, ...]
    lam: ts.Setting = 1.0
    normalize: bool = False

    def to_dict(self) -> dict[str, Any]:
        return {**weighting_json(self.weights, self.lam), "normalize": self.normalize}


def parse_task_arithmetic(given: Mapping[str, Any], n_agents: int) -> TaskArithmeticParams:
    refuse_unknown("task_arithmetic", given, {"weights", "lambda", "normalize"})
    weights, lam = parse_weighting(given, n_agents)
    return TaskArithmeticParams(weights, lam, options.boolean("normalize", given.get("normalize", False)))


def prepare_task_arithmetic(params: TaskArithmeticParams, ctx: StatsContext) -> Prepared:
    names = list(ctx.family.base.tensors)
    return gta_prepared(
        weight_report(params.weights),
        ts.per_tensor(params.weights, names),
        np.ones((len(names), len(params.weights)), np.float32),
        ts.resolve(params.lam, names).astype(np.float32),
        normalize=params.normalize,
    )


def check_task_arithmetic(params: TaskArithmeticParams, names: Sequence[str]) -> None:
    check_weighting(params.weights, params.lam, names)


TASK_ARITHMETIC = MethodSpec(
    "task_arithmetic",
    "theta0 + lambda * sum of weighted task vectors",
    parse_task_arithmetic,
    prepare_task_arithmetic,
    check=check_task_arithmetic,
)
