"""The executor seam: something that runs a pass's batches of blocks (locally, or on a cluster)."""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any, Protocol

from ramstream.execution.progress import Progress
from ramstream.execution.work import BlockWork
from ramstream.format.family import Family
from ramstream.plan import Batch, Plan


class Executor(Protocol):
    def run(
        self, work: BlockWork[Any], family: Family, plan: Plan, batches: Sequence[Batch], progress: Progress
    ) -> None:
        """Compute, write and mark every batch of ``batches`` (batches of ``plan``'s blocks, the
        pass's own cut of them), advancing ``progress`` by each batch's input bytes. Returns once
        every mark is recorded; on an error nothing is written after it returns."""
        ...

    def close(self) -> None:
        """Release what the executor started (a cluster); the backend belongs to the caller."""
        ...
