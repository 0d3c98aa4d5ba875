"""A pass computing method statistics (``ramstream.statistics``) for the blocks that lack them.

Every missing statistic of a block is computed from one read of that block; each statistic has
its own journal, so several can be added to an index over time and a kill loses only the block
in flight.
"""

from __future__ import annotations

from ramstream.format.family import Family
from ramstream.index.store import IndexStore
from ramstream.io.reader import InputFiles
from ramstream.kernels.probe import workers
from ramstream.passes.inputs import BlockInputs
from ramstream.passes.progress import Progress
from ramstream.statistics.base import BlockStatistic


def run_statistics(family: Family, index: IndexStore, stats: list[BlockStatistic], quiet: bool) -> None:
    pending = [s for s in stats if not index.statistic_complete(s.key)]
    if not pending:
        return
    plan = index.plan
    n_agents = len(family.agents)
    stores = [index.statistic(s.key, s.shape(n_agents), s.dtype) for s in pending]
    done = [journal.done(len(plan.blocks)) for _, journal in stores]
    todo = [b for b in plan.blocks if not all(d[b.index] for d in done)]
    label = "statistics (" + ", ".join(s.key.split("-")[0] for s in pending) + ")"
    progress = Progress.for_terminal(label, sum(plan.block_bytes(b) for b in todo), quiet)
    n_workers = workers()
    with InputFiles() as files:
        inputs = BlockInputs(family, plan, files)
        for i, block in enumerate(todo):
            if i + 1 < len(todo):
                inputs.prefetch(todo[i + 1])
            arrays = inputs.arrays(block)
            tensor = plan.tensors[block.tensor]
            for stat, (array, journal), flags in zip(pending, stores, done, strict=True):
                if not flags[block.index]:
                    index.write_statistic(array, journal, block.index, stat.compute(arrays, block, tensor, n_workers))
            del arrays
            inputs.release(block)
            progress.advance(plan.block_bytes(block))
    progress.close()
    for stat in pending:
        index.mark_statistic_complete(stat.key)
