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

from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np

from ramstream.backends.base import Backend
from ramstream.backends.base import LinearParams as LinearRecord
from ramstream.blocks import BlockArrays
from ramstream.errors import ConfigError
from ramstream.methods import options
from ramstream.methods import tensor_settings as ts
from ramstream.methods.base import MethodSpec, Prepared, refuse_unknown
from ramstream.methods.gta import uniform_report
from ramstream.plan import Block
from ramstream.statistics.context import StatsContext


@dataclass(frozen=True)
class LinearParams:
    weights: tuple[ts.Setting, ...]  # each a number, or a value per tensor (gradients and filters)
    base_weight: ts.Setting = 0.0
    normalize: bool = True

    def to_dict(self) -> dict[str, Any]:
        return {
            "weights": [ts.to_json(w) for w in self.weights],
            "base_weight": ts.to_json(self.base_weight),
            "normalize": self.normalize,
        }


def parse_linear(given: Mapping[str, Any], n_agents: int) -> LinearParams:
    refuse_unknown("linear", given, {"weights", "base_weight", "normalize"})
    weights = ts.per_agent("weights", given.get("weights", 1.0), n_agents)
    base_weight = ts.parse("base_weight", given.get("base_weight", 0.0))
    normalize = options.boolean("normalize", given.get("normalize", True))
    params = LinearParams(weights, base_weight, normalize)
    if ts.uniform((base_weight, *weights)) is not None:
        _check_sums(params, ["x"], None)
    return params


def _check_sums(params: LinearParams, names: Sequence[str], say: Sequence[str] | None) -> None:
    """With normalize, every tensor's weights must sum (in float32, as the kernel adds them) to a
    finite value away from zero; ``say``: the tensors' names for the message (None: all alike)."""
    if not params.normalize:
        return
    columns = ts.per_tensor64([params.base_weight, *params.weights], names)
    for ti, row in enumerate(columns):
        total = options.float32_sum(tuple(float(w) for w in row))
        where = "" if say is None else f" for tensor {say[ti]!r}"
        if abs(total) < np.float32(1e-8):
            raise ConfigError(f"the weights sum to zero{where}: cannot normalize; change them or turn normalize off")
        if not np.isfinite(total):
            raise ConfigError(f"the weights' sum overflows float32 (where merges compute){where}: lower them")


def check_linear(params: LinearParams, names: Sequence[str]) -> None:
    ts.check([params.base_weight, *params.weights], names)
    _check_sums(params, names, names)


def prepare_linear(params: LinearParams, ctx: StatsContext) -> Prepared:
    names = [t.name for t in ctx.plan.tensors]
    weights = ts.per_tensor(params.weights, names)
    base = ts.per_tensor([params.base_weight], names)[:, 0]
    records = [LinearRecord(weights[ti], np.float32(base[ti]), params.normalize) for ti in range(len(names))]

    def merge_block(arrays: BlockArrays, block: Block, out: np.ndarray, out_code: int, backend: Backend) -> int:
        return backend.merge_linear(arrays, records[block.tensor], out, out_code)

    return Prepared(merge_block, uniform_report("weight", params.weights))


LINEAR = MethodSpec(
    "linear",
    "weighted mean of the agents' weights (and the base's, with base_weight)",
    parse_linear,
    prepare_linear,
    task_vectors=False,
    check=check_linear,
)
