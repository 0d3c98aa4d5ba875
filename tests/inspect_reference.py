"""A dense reference for ``ramstream inspect``: every number from the float32 values written.

Shares no code with ramstream. Masks are ``|f32(agent) - f32(base)| > float32(eps)``; a scope's
counts are summed over its tensors; ratios are computed in float64 from the integers with the
definitions of docs/inspect.md.
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from typing import Any

import numpy as np

from tests.families import Family

EPS = 1e-5


def dense_masks(family: Family, name: str, eps: float = EPS) -> np.ndarray:
    """(N, numel) bool."""
    base = family.base_values[name].astype(np.float32).reshape(-1)
    return np.array(
        [np.abs(a[name].astype(np.float32).reshape(-1) - base) > np.float32(eps) for a in family.agent_values],
        dtype=bool,
    ).reshape(len(family.agent_values), -1)


@dataclass
class Dense:
    """Counts of one scope, from the dense masks."""

    overlap: np.ndarray  # (N, N): [t, k-1] = agent t active and exactly k agents active
    coverage: np.ndarray  # (N+1,)

    @classmethod
    def of(cls, masks: np.ndarray) -> Dense:
        n = masks.shape[0]
        c = masks.sum(axis=0)
        overlap = np.array([[np.count_nonzero(masks[t] & (c == k)) for k in range(1, n + 1)] for t in range(n)])
        coverage = np.array([np.count_nonzero(c == k) for k in range(n + 1)])
        return cls(overlap.astype(np.int64).reshape(n, n), coverage.astype(np.int64))

    def __add__(self, other: Dense) -> Dense:
        return Dense(self.overlap + other.overlap, self.coverage + other.coverage)

    @property
    def params(self) -> int:
        return int(self.coverage.sum())

    def agent(self, t: int) -> dict[str, Any]:
        active = int(self.overlap[t].sum())
        unique = int(self.overlap[t, 0])
        shared = active - unique
        if unique:
            rho: float = shared / unique
        else:
            rho = float("inf") if shared else 0.0
        return {
            "active": active,
            "unique": unique,
            "shared": shared,
            "density": active / self.params if self.params else 0.0,
            "unique_share": unique / active if active else 0.0,
            "rho": rho,
            "overlap_histogram": [int(x) for x in self.overlap[t]],
        }

    @property
    def collide(self) -> float:
        return float(self.coverage[2:].sum()) / self.params if self.params else 0.0


def tensor_counts(family: Family, eps: float = EPS) -> dict[str, Dense]:
    return {name: Dense.of(dense_masks(family, name, eps)) for name in family.base_values}


def summed(parts: list[Dense], n_agents: int) -> Dense:
    total = Dense(np.zeros((n_agents, n_agents), np.int64), np.zeros(n_agents + 1, np.int64))
    for p in parts:
        total = total + p
    return total


def layer_of(name: str) -> str:
    """The reference's own reading of a name: ``model.layers.<i>.`` -> "i", else the module."""
    match = re.search(r"\.layers\.(\d+)\.", name)
    return match.group(1) if match else module_of(name)


def module_of(name: str) -> str:
    match = re.search(r"\.layers\.\d+\.(.*)$", name)
    rest = match.group(1) if match else re.sub(r"^(model\.)+", "", name)
    return rest[: -len(".weight")] if rest.endswith(".weight") else rest


def lam(agent: dict[str, Any], r: float, alpha: float) -> float:
    """RAM+ (paper rule): 1 + r * clip(rho, 0, alpha)."""
    return 1.0 + r * min(max(agent["rho"], 0.0), alpha)


def image(masks: np.ndarray, shape: tuple[int, ...], max_cells: int) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """(active (N, H, W), collide (H, W), cells (H, W)) with the binning rule of docs/inspect.md."""
    n = masks.shape[0]
    rows = shape[0] if len(shape) >= 2 else 1
    cols = masks.shape[1] // rows
    unit = 8 if cols % 8 == 0 and cols >= 8 * max_cells else 1
    height, width = min(rows, max_cells), min(cols // unit, max_cells)
    active = np.zeros((n, height, width), np.int64)
    collide = np.zeros((height, width), np.int64)
    cells = np.zeros((height, width), np.int64)
    grid = masks.reshape(n, rows, cols).astype(np.int64)
    i = (np.arange(rows) * height // rows)[:, None].repeat(cols, axis=1)
    j = ((np.arange(cols) // unit) * width // (cols // unit))[None, :].repeat(rows, axis=0)
    for t in range(n):
        np.add.at(active[t], (i, j), grid[t])
    np.add.at(collide, (i, j), (grid.sum(axis=0) >= 2).astype(np.int64))
    np.add.at(cells, (i, j), 1)
    return active, collide, cells
