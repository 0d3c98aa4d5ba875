"""A dense reference of arcee_fusion, straight from mergekit 0.1.5's equations over whole tensors
in numpy: the row KL in float64 (each row's sums exact, ``math.fsum``), rounded to float32, the
importance f32(|d|) * KL, the quantiles by a full sort, the mask and a + d * m in float32."""

from __future__ import annotations

import math

import numpy as np

F = np.float32
EPS = float(F(1e-8))  # mergekit's 1e-8, as torch adds it to a float32 tensor


def row_kl(base: np.ndarray, agent: np.ndarray) -> np.ndarray:
    """float32 (rows,): sum_j p_j log(p_j / q_j) per row of the last dimension, p = softmax(agent
    row) + 1e-8, q = softmax(base row) + 1e-8, in float64 (>= 0 in exact arithmetic: clamped)."""
    rows = []
    for x, y in zip(agent.reshape(-1, _row(agent)), base.reshape(-1, _row(base)), strict=True):
        ex, ey = np.exp(x.astype(np.float64) - x.max()), np.exp(y.astype(np.float64) - y.max())
        p, q = ex / math.fsum(ex) + EPS, ey / math.fsum(ey) + EPS
        rows.append(max(math.fsum(p * np.log(p / q)), 0.0))
    return np.array(rows, np.float64).astype(F)


def _row(a: np.ndarray) -> int:
    return a.shape[-1] if a.ndim else 1


def importance(base: np.ndarray, agent: np.ndarray, kl: np.ndarray) -> np.ndarray:
    """float32, the tensor's shape: f32(|agent - base|) * kl of the element's row."""
    d = np.abs(agent.astype(F) - base.astype(F))
    return (d.reshape(-1, _row(d)) * kl.astype(F)[:, None]).reshape(d.shape)


def threshold(values: np.ndarray) -> np.float32:
    """median + 1.5 (q3 - q1), the quantiles at ascending index floor(q (n - 1)) of all values."""
    s = np.sort(values.ravel())
    n = s.size
    q1, median, q3 = (s[math.floor(q * (n - 1))] for q in (0.25, 0.5, 0.75))
    return F(median + F(1.5) * F(q3 - q1))


def fusion(base: np.ndarray, agent: np.ndarray, weights: np.ndarray) -> np.ndarray:
    """float32 base + (agent - base) * m, m = 1 where ``weights`` (the importance) >= its threshold."""
    a, b = base.astype(F), agent.astype(F)
    mask = (weights >= threshold(weights)).astype(F)
    return a + (b - a) * mask


def arcee_fusion(base: np.ndarray, agent: np.ndarray) -> np.ndarray:
    """The whole method on one tensor (its shape), float32."""
    return fusion(base, agent, importance(base, agent, row_kl(base, agent)))
