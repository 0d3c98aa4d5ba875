"""Overlap statistics: per-block partials from the probe kernel, rolled up per tensor and model.

``overlap[t, k-1]`` counts elements where agent t is active and exactly k agents are active;
``coverage[k]`` counts elements where exactly k agents are active. Partials combine by addition,
so any split into blocks, threads or runs gives the same totals.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from ramstream.plan import Plan, sum_by_tensor


@dataclass(frozen=True)
class OverlapCounts:
    overlap: np.ndarray  # (..., N, N) int64
    coverage: np.ndarray  # (..., N+1) int64

    @classmethod
    def zeros(cls, n_agents: int, leading: tuple[int, ...] = ()) -> OverlapCounts:
        return cls(np.zeros((*leading, n_agents, n_agents), np.int64), np.zeros((*leading, n_agents + 1), np.int64))

    def combine(self, other: OverlapCounts) -> OverlapCounts:
        return OverlapCounts(self.overlap + other.overlap, self.coverage + other.coverage)

    @property
    def active(self) -> np.ndarray:
        return self.overlap.sum(axis=-1)

    @property
    def unique(self) -> np.ndarray:
        return self.overlap[..., 0]

    @property
    def shared(self) -> np.ndarray:
        return self.overlap[..., 1:].sum(axis=-1)

    @property
    def elements(self) -> np.ndarray:
        return self.coverage.sum(axis=-1)

    def rho(self) -> np.ndarray:
        """shared / unique per agent: inf when unique = 0 < shared, 0 when both are 0."""
        shared = self.shared.astype(np.float64)
        unique = self.unique.astype(np.float64)
        with np.errstate(divide="ignore", invalid="ignore"):
            rho = shared / unique
        rho[(unique == 0) & (shared == 0)] = 0.0
        rho[(unique == 0) & (shared > 0)] = np.inf
        return rho


def per_tensor(plan: Plan, overlap_blocks: np.ndarray, coverage_blocks: np.ndarray) -> OverlapCounts:
    """Roll block partials up per tensor (non-merged tensors get zeros)."""
    return OverlapCounts(sum_by_tensor(plan, overlap_blocks), sum_by_tensor(plan, coverage_blocks))


def model_total(tensors: OverlapCounts) -> OverlapCounts:
    return OverlapCounts(tensors.overlap.sum(axis=0), tensors.coverage.sum(axis=0))
