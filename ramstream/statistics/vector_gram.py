"""Exact Gram sums per vector of each tensor: its rows or its columns (row- and column-wise nuslerp).

A block's partial holds, for each vector it touches (``vector_sums.vector_layout``: rows from
the block's first, or columns from the first element's), the exact sums of v_a * v_b per pair in
``backends.vector_sums``' format, normalised; ``tensor_vector_sums`` adds a tensor's partials
into its vectors and rounds each total to float64 once. Exact, so the sums are the same whatever
the block split, thread count, backend or executor.

Size: a partial is ``width`` vectors of 3 pairs x 20 digits (480 bytes a vector for two vectors),
``width`` being the most vectors a block of the plan touches (rows: block elements / row length
+ 1; columns: the columns of the widest tensor); a tensor's totals, 480 bytes a vector, are held
while it is finished, one tensor at a time.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from ramstream.backends.base import Backend
from ramstream.backends.vector_sums import DIGITS, finish, vector_ids, vector_layout
from ramstream.blocks import BlockArrays
from ramstream.errors import ConfigError
from ramstream.plan import Block, Plan, TensorPlan
from ramstream.statistics.context import StatsContext
from ramstream.statistics.exact_sums import pairs

PARTIAL_LIMIT = 64 << 20  # bytes of one block's partial


@dataclass(frozen=True)
class VectorGram:
    """Per vector (rows, or with ``row_wise`` columns), exact sums of v_a * v_b for every pair
    a <= b over the task vectors, or with ``weights`` over the weights (the base first)."""

    weights: bool
    row_wise: bool
    width: int  # vectors per partial: the most any block of the plan touches
    allow_nonfinite: bool = False  # NaN/Inf elements count as 0 instead of raising (not in the key)

    @property
    def key(self) -> str:
        what = "weights" if self.weights else "tau"
        along = "columns" if self.row_wise else "rows"
        return f"vector_gram_v1-{what}-{along}-width{self.width}"

    def shape(self, n_agents: int) -> tuple[int, ...]:
        return (self.width, len(pairs(n_agents + 1 if self.weights else n_agents)), DIGITS)

    @property
    def dtype(self) -> str:
        return "int64"

    def compute(self, arrays: BlockArrays, block: Block, tensor: TensorPlan, backend: Backend) -> np.ndarray:
        layout = vector_layout(tensor.shape, block.start, block.stop, self.row_wise)
        result = backend.vector_gram(arrays, layout, weights=self.weights)
        if result.first_nonfinite >= 0 and not self.allow_nonfinite:
            raise arrays.nonfinite_error(result.first_nonfinite)
        out = np.zeros(self.shape(arrays.n_agents), np.int64)
        out[: layout.count] = result.sums
        return out


def width(plan: Plan, row_wise: bool) -> int:
    """The most vectors a block of ``plan`` touches."""
    counts = [
        vector_layout(plan.tensors[b.tensor].shape, b.start, b.stop, row_wise).count for b in plan.blocks if b.size
    ]
    return max(counts, default=1)


def tensor_vector_sums(ctx: StatsContext, stat: VectorGram, tensor: int, chunk: int = 64) -> np.ndarray:
    """float64 (vectors, pairs): the tensor's per-vector totals (zeros for a tensor without blocks)."""
    plan = ctx.plan
    info = plan.tensors[tensor]
    count = vector_layout(info.shape, 0, max(info.numel, 1), stat.row_wise).mod
    n_pairs = stat.shape(len(ctx.family.agents))[1]
    total = np.zeros((count, n_pairs, DIGITS), np.int64)
    blocks = plan.blocks_of(tensor)
    for lo in range(blocks.start, blocks.stop, chunk):
        span = range(lo, min(lo + chunk, blocks.stop))
        partials = ctx.partials(stat, span)
        for k, b in enumerate(span):
            block = plan.blocks[b]
            layout = vector_layout(info.shape, block.start, block.stop, stat.row_wise)
            total[vector_ids(layout)] += partials[k, : layout.count]
    return finish(total)


def check_width(stat: VectorGram, n_agents: int) -> None:
    """Refuse partials too large to hold beside the blocks (rows far shorter than the blocks)."""
    nbytes = int(np.prod(stat.shape(n_agents))) * 8
    if nbytes > PARTIAL_LIMIT:
        along = "columns" if stat.row_wise else "rows"
        raise ConfigError(
            f"per-vector nuslerp statistics would take {nbytes >> 20} MiB per block ({stat.width} {along} of a "
            "block); give a smaller --memory, or use nuslerp over whole tensors (nuslerp_flatten: true)"
        )
