"""The local executor: one batch loop in this process, with write-behind.

Batches run in order on the calling thread (the backend parallelises inside a block); the next
batch's inputs are announced to the OS while this one computes, and a backend that streams is
told which blocks come (``Backend.expect``: it reads the next block's first tile ahead); each batch's ``write`` then
``mark`` run on write-behind threads while the next batches compute, at most ``depth`` pending,
so a pass holds ``depth + 1`` result buffers and a kill loses at most ``depth`` batches.
"""

from __future__ import annotations

from collections import deque
from collections.abc import Callable, Sequence
from typing import Any

from ramstream.backends.base import Backend
from ramstream.blocks import BlockReader
from ramstream.execution.progress import Done, Progress
from ramstream.execution.work import BlockWork, ComputesLater
from ramstream.execution.write_behind import WriteBehind
from ramstream.format.family import Family
from ramstream.io.reader import InputFiles
from ramstream.plan import Batch, Plan

DEPTH = 2  # batches being written while the next computes
RESULT_SLOTS = DEPTH + 1  # result buffers a pass holds per output: what the memory budget counts


class LocalExecutor:
    def __init__(self, backend: Backend, depth: int = DEPTH) -> None:
        self.backend = backend
        self.depth = depth

    def close(self) -> None:
        """Nothing to release: the backend belongs to the caller."""

    def run(
        self, work: BlockWork[Any], family: Family, plan: Plan, batches: Sequence[Batch], progress: Progress
    ) -> None:
        progress.where = f"{self.backend.name} on {self.backend.device}"
        if self.backend.defers and isinstance(work, ComputesLater) and self.depth > 1:
            self._run_lagging(work, family, plan, batches, progress)
            return
        with InputFiles() as files, WriteBehind(self.depth) as behind:
            reader = BlockReader(family, plan, files, self.backend.lora_product, self.backend.fp8_dequantize)
            for i, batch in enumerate(batches):
                if i + 1 < len(batches):
                    reader.prefetch(batches[i + 1])
                _expect(self.backend, reader, plan, batches, i)
                arrays = [reader.arrays(plan.blocks[b]) for b in batch.blocks]
                result = work.compute(batch, arrays, self.backend, i % (behind.depth + 1))
                del arrays
                reader.release(batch)
                progress.advance(plan.batch_bytes(batch))
                behind.submit(_Persist(work, batch, result, progress.snapshot()))

    def _run_lagging(self, work: Any, family: Family, plan: Plan, batches: Sequence[Batch], progress: Progress) -> None:
        """On a backend that defers (a GPU): batch i's results are waited for, checked and handed
        to the write-behind only once batch i + 1's merges are queued, so the device never drains
        between batches. The result buffers stay ``RESULT_SLOTS``: one batch being queued, one
        landing, ``depth - 1`` being written. A batch whose inputs were decoded into memory (LoRA
        agents, quantized tensors, mixed formats) is waited for before the next is read."""
        unsettled: deque[tuple[Batch, Callable[[], Any], Done]] = deque()
        with InputFiles() as files, WriteBehind(self.depth - 1) as behind:
            reader = BlockReader(family, plan, files, self.backend.lora_product, self.backend.fp8_dequantize)
            try:
                for i, batch in enumerate(batches):
                    if i + 1 < len(batches):
                        reader.prefetch(batches[i + 1])
                    _expect(self.backend, reader, plan, batches, i)
                    arrays = [reader.arrays(plan.blocks[b]) for b in batch.blocks]
                    later = work.compute_later(batch, arrays, self.backend, i % (self.depth + 1))
                    # a batch whose inputs were decoded into memory is waited for at once: the
                    # next batch's inputs are never held beside it (``--memory`` counts one)
                    keep = 0 if any(a.holds_memory() for a in arrays) else 1
                    del arrays
                    reader.release(batch)
                    progress.advance(plan.batch_bytes(batch))
                    unsettled.append((batch, later, progress.snapshot()))
                    while len(unsettled) > keep:
                        _submit(behind, work, unsettled.popleft())
                while unsettled:
                    _submit(behind, work, unsettled.popleft())
            finally:
                for _, later, _ in unsettled:  # a batch failed: nothing may land in the buffers after the pass
                    try:
                        later()
                    except BaseException:  # the first error is the one to report
                        pass


def _expect(backend: Backend, reader: BlockReader, plan: Plan, batches: Sequence[Batch], i: int) -> None:
    """On a backend that streams: the blocks batch ``i``'s calls read, and the next batch's first
    (read ahead while batch ``i``'s last block computes)."""
    if not backend.defers:
        return
    blocks = [*batches[i].blocks, *([batches[i + 1].first] if i + 1 < len(batches) else [])]
    backend.expect([reader.file_sources(plan.blocks[b]) for b in blocks])


def _submit(behind: WriteBehind, work: BlockWork[Any], pending: tuple[Batch, Callable[[], Any], Done]) -> None:
    """A landed batch's results waited for and checked (raising here, on the driving thread, as
    ``compute`` would), then persisted behind."""
    batch, later, done = pending
    behind.submit(_Persist(work, batch, later(), done))


class _Persist:
    """On a write-behind thread: the batch's durable data, then its journal mark."""

    def __init__(self, work: BlockWork[Any], batch: Batch, result: Any, done: Done) -> None:
        self.work, self.batch, self.result, self.done = work, batch, result, done

    def __call__(self) -> None:
        self.work.persist(self.batch, self.result, self.done)
