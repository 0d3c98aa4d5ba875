"""Create, validate and fill the index; read its statistics back.

Layout (see ``docs/index-format.md``); one chunk per batch of blocks (``plan.Batch``), so an
index costs files in proportion to the family's bytes, not to its tensor count::

    <index>/zarr.json                 group; attrs["ramstream_index"] = the header below
    <index>/masks                     uint8 (batches, N, W), chunks (1, N, W): a batch's blocks'
                                      packed masks side by side (``plan.mask_offsets``), zero-padded
    <index>/stats/counts              int64 (batches, S, N*N + N + 1), chunks (1, S, ...): per block
                                      of the batch, overlap (N, N) then coverage (N+1), zero rows after
    <index>/stats/tensor_overlap      int64 (tensors, N, N): per-tensor sums, written when the probe ends
    <index>/stats/tensor_coverage     int64 (tensors, N+1): likewise
    <index>/progress/probe            uint8 (batches,), one chunk per batch: 1 = done

W is ``plan.mask_width``, S the blocks of the longest batch. ``overlap[t, k-1]`` counts elements
where agent t is active and exactly k agents are; ``coverage[k]`` elements where k agents are.

Every chunk a journal marks is written, even when all its values are zero (``write_empty_chunks``),
and read only where its journal marks it: a chunk that is missing there (``IndexLocalStore``) or
fails its checksum is refused naming the array, never read as zeros. The group attribute
``every_chunk_written`` says so; an index without it was written by an earlier ramstream, which
left chunks of zeros out, and a missing chunk there is refused saying that (probe again).
"""

from __future__ import annotations

import asyncio
import shlex
import shutil
import time
from collections.abc import Callable, Coroutine
from pathlib import Path
from typing import Any

import numpy as np
import zarr
from zarr.codecs import Crc32cCodec, ZstdCodec
from zarr.core.array_spec import ArrayConfigParams
from zarr.core.buffer import default_buffer_prototype
from zarr.core.sync import sync

from ramstream.config import DEFAULT_EPS
from ramstream.errors import IndexMismatchError, StoreCorruptError
from ramstream.format.dtypes import FP8_FLOATS
from ramstream.index.guard import store_io
from ramstream.index.header import IndexHeader
from ramstream.index.journal import FLAT_KEYS, Journal
from ramstream.index.local_store import IndexLocalStore, open_group
from ramstream.plan import (
    Batch,
    Plan,
    batch_positions,
    mask_bytes,
    plan_from_tensors,
    sum_by_tensor,
    widest,
)

SCHEMA_VERSION = 3  # 3: one chunk per batch of blocks (2: per block, masks per tensor)
ATTR = "ramstream_index"
UNCHECKED_ATTR = "nonfinite_unchecked"  # set by a probe run with allow_nonfinite (never cleared)
# Set at creation by a writer that writes every chunk, zeros included; absent in indexes written by
# earlier ramstreams (which skipped chunks of zeros: there a missing chunk may be one of those).
EVERY_CHUNK_ATTR = "every_chunk_written"
AGREEMENT_PREFIX = "agreement_"  # the keys of ``probe --agreement``'s statistics (statistics/agreement.py)
# Every chunk carries a CRC32C of its stored bytes, so a truncated or altered chunk is detected.
COMPRESSED = (ZstdCodec(level=1), Crc32cCodec())
CHECKED = (Crc32cCodec(),)
# A statistic's partials are stored a batch per chunk, cut further so that a chunk (and what a
# pass holds of it) stays below this many bytes: large histograms get fewer blocks per chunk.
STAT_CHUNK_BYTES = 16 * 1024**2
# Zarr skips (and deletes) a chunk whose values all equal the fill value unless told otherwise; a
# chunk of zeros is data here (no overlap in a tensor, a statistic of unchanged weights), and its
# absence must mean damage. A runtime setting, not stored with the array: applied on every open.
EVERY_CHUNK: ArrayConfigParams = {"write_empty_chunks": True}
_ADVICE = "delete the index and run the command again"


PROBE_ARRAYS = ("counts", "tensor_overlap", "tensor_coverage")  # the probe's, in stats/; the rest are statistics


def counts_width(n_agents: int) -> int:
    """Values per block in ``stats/counts``: overlap (N, N), then coverage (N+1)."""
    return n_agents * n_agents + n_agents + 1


class IndexStore:
    """An open index: the header, the plan it was built with, its arrays and its journal."""

    def __init__(self, path: Path, group: zarr.Group, header: IndexHeader, plan: Plan) -> None:
        self.path = path
        self.group = group
        self.header = header
        self.plan = plan
        self.journal = Journal.open(group, "progress/probe", len(plan.batches))
        self._arrays: dict[str, zarr.Array] = {}  # opened once: each open reads its metadata
        self._batch_of, self._slot_of = batch_positions(plan.batches, len(plan.blocks))
        self._mask_cache: tuple[int, np.ndarray] | None = None  # the last batch of masks read
        self._unit_cache: dict[int, tuple[tuple[Batch, ...], tuple[np.ndarray, np.ndarray]]] = {}
        for key in self._shapes():  # arrays sized otherwise than the header says are refused on open
            self._array(key)

    @property
    def n_agents(self) -> int:
        return len(self.header.agents)

    # -- writing ---------------------------------------------------------------------------
    def write_batch(self, batch: Batch, masks: np.ndarray, counts: np.ndarray, *, mark: bool = True) -> None:
        """Persist one probed batch (``masks`` (N, W) packed side by side, ``counts`` (blocks of
        the batch, counts_width)), then (``mark``) mark it done, in that order. A process that
        does not own the journal (a cluster's worker) writes with ``mark=False``."""
        stored = self._array("stats/counts")
        rows = np.zeros(stored.shape[1:], np.int64)
        rows[: len(counts)] = counts
        writes = ((self._array("masks"), batch.index, masks), (stored, batch.index, rows))
        with store_io(self.path, f"writing batch {batch.index} of the index"):
            # The chunks at once, then the mark, in one round trip to zarr's event loop: on a
            # busy machine each round trip waits for a core.
            data = [a.async_array.setitem(where, value) for a, where, value in writes]
            sync(_gather_then(data, (lambda: self.journal.marking(batch.index)) if mark else None))

    def write_statistic(self, array: zarr.Array, unit: Batch, rows: np.ndarray) -> None:
        """Persist one unit's chunk of a method statistic: its blocks' partials, then zero rows
        (``array.shape[1:]``; its journal marks it afterwards). Written as the whole chunk it is,
        leading axis kept: zarr then stores the rows as they are, where an integer index makes it
        build a chunk of zeros and copy them in (another STAT_CHUNK_BYTES held at once)."""
        with store_io(self.path, f"writing batch {unit.index} of statistic {array.basename!r}"):
            array[unit.index : unit.index + 1] = rows[None]

    def _array(self, key: str) -> zarr.Array:
        cached = self._arrays.get(key)
        if cached is not None:
            return cached
        with store_io(self.path, f"opening the index array {key!r}"):
            node = self.group.get(key)
        if not isinstance(node, zarr.Array):
            raise IndexMismatchError(f"{self.path}: array {key!r} is missing; the index is damaged, delete it")
        expected = self._shapes().get(key)
        if expected is not None and (node.shape, str(node.dtype)) != expected:
            raise IndexMismatchError(
                f"{self.path}: array {key!r} is {node.dtype} {list(node.shape)}, where its header implies "
                f"{expected[1]} {list(expected[0])}; the index is damaged, delete it and probe again"
            )
        node = node.with_config(EVERY_CHUNK)
        self._arrays[key] = node
        return node

    def _shapes(self) -> dict[str, tuple[tuple[int, ...], str]]:
        """The shape and dtype the header implies for each array the probe writes."""
        n_batches, n_agents = max(len(self.plan.batches), 1), self.n_agents
        return {
            "masks": ((n_batches, n_agents, self.plan.mask_width), "uint8"),
            "stats/counts": ((n_batches, widest(self.plan.batches), counts_width(n_agents)), "int64"),
        }

    def done(self) -> np.ndarray:
        """A boolean per batch of the plan; a finished probe's journal that lacks a mark is damaged."""
        done = self.journal.done(len(self.plan.batches))
        if self.probe_complete() and not done.all():
            raise StoreCorruptError(_unmarked(self.path, "progress/probe", "the probe", done))
        return done

    def probe_complete(self) -> bool:
        record = self.group.attrs.get("probe")
        return isinstance(record, dict) and bool(record.get("complete", False))

    @property
    def nonfinite_unchecked(self) -> bool:
        """True once any probe of this index ran with ``allow_nonfinite``: its blocks were not
        checked for NaN/Inf, so a finished probe does not vouch for the inputs."""
        return bool(self.group.attrs.get(UNCHECKED_ATTR, False))

    def mark_nonfinite_unchecked(self) -> None:
        """Record, before such a probe writes its first block, that it lets NaN/Inf through."""
        if not self.nonfinite_unchecked:
            with store_io(self.path, "recording --allow-nonfinite in the index"):
                self.group.attrs[UNCHECKED_ATTR] = True

    def record_probe(self, seconds: float, nbytes: int, complete: bool) -> None:
        """Keep the last run's throughput (for status ETAs) and whether the pass finished."""
        with store_io(self.path, "recording the probe pass"):
            self.group.attrs["probe"] = {
                "complete": complete,
                "seconds": seconds,
                "bytes": nbytes,
                "finished_at": time.time() if complete else None,
            }

    # -- reading ---------------------------------------------------------------------------
    def block_stats(self) -> tuple[np.ndarray, np.ndarray]:
        """``overlap (blocks, N, N)`` and ``coverage (blocks, N+1)`` as stored."""
        n = len(self.plan.blocks)
        n_agents = self.n_agents
        if n == 0:
            return np.zeros((0, n_agents, n_agents), np.int64), np.zeros((0, n_agents + 1), np.int64)
        array = self._array("stats/counts")
        stored = np.zeros(array.shape, np.int64)  # batches not probed yet count nothing
        probed = np.flatnonzero(self.done())
        if len(probed):
            with store_io(self.path, "reading the index array 'stats/counts'"):
                stored[probed] = array.get_orthogonal_selection((probed, slice(None), slice(None)))
        rows = stored[self._batch_of, self._slot_of]
        overlap = rows[:, : n_agents * n_agents].reshape(n, n_agents, n_agents)
        coverage = rows[:, n_agents * n_agents :]
        # Every element of a probed block is counted once: a chunk lost after its mark (deleted,
        # or a disk that lied about a sync) would read back as zeros, the array's fill value.
        # The journal is read only for batches whose counts do not add up: an unprobed batch
        # reads as zeros too, and only a marked one is damaged.
        sizes = np.array([b.size for b in self.plan.blocks], np.int64)
        lost = np.flatnonzero(coverage.sum(axis=1) != sizes)
        if len(lost):
            lost = lost[self.done()[self._batch_of[lost]]]
        if len(lost):
            raise StoreCorruptError(
                f"{self.path}: the counts of probed batch {int(self._batch_of[lost[0]])} are missing or damaged "
                f"({len(lost)} block(s)); delete the index and probe again"
            )
        return overlap, coverage

    def write_rollup(self) -> None:
        """Persist the per-tensor sums of the block statistics (one chunk each), so that readers
        of a finished index read two chunks instead of every batch's. Call after the last batch,
        before ``record_probe(complete=True)``: readers trust the roll-up only once complete."""
        overlap, coverage = self._summed_block_stats()
        stats = self.group["stats"]
        assert isinstance(stats, zarr.Group)
        for name, data in (("tensor_overlap", overlap), ("tensor_coverage", coverage)):
            chunks = (max(data.shape[0], 1), *data.shape[1:])
            with store_io(self.path, f"writing the roll-up {name}"):
                array = stats.create_array(
                    name,
                    shape=data.shape,
                    chunks=chunks,
                    dtype="int64",
                    fill_value=0,
                    overwrite=True,
                    compressors=COMPRESSED,
                    config=EVERY_CHUNK,
                )
                array[...] = data

    def tensor_counts(self) -> tuple[np.ndarray, np.ndarray]:
        """Per-tensor totals ``(tensors, N, N)`` / ``(tensors, N+1)``: the roll-up of a finished
        probe when present, else summed from the blocks (the same integers either way)."""
        n_tensors, n_agents = len(self.plan.tensors), self.n_agents
        overlap, coverage = self.group.get("stats/tensor_overlap"), self.group.get("stats/tensor_coverage")
        if (
            self.probe_complete()
            and isinstance(overlap, zarr.Array)
            and isinstance(coverage, zarr.Array)
            and overlap.shape == (n_tensors, n_agents, n_agents)
            and coverage.shape == (n_tensors, n_agents + 1)
        ):
            return self._read_whole(overlap), self._read_whole(coverage)
        return self._summed_block_stats()

    def _read_whole(self, array: zarr.Array) -> np.ndarray:
        with store_io(self.path, f"reading the index array {array.path!r}"):
            return np.asarray(array[...])

    def _summed_block_stats(self) -> tuple[np.ndarray, np.ndarray]:
        """Every block's overlap and coverage, added up per tensor."""
        overlap_blocks, coverage_blocks = self.block_stats()
        return sum_by_tensor(self.plan, overlap_blocks), sum_by_tensor(self.plan, coverage_blocks)

    # -- method statistics (see ramstream/statistics) --------------------------------------
    def statistic_units(self, shape: tuple[int, ...], dtype: str) -> tuple[Batch, ...]:
        """The batches a statistic of partials ``shape`` is computed, stored and marked in: the
        plan's, cut so that a chunk of partials stays within ``STAT_CHUNK_BYTES``."""
        return self._units(shape, dtype)[0]

    def statistic_positions(self, shape: tuple[int, ...], dtype: str) -> tuple[np.ndarray, np.ndarray]:
        """Each block's unit and position in it (``statistic_units``), int64 ``(blocks,)`` twice."""
        return self._units(shape, dtype)[1]

    def _units(self, shape: tuple[int, ...], dtype: str) -> tuple[tuple[Batch, ...], tuple[np.ndarray, np.ndarray]]:
        per_block = int(np.prod(shape, dtype=np.int64)) * np.dtype(dtype).itemsize
        segments = max(1, STAT_CHUNK_BYTES // max(per_block, 1))
        found = self._unit_cache.get(segments)
        if found is None:
            units = self.plan.batches_of_at_most(segments)
            found = self._unit_cache[segments] = (units, batch_positions(units, len(self.plan.blocks)))
        return found

    def statistic(self, key: str, shape: tuple[int, ...], dtype: str) -> tuple[zarr.Array, Journal]:
        """The array ``stats/<key>`` (units, S, *shape) and its journal ``progress/<key>``,
        created on first use (``statistic_units``: the units; S: blocks of the longest)."""
        units = self.statistic_units(shape, dtype)
        layout = (max(len(units), 1), widest(units), *shape)
        name = f"stats/{key}"
        with store_io(self.path, f"opening the index array {name!r}"):
            node = self.group.get(name)
        if node is None:
            with store_io(self.path, f"creating statistic {key!r}"):
                node = self.group.create_array(
                    name,
                    shape=layout,
                    chunks=(1, *layout[1:]),
                    dtype=dtype,
                    fill_value=0,
                    compressors=COMPRESSED,
                    chunk_key_encoding=FLAT_KEYS,
                )
                journal = Journal.create(self.group, f"progress/{key}", len(units))
        else:
            with store_io(self.path, f"opening the journal 'progress/{key}'"):
                journal = Journal.open(self.group, f"progress/{key}", len(units))
        if not isinstance(node, zarr.Array) or node.shape != layout:
            raise IndexMismatchError(f"{self.path}: statistic {key!r} has an unexpected layout; delete the index")
        return node.with_config(EVERY_CHUNK), journal

    def read_statistic(self, array: zarr.Array, units: slice, into: np.ndarray | None = None) -> np.ndarray:
        """The stored partials of ``units`` of a statistic's ``array`` (from ``statistic``), read
        into ``into`` when given (its shape that of the units' chunks: a walk over thousands of
        histograms reuses one buffer instead of mapping a fresh one per read)."""
        with store_io(self.path, f"reading the index array {array.path!r}"):
            if into is None:
                return np.asarray(array[units])
            array.get_basic_selection(units, out=default_buffer_prototype().nd_buffer.from_numpy_array(into))
            return into

    def statistic_keys(self) -> list[str]:
        """The method statistics the index holds (complete or not), by key."""
        with store_io(self.path, "listing the index's statistics"):
            stats = self.group.get("stats")
            names = sorted(stats.array_keys()) if isinstance(stats, zarr.Group) else []
        return [name for name in names if name not in PROBE_ARRAYS]

    def statistic_progress(self, key: str) -> tuple[tuple[Batch, ...], np.ndarray, Journal]:
        """A statistic's units, which are done (its journal, read), and its journal; a statistic
        recorded complete whose journal lacks a mark is damaged."""
        array = self._array(f"stats/{key}")
        units = self.statistic_units(tuple(array.shape[2:]), str(array.dtype))
        if array.shape[0] != max(len(units), 1):
            raise IndexMismatchError(f"{self.path}: statistic {key!r} has an unexpected layout; delete the index")
        with store_io(self.path, f"opening the journal 'progress/{key}'"):
            journal = Journal.open(self.group, f"progress/{key}", len(units))
        done = journal.done(len(units))
        if self.statistic_complete(key) and not done.all():
            raise StoreCorruptError(_unmarked(self.path, f"progress/{key}", f"the statistic {key!r}", done))
        return units, done, journal

    def statistic_complete(self, key: str) -> bool:
        done = self.group.attrs.get("statistics")
        return isinstance(done, dict) and bool(done.get(key))

    def mark_statistic_complete(self, key: str) -> None:
        done = self.group.attrs.get("statistics")
        merged = dict(done) if isinstance(done, dict) else {}
        merged[key] = True
        with store_io(self.path, f"recording statistic {key!r}"):
            self.group.attrs["statistics"] = merged

    def tensor_mask(self, tensor: int) -> np.ndarray:
        """The packed masks ``(N, ceil(numel/8))`` of one tensor (for inspection and tests)."""
        blocks = self.plan.blocks_of(tensor)
        parts = [self.block_mask(b) for b in blocks]
        return np.concatenate(parts, axis=1) if parts else np.zeros((self.n_agents, 0), np.uint8)

    def block_mask(self, block: int) -> np.ndarray:
        """The packed masks ``(N, ceil(size/8))`` of one block (for bounded-memory inspection);
        the last batch read is kept, as a batch's blocks are usually read one after the other."""
        batch = int(self._batch_of[block])
        if self._mask_cache is None or self._mask_cache[0] != batch:
            with store_io(self.path, f"reading batch {batch} of the index array 'masks'"):
                self._mask_cache = (batch, np.asarray(self._array("masks")[batch]))
        start = int(self.plan.mask_offsets[block])
        return self._mask_cache[1][:, start : start + mask_bytes(self.plan.blocks[block].size)]


def _unmarked(path: Path, journal: str, what: str, done: np.ndarray) -> str:
    first = int(np.flatnonzero(~done)[0])
    return (
        f"{path}: the journal {journal!r} lacks the mark of item {first} ({int((~done).sum())} in all), though "
        f"{what} is recorded finished (a chunk deleted, or lost by the disk); {_ADVICE}"
    )


async def _gather_all(coroutines: list[Coroutine[Any, Any, Any]]) -> None:
    """Await every coroutine, then raise the first failure: a plain ``gather`` raises at the
    first one and leaves the others' errors unretrieved (asyncio then prints "Future exception
    was never retrieved" after ramstream's clean message, e.g. when the disk fills)."""
    results = await asyncio.gather(*coroutines, return_exceptions=True)
    for result in results:
        if isinstance(result, BaseException):
            raise result


async def _gather_then(
    writes: list[Coroutine[Any, Any, None]], then: Callable[[], Coroutine[Any, Any, None]] | None
) -> None:
    """Await ``writes`` together, then (only if all succeeded) the coroutine ``then`` makes."""
    await _gather_all(writes)
    if then is not None:
        await then()


def create_index(path: Path, header: IndexHeader, plan: Plan) -> IndexStore:
    """Create a fresh index at ``path`` (replacing an unfinished creation, never other data)."""
    # The state is in the very first metadata written, so a kill at any later point is recognisable.
    with store_io(path, "creating the index"):
        return _create(path, header, plan)


def _create(path: Path, header: IndexHeader, plan: Plan) -> IndexStore:
    group = open_group(path, mode="w", index=True, attributes={"state": "creating"})
    n_agents = len(header.agents)
    n_batches = max(len(plan.batches), 1)
    group.create_array(
        "masks",
        shape=(n_batches, n_agents, plan.mask_width),
        chunks=(1, n_agents, plan.mask_width),
        dtype="uint8",
        fill_value=0,
        compressors=CHECKED,  # zstd cost 4x the rest of a block's index write; masks stay raw
        chunk_key_encoding=FLAT_KEYS,
    )
    stats = group.create_group("stats")
    rows = widest(plan.batches)
    stats.create_array(
        "counts",
        shape=(n_batches, rows, counts_width(n_agents)),
        chunks=(1, rows, counts_width(n_agents)),
        dtype="int64",
        fill_value=0,
        compressors=COMPRESSED,
        chunk_key_encoding=FLAT_KEYS,
    )
    progress = group.create_group("progress")
    Journal.create(progress, "probe", len(plan.batches))
    group.attrs.update({ATTR: header.to_dict(), EVERY_CHUNK_ATTR: True})
    group.attrs["state"] = "ready"
    return IndexStore(path, group, header, plan)


def open_index_store(path: Path, read_only: bool = False) -> IndexStore:
    """Open an existing index, validating its schema version."""
    group = _open_group(path, read_only)
    doc = group.attrs[ATTR]
    if not isinstance(doc, dict):
        raise IndexMismatchError(f"{path}: the index header is damaged; delete it and probe again")
    try:
        header = IndexHeader.from_dict(dict(doc))
    except IndexMismatchError as exc:
        raise IndexMismatchError(f"{path}: {exc}; delete it and probe again") from exc
    store = group.store
    if isinstance(store, IndexLocalStore) and group.attrs.get(EVERY_CHUNK_ATTR) is not True:
        store.probe_again = probe_again(path, header, group)  # a missing chunk: the earlier writer's gap
    return IndexStore(path, group, header, _plan_of(header))


def probe_again(path: Path, header: IndexHeader, group: zarr.Group) -> str:
    """The commands that replace the index at ``path`` by a new probe of the same inputs (ε, and
    the agreement statistics when it holds them); a merge recomputes its method's own."""
    words = ["ramstream", "probe", *(str(i["path"]) for i in header.inputs), "--index", str(path)]
    if header.eps != DEFAULT_EPS:
        words += ["--eps", repr(header.eps)]
    if header.quantized_base_as != "f32" or any(t.dtypes[0] in FP8_FLOATS for t in header.tensors):
        words += ["--quantized-base-as", header.quantized_base_as]  # auto might read the base otherwise
    statistics = group.attrs.get("statistics")
    if isinstance(statistics, dict) and any(str(k).startswith(AGREEMENT_PREFIX) for k in statistics):
        words.append("--agreement")
    return f"rm -r {shlex.quote(str(path))} && {shlex.join(words)}"


def _open_group(path: Path, read_only: bool) -> zarr.Group:
    if not (path / "zarr.json").is_file():
        if path.exists() and not path.is_dir():
            raise IndexMismatchError(f"{path}: is a file, not a ramstream index; give another --index path")
        if path.is_dir() and any(path.iterdir()):
            if not _holds_only_index_entries(path):
                raise IndexMismatchError(
                    f"{path}: a directory that is not a ramstream index (it holds {_first_foreign(path)!r}); "
                    "give an index's path, or (probe, merge) an --index path that does not exist yet"
                )
            raise IndexMismatchError(
                f"{path}: a damaged ramstream index (its zarr.json is missing: deleted or cut short during a run); "
                "delete this directory and run the command again"
            )
        raise IndexMismatchError(f"{path}: no ramstream index here; run probe (or merge) first, or check the path")
    try:
        group = open_group(path, mode="r" if read_only else "r+", index=True)
    except Exception as exc:  # zarr raises several types for "not a group"
        raise IndexMismatchError(
            f"{path}: not a ramstream index ({type(exc).__name__}); give another --index path"
        ) from exc
    if ATTR not in group.attrs and dict(group.attrs) != {"state": "creating"}:
        raise IndexMismatchError(
            f"{path}: a Zarr store that ramstream did not write (no ramstream index header); give another --index "
            "path (this one is left as it is)"
        )
    if group.attrs.get("state") != "ready" or ATTR not in group.attrs:
        raise IndexMismatchError(f"{path}: not a complete ramstream index; delete it or give another --index path")
    header = group.attrs[ATTR]
    if not isinstance(header, dict):
        raise IndexMismatchError(f"{path}: the index header is damaged (not a mapping); delete it and probe again")
    version = header.get("schema_version")
    if version != SCHEMA_VERSION:
        raise IndexMismatchError(
            f"{path}: index schema version {version}, this ramstream reads {SCHEMA_VERSION}; delete it and probe again"
        )
    return group


def is_unfinished_creation(path: Path) -> bool:
    """True when ``path`` is an index whose creation was interrupted (safe to replace).

    That is: an empty directory, one holding only zarr's temporary ``*.partial`` file of its
    first metadata, or a group whose state is still ``creating``.
    """
    if path.is_dir() and not (path / "zarr.json").exists():
        return all(p.name.endswith(".partial") and p.is_file() for p in path.iterdir())
    if not _holds_only_index_entries(path):
        return False  # whatever it is, it holds more than an index being created: never removed
    try:
        group = zarr.open_group(str(path), mode="r", zarr_format=3)
    except Exception:
        return False
    attrs = dict(group.attrs)
    return attrs.get("state") == "creating" and set(attrs) <= {"state", ATTR, EVERY_CHUNK_ATTR}  # what _create writes


# What an index directory holds (``_create``), and zarr's temporary files of a write in flight.
INDEX_ENTRIES = frozenset({"zarr.json", "masks", "stats", "progress"})


def _holds_only_index_entries(path: Path) -> bool:
    return path.is_dir() and _first_foreign(path) is None


def _first_foreign(path: Path) -> str | None:
    return next((p.name for p in sorted(path.iterdir()) if not _is_index_entry(p.name)), None)


def _is_index_entry(name: str) -> bool:
    return name in INDEX_ENTRIES or name.endswith(".partial")


def remove_index(path: Path) -> None:
    shutil.rmtree(path)


def _plan_of(header: IndexHeader) -> Plan:
    return plan_from_tensors(header.tensors, header.block_elems)
