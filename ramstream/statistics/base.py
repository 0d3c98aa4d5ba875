"""The contract of a block statistic."""

from __future__ import annotations

from typing import Protocol

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
