"""A naive dense reference of the baseline methods (linear, task arithmetic, DARE, model stock),
written from the formulas in ramstream's method docstrings (mergekit's semantics), in float32.

It shares no code with ramstream's kernels, passes or statistics, with one exception: DARE's
random draws come from ``ramstream.backends.numba.counter_rng.stream_key`` / ``uniforms`` (the draws are
part of the method's definition: same seed, same kept elements). Every tensor is held whole and
agents are looped over in the plainest way; exact sums use ``fractions.Fraction``.

Where ramstream defines a fixed rounding, the reference follows it: sums start from 0.0 and add
agents in order; DARE's and model stock's constants are computed in float64 from exact sums of
64-element float64 group sums (groups start at multiples of 64 within each tensor), then cast to
float32 once.
"""

from __future__ import annotations

import math
from fractions import Fraction

import numpy as np

from ramstream.backends.numba.counter_rng import stream_key, uniforms
from tests.families import Family
from tests.reference import OUT_OF, encode_out

Output = dict[str, tuple[str, tuple[int, ...], np.ndarray]]
F0 = np.float32(0.0)


def task_vectors(family: Family, name: str) -> list[np.ndarray]:
    return [family.task_vector(t, name) for t in range(len(family.agent_values))]


def f32_sum(values: list[float]) -> np.float32:
    total = np.float32(0.0)
    for v in values:
        total = np.float32(total + np.float32(v))
    return total


def assemble(family: Family, merged: dict[str, np.ndarray], out_dtype: str = "auto") -> Output:
    """Encode float32 merged tensors like the output files, plus the copied non-float tensors."""
    out: Output = {}
    for name, values in merged.items():
        assert values.dtype == np.float32
        dtype = family.dtypes[name] if out_dtype == "auto" else OUT_OF[out_dtype]
        out[name] = (dtype, family.shapes[name], encode_out(values, dtype))
    for name, (dtype, raw) in family.copied.items():
        out[name] = (dtype, tuple(raw.shape), raw)
    return out


# -- linear ----------------------------------------------------------------------------------


def linear(
    family: Family, weights: list[float], base_weight: float = 0.0, normalize: bool = True, out_dtype: str = "auto"
) -> Output:
    """(w_0 theta_0 + sum_t w_t theta_t) [/ (w_0 + sum_t w_t)]; the base is skipped when w_0 = 0."""
    merged = {}
    for name in family.base_values:
        total: np.ndarray = np.zeros(family.base_values[name].size, np.float32)
        if base_weight != 0:
            total = total + np.float32(base_weight) * family.base_values[name].astype(np.float32).ravel()
        for t, w in enumerate(weights):
            total = total + np.float32(w) * family.agent_weights(t, name)
        if normalize:
            total = total / f32_sum([base_weight, *weights])
        merged[name] = total
    return assemble(family, merged, out_dtype)


# -- generalized task arithmetic ---------------------------------------------------------------


def gta_combine(
    base: np.ndarray,
    sparse: list[np.ndarray],
    kept: list[np.ndarray],
    weights: list[float],
    lam: float,
    consensus: str,
    normalize: bool,
) -> np.ndarray:
    """base + lam * mix of ``w_t * sparse_t`` over the surviving elements (``kept``)."""
    deltas = [
        np.where(k, np.float32(w) * s, F0).astype(np.float32) for w, s, k in zip(weights, sparse, kept, strict=True)
    ]
    mixed: np.ndarray
    divisor: np.ndarray | np.float32
    if consensus == "none":
        mixed = np.zeros(base.shape, np.float32)
        for d in deltas:
            mixed = mixed + d
        divisor = f32_sum(weights)
        divisor = np.float32(1.0) if abs(divisor) < np.float32(1e-8) else divisor
    else:
        elected = np.zeros(base.shape, np.float32)
        for d in deltas:
            elected = elected + d
        mixed = np.zeros(base.shape, np.float32)
        kept_weight = np.zeros(base.shape, np.float32)
        for w, d in zip(weights, deltas, strict=True):
            agree = ((d > 0) & (elected >= 0)) | ((d < 0) & (elected < 0))
            mixed = mixed + np.where(agree, d, F0)
            kept_weight = kept_weight + np.where(agree, np.float32(w), F0)
        kept_weight[kept_weight == 0] = np.float32(1.0)
        divisor = kept_weight
    if normalize:
        mixed = mixed / divisor
    out = base + np.float32(lam) * mixed
    assert out.dtype == np.float32
    return out


def task_arithmetic(
    family: Family, weights: list[float], lam: float = 1.0, normalize: bool = False, out_dtype: str = "auto"
) -> Output:
    merged = {}
    for name in family.base_values:
        base = family.base_values[name].astype(np.float32).ravel()
        taus = task_vectors(family, name)
        everything = [np.ones(base.shape, bool)] * len(taus)
        merged[name] = gta_combine(base, taus, everything, weights, lam, "none", normalize)
    return assemble(family, merged, out_dtype)


# -- exact sums ------------------------------------------------------------------------------


def grouped_exact_sum(values: np.ndarray) -> float:
    """Sum groups of 64 consecutive float64 values in order from 0.0, then the group sums exactly
    (Fraction), rounded once to float64."""
    padded = np.zeros(-(-values.size // 64) * 64, np.float64)
    padded[: values.size] = values
    groups = padded.reshape(-1, 64)
    sums = np.zeros(len(groups), np.float64)
    for j in range(64):
        sums = sums + groups[:, j]
    return float(sum((Fraction(float(s)) for s in sums), Fraction(0)))


# -- DARE ------------------------------------------------------------------------------------


def dare_kept(seed: int, agent: int, name: str, numel: int, density: float) -> np.ndarray:
    return uniforms(stream_key(seed, agent, name), 0, numel) < np.float32(density)


def dare_scale(tau: np.ndarray, kept: np.ndarray, density: float, rescale: str) -> np.float32:
    if rescale == "none" or density >= 1.0:
        return np.float32(1.0)
    if rescale == "inverse":
        return np.float32(1.0 / density)
    before = grouped_exact_sum(np.abs(tau).astype(np.float64))
    after = grouped_exact_sum(np.where(kept, np.abs(tau), F0).astype(np.float64))
    if before < 1e-7 or after < 1e-7:
        return np.float32(1.0)
    return np.float32(before / after)


def dare(
    family: Family,
    *,
    weights: list[float],
    density: list[float],
    seed: int = 0,
    lam: float = 1.0,
    normalize: bool = False,
    rescale: str = "l1",
    consensus: str = "none",
    out_dtype: str = "auto",
) -> Output:
    merged = {}
    for name in family.base_values:
        base = family.base_values[name].astype(np.float32).ravel()
        taus = task_vectors(family, name)
        kept = [dare_kept(seed, t, name, base.size, density[t]) for t in range(len(taus))]
        scales = [dare_scale(tau, k, d, rescale) for tau, k, d in zip(taus, kept, density, strict=True)]
        sparse = [(tau * s).astype(np.float32) for tau, s in zip(taus, scales, strict=True)]
        merged[name] = gta_combine(base, sparse, kept, weights, lam, consensus, normalize)
    return assemble(family, merged, out_dtype)


# -- model stock -----------------------------------------------------------------------------


def model_stock_t(taus: list[np.ndarray]) -> float:
    n = len(taus)
    dot = {
        (a, b): grouped_exact_sum(taus[a].astype(np.float64) * taus[b].astype(np.float64))
        for a in range(n)
        for b in range(a, n)
    }
    norms = [math.sqrt(dot[(a, a)]) for a in range(n)]
    cosines = [
        min(max(dot[(a, b)] / max(norms[a] * norms[b], 1e-6), -1.0), 1.0) for a in range(n) for b in range(a + 1, n)
    ]
    cos = sum(cosines) / len(cosines)
    denominator = 1 + (n - 1) * cos
    return 0.0 if abs(denominator) < 1e-6 else n * cos / denominator


def model_stock(family: Family, out_dtype: str = "auto") -> tuple[Output, dict[str, float]]:
    merged, ts = {}, {}
    for name in family.base_values:
        base = family.base_values[name].astype(np.float32).ravel()
        taus = task_vectors(family, name)
        ts[name] = model_stock_t(taus)
        total = np.zeros(base.shape, np.float32)
        for tau in taus:
            total = total + tau
        merged[name] = base + np.float32(ts[name]) * (total / np.float32(len(taus)))
    return assemble(family, merged, out_dtype), ts
