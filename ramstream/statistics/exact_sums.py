"""Exact per-tensor sums: DARE's L1 norms, model stock's Gram matrix of the task vectors, the
spherical methods' Gram matrix of the weights.

A block's partial is a set of renormalised ``exact_sum`` accumulator rows (int64); the rows of a
tensor's blocks add without overflow (fewer than 2**31 blocks) and ``finish`` rounds the exact
total to float64 once, so totals never depend on the block size, thread count or resume point.
The fixed grouping of 64 elements summed in float64 first is described in
the backend (``Backend.abs_sums``, ``Backend.gram``).
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from functools import cached_property

import numpy as np

from ramstream.backends.base import Backend, KeepRandom
from ramstream.backends.exact_sum import BINS, finish
from ramstream.backends.rng import random_keys
from ramstream.blocks import BlockArrays
from ramstream.plan import Block, TensorPlan
from ramstream.statistics.base import BlockStatistic, Found
from ramstream.statistics.context import StatsContext
from ramstream.statistics.magnitude import digest, refused_nonfinite, tensor_totals


@dataclass(frozen=True)
class DareL1Sums:
    """Per agent: exact sum of |tau| (row 0) and of |tau| over the elements DARE keeps (row 1).

    ``density`` holds the float32 values the keep test compares with, the same for every tensor;
    or ``by_tensor`` holds them per tensor name (a density that varies per tensor). They and the
    seed are part of the key.
    """

    seed: int
    density: tuple[float, ...]
    allow_nonfinite: bool = False  # NaN/Inf elements count as 0 instead of raising (not in the key)
    by_tensor: tuple[tuple[str, tuple[float, ...]], ...] = ()

    @property
    def key(self) -> str:
        if self.by_tensor:
            rows = np.array([d for _, d in self.by_tensor], np.float32)
            names = "\0".join(name for name, _ in self.by_tensor).encode()
            return f"dare_l1_v1-seed{self.seed}-pertensor{digest(rows, names)}"
        bits = "_".join(f"{int(np.float32(d).view(np.uint32)):08x}" for d in self.density)
        return f"dare_l1_v1-seed{self.seed}-density{bits}"

    @cached_property
    def _densities(self) -> dict[str, np.ndarray]:
        return {name: np.array(d, np.float32) for name, d in self.by_tensor}

    def shape(self, n_agents: int) -> tuple[int, ...]:
        return (n_agents, 2, BINS + 1)

    @property
    def dtype(self) -> str:
        return "int64"

    def compute(self, arrays: BlockArrays, block: Block, tensor: TensorPlan, backend: Backend) -> np.ndarray:
        return self.compute_later(arrays, block, tensor, backend)({})

    def compute_later(
        self, arrays: BlockArrays, block: Block, tensor: TensorPlan, backend: Backend
    ) -> Callable[[Found], np.ndarray]:
        keys = random_keys(self.seed, arrays.n_agents, tensor.name)
        density = self._densities[tensor.name] if self.by_tensor else np.array(self.density, np.float32)
        result = backend.abs_sums(arrays, KeepRandom(keys, density, block.start))
        return lambda found: refused_nonfinite(result, found, arrays, self.allow_nonfinite)


@dataclass(frozen=True)
class Gram:
    """Exact sums of v_a * v_b for every pair a <= b (``pairs(V)`` order) over the agents' task
    vectors (V = N; model stock), or with ``weights`` over the weights themselves, the base first
    (V = N + 1; the spherical methods' norms and angles)."""

    weights: bool = False
    allow_nonfinite: bool = False  # NaN/Inf elements count as 0 instead of raising (not in the key)

    @property
    def key(self) -> str:
        return "weight_gram_v1" if self.weights else "gram_v1"

    def shape(self, n_agents: int) -> tuple[int, ...]:
        return (len(pairs(n_agents + 1 if self.weights else n_agents)), BINS + 1)

    @property
    def dtype(self) -> str:
        return "int64"

    def compute(self, arrays: BlockArrays, block: Block, tensor: TensorPlan, backend: Backend) -> np.ndarray:
        return self.compute_later(arrays, block, tensor, backend)({})

    def compute_later(
        self, arrays: BlockArrays, block: Block, tensor: TensorPlan, backend: Backend
    ) -> Callable[[Found], np.ndarray]:
        result = backend.gram(arrays, weights=self.weights)
        return lambda found: refused_nonfinite(result, found, arrays, self.allow_nonfinite)


def pairs(n_agents: int) -> list[tuple[int, int]]:
    return [(a, b) for a in range(n_agents) for b in range(a, n_agents)]


def tensor_sums(ctx: StatsContext, stat: BlockStatistic) -> np.ndarray:
    """float64 totals ``(tensors, *rows)`` of a statistic whose partials are accumulator rows
    ``(*rows, BINS + 1)``, computing it if needed (read a bounded number of blocks at a time).

    Tensors without blocks (not merged, or empty) get zeros.
    """
    ctx.compute(stat)
    rows = stat.shape(len(ctx.family.agents))[:-1]
    out = np.zeros((len(ctx.plan.tensors), *rows), np.float64)
    for t, total in tensor_totals(ctx, stat):
        out[t] = np.array([finish(row) for row in total.reshape(-1, BINS + 1)], np.float64).reshape(rows)
    return out
