"""The probe pass: every block's masks and overlap counts into the index, resumably."""

from __future__ import annotations

import numpy as np

from ramstream.format.family import Family
from ramstream.index.store import IndexStore
from ramstream.io.reader import MappedFiles
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
    masks = np.empty((n_agents, plan.block_elems // 8), np.uint8)
    eps = index.header.eps
    with MappedFiles() as files:
        inputs = BlockInputs(family, plan, files)
        for i, block in enumerate(todo):
            if i + 1 < len(todo):
                inputs.prefetch(todo[i + 1])
            arrays = inputs.arrays(block)
            overlap = np.zeros((n_workers, n_agents, n_agents), np.int64)
            coverage = np.zeros((n_workers, n_agents + 1), np.int64)
            nonfinite = np.full(n_workers, -1, np.int64)
            probe_block(
                arrays.base,
                arrays.base_code,
                arrays.agents,
                arrays.agent_codes,
                eps,
                masks,
                overlap,
                coverage,
                nonfinite,
            )
            if (nonfinite >= 0).any() and not allow_nonfinite:
                raise inputs.nonfinite_error(block, int(nonfinite[nonfinite >= 0].min()))
            del arrays
            inputs.release(block)
            nbytes = (block.size + 7) // 8
            index.write_block(block.index, masks[:, :nbytes], overlap.sum(axis=0), coverage.sum(axis=0))
            progress.advance(plan.block_bytes(block))
            index.journal.record_rate(progress.done, progress.elapsed)
    progress.close()
    index.journal.record_rate(progress.done, progress.elapsed, final=True)
    index.write_rollup()
    index.record_probe(progress.elapsed, progress.done, complete=True)
