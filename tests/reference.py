"""A naive dense reference of RAM / RAM+ / RAM+s, written from the equations of DESIGN.md alone.

It shares no code with ramstream: it works on the float32 values that tests/families.py wrote
(``Family.base_values`` / ``Family.agent_values``), holds every tensor whole, and loops over
agents in the plainest way. Everything is float32 except lambda, which is computed in float64
from integer counts and cast to float32 once, before it multiplies a task vector (as ramstream
does; the spec says "all arithmetic in float32" and lambda is a constant of the run).
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from tests.families import Family, f32_to_bf16

DEFAULTS = {"ram": (0.0, 2.0), "ram+": (0.1, 2.0), "ram+s": (0.1, 2.0)}
OUT_OF = {"bf16": "BF16", "f16": "F16", "f32": "F32"}


@dataclass(frozen=True)
class Counts:
    """Overlap statistics of one scope (a tensor or the whole model)."""

    overlap: np.ndarray  # (N, N) int64: [t, k-1] = agent t active and exactly k agents active
    coverage: np.ndarray  # (N+1,) int64: [k] = elements where exactly k agents are active

    @property
    def active(self) -> np.ndarray:
        return self.overlap.sum(axis=1)

    @property
    def unique(self) -> np.ndarray:
        return self.overlap[:, 0].copy()

    @property
    def shared(self) -> np.ndarray:
        return self.overlap[:, 1:].sum(axis=1)

    def __add__(self, other: Counts) -> Counts:
        return Counts(self.overlap + other.overlap, self.coverage + other.coverage)


def task_vectors(family: Family, name: str) -> list[np.ndarray]:
    return [family.task_vector(t, name) for t in range(len(family.agent_values))]


def active_masks(family: Family, name: str, eps: float) -> np.ndarray:
    """(N, numel) bool: float32(eps) < |tau_t| < Inf, strictly, compared in float32 (NaN/Inf: inactive)."""
    eps32 = np.float32(eps)
    taus = task_vectors(family, name)
    return np.array([(np.abs(tau) > eps32) & np.isfinite(tau) for tau in taus], dtype=bool).reshape(len(taus), -1)


def counts_of(masks: np.ndarray) -> Counts:
    n_agents = masks.shape[0]
    c = masks.sum(axis=0)
    overlap = np.zeros((n_agents, n_agents), np.int64)
    for t in range(n_agents):
        for k in range(1, n_agents + 1):
            overlap[t, k - 1] = int(np.count_nonzero(masks[t] & (c == k)))
    coverage = np.array([np.count_nonzero(c == k) for k in range(n_agents + 1)], np.int64)
    return Counts(overlap, coverage)


def tensor_counts(family: Family, eps: float) -> dict[str, Counts]:
    """Counts of every float tensor (the copied non-float tensors are not in the family values)."""
    return {name: counts_of(active_masks(family, name, eps)) for name in family.base_values}


def model_counts(family: Family, eps: float) -> Counts:
    n_agents = len(family.agent_values)
    total = Counts(np.zeros((n_agents, n_agents), np.int64), np.zeros(n_agents + 1, np.int64))
    for counts in tensor_counts(family, eps).values():
        total = total + counts
    return total


def rho(counts: Counts) -> np.ndarray:
    """shared / unique per agent: inf when unique = 0 < shared, 0 when both are 0."""
    out = np.zeros(len(counts.unique), np.float64)
    for t, (s, u) in enumerate(zip(counts.shared.tolist(), counts.unique.tolist(), strict=True)):
        if u > 0:
            out[t] = s / u
        elif s > 0:
            out[t] = np.inf
    return out


def lambdas(
    counts: Counts, method: str, lambda_rule: str = "paper", r: float | None = None, alpha: float | None = None
) -> np.ndarray:
    """lambda_t per agent, float64."""
    r = DEFAULTS[method][0] if r is None else r
    alpha = DEFAULTS[method][1] if alpha is None else alpha
    n_agents = len(counts.unique)
    if method == "ram":
        return np.ones(n_agents, np.float64)
    if method == "ram+s":
        out = np.ones(n_agents, np.float64)
        for t, (s, u) in enumerate(zip(counts.shared.tolist(), counts.unique.tolist(), strict=True)):
            if s + u > 0:
                out[t] = 1.0 + r * (s / (s + u))
        return out
    cap = alpha if lambda_rule == "paper" else 1.0
    return np.array([1.0 + r * min(max(x, 0.0), cap) for x in rho(counts)], np.float64)


def merged_values(family: Family, name: str, eps: float, lam32: np.ndarray) -> np.ndarray:
    """float32 theta0 + tau_merged of one tensor, flat."""
    base = family.base_values[name].astype(np.float32).ravel()
    taus = [tau.ravel() for tau in task_vectors(family, name)]
    masks = active_masks(family, name, eps)
    c = masks.sum(axis=0)
    total = np.zeros(base.shape, np.float32)
    for t, tau in enumerate(taus):  # sum in agent order, starting from 0.0
        total[masks[t]] = total[masks[t]] + tau[masks[t]]
    merged = np.zeros(base.shape, np.float32)
    for t, tau in enumerate(taus):
        only = masks[t] & (c == 1)
        merged[only] = lam32[t] * tau[only]
    many = c >= 2
    merged[many] = total[many] / c[many].astype(np.float32)
    out = base + merged
    assert out.dtype == np.float32
    return out


def encode_out(values: np.ndarray, dtype: str) -> np.ndarray:
    if dtype == "BF16":
        return f32_to_bf16(values)
    if dtype == "F16":
        return values.astype(np.float16)
    if dtype == "F32":
        return values.astype(np.float32)
    if dtype == "F64":
        return values.astype(np.float64)
    raise ValueError(dtype)


def reference_merge(
    family: Family,
    *,
    method: str = "ram+",
    rho_scope: str = "model",
    lambda_rule: str = "paper",
    eps: float = 1e-5,
    out_dtype: str = "auto",
    r: float | None = None,
    alpha: float | None = None,
) -> dict[str, tuple[str, tuple[int, ...], np.ndarray]]:
    """``name -> (dtype, shape, raw array)`` of the merged model, as read_model_dir returns it."""
    per_tensor = tensor_counts(family, eps)
    model = model_counts(family, eps)
    out: dict[str, tuple[str, tuple[int, ...], np.ndarray]] = {}
    for name in family.base_values:
        scope = per_tensor[name] if rho_scope == "tensor" else model
        lam32 = lambdas(scope, method, lambda_rule, r, alpha).astype(np.float32)
        dtype = family.dtypes[name] if out_dtype == "auto" else OUT_OF[out_dtype]
        out[name] = (dtype, family.shapes[name], encode_out(merged_values(family, name, eps, lam32), dtype))
    for name, (dtype, raw) in family.copied.items():
        out[name] = (dtype, tuple(raw.shape), raw)
    return out
