"""The probe pass: every block's masks and overlap counts into the index, resumably."""

from __future__ import annotations

import functools

import numpy as np

from ramstream.format.family import Family
from ramstream.index.store import IndexStore
from ramstream.io.reader import InputFiles
from ramstream.io.write_behind import WriteBehind
from ramstream.kernels.probe import probe_block, workers
from ramstream.passes.inputs import BlockInputs
from ramstream.passes.progress import Progress


def run_probe(family: Family, index: IndexStore, quiet: bool, allow_nonfinite: bool = False) -> None:
    """Probe the blocks the index's journal lacks; mark the pass complete at the end."""
    plan = index.plan
    done = index.done()
    todo = [b for b in plan.blocks if not done[b.index]]
    progress = Progress.for_terminal("probe", sum(plan.block_bytes(b) for b in todo), quiet)
    n_agents = len(family.agents)
    n_workers = workers()
    eps = index.header.eps
    with InputFiles() as files, WriteBehind() as behind:
        # The kernel fills one mask buffer while the blocks in flight are written from the others.
        masks = [np.empty((n_agents, plan.block_elems // 8), np.uint8) for _ in range(behind.depth + 1)]
        inputs = BlockInputs(family, plan, files)
        for i, block in enumerate(todo):
            if i + 1 < len(todo):
                inputs.prefetch(todo[i + 1])
            sources = inputs.arrays(block).sources
            block_masks = masks[i % len(masks)]
            overlap = np.zeros((n_workers, n_agents, n_agents), np.int64)
            coverage = np.zeros((n_workers, n_agents + 1), np.int64)
            nonfinite = np.full(n_workers, -1, np.int64)
            failed = np.full(n_workers, -1, np.int64)
            probe_block(
                sources.fds,
                sources.offsets,
                sources.codes,
                sources.size,
                eps,
                block_masks,
                overlap,
                coverage,
                nonfinite,
                failed,
            )
            sources.check(failed)
            if (nonfinite >= 0).any() and not allow_nonfinite:
                raise inputs.nonfinite_error(block, int(nonfinite[nonfinite >= 0].min()))
            inputs.release(block)
            progress.advance(plan.block_bytes(block))
            behind.submit(
                functools.partial(
                    _persist,
                    index,
                    block.index,
                    block_masks[:, : (block.size + 7) // 8],
                    overlap.sum(axis=0),
                    coverage.sum(axis=0),
                    progress.done,
                    progress.elapsed,
                )
            )
    progress.close()
    index.journal.record_rate(progress.done, progress.elapsed, final=True)
    index.write_rollup()
    index.record_probe(progress.elapsed, progress.done, complete=True)


def _persist(
    index: IndexStore,
    block: int,
    masks: np.ndarray,
    overlap: np.ndarray,
    coverage: np.ndarray,
    done_bytes: int,
    seconds: float,
) -> None:
    """On the write-behind thread: the block's masks and counts, its journal mark, the rate."""
    index.write_block(block, masks, overlap, coverage)
    index.journal.record_rate(done_bytes, seconds)
