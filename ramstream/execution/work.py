"""What a pass runs per block: the contract between the passes and the executors.

A pass says *what* to compute for a block and what to persist; an executor says *when* and
*where* (``execution.local``: this process, with write-behind threads). Persisting is split in
two so that a block is marked done only after its data is durable, wherever it was written:
``write`` makes the block's data durable (on whatever runs the block), ``mark`` records it in
the journal (on the process that owns the journal). A ``write`` whose data and journal share one
store may record the mark in the same step, after the data (the probe's index chunks);
``mark`` then records only what is left (the pass's rate). Writes are idempotent: a block redone after
a crash writes the same bytes at the same places.
"""

from __future__ import annotations

from typing import Protocol, TypeVar

from ramstream.backends.base import Backend
from ramstream.blocks import BlockArrays
from ramstream.plan import Block

R = TypeVar("R")


class BlockWork(Protocol[R]):
    label: str  # for progress: "probe", "merge", "statistics (...)"

    def compute(self, block: Block, arrays: BlockArrays, backend: Backend, slot: int) -> R:
        """The block's result. ``slot`` (0 .. depth) names a buffer the caller may reuse: the
        executor never hands out a slot whose previous result is still being written."""
        ...

    def write(self, block: Block, result: R) -> None:
        """Make the block's data durable (output bytes, index chunks)."""
        ...

    def mark(self, block: Block, done_bytes: int, seconds: float) -> None:
        """Record the block as done (after ``write`` returned), with the pass's progress so far."""
        ...
