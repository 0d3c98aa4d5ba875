"""What a method sees while it prepares: the family, and statistics on demand.

The index is opened (or created) only when a method asks for a statistic, so methods that need
none (linear, task arithmetic, DARE with the 1/(1-p) rescale) merge in a single read.
"""

from __future__ import annotations

from pathlib import Path

import numpy as np

from ramstream.config import RunOptions
from ramstream.format.family import Family
from ramstream.index import resolve
from ramstream.index.store import IndexStore
from ramstream.passes.probe_pass import run_probe
from ramstream.passes.stats_pass import run_statistics
from ramstream.plan import Plan
from ramstream.statistics.base import BlockStatistic
from ramstream.stats import OverlapCounts, per_tensor


class StatsContext:
    def __init__(self, family: Family, eps: float, index: Path | None, options: RunOptions, block_elems: int) -> None:
        self.family = family
        self.eps = eps
        self.options = options
        self._index_path = index
        self._block_elems = block_elems
        self._store: IndexStore | None = None
        self._overlap: OverlapCounts | None = None

    @property
    def store(self) -> IndexStore:
        """The index (opened or created on first use)."""
        if self._store is None:
            self._store = resolve.open_or_create(
                self.family, self.eps, self._index_path, self.options.cache_dir, self._block_elems
            )
        return self._store

    @property
    def used_index(self) -> bool:
        return self._store is not None

    @property
    def plan(self) -> Plan:
        """The index's blocks (statistics partials are per block of this plan)."""
        return self.store.plan

    def overlap(self) -> OverlapCounts:
        """RAM's overlap counts per tensor (running the probe pass if it is not complete)."""
        if self._overlap is None:
            if not self.store.probe_complete():
                run_probe(self.family, self.store, self.options.quiet)
            self._overlap = per_tensor(self.store.plan, *self.store.block_stats())
        return self._overlap

    def gather(self, *stats: BlockStatistic) -> list[np.ndarray]:
        """Each statistic's per-block partials ``(blocks, *shape)``, computing what is missing."""
        run_statistics(self.family, self.store, list(stats), self.options.quiet)
        n = len(self.store.plan.blocks)
        n_agents = len(self.family.agents)
        out = []
        for stat in stats:
            array, _ = self.store.statistic(stat.key, stat.shape(n_agents), stat.dtype)
            out.append(np.asarray(array[:n]) if n else np.zeros((0, *stat.shape(n_agents)), stat.dtype))
        return out
