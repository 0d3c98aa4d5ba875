"""Linear merging (model soups, arXiv 2203.05482), as mergekit's ``linear``.

    merged = (w_0 theta_0 + sum_t w_t theta_t) / (w_0 + sum_t w_t)   (normalize, the default)
    merged = w_0 theta_0 + sum_t w_t theta_t                          (normalize off)

in float32, the base first, then the agents in order. ``base_weight`` w_0 defaults to 0: the
base takes no part (beyond giving the names, shapes and copied tensors; the kernel skips it). To
average it in, give it a weight: mergekit's ``linear`` averages ``base_model`` with the models
(appended last when not listed among them), which is ``base_weight`` here (added first, so the
float32 sums may round differently in the last place). ``weights`` default to 1 for every agent
(a plain mean); mergekit requires them.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

import numpy as np

from ramstream.backends.base import Backend
from ramstream.backends.base import LinearParams as LinearRecord
from ramstream.blocks import BlockArrays
from ramstream.errors import ConfigError
from ramstream.methods import options
from ramstream.methods.base import MethodSpec, Prepared, refuse_unknown
from ramstream.plan import Block
from ramstream.statistics.context import StatsContext


@dataclass(frozen=True)
class LinearParams:
    weights: tuple[float, ...]
    base_weight: float = 0.0
    normalize: bool = True

    def to_dict(self) -> dict[str, Any]:
        return {"weights": list(self.weights), "base_weight": self.base_weight, "normalize": self.normalize}


def parse_linear(given: Mapping[str, Any], n_agents: int) -> LinearParams:
    refuse_unknown("linear", given, {"weights", "base_weight", "normalize"})
    weights = options.per_agent("weights", given.get("weights", 1.0), n_agents)
    base_weight = options.number("base_weight", given.get("base_weight", 0.0))
    normalize = options.boolean("normalize", given.get("normalize", True))
    total = options.float32_sum((base_weight, *weights))
    if normalize and abs(total) < np.float32(1e-8):
        raise ConfigError("the weights sum to zero: cannot normalize; change them or turn normalize off")
    if normalize and not np.isfinite(total):
        raise ConfigError("the weights' sum overflows float32 (where merges compute): lower them")
    return LinearParams(weights, base_weight, normalize)


def prepare_linear(params: LinearParams, ctx: StatsContext) -> Prepared:
    record = LinearRecord(np.array(params.weights, np.float32), np.float32(params.base_weight), params.normalize)

    def merge_block(arrays: BlockArrays, block: Block, out: np.ndarray, out_code: int, backend: Backend) -> int:
        return backend.merge_linear(arrays, record, out, out_code)

    return Prepared(merge_block, {"weight": params.weights})


LINEAR = MethodSpec(
    "linear",
    "weighted mean of the agents' weights (and the base's, with base_weight)",
    parse_linear,
    prepare_linear,
    task_vectors=False,
)
