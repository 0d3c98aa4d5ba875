"""Pairwise agreement of the agents' updates, an index statistic (``ramstream probe --agreement``).

Each block's partial is ``Backend.agreement``'s result flattened: the counts (P, 2), then the
exact sums (3 P + 2 N, DIGITS) in ``backends.agreement``'s layout. Exact digits add up in any
grouping, so a tensor's, a layer's or the model's totals are the exact sums rounded to float64
once, whatever the block size, thread count, backend, executor or resume point.

It is a pass of its own, not part of the probe: the probe stays as fast as it is for the methods
that need only the masks and counts, and a user who wants agreement pays one more read of the
inputs, once (the partials are cached in the index like every other statistic; a killed pass
resumes from its journal).

Size: 8 (2 P + (3 P + 2 N) DIGITS) bytes a block: 2.4 KiB for three agents, 18 KiB for eight.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from ramstream.backends.agreement import agent_pairs, sum_rows
from ramstream.backends.base import Backend
from ramstream.backends.vector_sums import DIGITS, finish
from ramstream.blocks import BlockArrays
from ramstream.errors import IndexMismatchError
from ramstream.index.store import IndexStore
from ramstream.plan import Block, TensorPlan


@dataclass(frozen=True)
class Agreement:
    """Per block: every pair's shared count, same-sign count and exact sums; every agent's exact
    sums of squares over its unique and its shared elements. ``eps`` is the index's."""

    eps: float

    @property
    def key(self) -> str:
        return f"agreement_v1-eps{int(np.float64(self.eps).view(np.uint64)):016x}"

    def shape(self, n_agents: int) -> tuple[int, ...]:
        return (2 * len(agent_pairs(n_agents)) + sum_rows(n_agents) * DIGITS,)

    @property
    def dtype(self) -> str:
        return "int64"

    def compute(self, arrays: BlockArrays, block: Block, tensor: TensorPlan, backend: Backend) -> np.ndarray:
        result = backend.agreement(arrays, self.eps)
        return np.concatenate([result.counts.ravel(), result.sums.ravel()])


@dataclass(frozen=True)
class AgreementTotals:
    """Totals per row (a tensor, or a group of tensors): ``counts`` int64 (rows, P, 2) and the
    exact ``sums`` rounded once, float64 (rows, 3 P + 2 N)."""

    counts: np.ndarray
    sums: np.ndarray


def missing_message(store: IndexStore) -> str:
    return (
        f"the index {store.path} has no agreement statistics; add them (one more read of the checkpoints) with: "
        f"ramstream probe BASE AGENTS --agreement --index {store.path}"
    )


def agreement_totals(store: IndexStore, owner: np.ndarray, n_rows: int) -> AgreementTotals:
    """Add each tensor's block partials into row ``owner[tensor]`` (-1: nowhere), exactly.

    Reads one chunk of partials at a time; a row's exact accumulator is held only until its
    last tensor is added (every row of a per-tensor table is finished at once)."""
    stat = Agreement(store.header.eps)
    if not store.statistic_complete(stat.key):
        raise IndexMismatchError(missing_message(store))
    n_agents = store.n_agents
    n_pairs, n_sums = len(agent_pairs(n_agents)), sum_rows(n_agents)
    shape = stat.shape(n_agents)
    array, _ = store.statistic(stat.key, shape, stat.dtype)
    unit_of, slot_of = store.statistic_positions(shape, stat.dtype)
    plan = store.plan
    counts = np.zeros((n_rows, n_pairs, 2), np.int64)
    sums = np.zeros((n_rows, n_sums), np.float64)
    left = np.bincount(owner[owner >= 0], minlength=n_rows)
    open_rows: dict[int, np.ndarray] = {}
    chunk: tuple[int, np.ndarray] | None = None
    for tensor, row in enumerate(owner.tolist()):
        if row < 0:
            continue
        acc = open_rows.setdefault(row, np.zeros((n_sums, DIGITS), np.int64))
        for b in plan.blocks_of(tensor):
            unit = int(unit_of[b])
            if chunk is None or chunk[0] != unit:
                chunk = (unit, store.read_statistic(array, slice(unit, unit + 1))[0])
            partial = chunk[1][int(slot_of[b])]
            counts[row] += partial[: 2 * n_pairs].reshape(n_pairs, 2)
            acc += partial[2 * n_pairs :].reshape(n_sums, DIGITS)
        left[row] -= 1
        if left[row] == 0:
            sums[row] = finish(open_rows.pop(row))
    return AgreementTotals(counts, sums)
