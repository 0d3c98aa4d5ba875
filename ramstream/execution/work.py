"""What a pass runs per batch of blocks: the contract between the passes and the executors.

The unit is a batch (``plan.Batch``): consecutive blocks, many small tensors' or one large
tensor's piece, computed together, persisted in one write per store and marked once. A pass
says *what* to compute for a batch and what to persist; an executor says *when* and
*where* (``execution.local``: this process, with write-behind threads; ``execution.dask``: the
workers of a Dask cluster). Persisting is split in two so that a block is marked done only after
its data is durable, wherever it was written: ``write`` makes the block's data durable (on
whatever runs the block), ``mark`` records it in the journal (always on the process that owns
the journal, the driver). ``persist`` is both, in that order, for an executor that writes where
the journal is: a work whose data and journal share one store may fuse them into one round trip
(the probe's index chunks). Writes are idempotent: a block redone after a crash, or by a second
worker after the first died, writes the same bytes at the same places.

``remote`` describes the work for another process: a picklable record (paths, parameters, the
plan) whose ``open`` rebuilds ``compute`` and ``write`` there, opening files and stores by path.

A work of several parts (a sweep's outputs) may let a part fail on its own (``PartsFailAlone``):
the part stops, the others go on. Whatever computes the blocks records the failure; an executor
whose blocks are computed elsewhere hands the failures reported there to the driver's work before
it marks the batches they came with, so the journal never marks a failed part's missing bytes.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from typing import Any, Protocol, TypeVar, runtime_checkable

from ramstream.backends.base import Backend
from ramstream.blocks import BlockArrays
from ramstream.errors import RamstreamError
from ramstream.execution.progress import Done
from ramstream.plan import Batch

R = TypeVar("R")


class BlockTasks(Protocol[R]):
    """Computing and writing blocks: what a worker needs (it never marks)."""

    def compute(self, batch: Batch, arrays: Sequence[BlockArrays], backend: Backend, slot: int) -> R:
        """The batch's result (``arrays``: those of its blocks, in order). ``slot`` (0 .. depth)
        names a buffer the caller may reuse: the executor never hands out a slot whose previous
        result is still being written."""
        ...

    def write(self, batch: Batch, result: R) -> None:
        """Make the batch's data durable (output bytes, index chunks)."""
        ...

    def close(self) -> None:
        """Release what ``write`` holds open (files, stores)."""
        ...


class RemoteWork(Protocol[R]):
    """A pass's work for another process: picklable, opened there by path."""

    @property
    def key(self) -> str:
        """Tells one pass's work from another's (workers cache what ``open`` returns by it)."""
        ...

    def open(self) -> BlockTasks[R]: ...


class BlockWork(BlockTasks[R], Protocol[R]):
    label: str  # for progress: "probe", "merge", "statistics (...)"

    def mark(self, batch: Batch, done: Done) -> None:
        """Record the batch as done (after its ``write`` returned), with the pass's progress so far."""
        ...

    def persist(self, batch: Batch, result: R, done: Done) -> None:
        """``write`` then ``mark`` (fused where data and journal share one store)."""
        ...

    def remote(self) -> RemoteWork[R]:
        """This work as another process rebuilds it (see the module docstring)."""
        ...


@runtime_checkable
class ComputesLater(Protocol):
    """Work whose batch can be computed in two steps (``Backend.deferred``): its backend calls
    queued, then the returned function waits for their results and checks them."""

    def compute_later(
        self, batch: Batch, arrays: Sequence[BlockArrays], backend: Backend, slot: int
    ) -> Callable[[], Any]: ...


@runtime_checkable
class PartsFailAlone(Protocol):
    """Work whose parts fail on their own: a value-dependent refusal stops that part only."""

    def failures(self) -> dict[int, RamstreamError]:
        """The parts that stopped on their own so far, by position, with why (the first reason)."""
        ...

    def failed_elsewhere(self, failures: Mapping[int, RamstreamError]) -> None:
        """Record failures found where the blocks were computed (a worker), before their batches
        are marked; a part's first reason is kept."""
        ...
