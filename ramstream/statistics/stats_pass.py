"""A pass computing method statistics (``ramstream.statistics``) for the blocks that lack them.

Every missing statistic of a block is computed from one read of that block; each statistic has
its own journal, so several can be added to an index over time and a kill loses only the batches
in flight. A statistic is stored and marked in its own units (``IndexStore.statistic_units``:
the plan's batches, cut so a chunk of partials stays bounded); the pass runs over the coarsest
cut, the plan's batches, and writes each statistic's units as they complete.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
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
from ramstream.plan import Batch, Block, TensorPlan
from ramstream.statistics.base import BlockStatistic, ComputedLater

# Per statistic (its position in the pass): the units written, each with its chunk of partials.
Partials = list[tuple[int, list[tuple[Batch, np.ndarray]]]]


# (rows, row, statistic, its arguments): a partial to compute in a deferred scope
Waiting = list[tuple[np.ndarray, int, ComputedLater, tuple[BlockArrays, Block, TensorPlan, Backend]]]
# Partials of one batch whose computation may be in flight at once (``compute_later``); past it a
# batch's further blocks (thousands of small tensors) are computed as ``compute`` does.
LATER_BYTES = 32 * 1024**2


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
        self.done = done  # per statistic, a boolean per unit
        self.units = [index.statistic_units(s.shape(index.n_agents), s.dtype) for s in stats]
        self._unit_of = [index.statistic_positions(s.shape(index.n_agents), s.dtype)[0] for s in stats]
        self.label = _label(stats)

    def missing(self, batch: Batch) -> list[tuple[int, list[Batch]]]:
        """Per statistic the batch lacks: its position in the pass and its missing units."""
        out = []
        for k, units in enumerate(self.units):
            ids = np.unique(self._unit_of[k][batch.first : batch.stop])
            missing = [units[u] for u in ids if not self.done[k][u]]
            if missing:
                out.append((k, missing))
        return out

    def compute(self, batch: Batch, arrays: Sequence[BlockArrays], backend: Backend, slot: int) -> Partials:
        return self._rows(batch, arrays, backend, 0)[0]

    def compute_later(
        self, batch: Batch, arrays: Sequence[BlockArrays], backend: Backend, slot: int
    ) -> Callable[[], Partials]:
        """``compute`` in two steps (``Backend.deferred``): the calls of the statistics that can
        wait (``ComputedLater``: the histograms and exact sums) queued in one deferred scope, up to
        ``LATER_BYTES`` of their partials (each lands in host memory of its own first), the others
        computed first; the partials checked and stored by the returned function once landed."""
        result, waiting = self._rows(batch, arrays, backend, LATER_BYTES)
        with backend.deferred() as landing:
            pending = [(rows, row, stat.compute_later(*at)) for rows, row, stat, at in waiting]

        def checked() -> Partials:
            found = landing.wait()
            for rows, row, partial in pending:
                rows[row] = partial(found)
            return result

        return checked

    def _rows(
        self, batch: Batch, arrays: Sequence[BlockArrays], backend: Backend, room: int
    ) -> tuple[Partials, Waiting]:
        """The batch's partials, each unit's chunk of rows filled in place (zero rows after the
        unit's blocks: one buffer of at most STAT_CHUNK_BYTES, not a list, its stack and a padded
        copy), but for the rows of statistics that can wait, up to ``room`` bytes: those are
        returned to be computed later."""
        plan = self.index.plan
        result: Partials = []
        waiting: Waiting = []
        for k, units in self.missing(batch):
            stat = self.stats[k]
            written = []
            for unit in units:
                rows = np.zeros(self.stores[k][0].shape[1:], stat.dtype)
                for row, b in enumerate(unit.blocks):
                    block = plan.blocks[b]
                    at = (arrays[b - batch.first], block, plan.tensors[block.tensor], backend)
                    if isinstance(stat, ComputedLater) and rows[row].nbytes <= room:
                        waiting.append((rows, row, stat, at))
                        room -= rows[row].nbytes
                    else:  # outside a deferred scope: its backend calls return their results
                        rows[row] = stat.compute(*at)
                written.append((unit, rows))
            result.append((k, written))
        return result, waiting

    def write(self, batch: Batch, result: Partials) -> None:
        for k, units in result:
            for unit, partials in units:
                self.index.write_statistic(self.stores[k][0], unit, partials)

    def mark(self, batch: Batch, done: Done) -> None:
        for k, units in self.missing(batch):
            for unit in units:
                self.stores[k][1].mark(unit.index)
            self.stores[k][1].record_rate(done.bytes, done.seconds, where=done.where)  # for status's ETA

    def persist(self, batch: Batch, result: Partials, done: Done) -> None:
        self.write(batch, result)
        self.mark(batch, done)

    def close(self) -> None:
        """The index store holds nothing open between writes."""

    def remote(self) -> RemoteStatistics:
        key = f"statistics:{self.index.path.resolve()}:" + ",".join(s.key for s in self.stats)
        return RemoteStatistics(key, self.index.path.resolve(), self.stats, self.done)


def pass_batches(index: IndexStore, stats: list[BlockStatistic]) -> tuple[Batch, ...]:
    """The blocks a statistics pass computes and stores together: the units of its statistics
    (each a chunk of at most ``STAT_CHUNK_BYTES`` of partials) where they all have the same
    units, so that a plan batch of thousands of small tensors, each with histograms of hundreds
    of KiB, is not held whole (a MoE's TIES pass held 110 MiB of one batch's partials under a
    --memory of 64 MiB); the plan's batches otherwise (their units are computed with them)."""
    layouts = {index.statistic_units(s.shape(index.n_agents), s.dtype) for s in stats}
    return layouts.pop() if len(layouts) == 1 else index.plan.batches


def _label(stats: list[BlockStatistic]) -> str:
    """``statistics (abs_hi16_v1, abs_lo16_v1 x3)``: a sweep's low histograms are one kind, several keys."""
    kinds = [s.key.split("-")[0] for s in stats]
    counted = [k if kinds.count(k) == 1 else f"{k} x{kinds.count(k)}" for k in dict.fromkeys(kinds)]
    return f"statistics ({', '.join(counted)})"


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
    done = [journal.done(journal.size) for _, journal in stores]
    work = StatisticsWork(index, pending, stores, done)
    todo = [b for b in pass_batches(index, pending) if work.missing(b)]
    progress = Progress.for_terminal(work.label, sum(plan.batch_bytes(b) for b in todo), quiet)
    try:
        executor.run(work, family, plan, todo, progress)
    finally:
        progress.close()
    for _, journal in stores:
        journal.record_rate(progress.done, progress.elapsed, final=True, where=progress.where)
    for stat in pending:
        index.mark_statistic_complete(stat.key)
