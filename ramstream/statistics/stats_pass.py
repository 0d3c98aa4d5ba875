"""A pass computing method statistics (``ramstream.statistics``) for the blocks that lack them.

Every missing statistic of a block is computed from one read of that block; each statistic has
its own journal, so several can be added to an index over time and a kill loses only the blocks
in flight.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

import numpy as np
import zarr

from ramstream.backends.base import Backend
from ramstream.blocks import BlockArrays
from ramstream.execution.executor import Executor
from ramstream.execution.progress import Done, Progress
from ramstream.format.family import Family
from ramstream.index.journal import Journal
from ramstream.index.store import IndexStore, open_index_store
from ramstream.plan import Block
from ramstream.statistics.base import BlockStatistic

Partials = list[tuple[int, np.ndarray]]  # (statistic's position in the pass, the block's partial)


class StatisticsWork:
    def __init__(
        self,
        index: IndexStore,
        stats: list[BlockStatistic],
        stores: list[tuple[zarr.Array, Journal]],
        done: list[np.ndarray],
    ) -> None:
        self.index = index
        self.stats = stats
        self.stores = stores
        self.done = done
        self.label = "statistics (" + ", ".join(s.key.split("-")[0] for s in stats) + ")"

    def _missing(self, block: Block) -> list[int]:
        """The statistics (positions in the pass) that ``block`` lacks."""
        return [k for k in range(len(self.stats)) if not self.done[k][block.index]]

    def compute(self, block: Block, arrays: BlockArrays, backend: Backend, slot: int) -> Partials:
        tensor = self.index.plan.tensors[block.tensor]
        return [(k, self.stats[k].compute(arrays, block, tensor, backend)) for k in self._missing(block)]

    def write(self, block: Block, result: Partials) -> None:
        for k, partial in result:
            self.index.write_statistic(self.stores[k][0], block.index, partial)

    def mark(self, block: Block, done: Done) -> None:
        for k in self._missing(block):
            self.stores[k][1].mark(block.index)

    def persist(self, block: Block, result: Partials, done: Done) -> None:
        self.write(block, result)
        self.mark(block, done)

    def close(self) -> None:
        """The index store holds nothing open between writes."""

    def remote(self) -> RemoteStatistics:
        key = f"statistics:{self.index.path.resolve()}:" + ",".join(s.key for s in self.stats)
        return RemoteStatistics(key, self.index.path.resolve(), self.stats, self.done)


@dataclass(frozen=True, eq=False)
class RemoteStatistics:
    """The statistics pass for a cluster's worker: it opens the index by path and writes partials."""

    key: str
    index: Path
    stats: list[BlockStatistic]
    done: list[np.ndarray]

    def open(self) -> StatisticsWork:
        index = open_index_store(self.index)
        n_agents = index.n_agents
        stores = [index.statistic(s.key, s.shape(n_agents), s.dtype) for s in self.stats]
        return StatisticsWork(index, self.stats, stores, self.done)


def run_statistics(
    family: Family, index: IndexStore, stats: list[BlockStatistic], executor: Executor, quiet: bool
) -> None:
    pending = [s for s in stats if not index.statistic_complete(s.key)]
    if not pending:
        return
    plan = index.plan
    n_agents = len(family.agents)
    stores = [index.statistic(s.key, s.shape(n_agents), s.dtype) for s in pending]
    done = [journal.done(len(plan.blocks)) for _, journal in stores]
    todo = [b for b in plan.blocks if not all(d[b.index] for d in done)]
    work = StatisticsWork(index, pending, stores, done)
    progress = Progress.for_terminal(work.label, sum(plan.block_bytes(b) for b in todo), quiet)
    try:
        executor.run(work, family, plan, todo, progress)
    finally:
        progress.close()
    for stat in pending:
        index.mark_statistic_complete(stat.key)
