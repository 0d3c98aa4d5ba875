"""Cut the family's tensors into blocks: flat element ranges inside one tensor.

Block starts are multiples of the block size, itself a multiple of 64 elements, so the
bit-packed masks of a block are whole bytes (whole 64-bit words) and never straddle blocks.
A tensor larger than the budget simply has many blocks.
"""

from __future__ import annotations

from dataclasses import dataclass

from ramstream.format.dtypes import ITEMSIZE, is_float
from ramstream.format.family import Family

MIN_BLOCK = 1 << 16
MAX_BLOCK = 1 << 24
# Share of the budget given to block buffers; the rest covers transient copies (zarr encoding,
# the next block's readahead) and keeps the promise "peak RSS <= budget + interpreter".
BUDGET_SHARE = 0.5


@dataclass(frozen=True)
class TensorPlan:
    name: str
    shape: tuple[int, ...]
    numel: int
    dtypes: tuple[str, ...]  # base first, then each agent

    @property
    def merged(self) -> bool:
        """Float tensors are merged; the others are copied from the base."""
        return is_float(self.dtypes[0])


@dataclass(frozen=True)
class Block:
    index: int
    tensor: int
    start: int
    stop: int

    @property
    def size(self) -> int:
        return self.stop - self.start


@dataclass(frozen=True)
class Plan:
    tensors: tuple[TensorPlan, ...]
    block_elems: int
    blocks: tuple[Block, ...]

    def blocks_of(self, tensor: int) -> range:
        """The indices of the blocks of tensor ``tensor`` (they are consecutive)."""
        first = self._first_block[tensor]
        return range(first, first + _count(self.tensors[tensor].numel, self.block_elems))

    @property
    def _first_block(self) -> list[int]:
        starts, k = [], 0
        for t in self.tensors:
            starts.append(k)
            k += _count(t.numel, self.block_elems) if t.merged else 0
        return starts

    def block_bytes(self, block: Block) -> int:
        """Input bytes a block reads (base plus every agent)."""
        return block.size * sum(ITEMSIZE[d] for d in self.tensors[block.tensor].dtypes)


def _count(numel: int, block: int) -> int:
    return (numel + block - 1) // block


def bytes_per_element(family: Family, out_itemsize: int = 0) -> int:
    """Worst-case bytes held per block element: every input decoded to f32 plus masks and output."""
    n_agents = len(family.agents)
    return 4 * (n_agents + 1) + n_agents + out_itemsize


def block_elems_for(memory: int, per_element: int) -> int:
    """The largest power-of-two block that fits ``BUDGET_SHARE`` of ``memory``."""
    fit = int(memory * BUDGET_SHARE) // per_element
    size = MIN_BLOCK
    while size * 2 <= min(fit, MAX_BLOCK):
        size *= 2
    return size


def make_plan(family: Family, block_elems: int) -> Plan:
    tensors = tuple(
        TensorPlan(
            name,
            ref.entry.shape,
            ref.entry.numel,
            (ref.entry.dtype, *(a.tensors[name].entry.dtype for a in family.agents)),
        )
        for name, ref in family.base.tensors.items()
    )
    return plan_from_tensors(tensors, block_elems)


def plan_from_tensors(tensors: tuple[TensorPlan, ...], block_elems: int) -> Plan:
    """Blocks of ``block_elems`` elements over the merged tensors, in tensor order."""
    blocks: list[Block] = []
    for ti, t in enumerate(tensors):
        if not t.merged:
            continue
        for start in range(0, t.numel, block_elems):
            blocks.append(Block(len(blocks), ti, start, min(start + block_elems, t.numel)))
    return Plan(tensors, block_elems, tuple(blocks))
