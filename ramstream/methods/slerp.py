"""Spherical interpolation of two models, as mergekit's ``slerp`` and ``nuslerp``.

slerp (the base and one agent; ``t`` per tensor, gradients and filters allowed): with the whole
tensors as vectors v0 = base, v1 = agent, per tensor in float64 from exact sums,

    n_i   = |v_i|, or 1 where |v_i| <= 1e-8
    d     = clamp(<v0, v1> / (n_0 n_1), -1, 1)
    c0,c1 = 1 - t, t                                          where |d| > 0.9995 (nearly parallel)
          = sin((1 - t) theta) / sin theta, sin(t theta) / sin theta, theta = acos d, otherwise

    merged = c0 f32(base) + c1 f32(agent)                     (float32, coefficients in float32)

nuslerp (two agents, per-agent ``weight``; t = w_1 / (w_0 + w_1), 0.5 when |w_0 + w_1| < 1e-6):
the same interpolation between the agents' task vectors, added to the base
(``base + c0 tau_0 + c1 tau_1``), where cos = <u_0, u_1> with u_i = v_i / max(|v_i|, 1e-7),
and the linear branch where 1 - cos^2 <= 1e-16. With ``no_base`` (a mergekit config without
``base_model``) BASE is the first of the two models and the weights themselves are interpolated.

With ``nuslerp_flatten: false`` each vector of a tensor is interpolated on its own: its rows
(vectors along dim -1) or with ``nuslerp_row_wise`` its columns (along dim 0); a tensor of one
dimension is one vector. The same coefficients per vector, in float64 from that vector's exact
sums (``statistics.vector_gram``: one pass, rows or columns anywhere in the blocks), rounded to
float32 once; the merge combines each element with its vector's (``Backend.merge_vectors``).
"""

from __future__ import annotations

import math
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np

from ramstream.backends.base import Backend
from ramstream.backends.vector_sums import vector_ids, vector_layout
from ramstream.blocks import BlockArrays
from ramstream.errors import ConfigError
from ramstream.methods import options
from ramstream.methods import tensor_settings as ts
from ramstream.methods.base import MethodSpec, Prepared, refuse_unknown
from ramstream.methods.combination import combination_prepared, tensor_names
from ramstream.plan import Block
from ramstream.statistics.context import StatsContext
from ramstream.statistics.vector_gram import VectorGram, check_width, tensor_vector_sums, width

SLERP_DOT_THRESHOLD = 0.9995
SLERP_NORM_EPS = 1e-8
NUSLERP_EPS = 1e-8
NUSLERP_NORM_CLAMP = 1e-7


def slerp_coefficients(t: float, norm0: float, norm1: float, dot: float) -> tuple[float, float]:
    """mergekit's slerp coefficients from the two norms and the dot product."""
    n0 = norm0 if norm0 > SLERP_NORM_EPS else 1.0
    n1 = norm1 if norm1 > SLERP_NORM_EPS else 1.0
    d = min(max(dot / (n0 * n1), -1.0), 1.0)
    return _arc(t, d, abs(d) > SLERP_DOT_THRESHOLD)


def nuslerp_coefficients(t: float, norm0: float, norm1: float, dot: float) -> tuple[float, float]:
    """mergekit's nuslerp coefficients (flattened) from the two norms and the dot product."""
    cos = dot / (max(norm0, NUSLERP_NORM_CLAMP) * max(norm1, NUSLERP_NORM_CLAMP))
    cos = min(max(cos, -1.0), 1.0)
    return _arc(t, cos, 1.0 - cos * cos <= NUSLERP_EPS**2)


def _arc(t: float, cos: float, linear: bool) -> tuple[float, float]:
    """The interpolation's two coefficients: along the arc of angle acos(cos), or the straight
    line where the method deems the vectors (anti)parallel."""
    if linear:
        return 1.0 - t, t
    theta = math.acos(cos)
    s = math.sin(theta)
    return math.sin((1.0 - t) * theta) / s, math.sin(t * theta) / s


@dataclass(frozen=True)
class SlerpParams:
    t: ts.Setting

    def to_dict(self) -> dict[str, Any]:
        return {"t": ts.to_json(self.t)}


def parse_slerp(given: Mapping[str, Any], n_agents: int) -> SlerpParams:
    refuse_unknown("slerp", given, {"t"})
    if n_agents != 1:
        raise ConfigError(f"slerp interpolates the base and ONE agent; got {n_agents} agents (use multislerp)")
    if "t" not in given:
        raise ConfigError("--t is required with --method slerp (0 gives the base, 1 the agent)")
    return SlerpParams(ts.parse("t", given["t"]))


def _gram_terms(gram: np.ndarray) -> tuple[float, float, float]:
    return math.sqrt(max(gram[0, 0], 0.0)), math.sqrt(max(gram[1, 1], 0.0)), float(gram[0, 1])


def prepare_slerp(params: SlerpParams, ctx: StatsContext) -> Prepared:
    t = ts.resolve(params.t, tensor_names(ctx))

    def coefficients(tensor: int, gram: np.ndarray) -> np.ndarray:
        return np.array(slerp_coefficients(float(t[tensor]), *_gram_terms(gram)))

    return combination_prepared(ctx, True, coefficients)


def check_slerp(params: SlerpParams, names: Sequence[str]) -> None:
    ts.check([params.t], names)


@dataclass(frozen=True)
class NuslerpParams:
    weights: tuple[ts.Setting, ...]  # one per model interpolated (with no_base, BASE is the first)
    no_base: bool = False
    row_wise: bool = False  # with flatten False: columns (dim 0) instead of rows (dim -1)
    flatten: bool = True  # a tensor is one vector

    def to_dict(self) -> dict[str, Any]:
        return {
            "weights": [ts.to_json(w) for w in self.weights],
            "no_base": self.no_base,
            "nuslerp_row_wise": self.row_wise,
            "nuslerp_flatten": self.flatten,
        }


def parse_nuslerp(given: Mapping[str, Any], n_agents: int) -> NuslerpParams:
    refuse_unknown("nuslerp", given, {"weights", "no_base", "nuslerp_row_wise", "nuslerp_flatten"})
    no_base = options.boolean("no_base", given.get("no_base", False))
    models = n_agents + 1 if no_base else n_agents
    if models != 2:
        raise ConfigError(
            f"nuslerp interpolates exactly two models ({'BASE and one agent' if no_base else 'two agents'}); "
            f"got {models}"
        )
    flatten = options.boolean("nuslerp_flatten", given.get("nuslerp_flatten", True))
    row_wise = options.boolean("nuslerp_row_wise", given.get("nuslerp_row_wise", False))
    if "weights" not in given:
        raise ConfigError("--weights is required with --method nuslerp (one per model; t = w1 / (w0 + w1))")
    weights = ts.per_model("weights", given["weights"], models)
    return NuslerpParams(weights, no_base, row_wise, flatten)


def prepare_nuslerp(params: NuslerpParams, ctx: StatsContext) -> Prepared:
    names = tensor_names(ctx)
    w0, w1 = (ts.resolve(w, names) for w in params.weights)

    def t_of(tensor: int) -> float:
        total = w0[tensor] + w1[tensor]
        return 0.5 if abs(total) < 1e-6 else float(w1[tensor] / total)

    if not params.flatten:
        return _per_vector(params, ctx, t_of)

    def coefficients(tensor: int, gram: np.ndarray) -> np.ndarray:
        return np.array(nuslerp_coefficients(t_of(tensor), *_gram_terms(gram)))

    return combination_prepared(ctx, params.no_base, coefficients)


def _per_vector(params: NuslerpParams, ctx: StatsContext, t_of: Callable[[int], float]) -> Prepared:
    """Row- or column-wise nuslerp: per tensor, float32 (vectors, 2) coefficients (8 bytes a
    vector, every merged tensor's held through the merge) from the exact per-vector sums."""
    plan = ctx.plan
    stat = VectorGram(params.no_base, params.row_wise, width(plan, params.row_wise), ctx.allow_nonfinite)
    check_width(stat, len(ctx.family.agents))
    ctx.compute(stat)
    tables: dict[int, np.ndarray] = {}
    for tensor in range(len(plan.tensors)):
        if len(plan.blocks_of(tensor)):
            t = t_of(tensor)
            sums = tensor_vector_sums(ctx, stat, tensor)  # pairs (0, 0), (0, 1), (1, 1)
            coefs = [
                nuslerp_coefficients(t, math.sqrt(max(g00, 0.0)), math.sqrt(max(g11, 0.0)), g01)
                for g00, g01, g11 in sums.tolist()
            ]
            tables[tensor] = np.array(coefs, np.float64).astype(np.float32).reshape(-1, 2)

    def merge_block(arrays: BlockArrays, block: Block, out: np.ndarray, out_code: int, backend: Backend) -> int:
        layout = vector_layout(plan.tensors[block.tensor].shape, block.start, block.stop, params.row_wise)
        coefs = tables[block.tensor][vector_ids(layout)]
        return backend.merge_vectors(arrays, layout, coefs, params.no_base, out, out_code)

    return Prepared(merge_block)


def check_nuslerp(params: NuslerpParams, names: Sequence[str]) -> None:
    ts.check(params.weights, names)


SLERP = MethodSpec(
    "slerp",
    "spherical interpolation of the base and one agent by t (mergekit's slerp)",
    parse_slerp,
    prepare_slerp,
    task_vectors=False,
    check=check_slerp,
)

NUSLERP = MethodSpec(
    "nuslerp",
    "spherical interpolation of two task vectors by their weights (mergekit's nuslerp)",
    parse_nuslerp,
    prepare_nuslerp,
    check=check_nuslerp,
)
