"""The merge pass: every block through the method's block merger into the partial shards, resumably.

Work items are the plan's batches of merged blocks, then one item per non-float tensor (copied from the base in
bounded chunks). The journal lives in ``<out>/.ramstream/journal`` and marks an item only after
its bytes are durable, so a kill loses at most the items in flight. The blocks run on an
executor (``MergeWork`` says what to compute and persist per block); the copies run here.

A sweep's outputs are merged together, and one output's failure is its own: a refusal that
depends on the values (``OUTPUT_FAILURES``: a merged value out of range, a task vector that
overflows) stops that output only, the others run on (``MergeWork.failed``); the journal then
stops naming it, so that a rerun starts over rather than resume an output with holes. On a Dask
cluster the same holds: each worker stops writing an output once it refused it, and reports the
refusal with the batches it wrote; the driver records it (``MergeWork.failed_elsewhere``) before
it marks those batches. A worker that has not seen the refusal yet may still write that output's
later batches, which changes nothing: its directory is left unfinished either way.
"""

from __future__ import annotations

import threading
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, replace
from pathlib import Path

import numpy as np
import zarr

from ramstream.backends.base import Backend
from ramstream.backends.landing import landed
from ramstream.blocks import BlockArrays
from ramstream.errors import NonFiniteOutputError, RamstreamError, TaskVectorOverflowError
from ramstream.execution.executor import Executor
from ramstream.execution.progress import Done, Progress
from ramstream.format.dtypes import FLOAT_CODES, FP8_FLOATS, ITEMSIZE, RAW_CARRIER, FloatCode
from ramstream.format.family import Family, with_absolute_paths
from ramstream.index.guard import store_io
from ramstream.index.journal import Journal
from ramstream.index.local_store import open_group as durable_group
from ramstream.io.reader import InputFiles
from ramstream.io.writer import Run, ShardLayout, ShardWriter
from ramstream.merge import finite, fp8_out
from ramstream.methods.base import BlockMerger, Fused
from ramstream.plan import Batch, Block, Plan

COPY_CHUNK = 16 * 1024 * 1024
# Refusals that depend on one output's values, not on the inputs or the run: in a sweep, that
# output's failure alone.
OUTPUT_FAILURES: tuple[type[RamstreamError], ...] = (NonFiniteOutputError, TaskVectorOverflowError)


@dataclass(frozen=True)
class MergeJob:
    family: Family
    plan: Plan
    merge_block: BlockMerger
    out_dtypes: tuple[str, ...]  # per tensor, the dtype written
    layout: ShardLayout
    index: Path | None = None  # the index used, recorded in the journal for ``ramstream status``
    check_nonfinite: bool = True  # refuse NaN/Inf inputs (off when the probe pass already checked)
    task_vectors: bool = True  # the method merges agent-minus-base differences (not linear)
    fused: Fused | None = None  # how it merges together with other outputs of its group


def _journal_path(work: Path) -> Path:
    return work / "journal"


# What a journal's marks stand for: "batches" (a mark per batch of blocks, then per copied tensor).
# A journal without it (written by ramstream before batches) is started over, never misread.
JOURNAL_UNITS = "batches"


def stored_block_elems(work: Path) -> int | None:
    """The block size of an unfinished merge's journal, if there is one (of this format)."""
    path = _journal_path(work)
    if not (path / "zarr.json").exists():
        return None
    attrs = zarr.open_group(str(path), mode="r", zarr_format=3).attrs
    value = attrs.get("block_elems")
    return int(value) if isinstance(value, int) and attrs.get("units") == JOURNAL_UNITS else None


def open_journal(
    work: Path, n_items: int, block_elems: int, index: Path | None = None, outputs: Sequence[str] | None = None
) -> Journal:
    """The merge journal in ``work``: resumed when it marks the same items for the same outputs
    (``outputs``: a sweep's candidates; None for a plain merge), else started over."""
    path = _journal_path(work)
    if stored_block_elems(work) == block_elems:
        group = durable_group(path, mode="r+")
        journal = Journal.open(group, "merge")
        stored = group.attrs.get("outputs")
        if journal.size == max(n_items, 1) and stored == (None if outputs is None else list(outputs)):
            return journal
    group = durable_group(path, mode="w")  # a mark is synced, after its batch's synced bytes
    journal = Journal.create(group, "merge", n_items)
    if outputs is not None:
        group.attrs["outputs"] = list(outputs)
    if index is not None:
        group.attrs["index"] = str(Path(index).resolve())
    group.attrs["units"] = JOURNAL_UNITS
    group.attrs["block_elems"] = block_elems  # last: a journal without it is recreated
    return journal


def copied_tensors(plan: Plan) -> list[int]:
    return [i for i, t in enumerate(plan.tensors) if not t.merged]


@dataclass(frozen=True)
class MergedBatch:
    """A batch's merged bytes: one staged buffer per run of blocks lying back to back in a shard."""

    runs: list[tuple[Run, np.ndarray]]


class MergeBlocks:
    """Per batch: merge each block into its place in the slot's staging buffers, refuse NaN/Inf
    inputs (unless the probe vouched) and outputs, and write them to their shards (durably)."""

    def __init__(self, job: MergeJob, writer: ShardWriter) -> None:
        self.job = job
        self.writer = writer

    def _runs(self, batch: Batch) -> tuple[list[Run], list[tuple[int, int]]]:
        """The batch's runs, and for each block its run and byte offset within the run; a block
        written in FP8 is followed by its scales' run (``fp8_out``)."""
        plan, out_dtypes = self.job.plan, self.job.out_dtypes
        runs: list[Run] = []
        where: list[tuple[int, int]] = []
        for b in batch.blocks:
            if out_dtypes[plan.blocks[b].tensor] in FP8_FLOATS:
                where.append((len(runs), 0))
                runs += fp8_out.runs(self.writer, self._fp8_of(plan.blocks[b]), plan.blocks[b])
                continue
            block = plan.blocks[b]
            itemsize = ITEMSIZE[out_dtypes[block.tensor]]
            name = plan.tensors[block.tensor].name
            run = self.writer.run_of(name, block.start * itemsize, block.size * itemsize, itemsize)
            last = runs[-1] if runs else None
            if (
                last is not None
                and last.congruent
                and run.congruent
                and last.shard == run.shard
                and last.offset + last.nbytes == run.offset
            ):
                where.append((len(runs) - 1, last.nbytes))
                runs[-1] = Run(last.shard, last.offset, last.nbytes + run.nbytes)
            else:
                where.append((len(runs), 0))
                runs.append(run)
        return runs, where

    def stage(self, batch: Batch, slot: int, backend: Backend) -> Staged:
        """The batch's staging buffers in ``slot`` (the backend's host memory: the merges' results
        land there without a copy) and, per block, where its output goes."""
        runs, where = self._runs(batch)
        return Staged(runs, self.writer.staging_runs(slot, runs, backend.host_memory), where)

    def _fp8_of(self, block: Block) -> fp8_out.Fp8Tensor:
        return fp8_out.Fp8Tensor.like(self.job.family.base.quantized[self.job.plan.tensors[block.tensor].name])

    def out_of(self, staged: Staged, i: int, block: Block) -> tuple[np.ndarray, int]:
        """Block ``i`` of the batch's output (its format's raw carrier) and format code; for a
        block written in FP8, a float32 buffer that ``finish`` quantizes into place."""
        out_dtype = self.job.out_dtypes[block.tensor]
        if out_dtype in FP8_FLOATS:
            return np.empty(block.size, np.float32), int(FloatCode.F32)
        carrier = np.dtype(RAW_CARRIER[FLOAT_CODES[out_dtype]])
        run, at = staged.where[i]
        return staged.buffers[run][at : at + block.size * carrier.itemsize].view(carrier), int(FLOAT_CODES[out_dtype])

    def check_output(self, block: Block, arrays: BlockArrays, backend: Backend, out: np.ndarray, code: int) -> None:
        job = self.job
        name = job.plan.tensors[block.tensor].name
        finite.check_block(
            out, code, arrays, block, name, job.check_nonfinite, job.merge_block, backend, job.task_vectors
        )

    def finish(self, staged: Staged, i: int, block: Block, out: np.ndarray) -> None:
        """Quantize block ``i``'s merged float32 values into its staged FP8 bytes and scales (no-op
        for other formats)."""
        if self.job.out_dtypes[block.tensor] in FP8_FLOATS:
            run = staged.where[i][0]
            fp8_out.quantize_into(self._fp8_of(block), out, staged.buffers[run], staged.buffers[run + 1])

    def write(self, batch: Batch, result: MergedBatch) -> None:
        self.writer.write_runs(result.runs)

    def close(self) -> None:
        self.writer.close()


@dataclass(frozen=True)
class Staged:
    runs: list[Run]
    buffers: list[np.ndarray]
    where: list[tuple[int, int]]  # per block: its run, and its byte offset in the run


class Outputs:
    """A worker's side of ``MergeWork``: compute and write every output, never mark. Outputs
    whose merges fuse (``Prepared.fused``: the same group and output dtypes) are merged by one
    backend call per block, reading its inputs once for all of them. With ``isolate``, an
    output's value-dependent refusal (``OUTPUT_FAILURES``) is kept in ``failed`` and that output
    is neither checked nor written any more; the others go on."""

    def __init__(self, parts: list[MergeBlocks], isolate: bool = False) -> None:
        self.parts = parts
        self.isolate = isolate
        self.failed: dict[int, RamstreamError] = {}  # output -> why it stopped (first reason)
        self._failing = threading.Lock()  # batches are computed on several threads
        groups: dict[object, list[int]] = {}
        for k, part in enumerate(parts):
            fused = part.job.fused
            key = (fused.group, part.job.out_dtypes) if fused is not None else ("alone", k)
            groups.setdefault(key, []).append(k)
        self.groups = list(groups.values())

    def compute(self, batch: Batch, arrays: Sequence[BlockArrays], backend: Backend, slot: int) -> list[MergedBatch]:
        staged = [part.stage(batch, slot, backend) for part in self.parts]
        for i, block_arrays in enumerate(arrays):
            merged = self._merge_block(batch, i, block_arrays, staged, backend)
            self._check_block(batch, i, block_arrays, staged, backend, merged, {})
        return [MergedBatch(list(zip(s.runs, s.buffers, strict=True))) for s in staged]

    def compute_later(
        self, batch: Batch, arrays: Sequence[BlockArrays], backend: Backend, slot: int
    ) -> Callable[[], list[MergedBatch]]:
        """``compute`` in two steps: every block's merges queued now (their results may still be
        on their way: ``Backend.deferred``), then the returned function waits for them and checks
        each block. The executor calls it once the next batch's merges are queued, so the device
        goes from one batch to the next without a drain."""
        staged = [part.stage(batch, slot, backend) for part in self.parts]
        with backend.deferred() as landing:
            merged = [self._merge_block(batch, i, a, staged, backend) for i, a in enumerate(arrays)]

        def checked() -> list[MergedBatch]:
            found = landing.wait()
            for i, block_arrays in enumerate(arrays):
                self._check_block(batch, i, block_arrays, staged, backend, merged[i], found)
            return [MergedBatch(list(zip(s.runs, s.buffers, strict=True))) for s in staged]

        return checked

    def _merge_block(
        self, batch: Batch, i: int, arrays: BlockArrays, staged: list[Staged], backend: Backend
    ) -> list[tuple[list[int], tuple[int, list[tuple[np.ndarray, int]]]]]:
        """Block ``i`` merged into the slot's staging buffers: per group of outputs, the first
        NaN/Inf input (or a landing's token for it) and the outputs."""
        block = self.parts[0].job.plan.blocks[batch.blocks[i]]
        return [(members, self._merge(members, i, block, arrays, staged, backend)) for members in self.groups]

    def _check_block(
        self,
        batch: Batch,
        i: int,
        arrays: BlockArrays,
        staged: list[Staged],
        backend: Backend,
        merged: list[tuple[list[int], tuple[int, list[tuple[np.ndarray, int]]]]],
        found: dict[int, int],
    ) -> None:
        """Block ``i``'s inputs and outputs checked for NaN/Inf (``found``: what a landing's tokens
        stand for), then its outputs finished."""
        block = self.parts[0].job.plan.blocks[batch.blocks[i]]
        # The outputs share their inputs: NaN/Inf in them is refused (the merges report it, having
        # read every input) only when every output asks (one that does not either lets them
        # through, with all the others, or had its probe vouch that there are none).
        check = all(p.job.check_nonfinite for p in self.parts)
        bad = min((first for _, (token, _) in merged if (first := landed(token, found, token)) >= 0), default=-1)
        if check and bad >= 0:
            raise arrays.nonfinite_error(bad)
        for members, (_, outs) in merged:
            for k, (out, out_code) in zip(members, outs, strict=True):
                if k not in self.failed:
                    self._checked(k, block, arrays, backend, out, out_code)
                    self.parts[k].finish(staged[k], i, block, out)

    def failures(self) -> dict[int, RamstreamError]:
        with self._failing:
            return dict(self.failed)

    def failed_elsewhere(self, failures: Mapping[int, RamstreamError]) -> None:
        with self._failing:
            for k, exc in failures.items():
                self.failed.setdefault(k, exc)

    def _checked(
        self, k: int, block: Block, arrays: BlockArrays, backend: Backend, out: np.ndarray, out_code: int
    ) -> None:
        """Output ``k``'s check of the block; its refusal is its failure alone when isolating."""
        try:
            self.parts[k].check_output(block, arrays, backend, out, out_code)
        except OUTPUT_FAILURES as exc:
            if not self.isolate:
                raise
            with self._failing:
                self.failed.setdefault(k, exc)

    def _merge(
        self, members: list[int], i: int, block: Block, arrays: BlockArrays, staged: list[Staged], backend: Backend
    ) -> tuple[int, list[tuple[np.ndarray, int]]]:
        """Merge the block into the outputs of one group: the first NaN/Inf input, and the outputs."""
        parts = [self.parts[k] for k in members]
        outs = [part.out_of(staged[k], i, block) for k, part in zip(members, parts, strict=True)]
        code = outs[0][1]
        first = parts[0].job
        if len(parts) == 1 or first.fused is None:
            bad = first.merge_block(arrays, block, outs[0][0], code, backend)
        else:
            owns = [p.job.fused.own for p in parts if p.job.fused is not None]
            bad = first.fused.merge_many(arrays, block, owns, [out for out, _ in outs], code, backend)
        return bad, outs

    def write(self, batch: Batch, result: list[MergedBatch]) -> None:
        for k, (part, merged) in enumerate(zip(self.parts, result, strict=True)):
            if k not in self.failed:
                part.write(batch, merged)

    def close(self) -> None:
        for part in self.parts:
            part.close()


class MergeWork(Outputs):
    """The merge blocks of K outputs computed from one read of each batch's inputs (a plain merge
    is K = 1; a sweep's candidates are the others), marked in the journal once every output's
    bytes of the batch are written."""

    label = "merge"

    def __init__(
        self,
        jobs: Sequence[MergeJob],
        writers: Sequence[ShardWriter],
        journal: Journal,
        works: Sequence[Path],
        outputs: Sequence[str] | None = None,
        journal_dir: Path | None = None,
    ) -> None:
        parts = [MergeBlocks(job, writer) for job, writer in zip(jobs, writers, strict=True)]
        super().__init__(parts, isolate=outputs is not None)
        self.journal = journal
        self.works = tuple(works)
        self.outputs = list(outputs) if outputs is not None else None
        self.journal_dir = journal_dir
        self._unnamed: set[int] = set()  # failed outputs the journal no longer names

    def mark(self, batch: Batch, done: Done) -> None:
        self._unname_failed()
        self.journal.mark(batch.index)
        self.journal.record_rate(done.bytes, done.seconds, where=done.where)

    def persist(self, batch: Batch, result: list[MergedBatch], done: Done) -> None:
        self.write(batch, result)
        self.mark(batch, done)

    def _unname_failed(self) -> None:
        """Before a batch is marked: a failed output's bytes stop at its failure, so the journal
        stops naming it (a rerun merging it again then starts the journal over, never resumes)."""
        with self._failing:
            new = sorted(set(self.failed) - self._unnamed)
            self._unnamed |= set(new)
        if new and self.outputs is not None and self.journal_dir is not None:
            names = [n for k, n in enumerate(self.outputs) if k not in self._unnamed]
            path = _journal_path(self.journal_dir)
            with store_io(path, "recording a failed output in the merge's journal"):
                durable_group(path, mode="r+").attrs["outputs"] = names

    def remote(self) -> RemoteMerge:
        works = tuple(w.resolve() for w in self.works)
        jobs = tuple(replace(p.job, family=with_absolute_paths(p.job.family)) for p in self.parts)
        return RemoteMerge("merge:" + ":".join(map(str, works)), jobs, works, self.isolate)


@dataclass(frozen=True)
class RemoteMerge:
    """The merge for a cluster's worker: it opens each output's partial shards by path and writes
    blocks; with ``isolate`` (a sweep), an output's own refusal stops that output only there too."""

    key: str
    jobs: tuple[MergeJob, ...]
    works: tuple[Path, ...]
    isolate: bool = False

    def open(self) -> Outputs:
        parts = [MergeBlocks(j, ShardWriter(j.layout, w)) for j, w in zip(self.jobs, self.works, strict=True)]
        return Outputs(parts, self.isolate)


def run_merge(job: MergeJob, work: Path, executor: Executor, quiet: bool) -> None:
    """One merge's pass, its journal and partial shards in ``work``."""
    run_merges([job], [work], work, executor, quiet)


def run_merges(
    jobs: Sequence[MergeJob],
    works: Sequence[Path],
    journal_dir: Path,
    executor: Executor,
    quiet: bool,
    outputs: Sequence[str] | None = None,
) -> dict[int, RamstreamError]:
    """The merge pass of K outputs of one family and plan: each batch's inputs are read once and
    merged K times (``jobs[k]`` into the partial shards in ``works[k]``); the journal in
    ``journal_dir`` marks a batch once all K are written (``outputs`` names them: a journal of
    other outputs starts over). The jobs share the family, the plan and the index. Returns the
    outputs that failed on their own (several ``outputs``, see the module docstring), by position."""
    first = jobs[0]
    plan = first.plan
    copies = copied_tensors(plan)
    n_batches = len(plan.batches)
    n_items = n_batches + len(copies)
    journal = open_journal(journal_dir, n_items, plan.block_elems, first.index, outputs)
    done = journal.done(n_items)
    if done.all():
        return {}
    todo = [b for b in plan.batches if not done[b.index]]
    todo_copies = [t for k, t in enumerate(copies) if not done[n_batches + k]]
    total = sum(plan.batch_bytes(b) for b in todo) + sum(
        plan.tensors[t].numel * ITEMSIZE[plan.tensors[t].dtypes[0]] for t in todo_copies
    )
    progress = Progress.for_terminal("merge", total, quiet)
    writers = [ShardWriter(job.layout, work) for job, work in zip(jobs, works, strict=True)]
    work = MergeWork(jobs, writers, journal, works, outputs, journal_dir)
    try:
        _copy_activation_scales(first, writers)  # first: no block marked done before they are written
        executor.run(work, first.family, plan, todo, progress)
        with InputFiles() as files:
            for k, t in enumerate(copies):
                if done[n_batches + k]:
                    continue
                _copy_tensor(first, files, writers, t, progress)
                journal.mark(n_batches + k)
                journal.record_rate(progress.done, progress.elapsed, where=progress.where)
        for writer in writers:
            writer.sync()
        journal.record_rate(progress.done, progress.elapsed, final=True, where=progress.where)
    finally:
        for writer in writers:
            writer.close()
        progress.close()
    return dict(work.failed)


def _copy_activation_scales(job: MergeJob, writers: Sequence[ShardWriter]) -> None:
    """Copy the base's static activation scales into the outputs whose layout holds them (an
    output in the base's FP8 scheme): a few bytes each, rewritten by every run until the pass is
    done, so a resumed merge has them too."""
    scales = job.family.base.activation_scales
    if not scales or not any(name in w.layout.placements for w in writers for name in scales):
        return
    with InputFiles() as files:
        for name, ref in scales.items():
            data = bytes(files.byte_range(ref, 0, ref.entry.nbytes))
            files.release(ref, 0, ref.entry.numel)
            for writer in writers:
                if data and name in writer.layout.placements:
                    writer.write(name, 0, data)


def _copy_tensor(
    job: MergeJob, files: InputFiles, writers: Sequence[ShardWriter], tensor: int, progress: Progress
) -> None:
    """Copy a non-float tensor's bytes from the base into every output, a bounded chunk at a time."""
    name = job.plan.tensors[tensor].name
    ref = job.family.base.tensors[name]
    nbytes = ref.entry.nbytes
    for start in range(0, nbytes, COPY_CHUNK):
        stop = min(start + COPY_CHUNK, nbytes)
        chunk = bytes(files.byte_range(ref, start, stop))
        for writer in writers:
            writer.write(name, start, chunk)
        progress.advance(stop - start)
    if nbytes:
        # byte_range maps pages of the base: drop them like any block.
        files.release(ref, 0, ref.entry.numel)
