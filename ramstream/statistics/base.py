"""The contract of a block statistic."""

from __future__ import annotations

from collections.abc import Callable, Mapping
from typing import Any, Protocol, runtime_checkable

import numpy as np

from ramstream.backends.base import Backend
from ramstream.blocks import BlockArrays
from ramstream.plan import Block, TensorPlan


class BlockStatistic(Protocol):
    """A per-block partial result, persisted as ``stats/<key>`` in the index.

    ``key`` must change whenever anything that changes the partials changes (parameters that
    select elements, a seed...), so an index never mixes partials of two definitions.
    """

    @property
    def key(self) -> str: ...

    def shape(self, n_agents: int) -> tuple[int, ...]:
        """Shape of one block's partial."""
        ...

    @property
    def dtype(self) -> str: ...

    def compute(self, arrays: BlockArrays, block: Block, tensor: TensorPlan, backend: Backend) -> np.ndarray:
        """The partial of ``block`` (pure: depends only on the arrays, the block and the tensor,
        never on the backend that computes it)."""
        ...


Found = Mapping[int, Any]  # what a landing found, by token (``backends.landing``)


@runtime_checkable
class ComputedLater(Protocol):
    """A statistic whose backend calls may return before their results land (inside
    ``Backend.deferred()``, on a device that streams): the statistics pass queues a batch's calls,
    then checks and stores the partials once the landing has waited for them."""

    def compute_later(
        self, arrays: BlockArrays, block: Block, tensor: TensorPlan, backend: Backend
    ) -> Callable[[Found], np.ndarray]:
        """``compute`` in two steps: the backend's calls queued now; the function returned, given
        what the landing found, checks and returns the partial. Outside a deferred scope, it is
        ``compute`` (``compute_later(...)({})``)."""
        ...
