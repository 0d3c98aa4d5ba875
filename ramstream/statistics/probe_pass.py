"""The probe pass: the overlap statistic (RAM's masks and counts) for every block, into the index.

Per block the backend packs each agent's active mask and counts the overlaps; the masks and
counts are written as the block's index chunks, then the block is marked in the index's journal.
The pass runs on an executor, so it resumes from the journal wherever it stopped.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

import numpy as np

from ramstream.backends.base import Backend, ProbeCounts
from ramstream.blocks import BlockArrays
from ramstream.execution.executor import Executor
from ramstream.execution.progress import Done, Progress
from ramstream.format.family import Family
from ramstream.index.store import IndexStore, open_index_store
from ramstream.plan import Block


@dataclass(frozen=True)
class ProbeResult:
    masks: np.ndarray  # uint8 (N, ceil(size / 8)): a view of the slot's buffer
    counts: ProbeCounts


class ProbeWork:
    label = "probe"

    def __init__(self, index: IndexStore, allow_nonfinite: bool) -> None:
        self.index = index
        self.eps = index.header.eps
        self.allow_nonfinite = allow_nonfinite
        self._masks: dict[int, np.ndarray] = {}  # slot -> mask buffer of a whole block

    def compute(self, block: Block, arrays: BlockArrays, backend: Backend, slot: int) -> ProbeResult:
        masks = self._masks.get(slot)
        if masks is None:
            masks = self._masks[slot] = np.empty((self.index.n_agents, self.index.plan.block_elems // 8), np.uint8)
        counts = backend.probe(arrays.sources, self.eps, masks)
        if counts.first_nonfinite >= 0 and not self.allow_nonfinite:
            raise arrays.nonfinite_error(counts.first_nonfinite)
        return ProbeResult(masks[:, : (block.size + 7) // 8], counts)

    def write(self, block: Block, result: ProbeResult) -> None:
        self.index.write_block(block.index, result.masks, result.counts.overlap, result.counts.coverage, mark=False)

    def mark(self, block: Block, done: Done) -> None:
        self.index.journal.mark(block.index)
        self.index.journal.record_rate(done.bytes, done.seconds, where=done.where)

    def persist(self, block: Block, result: ProbeResult, done: Done) -> None:
        # The chunks and the journal mark go in one round trip to zarr, data first (measured: a
        # round trip per block waits for a core on a busy machine).
        self.index.write_block(block.index, result.masks, result.counts.overlap, result.counts.coverage)
        self.index.journal.record_rate(done.bytes, done.seconds, where=done.where)

    def close(self) -> None:
        """The index store holds nothing open between writes."""

    def remote(self) -> RemoteProbe:
        path = self.index.path.resolve()
        return RemoteProbe(f"probe:{path}", path, self.allow_nonfinite)


@dataclass(frozen=True)
class RemoteProbe:
    """The probe for a cluster's worker: it opens the index by path and writes its chunks."""

    key: str
    index: Path
    allow_nonfinite: bool

    def open(self) -> ProbeWork:
        return ProbeWork(open_index_store(self.index), self.allow_nonfinite)


def run_probe(
    family: Family, index: IndexStore, executor: Executor, quiet: bool, allow_nonfinite: bool = False
) -> None:
    """Probe the blocks the index's journal lacks; mark the pass complete at the end."""
    plan = index.plan
    done = index.done()
    todo = [b for b in plan.blocks if not done[b.index]]
    progress = Progress.for_terminal("probe", sum(plan.block_bytes(b) for b in todo), quiet)
    try:
        executor.run(ProbeWork(index, allow_nonfinite), family, plan, todo, progress)
    finally:
        progress.close()
    index.journal.record_rate(progress.done, progress.elapsed, final=True, where=progress.where)
    index.write_rollup()
    index.record_probe(progress.elapsed, progress.done, complete=True)
