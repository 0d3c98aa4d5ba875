"""The executor seam: something that runs a pass's blocks (locally, or on a cluster)."""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any, Protocol

from ramstream.execution.progress import Progress
from ramstream.execution.work import BlockWork
from ramstream.format.family import Family
from ramstream.plan import Block, Plan


class Executor(Protocol):
    def run(
        self, work: BlockWork[Any], family: Family, plan: Plan, blocks: Sequence[Block], progress: Progress
    ) -> None:
        """Compute, write and mark every block of ``blocks`` (a subset of ``plan``'s), advancing
        ``progress`` by each block's input bytes. Returns once every mark is recorded; on an
        error nothing is written after it returns."""
        ...

    def close(self) -> None:
        """Release what the executor started (a cluster); the backend belongs to the caller."""
        ...
