"""Create, validate and fill the index; read its statistics back.

Layout (see ``docs/index-format.md``)::

    <index>/zarr.json                 group; attrs["ramstream_index"] = the header below
    <index>/masks/<i>                 uint8 (N, ceil(numel_i / 8)), chunks (N, min(block, numel_i)/8): tensor i
    <index>/stats/overlap             int64 (blocks, N, N): agent t active and c == k+1
    <index>/stats/coverage            int64 (blocks, N+1): elements with c == k
    <index>/stats/tensor_overlap      int64 (tensors, N, N): per-tensor sums, written when the probe ends
    <index>/stats/tensor_coverage     int64 (tensors, N+1): likewise
    <index>/progress/probe            uint8 (blocks,), one chunk per block: 1 = done
"""

from __future__ import annotations

import asyncio
import shutil
import time
from collections.abc import Callable, Coroutine
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np
import zarr
import zarr.api.asynchronous
from zarr.codecs import Crc32cCodec, ZstdCodec
from zarr.core.sync import sync

from ramstream.errors import IndexMismatchError, StoreCorruptError
from ramstream.index.guard import store_io
from ramstream.index.journal import FLAT_KEYS, Journal
from ramstream.index.local_store import open_group
from ramstream.plan import Plan, TensorPlan, plan_from_tensors, sum_by_tensor
from ramstream.version import __version__

SCHEMA_VERSION = 2
ATTR = "ramstream_index"
UNCHECKED_ATTR = "nonfinite_unchecked"  # set by a probe run with allow_nonfinite (never cleared)
# Every chunk carries a CRC32C of its stored bytes, so a truncated or altered chunk is detected.
COMPRESSED = (ZstdCodec(level=1), Crc32cCodec())
CHECKED = (Crc32cCodec(),)


@dataclass(frozen=True)
class IndexHeader:
    """What the index was built from; compared field by field before an index is reused."""

    schema_version: int
    content_key: str
    eps: float
    block_elems: int
    base: str
    agents: tuple[str, ...]
    inputs: tuple[dict[str, Any], ...]
    tensors: tuple[TensorPlan, ...]
    ramstream_version: str = __version__

    def to_dict(self) -> dict[str, Any]:
        return {
            "schema_version": self.schema_version,
            "content_key": self.content_key,
            "eps": self.eps,
            "block_elems": self.block_elems,
            "base": self.base,
            "agents": list(self.agents),
            "inputs": list(self.inputs),
            "tensors": [{"name": t.name, "shape": list(t.shape), "dtypes": list(t.dtypes)} for t in self.tensors],
            "ramstream_version": self.ramstream_version,
        }

    @classmethod
    def from_dict(cls, doc: dict[str, Any]) -> IndexHeader:
        """Parse a header; anything malformed raises ``IndexMismatchError``."""
        try:
            return cls._from_dict(doc)
        except (KeyError, TypeError, ValueError, AttributeError, OverflowError) as exc:
            raise IndexMismatchError(f"the index header is damaged ({type(exc).__name__}: {exc})") from exc

    @classmethod
    def _from_dict(cls, doc: dict[str, Any]) -> IndexHeader:
        tensors = tuple(
            TensorPlan(t["name"], tuple(t["shape"]), int(np.prod(t["shape"], dtype=np.int64)), tuple(t["dtypes"]))
            for t in doc["tensors"]
        )
        return cls(
            int(doc["schema_version"]),
            str(doc["content_key"]),
            float(doc["eps"]),
            int(doc["block_elems"]),
            str(doc["base"]),
            tuple(doc["agents"]),
            tuple(doc["inputs"]),
            tensors,
            str(doc.get("ramstream_version", "?")),
        )


class IndexStore:
    """An open index: the header, the plan it was built with, its arrays and its journal."""

    def __init__(self, path: Path, group: zarr.Group, header: IndexHeader, plan: Plan) -> None:
        self.path = path
        self.group = group
        self.header = header
        self.plan = plan
        self.journal = Journal.open(group, "progress/probe")
        self._masks: dict[int, zarr.Array] = {}
        self._arrays: dict[str, zarr.Array] = {}  # opened once: each open reads its metadata

    @property
    def n_agents(self) -> int:
        return len(self.header.agents)

    # -- writing ---------------------------------------------------------------------------
    def write_block(
        self, block: int, masks: np.ndarray, overlap: np.ndarray, coverage: np.ndarray, *, mark: bool = True
    ) -> None:
        """Persist one probed block, then (``mark``) mark it done, in that order. A process that
        does not own the journal (a cluster's worker) writes with ``mark=False``."""
        b = self.plan.blocks[block]
        array = self._mask_array(b.tensor)
        byte0 = b.start // 8
        writes = (
            (array, (slice(None), slice(byte0, byte0 + masks.shape[1])), masks),
            (self._array("stats/overlap"), block, overlap),
            (self._array("stats/coverage"), block, coverage),
        )
        with store_io(self.path, f"writing block {block} of the index"):
            # The three chunks at once, then the mark, in one round trip to zarr's event loop: on
            # a busy machine each round trip waits for a core, and a block used to make four.
            data = [a.async_array.setitem(where, value) for a, where, value in writes]
            sync(_gather_then(data, (lambda: self.journal.marking(block)) if mark else None))

    def write_statistic(self, array: zarr.Array, block: int, partial: np.ndarray) -> None:
        """Persist one block's partial of a method statistic (its journal marks it afterwards)."""
        with store_io(self.path, f"writing block {block} of statistic {array.basename!r}"):
            array[block] = partial

    def _array(self, key: str) -> zarr.Array:
        cached = self._arrays.get(key)
        if cached is not None:
            return cached
        node = self.group.get(key)
        if not isinstance(node, zarr.Array):
            raise IndexMismatchError(f"{self.path}: array {key!r} is missing; the index is damaged, delete it")
        self._arrays[key] = node
        return node

    def _mask_array(self, tensor: int) -> zarr.Array:
        array = self._masks.get(tensor)
        if array is None:
            # write_empty_chunks: skip zarr's scan of every chunk for "all fill value" (a runtime
            # setting, not stored with the array, so it is applied on every open).
            array = self._array(f"masks/{tensor}").with_config({"write_empty_chunks": True})  # type: ignore[call-overload]
            self._masks[tensor] = array
        return array

    def done(self) -> np.ndarray:
        return self.journal.done(len(self.plan.blocks))

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
        with store_io(self.path, "reading the overlap statistics"):
            overlap = np.asarray(self._array("stats/overlap")[:n])
            coverage = np.asarray(self._array("stats/coverage")[:n])
        # Every element of a probed block is counted once: a chunk lost after its mark (deleted,
        # or a disk that lied about a sync) would read back as zeros, the array's fill value.
        # The journal (a file per block) is read only for blocks whose counts do not add up: an
        # unprobed block reads as zeros too, and only a marked one is damaged.
        sizes = np.array([b.size for b in self.plan.blocks], np.int64)
        lost = np.flatnonzero(coverage.sum(axis=1) != sizes)
        if len(lost):
            lost = lost[self.done()[lost]]
        if len(lost):
            raise StoreCorruptError(
                f"{self.path}: the counts of probed block {int(lost[0])} are missing or damaged "
                f"({len(lost)} block(s)); delete the index and probe again"
            )
        return overlap, coverage

    def write_rollup(self) -> None:
        """Persist the per-tensor sums of the block statistics (one chunk each), so that readers
        of a finished index read two chunks instead of every block's. Call after the last block,
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
                    compressors=CHECKED,
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
            with store_io(self.path, "reading the per-tensor roll-up"):
                return np.asarray(overlap[...]), np.asarray(coverage[...])
        return self._summed_block_stats()

    def _summed_block_stats(self) -> tuple[np.ndarray, np.ndarray]:
        """Every block's overlap and coverage, added up per tensor."""
        overlap_blocks, coverage_blocks = self.block_stats()
        return sum_by_tensor(self.plan, overlap_blocks), sum_by_tensor(self.plan, coverage_blocks)

    # -- method statistics (see ramstream/statistics) --------------------------------------
    def statistic(self, key: str, shape: tuple[int, ...], dtype: str) -> tuple[zarr.Array, Journal]:
        """The per-block array ``stats/<key>`` and its journal ``progress/<key>``, created on first use."""
        n_blocks = max(len(self.plan.blocks), 1)
        name = f"stats/{key}"
        node = self.group.get(name)
        if node is None:
            with store_io(self.path, f"creating statistic {key!r}"):
                node = self.group.create_array(
                    name,
                    shape=(n_blocks, *shape),
                    chunks=(1, *shape),
                    dtype=dtype,
                    fill_value=0,
                    compressors=COMPRESSED,
                    chunk_key_encoding=FLAT_KEYS,
                )
                journal = Journal.create(self.group, f"progress/{key}", len(self.plan.blocks))
        else:
            journal = Journal.open(self.group, f"progress/{key}")
        if not isinstance(node, zarr.Array) or node.shape != (n_blocks, *shape):
            raise IndexMismatchError(f"{self.path}: statistic {key!r} has an unexpected layout; delete the index")
        return node, journal

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
        """The packed masks ``(N, ceil(numel/8))`` of one tensor (for inspection)."""
        with store_io(self.path, f"reading the masks of tensor {self.plan.tensors[tensor].name!r}"):
            return np.asarray(self._mask_array(tensor)[:])

    def block_mask(self, block: int) -> np.ndarray:
        """The packed masks ``(N, ceil(size/8))`` of one block (for bounded-memory inspection)."""
        b = self.plan.blocks[block]
        byte0 = b.start // 8
        return np.asarray(self._mask_array(b.tensor)[:, byte0 : byte0 + (b.size + 7) // 8])


async def _create_arrays(store: Any, path: str, specs: dict[str, dict[str, Any]]) -> None:
    """Create the arrays of group ``path`` at once (one per merged tensor: hundreds on a 70B model,
    each a metadata file; one after the other they were most of an index's creation time)."""
    parent = await zarr.api.asynchronous.open_group(store=store, path=path, mode="r+", zarr_format=3)
    await _gather_all([parent.create_array(name, **spec) for name, spec in specs.items()])


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


def _mask_chunk_bytes(numel: int, block_elems: int) -> int:
    """Bytes per agent in one mask chunk: a block's, or the whole tensor's when it is smaller.

    Zarr stores an edge chunk at full chunk size, so a 2048-element norm under 16 Mi-element
    blocks would otherwise write 2 MiB of padding per agent (the masks were 3x their content).
    """
    return max(1, min(block_elems // 8, (numel + 7) // 8))


def create_index(path: Path, header: IndexHeader, plan: Plan) -> IndexStore:
    """Create a fresh index at ``path`` (replacing an unfinished creation, never other data)."""
    # The state is in the very first metadata written, so a kill at any later point is recognisable.
    with store_io(path, "creating the index"):
        return _create(path, header, plan)


def _create(path: Path, header: IndexHeader, plan: Plan) -> IndexStore:
    group = open_group(path, mode="w", attributes={"state": "creating"})
    n_agents = len(header.agents)
    n_blocks = max(len(plan.blocks), 1)
    group.create_group("masks")
    specs = {
        str(i): {
            "shape": (n_agents, (t.numel + 7) // 8),
            "chunks": (n_agents, _mask_chunk_bytes(t.numel, plan.block_elems)),
            "dtype": "uint8",
            "fill_value": 0,
            "compressors": CHECKED,  # zstd cost 4x the rest of a block's index write; masks stay raw
            "chunk_key_encoding": FLAT_KEYS,
            "attributes": {"tensor": t.name},
        }
        for i, t in enumerate(plan.tensors)
        if t.merged
    }
    sync(_create_arrays(group.store, "masks", specs))
    stats = group.create_group("stats")
    stats.create_array(
        "overlap",
        shape=(n_blocks, n_agents, n_agents),
        chunks=(1, n_agents, n_agents),
        dtype="int64",
        fill_value=0,
        compressors=CHECKED,
        chunk_key_encoding=FLAT_KEYS,
    )
    stats.create_array(
        "coverage",
        shape=(n_blocks, n_agents + 1),
        chunks=(1, n_agents + 1),
        dtype="int64",
        fill_value=0,
        compressors=CHECKED,
        chunk_key_encoding=FLAT_KEYS,
    )
    progress = group.create_group("progress")
    Journal.create(progress, "probe", len(plan.blocks))
    group.attrs[ATTR] = header.to_dict()
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
    return IndexStore(path, group, header, _plan_of(header))


def _open_group(path: Path, read_only: bool) -> zarr.Group:
    if not (path / "zarr.json").is_file():
        if path.is_dir() and any(path.iterdir()):
            raise IndexMismatchError(
                f"{path}: a damaged ramstream index (its zarr.json is missing: deleted or cut short during a run); "
                "delete this directory and run the command again"
            )
        raise IndexMismatchError(f"{path}: no ramstream index here; run probe (or merge) first, or check the path")
    try:
        group = open_group(path, mode="r" if read_only else "r+")
    except Exception as exc:  # zarr raises several types for "not a group"
        raise IndexMismatchError(
            f"{path}: not a ramstream index ({type(exc).__name__}); give another --index path"
        ) from exc
    if group.attrs.get("state") != "ready" or ATTR not in group.attrs:
        raise IndexMismatchError(f"{path}: not a complete ramstream index; delete it or give another --index path")
    version = group.attrs[ATTR].get("schema_version")  # type: ignore[union-attr]
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
    try:
        group = zarr.open_group(str(path), mode="r", zarr_format=3)
    except Exception:
        return False
    return group.attrs.get("state") == "creating"


def remove_index(path: Path) -> None:
    shutil.rmtree(path)


def _plan_of(header: IndexHeader) -> Plan:
    return plan_from_tensors(header.tensors, header.block_elems)
