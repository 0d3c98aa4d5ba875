"""The local executor: one block loop in this process, with write-behind.

Blocks run in order on the calling thread (the backend parallelises inside a block); the next
block's inputs are announced to the OS while this one computes; each block's ``write`` then
``mark`` run on write-behind threads while the next blocks compute, at most ``depth`` pending,
so a pass holds ``depth + 1`` result buffers and a kill loses at most ``depth`` blocks.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from ramstream.backends.base import Backend
from ramstream.blocks import BlockReader
from ramstream.execution.progress import Done, Progress
from ramstream.execution.work import BlockWork
from ramstream.execution.write_behind import WriteBehind
from ramstream.format.family import Family
from ramstream.io.reader import InputFiles
from ramstream.plan import Block, Plan


class LocalExecutor:
    def __init__(self, backend: Backend, depth: int = 2) -> None:
        self.backend = backend
        self.depth = depth

    def close(self) -> None:
        """Nothing to release: the backend belongs to the caller."""

    def run(
        self, work: BlockWork[Any], family: Family, plan: Plan, blocks: Sequence[Block], progress: Progress
    ) -> None:
        progress.where = f"{self.backend.name} on {self.backend.device}"
        with InputFiles() as files, WriteBehind(self.depth) as behind:
            reader = BlockReader(family, plan, files)
            for i, block in enumerate(blocks):
                if i + 1 < len(blocks):
                    reader.prefetch(blocks[i + 1])
                arrays = reader.arrays(block)
                result = work.compute(block, arrays, self.backend, i % (behind.depth + 1))
                del arrays
                reader.release(block)
                progress.advance(plan.block_bytes(block))
                behind.submit(_Persist(work, block, result, progress.snapshot()))


class _Persist:
    """On a write-behind thread: the block's durable data, then its journal mark."""

    def __init__(self, work: BlockWork[Any], block: Block, result: Any, done: Done) -> None:
        self.work, self.block, self.result, self.done = work, block, result, done

    def __call__(self) -> None:
        self.work.persist(self.block, self.result, self.done)
