"""Dense float64 references of the spherical methods, straight from mergekit 0.1.5's equations
over whole tensors as vectors (not from Gram matrices, as ramstream computes them), and of
mergekit's gradients and filters."""

from __future__ import annotations

import re
from typing import Any

import numpy as np

LAYER = re.compile(r"\.layers\.(\d+)\.")


def setting_value(setting: Any, name: str, x: float) -> float | None:
    """mergekit's ``evaluate_setting``: a number, a gradient, or the first matching condition."""
    if isinstance(setting, dict):
        setting = [setting]
    if isinstance(setting, (int, float)):
        return float(setting)
    if all(isinstance(v, (int, float)) for v in setting):
        scaled = x * (len(setting) - 1)
        i0 = int(scaled)
        i1 = min(len(setting) - 1, i0 + 1)
        frac = scaled - i0
        return (1 - frac) * setting[i0] + frac * setting[i1]
    for cond in setting:
        if cond.get("filter") in (None, "*") or cond["filter"] in name:
            return setting_value(cond["value"], name, x)
    return None


def layer_x(name: str, layers: int) -> float:
    match = LAYER.search(name)
    if match is None:
        return 0.0
    return int(match.group(1)) / (layers - 1) if layers > 1 else 1.0


def slerp(t: float, v0: np.ndarray, v1: np.ndarray) -> np.ndarray:
    a, b = v0.astype(np.float64).ravel(), v1.astype(np.float64).ravel()
    na, nb = np.linalg.norm(a), np.linalg.norm(b)
    na, nb = (na if na > 1e-8 else 1.0), (nb if nb > 1e-8 else 1.0)
    d = float(np.clip(np.dot(a / na, b / nb), -1, 1))
    if abs(d) > 0.9995:
        return (1 - t) * a + t * b
    theta = np.arccos(d)
    return (np.sin((1 - t) * theta) * a + np.sin(t * theta) * b) / np.sin(theta)


def nuslerp(t: float, v0: np.ndarray, v1: np.ndarray) -> np.ndarray:
    a, b = v0.astype(np.float64).ravel(), v1.astype(np.float64).ravel()
    ua, ub = a / max(np.linalg.norm(a), 1e-7), b / max(np.linalg.norm(b), 1e-7)
    cos = float(np.clip(np.dot(ua, ub), -1, 1))
    if 1 - cos * cos <= 1e-16:
        return (1 - t) * a + t * b
    theta = np.arccos(cos)
    return (np.sin((1 - t) * theta) * a + np.sin(t * theta) * b) / np.sin(theta)


def nuslerp_vectors(t: float, v0: np.ndarray, v1: np.ndarray, shape: tuple[int, ...], row_wise: bool) -> np.ndarray:
    """mergekit's ``nuslerp_flatten: false``: ``nuslerp`` per row (vectors along dim -1) or with
    ``row_wise`` per column (dim 0 swapped with dim -1); a 1-D tensor is one vector. Flat result."""
    if len(shape) < 2:
        return nuslerp(t, v0, v1)
    a, b = (v.astype(np.float64).reshape(shape) for v in (v0, v1))
    if row_wise:
        a, b = np.swapaxes(a, 0, -1), np.swapaxes(b, 0, -1)
    rows = [nuslerp(t, x, y) for x, y in zip(a.reshape(-1, a.shape[-1]), b.reshape(-1, b.shape[-1]), strict=True)]
    out = np.stack(rows).reshape(a.shape)
    return (np.swapaxes(out, 0, -1) if row_wise else out).ravel()


def multislerp(vectors: list[np.ndarray], weights: list[float], normalize: bool = True) -> np.ndarray:
    vs = [v.astype(np.float64).ravel() for v in vectors]
    if len(vs) == 1:
        return vs[0]
    w = np.array(weights, np.float64)
    if normalize:
        w = w / w.sum()
    norms = np.array([np.linalg.norm(v) for v in vs])
    units = [v / (n + 1e-8) for v, n in zip(vs, norms, strict=True)]
    mean = sum(wi * u for wi, u in zip(w, units, strict=True))
    mean = mean / np.linalg.norm(mean)
    tangent = sum(wi * (u - np.dot(u, mean) * mean) for wi, u in zip(w, units, strict=True))
    tn = np.linalg.norm(tangent) + 1e-8
    return (mean * np.cos(tn) + tangent * np.sin(tn) / tn) * float(np.dot(norms, w))


def karcher(vectors: list[np.ndarray], max_iter: int = 10, tol: float = 1e-5) -> np.ndarray:
    vs = [v.astype(np.float64).ravel() for v in vectors]
    k = len(vs)
    if k == 1:
        return vs[0]
    alphas = [1.0 / k] * k
    norms = [float(np.linalg.norm(v)) for v in vs]
    units = [v / n if n > 0 else v * 0 for v, n in zip(vs, norms, strict=True)]
    valid = [i for i in range(k) if norms[i] > tol]
    if not valid:
        return vs[0] * 0
    w = np.array([alphas[i] for i in valid])
    w = w / w.sum()
    us = [units[i] for i in valid]
    mean = sum(a * u for a, u in zip(w, us, strict=True))
    mn = np.linalg.norm(mean)
    mean = us[0].copy() if mn < tol else mean / mn
    for _ in range(max_iter):
        tangent = np.zeros_like(mean)
        for a, u in zip(w, us, strict=True):
            d = float(np.clip(np.dot(mean, u), -1, 1))
            theta = np.arccos(d)
            if theta < tol:
                continue
            tangent += a * (theta / np.sin(theta)) * (u - d * mean)
        tn = np.linalg.norm(tangent)
        if tn < tol:
            break
        mean = np.cos(tn) * mean + np.sin(tn) * (tangent / tn)
        un = np.linalg.norm(mean)
        if un > tol:
            mean = mean / un
    return sum(a * n for a, n in zip(alphas, norms, strict=True)) * mean
