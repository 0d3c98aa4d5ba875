"""Weighted means on the hypersphere of several models, as mergekit's ``multislerp`` and ``karcher``.

Both treat each tensor as a vector and combine the inputs' directions; every vector they build is
a combination of the inputs, so they run over each tensor's exact Gram matrix (float64) and
merge with the resulting coefficients (``methods.combination``).

multislerp (per-agent ``weight``, ``normalize_weights``; eps = 1e-8): with v_i the agents' task
vectors (or, with ``no_base``, the weights of BASE and the agents), w the weights (divided by their
sum when normalised), u_i = v_i / (|v_i| + eps):

    m  = sum_i w_i u_i, then m / |m|   (|m| < eps: the weighted sum w_0 v_0 + w_1 v_1 for two
                                        vectors; refused for more, naming the tensor)
    g  = sum_i w_i (u_i - <u_i, m> m)            (the tangent at m)
    r  = m cos(|g| + eps) + g sin(|g| + eps) / (|g| + eps), times sum_i w_i |v_i|

and merged = base + r (r alone with ``no_base``). One vector is returned as it is.

karcher (``max_iter``, ``tol``; every input counts, the base included, each with weight 1/K):
mergekit's fixed-point iteration for the Karcher mean of the unit vectors, each iteration's dot
products taken from the Gram matrix, then scaled by the mean norm. mergekit iterates over the
materialised float32 tensors; here an iteration costs no pass over the weights.
"""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np

from ramstream.errors import ConfigError
from ramstream.format.dtypes import is_merged
from ramstream.methods import options
from ramstream.methods import tensor_settings as ts
from ramstream.methods.base import MethodSpec, Prepared, refuse_unknown
from ramstream.methods.combination import combination_prepared, dot, norm, spread, tensor_names, unit
from ramstream.methods.options import OptionError
from ramstream.statistics.context import StatsContext

MULTISLERP_EPS = 1e-8


@dataclass(frozen=True)
class MultislerpParams:
    weights: tuple[ts.Setting, ...]
    normalize_weights: bool = True
    no_base: bool = False

    def to_dict(self) -> dict[str, Any]:
        return {
            "weights": [ts.to_json(w) for w in self.weights],
            "normalize_weights": self.normalize_weights,
            "no_base": self.no_base,
        }


def parse_multislerp(given: Mapping[str, Any], n_agents: int) -> MultislerpParams:
    refuse_unknown("multislerp", given, {"weights", "normalize_weights", "no_base"})
    no_base = options.boolean("no_base", given.get("no_base", False))
    models = n_agents + 1 if no_base else n_agents
    if "weights" not in given:
        raise ConfigError("--weights is required with --method multislerp (one per model, or one for all)")
    weights = ts.per_model("weights", given["weights"], models)
    normalize = options.boolean("normalize_weights", given.get("normalize_weights", True))
    return MultislerpParams(weights, normalize, no_base)


def multislerp_coefficients(gram: np.ndarray, weights: np.ndarray, normalize: bool, name: str) -> np.ndarray:
    """The combination of the vectors that mergekit's multislerp returns (before adding the base)."""
    k = len(weights)
    if k == 1:
        return unit(1, 0)
    w = weights / weights.sum() if normalize else weights.astype(np.float64)
    norms = np.sqrt(np.maximum(np.diag(gram), 0.0))
    scale = 1.0 / (norms + MULTISLERP_EPS)  # u_i = scale_i v_i
    mean = w * scale
    mean_norm = norm(gram, mean)
    if mean_norm < MULTISLERP_EPS:
        if k == 2:
            return w.copy()
        raise ConfigError(
            f"multislerp: the weighted directions cancel out in tensor {name!r} (antipodal task vectors with "
            "balancing weights); change the weights"
        )
    mean = mean / mean_norm
    gm = gram @ mean
    dots = scale * gm  # <u_i, m>
    tangent = w * scale - float(np.dot(w, dots)) * mean
    tangent_norm = norm(gram, tangent) + MULTISLERP_EPS
    result = mean * math.cos(tangent_norm) + tangent * (math.sin(tangent_norm) / tangent_norm)
    return np.asarray(result * float(np.dot(norms, w)), np.float64)


def prepare_multislerp(params: MultislerpParams, ctx: StatsContext) -> Prepared:
    names = tensor_names(ctx)
    weights = np.stack([ts.resolve(w, names) for w in params.weights], axis=1)
    _check_directions(weights, names, ctx, params.normalize_weights)

    def coefficients(tensor: int, gram: np.ndarray) -> np.ndarray:
        if len(params.weights) == 1 and not params.no_base:
            # mergekit returns the one model as it is: its weights, not base + task vector.
            return np.array([0.0, 1.0])
        return multislerp_coefficients(gram, weights[tensor], params.normalize_weights, names[tensor])

    return combination_prepared(ctx, _weights_form(params), coefficients)


def _check_directions(weights: np.ndarray, names: list[str], ctx: StatsContext, normalize: bool) -> None:
    """Refuse, before any pass, weights that give a merged tensor no direction to take: all 0,
    or (``normalize_weights``) summing to 0, which cannot be divided by."""
    for name, row in zip(names, weights, strict=True):
        if len(row) < 2 or not is_merged(ctx.family.base.tensors[name].entry.dtype):
            continue  # one model is returned as it is; an integer tensor is copied
        if not row.any():
            raise ConfigError(
                f"multislerp: every weight of tensor {name!r} is 0, so the models give it no direction; "
                "give at least one model a weight other than 0"
            )
        if normalize and float(row.sum()) == 0.0:
            raise ConfigError(
                f"multislerp: the weights of tensor {name!r} sum to 0 ({', '.join(f'{w:g}' for w in row)}), so they "
                "cannot be normalised; change them, or set normalize_weights: false"
            )


def _weights_form(params: MultislerpParams) -> bool:
    return params.no_base or len(params.weights) == 1


def check_multislerp(params: MultislerpParams, names: Sequence[str]) -> None:
    ts.check(params.weights, names)


@dataclass(frozen=True)
class KarcherParams:
    max_iter: int = 10
    tol: float = 1e-5

    def to_dict(self) -> dict[str, Any]:
        return {"max_iter": self.max_iter, "tol": self.tol}


def parse_karcher(given: Mapping[str, Any], n_agents: int) -> KarcherParams:
    refuse_unknown("karcher", given, {"max_iter", "tol"})
    max_iter = given.get("max_iter", 10)
    if isinstance(max_iter, float) and max_iter.is_integer():
        max_iter = int(max_iter)
    if isinstance(max_iter, bool) or not isinstance(max_iter, int) or not 0 <= max_iter <= 10_000:
        raise OptionError("max_iter", f"must be an integer in [0, 10000], got {max_iter!r}")
    tol = options.number("tol", given.get("tol", 1e-5))
    if tol < 0:
        raise OptionError("tol", f"must be >= 0, got {tol:g}")
    return KarcherParams(max_iter, tol)


def karcher_coefficients(gram: np.ndarray, max_iter: int, tol: float) -> np.ndarray:
    """mergekit's weighted Karcher mean (weights 1/K) as a combination of the K vectors."""
    k = len(gram)
    if k == 1:
        return unit(1, 0)
    alphas = np.full(k, 1.0 / k)
    norms = np.sqrt(np.maximum(np.diag(gram), 0.0))
    valid = [i for i in range(k) if norms[i] > tol]
    if not valid:
        return np.zeros(k)
    weights = alphas[valid] / alphas[valid].sum()
    units = [unit(k, i) / norms[i] for i in valid]
    mean = spread(weights / norms[valid], valid, k)
    mean_norm = norm(gram, mean)
    mean = units[0].copy() if mean_norm < tol else mean / mean_norm
    for _ in range(max_iter):
        tangent = np.zeros(k)
        for alpha, u in zip(weights, units, strict=True):
            d = min(max(dot(gram, mean, u), -1.0), 1.0)
            theta = math.acos(d)
            if theta < tol:
                continue
            tangent += alpha * (theta / math.sin(theta)) * (u - d * mean)
        tangent_norm = norm(gram, tangent)
        if tangent_norm < tol:
            break
        mean = math.cos(tangent_norm) * mean + math.sin(tangent_norm) * (tangent / tangent_norm)
        unit_norm = norm(gram, mean)
        if unit_norm > tol:
            mean = mean / unit_norm
    return np.asarray(float(np.dot(alphas, norms)) * mean, np.float64)


def prepare_karcher(params: KarcherParams, ctx: StatsContext) -> Prepared:
    def coefficients(tensor: int, gram: np.ndarray) -> np.ndarray:
        return karcher_coefficients(gram, params.max_iter, params.tol)

    return combination_prepared(ctx, True, coefficients)


MULTISLERP = MethodSpec(
    "multislerp",
    "weighted spherical mean of the task vectors (mergekit's multislerp)",
    parse_multislerp,
    prepare_multislerp,
    check=check_multislerp,
)

KARCHER = MethodSpec(
    "karcher",
    "Karcher mean of the base and the agents on the sphere (mergekit's karcher)",
    parse_karcher,
    prepare_karcher,
    task_vectors=False,
)
