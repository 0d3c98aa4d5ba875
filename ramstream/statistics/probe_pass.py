"""The probe pass: the overlap statistic (RAM's masks and counts) for every batch, into the index.

Per block the backend packs each agent's active mask and counts the overlaps; a batch's blocks
pack their masks side by side into one buffer, and the masks and counts are written as the
batch's index chunks, then the batch is marked in the index's journal. The pass runs on an
executor, so it resumes from the journal wherever it stopped.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass
from pathlib import Path

import numpy as np

from ramstream.backends.base import Backend, ProbeCounts
from ramstream.backends.landing import landed
from ramstream.blocks import BlockArrays
from ramstream.execution.executor import Executor
from ramstream.execution.progress import Done, Progress
from ramstream.format.family import Family
from ramstream.index.store import IndexStore, counts_width, open_index_store
from ramstream.plan import Batch, mask_bytes


@dataclass(frozen=True)
class ProbeResult:
    masks: np.ndarray  # uint8 (N, W): a view of the slot's buffer, the batch's blocks side by side
    counts: np.ndarray  # int64 (blocks of the batch, N*N + N + 1): overlap, then coverage


class ProbeWork:
    label = "probe"

    def __init__(self, index: IndexStore, allow_nonfinite: bool) -> None:
        self.index = index
        self.eps = index.header.eps
        self.allow_nonfinite = allow_nonfinite
        self._masks: dict[int, np.ndarray] = {}  # slot -> mask buffer of a whole batch

    def compute(self, batch: Batch, arrays: Sequence[BlockArrays], backend: Backend, slot: int) -> ProbeResult:
        masks = self._slot_masks(batch, arrays, slot)
        counts = np.empty((len(batch), counts_width(self.index.n_agents)), np.int64)
        at = 0
        for k, block_arrays in enumerate(arrays):
            used = mask_bytes(block_arrays.size)
            self._counted(counts, k, block_arrays, backend.probe(block_arrays, self.eps, masks[:, at : at + used]))
            at += used
        return ProbeResult(masks[:, : self.index.plan.mask_width], counts)

    def compute_later(
        self, batch: Batch, arrays: Sequence[BlockArrays], backend: Backend, slot: int
    ) -> Callable[[], ProbeResult]:
        """``compute`` in two steps (``Backend.deferred``): the blocks' probes queued now, their
        masks and counts waited for and checked by the returned function."""
        masks = self._slot_masks(batch, arrays, slot)
        probed, at = [], 0
        with backend.deferred() as landing:
            for block_arrays in arrays:
                used = mask_bytes(block_arrays.size)
                probed.append(backend.probe(block_arrays, self.eps, masks[:, at : at + used]))
                at += used

        def checked() -> ProbeResult:
            found = landing.wait()
            counts = np.empty((len(batch), counts_width(self.index.n_agents)), np.int64)
            for k, (block_arrays, result) in enumerate(zip(arrays, probed, strict=True)):
                self._counted(counts, k, block_arrays, landed(result.first_nonfinite, found, result))
            return ProbeResult(masks[:, : self.index.plan.mask_width], counts)

        return checked

    def _slot_masks(self, batch: Batch, arrays: Sequence[BlockArrays], slot: int) -> np.ndarray:
        """The slot's mask buffer, its padding past the batch's blocks zeroed (the chunk's bytes
        are then the same whatever the slot held before)."""
        plan, n_agents = self.index.plan, self.index.n_agents
        masks = self._masks.get(slot)
        if masks is None:
            masks = self._masks[slot] = np.empty((n_agents, max(plan.block_elems // 8, plan.mask_width)), np.uint8)
        used = sum(mask_bytes(a.size) for a in arrays)
        masks[:, used : plan.mask_width] = 0
        return masks

    def _counted(self, counts: np.ndarray, k: int, arrays: BlockArrays, found: ProbeCounts) -> None:
        """Block ``k``'s counts into ``counts``; its NaN/Inf inputs refused unless allowed."""
        if found.first_nonfinite >= 0 and not self.allow_nonfinite:
            raise arrays.nonfinite_error(found.first_nonfinite)
        counts[k] = np.concatenate([found.overlap.reshape(-1), found.coverage])

    def write(self, batch: Batch, result: ProbeResult) -> None:
        self.index.write_batch(batch, result.masks, result.counts, mark=False)

    def mark(self, batch: Batch, done: Done) -> None:
        self.index.journal.mark(batch.index)
        self.index.journal.record_rate(done.bytes, done.seconds, where=done.where)

    def persist(self, batch: Batch, result: ProbeResult, done: Done) -> None:
        # The chunks and the journal mark go in one round trip to zarr, data first (measured: a
        # round trip per block waits for a core on a busy machine).
        self.index.write_batch(batch, result.masks, result.counts)
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
    todo = [b for b in plan.batches if not done[b.index]]
    progress = Progress.for_terminal("probe", sum(plan.batch_bytes(b) for b in todo), quiet)
    try:
        executor.run(ProbeWork(index, allow_nonfinite), family, plan, todo, progress)
    finally:
        progress.close()
    index.journal.record_rate(progress.done, progress.elapsed, final=True, where=progress.where)
    index.write_rollup()
    index.record_probe(progress.elapsed, progress.done, complete=True)
