"""The merge pass: every block through the method's kernel into the partial shards, resumably.

Work items are the merged blocks, then one item per non-float tensor (copied from the base in
bounded chunks). The journal lives in ``<out>/.ramstream/journal`` and marks an item only after
its bytes were handed to the OS (``pwrite``), so a kill loses at most the item in flight.
"""

from __future__ import annotations

import functools
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import zarr

from ramstream.format.dtypes import FLOAT_CODES, ITEMSIZE, RAW_CARRIER
from ramstream.format.family import Family
from ramstream.index.journal import Journal
from ramstream.io.reader import InputFiles
from ramstream.io.write_behind import WriteBehind
from ramstream.io.writer import ShardLayout, ShardWriter
from ramstream.kernels.nonfinite import first_nonfinite
from ramstream.kernels.probe import workers
from ramstream.methods.base import BlockMerger
from ramstream.passes.inputs import BlockInputs
from ramstream.passes.progress import Progress
from ramstream.plan import Plan

COPY_CHUNK = 16 * 1024 * 1024


@dataclass(frozen=True)
class MergeJob:
    family: Family
    plan: Plan
    merge_block: BlockMerger
    out_dtypes: tuple[str, ...]  # per tensor, the dtype written
    layout: ShardLayout
    index: Path | None = None  # the index used, recorded in the journal for ``ramstream status``
    check_nonfinite: bool = True  # refuse NaN/Inf inputs (off when the probe pass already checked)


def _journal_path(work: Path) -> Path:
    return work / "journal"


def stored_block_elems(work: Path) -> int | None:
    """The block size of an unfinished merge's journal, if there is one."""
    path = _journal_path(work)
    if not (path / "zarr.json").exists():
        return None
    value = zarr.open_group(str(path), mode="r", zarr_format=3).attrs.get("block_elems")
    return int(value) if isinstance(value, int) else None


def open_journal(work: Path, n_items: int, block_elems: int, index: Path | None = None) -> Journal:
    path = _journal_path(work)
    if stored_block_elems(work) == block_elems:
        journal = Journal.open(zarr.open_group(str(path), mode="r+", zarr_format=3), "merge")
        if journal.size == max(n_items, 1):
            return journal
    group = zarr.open_group(str(path), mode="w", zarr_format=3)
    journal = Journal.create(group, "merge", n_items)
    if index is not None:
        group.attrs["index"] = str(Path(index).resolve())
    group.attrs["block_elems"] = block_elems  # last: a journal without it is recreated
    return journal


def copied_tensors(plan: Plan) -> list[int]:
    return [i for i, t in enumerate(plan.tensors) if not t.merged]


def run_merge(job: MergeJob, work: Path, quiet: bool) -> None:
    plan = job.plan
    copies = copied_tensors(plan)
    n_items = len(plan.blocks) + len(copies)
    journal = open_journal(work, n_items, plan.block_elems, job.index)
    done = journal.done(n_items)
    if done.all():
        return
    todo = [b for b in plan.blocks if not done[b.index]]
    todo_copies = [t for k, t in enumerate(copies) if not done[len(plan.blocks) + k]]
    total = sum(plan.block_bytes(b) for b in todo) + sum(
        plan.tensors[t].numel * ITEMSIZE[plan.tensors[t].dtypes[0]] for t in todo_copies
    )
    progress = Progress.for_terminal("merge", total, quiet)
    writer = ShardWriter(job.layout, work)
    # depth + 1 staging buffers: the kernel fills one while the blocks in flight are written.
    n_workers = workers()
    try:
        with InputFiles() as files, WriteBehind() as behind:
            inputs = BlockInputs(job.family, plan, files)
            for i, block in enumerate(todo):
                if i + 1 < len(todo):
                    inputs.prefetch(todo[i + 1])
                tensor = plan.tensors[block.tensor]
                out_dtype = job.out_dtypes[block.tensor]
                byte_start = block.start * ITEMSIZE[out_dtype]
                carrier = np.dtype(RAW_CARRIER[FLOAT_CODES[out_dtype]])
                out = writer.staging(i % (behind.depth + 1), tensor.name, byte_start, block.size, carrier)
                arrays = inputs.arrays(block)
                if job.check_nonfinite:
                    bad = first_nonfinite(arrays.base, arrays.base_code, arrays.agents, arrays.agent_codes, n_workers)
                    if bad >= 0:
                        raise inputs.nonfinite_error(block, int(bad))
                job.merge_block(arrays, block, out, int(FLOAT_CODES[out_dtype]), n_workers)
                del arrays
                inputs.release(block)
                progress.advance(plan.block_bytes(block))
                behind.submit(
                    functools.partial(
                        _persist,
                        writer,
                        journal,
                        tensor.name,
                        byte_start,
                        out,
                        block.index,
                        progress.done,
                        progress.elapsed,
                    )
                )
            behind.drain()
            for k, t in enumerate(copies):
                if done[len(plan.blocks) + k]:
                    continue
                _copy_tensor(job, files, writer, t, progress)
                journal.mark(len(plan.blocks) + k)
                journal.record_rate(progress.done, progress.elapsed)
        writer.sync()
        journal.record_rate(progress.done, progress.elapsed, final=True)
    finally:
        writer.close()
        progress.close()


def _persist(
    writer: ShardWriter,
    journal: Journal,
    tensor: str,
    byte_start: int,
    data: np.ndarray,
    item: int,
    done_bytes: int,
    seconds: float,
) -> None:
    """On the write-behind thread: the block's bytes (durable), then its journal mark."""
    writer.write(tensor, byte_start, data)
    journal.mark(item)
    journal.record_rate(done_bytes, seconds)


def _copy_tensor(job: MergeJob, files: InputFiles, writer: ShardWriter, tensor: int, progress: Progress) -> None:
    """Copy a non-float tensor's bytes from the base, a bounded chunk at a time."""
    name = job.plan.tensors[tensor].name
    ref = job.family.base.tensors[name]
    nbytes = ref.entry.nbytes
    for start in range(0, nbytes, COPY_CHUNK):
        stop = min(start + COPY_CHUNK, nbytes)
        writer.write(name, start, bytes(files.byte_range(ref, start, stop)))
        progress.advance(stop - start)
    if nbytes:
        # byte_range maps pages of the base: drop them like any block.
        files.release(ref, 0, ref.entry.numel)
