"""A naive dense reference of TIES, breadcrumbs, breadcrumbs_ties, della and della_linear,
written from the formulas of docs/methods-magnitude.md (mergekit's semantics) in numpy float32.

Every tensor is held whole and trimmed with full stable sorts: TIES keeps the first k of the
descending stable order of |tau| (ties: lowest index first), breadcrumbs a window of the
ascending stable order; with ``trim_scope="model"`` one sort runs over every tensor of an
agent, concatenated in the order of their names. DELLA ranks each row with a stable argsort.
It shares no code with ramstream's kernels, passes or statistics; DELLA's draws come from
``ramstream.backends.numba.counter_rng`` (the draws are part of the method's definition) and L1 sums
follow ramstream's fixed rounding (float64 sums of 64-element groups, added exactly).
"""

from __future__ import annotations

import math

import numpy as np

from ramstream.backends.numba.counter_rng import stream_key, uniforms
from tests.families import Family
from tests.reference import encode_out

Output = dict[str, tuple[str, tuple[int, ...], np.ndarray]]


def task_vectors(family: Family, name: str) -> list[np.ndarray]:
    return [family.task_vector(t, name) for t in range(len(family.agent_values))]


def names(family: Family) -> list[str]:
    return list(family.base_values)


# -- selection --------------------------------------------------------------------------------


def ties_keep(magnitudes: np.ndarray, density: float) -> np.ndarray:
    n = magnitudes.size
    keep = np.zeros(n, bool)
    if density >= 1:
        keep[:] = True
    elif density > 0 and n:
        k = max(1, int(density * n))
        keep[np.argsort(-magnitudes, kind="stable")[:k]] = True
    return keep


def breadcrumbs_keep(magnitudes: np.ndarray, density: float, gamma: float) -> np.ndarray:
    n = magnitudes.size
    keep = np.zeros(n, bool)
    if density >= 1:
        keep[:] = True
        return keep
    target = int(density * n)
    bottom = max(0, n - target - int(gamma * n))
    keep[np.argsort(magnitudes, kind="stable")[bottom : bottom + target]] = True
    return keep


def magnitude_masks(
    family: Family, method: str, density: list[float], gamma: list[float], scope: str
) -> dict[str, list[np.ndarray]]:
    """name -> per agent bool mask of the kept elements (flat)."""
    taus = {name: task_vectors(family, name) for name in names(family)}
    n_agents = len(family.agent_values)

    def select(magnitudes: np.ndarray, t: int) -> np.ndarray:
        if method == "ties":
            return ties_keep(magnitudes, density[t])
        return breadcrumbs_keep(magnitudes, density[t], gamma[t])

    masks: dict[str, list[np.ndarray]] = {name: [] for name in taus}
    if scope == "tensor":
        for name, tau in taus.items():
            masks[name] = [select(np.abs(tau[t]), t) for t in range(n_agents)]
        return masks
    order = sorted(taus)
    for t in range(n_agents):
        flat = np.concatenate([np.abs(taus[name][t]) for name in order])
        keep = select(flat, t)
        at = 0
        for name in order:
            size = taus[name][t].size
            masks[name].append(keep[at : at + size])
            at += size
    return masks


def della_keep(
    tau: np.ndarray, shape: tuple[int, ...], name: str, t: int, seed: int, density: float, epsilon: float
) -> tuple[np.ndarray, np.ndarray]:
    """(kept bool, p float32) of one agent's flat task vector."""
    n = tau.size
    if density >= 1 or density <= 0 or n == 0:
        return np.full(n, density >= 1), np.ones(n, np.float32)
    if len(shape) >= 2:
        cube = np.abs(tau).reshape(shape[0], shape[1], -1)
    else:
        cube = np.abs(tau).reshape(1, n, 1)
    rows = cube.shape[1]
    order = np.argsort(cube, axis=1, kind="stable")
    ranks = np.empty(cube.shape, np.int64)
    np.put_along_axis(ranks, order, np.arange(rows).reshape(1, rows, 1), axis=1)
    if rows > 1:
        norm = ranks.astype(np.float32) / np.float32(rows - 1)
    else:
        norm = np.full(cube.shape, 0.5, np.float32)
    p = (np.float32(density - epsilon) + norm * np.float32(2 * epsilon)).astype(np.float32).ravel()
    u = uniforms(stream_key(seed, t, name), 0, n)
    return u < p, p


# -- rescale and combine ----------------------------------------------------------------------


def grouped_sum(values: np.ndarray) -> float:
    """Sum of float32 values: float64 sums of consecutive 64-element groups (in order, from 0.0),
    then the exact sum of those, rounded once."""
    v = values.astype(np.float64)
    v = np.concatenate([v, np.zeros(-len(v) % 64)]).reshape(-1, 64)
    return math.fsum(np.cumsum(v, axis=1)[:, -1].tolist()) if len(v) else 0.0


def l1_factor(tau: np.ndarray, keep: np.ndarray) -> np.float32:
    magnitudes = np.abs(tau)
    before = grouped_sum(magnitudes)
    after = grouped_sum(np.where(keep, magnitudes, np.float32(0.0)))
    if before < 1e-7 or after < 1e-7:
        return np.float32(1.0)
    return np.float32(before / after)


def combine(
    base: np.ndarray,
    sparse: list[np.ndarray],
    alive: list[np.ndarray],
    weights: list[float],
    consensus: bool,
    normalize: bool,
    lam: float,
) -> np.ndarray:
    """theta0 + lambda * mixed (mergekit's generalized task arithmetic, float32, agents in order)."""
    zero = np.float32(0.0)
    w = [np.float32(x) for x in weights]
    deltas = [
        np.where(a, w[t] * s, zero).astype(np.float32) for t, (s, a) in enumerate(zip(sparse, alive, strict=True))
    ]
    mixed = np.zeros(base.shape, np.float32)
    if consensus:
        majority = np.zeros(base.shape, np.float32)
        for d in deltas:
            majority = majority + d
        divisor = np.zeros(base.shape, np.float32)
        for t, d in enumerate(deltas):
            kept = ((d > 0) & (majority >= 0)) | ((d < 0) & (majority < 0))
            mixed = mixed + np.where(kept, d, zero)
            divisor = divisor + np.where(kept, w[t], zero)
        divisor = np.where(divisor == 0, np.float32(1.0), divisor).astype(np.float32)
    else:
        for d in deltas:
            mixed = mixed + d
        total = np.float32(0.0)
        for x in w:
            total = np.float32(total + x)
        divisor = np.full(base.shape, np.float32(1.0) if abs(total) < np.float32(1e-8) else total, np.float32)
    value = mixed / divisor if normalize else mixed
    out = base + np.float32(lam) * value
    assert out.dtype == np.float32
    return out


def _assemble(family: Family, merged: dict[str, np.ndarray]) -> Output:
    out: Output = {}
    for name, values in merged.items():
        dtype = family.dtypes[name]
        out[name] = (dtype, family.shapes[name], encode_out(values, dtype))
    for name, (dtype, raw) in family.copied.items():
        out[name] = (dtype, tuple(raw.shape), raw)
    return out


def per_agent(value: float | list[float], n: int) -> list[float]:
    return list(value) if isinstance(value, list) else [value] * n


def magnitude_merge(
    family: Family,
    method: str,
    *,
    density: float | list[float] = 1.0,
    gamma: float | list[float] = 0.01,
    weights: float | list[float] = 1.0,
    lam: float = 1.0,
    normalize: bool | None = None,
    rescale: bool | str = False,
    trim_scope: str = "tensor",
) -> Output:
    n = len(family.agent_values)
    dens, gam, w = per_agent(density, n), per_agent(gamma, n), per_agent(weights, n)
    masks = magnitude_masks(family, "ties" if method == "ties" else "breadcrumbs", dens, gam, trim_scope)
    normalize = (method == "ties") if normalize is None else normalize
    merged = {}
    for name in names(family):
        base = family.base_values[name].astype(np.float32).ravel()
        taus = task_vectors(family, name)
        sparse = []
        for t, tau in enumerate(taus):
            s = l1_factor(tau, masks[name][t]) if rescale in (True, "l1") else np.float32(1.0)
            sparse.append((tau * s).astype(np.float32))
        merged[name] = combine(base, sparse, masks[name], w, method != "breadcrumbs", normalize, lam)
    return _assemble(family, merged)


def della_merge(
    family: Family,
    method: str,
    *,
    density: float | list[float] = 1.0,
    epsilon: float | list[float] = 0.15,
    weights: float | list[float] = 1.0,
    lam: float = 1.0,
    normalize: bool | None = None,
    rescale: str = "l1",
    seed: int = 0,
) -> tuple[Output, dict[str, list[np.ndarray]]]:
    """The merged output and the kept masks (name -> per agent)."""
    n = len(family.agent_values)
    dens, eps, w = per_agent(density, n), per_agent(epsilon, n), per_agent(weights, n)
    normalize = (method == "della") if normalize is None else normalize
    merged, kept = {}, {}
    for name in names(family):
        base = family.base_values[name].astype(np.float32).ravel()
        sparse, alive = [], []
        for t, tau in enumerate(task_vectors(family, name)):
            keep, p = della_keep(tau, family.shapes[name], name, t, seed, dens[t], eps[t])
            if rescale == "inverse" and 0 < dens[t] < 1:
                multiplier = np.where(keep, np.float32(1.0) / p, np.float32(0.0)).astype(np.float32)
            else:
                multiplier = keep.astype(np.float32)
            s = l1_factor(tau, keep) if rescale == "l1" and 0 < dens[t] < 1 else np.float32(1.0)
            sparse.append(((tau * multiplier) * s).astype(np.float32))
            alive.append(keep)
        kept[name] = alive
        merged[name] = combine(base, sparse, alive, w, method == "della", normalize, lam)
    return _assemble(family, merged), kept
