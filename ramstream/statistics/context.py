"""What a method sees while it prepares: the family, the backend, and statistics on demand.

The index is opened (or created) only when a method asks for a statistic, so methods that need
none (linear, task arithmetic, DARE with the 1/(1-p) rescale) merge in a single read. Passes
run on the context's executor, which computes with its backend.
"""

from __future__ import annotations

import sys
from collections.abc import Iterator
from contextlib import AbstractContextManager
from pathlib import Path

import numpy as np
import zarr

from ramstream.backends.base import MAX_PROBE_AGENTS
from ramstream.config import RunOptions
from ramstream.errors import ConfigError
from ramstream.execution.executor import Executor
from ramstream.format.family import Family
from ramstream.index import resolve
from ramstream.index.store import STAT_CHUNK_BYTES, IndexStore
from ramstream.io.lock import hold
from ramstream.plan import Plan, widest
from ramstream.statistics.base import BlockStatistic
from ramstream.statistics.overlap import OverlapCounts
from ramstream.statistics.probe_pass import run_probe
from ramstream.statistics.stats_pass import run_statistics

# Partials read back at a time (``walk``): a chunk. A read holds zarr's decoded chunks and its
# output besides, so windows of 64 MiB took a TIES merge of many small tensors 170 MiB past its
# --memory of 64 MiB; one chunk at a time is also kept, not copied (``partials``).
READ_BYTES = STAT_CHUNK_BYTES


class StatsContext:
    def __init__(
        self,
        family: Family,
        eps: float,
        index: Path | None,
        options: RunOptions,
        block_elems: int,
        executor: Executor,
        allow_nonfinite: bool = False,
    ) -> None:
        self.family = family
        self.executor = executor
        self.allow_nonfinite = allow_nonfinite
        self.eps = eps
        self.options = options
        self._index_path = index
        self._block_elems = block_elems
        self._store: IndexStore | None = None
        self._overlap: OverlapCounts | None = None
        self._partials_cache: tuple[str, int, np.ndarray] | None = None  # key, unit, its partials
        # key -> the store it was opened from and the statistic's array: opening one costs two
        # metadata reads, and a method's walk over the tensors reads each unit of it in turn
        self._arrays: dict[str, tuple[IndexStore, zarr.Array]] = {}

    @property
    def store(self) -> IndexStore:
        """The index (opened or created on first use)."""
        if self._store is None:
            with self._writing():
                self._store = self._open()
        return self._store

    def _open(self) -> IndexStore:
        store = resolve.open_or_create(
            self.family, self.eps, self._index_path, self.options.cache_dir, self._block_elems
        )
        if store.plan.block_elems > self._block_elems and self._store is None:
            # The index keeps the blocks it was probed with (its partials are per block), so a
            # smaller --memory than the probe's cannot shrink them: say so rather than exceed it quietly.
            print(
                f"note: the index {store.path} has blocks of {store.plan.block_elems} elements, more than --memory "
                f"allows now ({self._block_elems}); its passes may exceed the budget: give another --index "
                "(or --cache-dir) to probe within it",
                file=sys.stderr,
            )
        return store

    def _writing(self) -> AbstractContextManager[None]:
        """The index's lock: a second process wanting to write it waits for the first."""
        path = resolve.index_path(self.family, self.eps, self._index_path, self.options.cache_dir)
        return hold(path.with_name(path.name + ".lock"), f"the index {path}", wait=True)

    @property
    def checked_nonfinite(self) -> bool:
        """True once the probe pass has vouched that no input holds NaN/Inf."""
        return self._overlap is not None and not self.allow_nonfinite and not self.store.nonfinite_unchecked

    @property
    def used_index(self) -> bool:
        return self._store is not None

    @property
    def asked_overlap(self) -> bool:
        """True once the method asked for the probe's overlap counts (RAM, and what reports them)."""
        return self._overlap is not None

    @property
    def plan(self) -> Plan:
        """The index's blocks (statistics partials are per block of this plan)."""
        return self.store.plan

    def overlap(self) -> OverlapCounts:
        """RAM's overlap counts per tensor (running the probe pass if it is not complete)."""
        if self._overlap is None:
            if len(self.family.agents) > MAX_PROBE_AGENTS:
                raise ConfigError(
                    f"the overlap probe counts at most {MAX_PROBE_AGENTS} agents, got {len(self.family.agents)}; "
                    "merge them in groups, or use a method without statistics (linear, task_arithmetic)"
                )
            if not self.store.probe_complete():
                with self._writing():
                    self._store = self._open()  # another process may have finished it meanwhile
                    if not self._store.probe_complete():
                        if self.allow_nonfinite:
                            self._store.mark_nonfinite_unchecked()
                        run_probe(self.family, self._store, self.executor, self.options.quiet, self.allow_nonfinite)
            self._overlap = OverlapCounts(*self.store.tensor_counts())  # the roll-up: two chunks
        return self._overlap

    def gather(self, *stats: BlockStatistic) -> list[np.ndarray]:
        """Each statistic's per-block partials ``(blocks, *shape)``, computing what is missing."""
        self.compute(*stats)
        blocks = range(len(self.store.plan.blocks))
        return [self.partials(stat, blocks) for stat in stats]

    def refresh(self) -> None:
        """See what another context wrote to the same index since this one opened it."""
        if self._store is not None:
            self._store = self._open()
            self._partials_cache = None

    def has(self, stat: BlockStatistic) -> bool:
        """Whether the index holds every block's partial of ``stat``."""
        return bool(self.store.statistic_complete(stat.key))

    def compute(self, *stats: BlockStatistic) -> None:
        """Compute what is missing of each statistic (in one pass), without reading it back:
        large partials are then read a few blocks at a time with ``partials``."""
        if not all(self.store.statistic_complete(s.key) for s in stats):
            self._partials_cache = None  # not held through a pass
            with self._writing():
                self._store = self._open()
                run_statistics(self.family, self._store, list(stats), self.executor, self.options.quiet)

    def partials(
        self, stat: BlockStatistic, blocks: range, window: np.ndarray | None = None, keep: bool = True
    ) -> np.ndarray:
        """The partials ``(len(blocks), *shape)`` of consecutive blocks of a computed statistic.

        They are stored a unit (a batch of blocks) per chunk. A read within one unit keeps that
        unit (at most ``STAT_CHUNK_BYTES``), since callers walk the blocks in order, often one
        tensor (one block) at a time; a read across units is the caller's bounded batch, read
        whole and not kept (it would stay resident through the merge pass). With ``window`` (room
        for the units' chunks, from ``walk``) the units are read into it; with it or ``keep=False``
        nothing is kept."""
        shape = stat.shape(len(self.family.agents))
        if not len(blocks):
            return np.zeros((0, *shape), stat.dtype)
        unit_of, slot_of = self.store.statistic_positions(shape, stat.dtype)
        lo, hi = int(unit_of[blocks.start]), int(unit_of[blocks.stop - 1]) + 1
        cached = self._partials_cache
        if window is not None:
            data = self.store.read_statistic(self._array(stat, shape), slice(lo, hi), window[: hi - lo])
        elif cached is None or cached[0] != stat.key or cached[1] != lo or hi != lo + 1:
            data = self.store.read_statistic(self._array(stat, shape), slice(lo, hi))
            if hi == lo + 1 and keep:
                self._partials_cache = (stat.key, lo, data)
        else:
            data = cached[2]
        # Rows of the units read, flat; the blocks' rows are a slice (no copy of what may be tens
        # of MiB) unless a unit shorter than the longest pads them apart.
        flat = data.reshape(-1, *shape)
        rows = (unit_of[blocks.start : blocks.stop] - lo) * data.shape[1] + slot_of[blocks.start : blocks.stop]
        if rows[-1] - rows[0] == len(rows) - 1:
            return flat[rows[0] : rows[-1] + 1]
        return flat[rows]

    def in_units(self, stat: BlockStatistic, blocks: range) -> Iterator[tuple[int, np.ndarray]]:
        """The partials of ``blocks`` of a computed statistic as ``(first block, partials)``, one
        stored unit (at most ``STAT_CHUNK_BYTES``) at a time: a tensor of many small blocks (a
        small ``--memory``) read whole would hold every unit it spans at once, and zarr's copy."""
        shape = stat.shape(len(self.family.agents))
        unit_of, _ = self.store.statistic_positions(shape, stat.dtype)
        lo = blocks.start
        while lo < blocks.stop:
            hi = min(int(np.searchsorted(unit_of, unit_of[lo], side="right")), blocks.stop)
            yield lo, self.partials(stat, range(lo, hi), keep=False)
            lo = hi

    def walk(self, stat: BlockStatistic) -> Iterator[tuple[int, np.ndarray]]:
        """Every block's partial of a computed statistic, in block order, as ``(first block,
        partials of consecutive blocks)``: as many whole units a read as fit in ``READ_BYTES`` (one
        at least). A read of the index costs milliseconds whatever its size, so a walk over many
        small tensors (norms, biases, a MoE's experts) reads a few times, not once per tensor.
        Every read lands in one buffer of the walk's own, dropped when the walk ends: a window is
        valid until the next step (copy what must outlive it), and nothing stays resident through
        the passes that follow."""
        shape = stat.shape(len(self.family.agents))
        units = self.store.statistic_units(shape, stat.dtype)
        per_unit = widest(units) * int(np.prod(shape, dtype=np.int64)) * np.dtype(stat.dtype).itemsize
        step = max(1, READ_BYTES // max(per_unit, 1))
        window = np.empty((min(step, len(units)), widest(units), *shape), stat.dtype)
        for i in range(0, len(units), step):
            group = units[i : i + step]
            yield group[0].first, self.partials(stat, range(group[0].first, group[-1].stop), window)

    def _array(self, stat: BlockStatistic, shape: tuple[int, ...]) -> zarr.Array:
        """The statistic's array in the store open now (kept while the store is)."""
        store = self.store
        opened = self._arrays.get(stat.key)
        if opened is None or opened[0] is not store:
            opened = self._arrays[stat.key] = (store, store.statistic(stat.key, shape, stat.dtype)[0])
        return opened[1]
