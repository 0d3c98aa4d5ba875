"""Cut the family's tensors into blocks, and pack consecutive blocks into batches.

A block is a flat element range inside one tensor: what a backend computes and what per-tensor
statistics are summed from. Block starts are multiples of the block size, itself a multiple of
64 elements, so the bit-packed masks of a block are whole bytes (whole 64-bit words) and never
straddle blocks. A tensor larger than the budget simply has many blocks.

A batch is a run of consecutive blocks whose elements (each rounded up to a whole mask byte)
fit in one block: the unit the executors run, the index stores in one chunk and the journals
mark. A dense model's large tensors make batches of one block; a mixture-of-experts checkpoint's
thousands of small expert tensors share batches, so a pass costs what its bytes cost, not a
write, a sync and a journal mark per tensor.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from functools import cached_property

import numpy as np

from ramstream.format.dtypes import ITEMSIZE, is_merged
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
        """Float tensors (quantized ones too) are merged; the others are copied from the base."""
        return is_merged(self.dtypes[0])


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
class Batch:
    """Blocks ``first .. stop - 1`` of the plan, run, persisted and marked as one."""

    index: int
    first: int
    stop: int

    @property
    def blocks(self) -> range:
        return range(self.first, self.stop)

    def __len__(self) -> int:
        return self.stop - self.first


def mask_bytes(size: int) -> int:
    """Bytes of one agent's packed mask of ``size`` elements."""
    return (size + 7) // 8


@dataclass(frozen=True)
class Plan:
    tensors: tuple[TensorPlan, ...]
    block_elems: int
    blocks: tuple[Block, ...]

    @cached_property
    def batches(self) -> tuple[Batch, ...]:
        """Consecutive blocks packed while their masks fit one block's (``block_elems / 8`` bytes
        per agent); a block at least that large (whole rows of a row-aligned plan) is alone."""
        return pack_batches(self.blocks, self.block_elems)

    def batches_of_at_most(self, segments: int) -> tuple[Batch, ...]:
        """``batches`` cut further into runs of at most ``segments`` blocks (for statistics whose
        per-block partials are large: a batch's partials are held and stored together)."""
        out: list[Batch] = []
        for batch in self.batches:
            for first in range(batch.first, batch.stop, max(1, segments)):
                out.append(Batch(len(out), first, min(first + segments, batch.stop)))
        return tuple(out)

    @cached_property
    def mask_offsets(self) -> np.ndarray:
        """int64 (blocks,): each block's first byte within its batch's packed masks (per agent)."""
        offsets = np.zeros(len(self.blocks), np.int64)
        for batch in self.batches:
            at = 0
            for b in batch.blocks:
                offsets[b] = at
                at += mask_bytes(self.blocks[b].size)
        return offsets

    @cached_property
    def mask_width(self) -> int:
        """Bytes per agent of the widest batch's packed masks (the index's mask chunk width)."""
        ends = [self.mask_offsets[g.stop - 1] + mask_bytes(self.blocks[g.stop - 1].size) for g in self.batches]
        return int(max([1, *ends]))

    def batch_bytes(self, batch: Batch) -> int:
        """Input bytes a batch reads (base plus every agent)."""
        return sum(self.block_bytes(self.blocks[b]) for b in batch.blocks)

    def blocks_of(self, tensor: int) -> range:
        """The indices of the blocks of tensor ``tensor`` (they are consecutive)."""
        return self._ranges.get(tensor, range(0))

    @cached_property
    def _ranges(self) -> dict[int, range]:
        ranges: dict[int, range] = {}
        for b in self.blocks:
            first = ranges.get(b.tensor, range(b.index, b.index)).start
            ranges[b.tensor] = range(first, b.index + 1)
        return ranges

    @property
    def max_block(self) -> int:
        """Elements of the largest block (the size of reusable block buffers)."""
        return max((b.size for b in self.blocks), default=0)

    def block_bytes(self, block: Block) -> int:
        """Input bytes a block reads (base plus every agent)."""
        return block.size * sum(ITEMSIZE[d] for d in self.tensors[block.tensor].dtypes)


def bytes_per_element(family: Family, out_itemsize: int = 0) -> int:
    """Worst-case bytes held per block element: every input decoded to f32, masks, and the outputs'
    staging buffers (``out_itemsize``: their bytes per element, all slots of all outputs). A LoRA
    agent's task vector is computed into memory (``blocks.lora``) before any decoding: 4 more; so
    are a quantized member's dequantized values (``blocks.quantized``): 4 more."""
    n_agents = len(family.agents)
    lora_agents = sum(1 for a in family.agents if a.deltas)
    quantized = sum(1 for m in family.members if m.quantized)
    return 4 * (n_agents + 1) + n_agents + 4 * (lora_agents + quantized) + out_itemsize


def elements_within(memory: int, per_element: int) -> int:
    """How many block elements ``BUDGET_SHARE`` of ``memory`` holds."""
    return int(memory * BUDGET_SHARE) // per_element


def memory_for(elements: int, per_element: int) -> int:
    """The smallest budget whose share holds a block of ``elements``."""
    return math.ceil(elements * per_element / BUDGET_SHARE)


def block_elems_for(memory: int, per_element: int) -> int:
    """The largest power-of-two block that fits ``BUDGET_SHARE`` of ``memory``."""
    fit = elements_within(memory, per_element)
    size = MIN_BLOCK
    while size * 2 <= min(fit, MAX_BLOCK):
        size *= 2
    return size


def make_plan(family: Family, block_elems: int, row_aligned: bool = False, bands: dict[str, int] | None = None) -> Plan:
    tensors = tuple(
        TensorPlan(
            name,
            ref.entry.shape,
            ref.entry.numel,
            (ref.entry.dtype, *(a.dtype_of(name) for a in family.agents)),
        )
        for name, ref in family.base.tensors.items()
    )
    return plan_from_tensors(tensors, block_elems, row_aligned, bands)


def row_elements(t: TensorPlan) -> int:
    """Elements of one row of ``t`` (what a row-aligned block holds at least)."""
    return _row(t)


def _row(t: TensorPlan) -> int:
    """Elements of one row: the last dimensions after the first (the whole of a 1-D tensor)."""
    return max(1, t.numel // t.shape[0]) if len(t.shape) >= 2 and t.shape[0] else max(t.numel, 1)


def plan_from_tensors(
    tensors: tuple[TensorPlan, ...], block_elems: int, row_aligned: bool = False, bands: dict[str, int] | None = None
) -> Plan:
    """Blocks of ``block_elems`` elements over the merged tensors, in tensor order.

    With ``row_aligned`` (methods that rank elements within a row), a block holds whole rows:
    as many as fit in ``block_elems``, and at least one. A tensor named in ``bands`` (one written
    in FP8 with a scale per band of that many rows) has blocks of whole bands, at least one.
    """
    blocks: list[Block] = []
    for ti, t in enumerate(tensors):
        if not t.merged:
            continue
        unit = _row(t) * (bands or {}).get(t.name, 1)
        aligned = row_aligned or t.name in (bands or {})  # a band of one row (per-channel scales) too
        step = max(1, block_elems // unit) * unit if aligned else block_elems
        for start in range(0, t.numel, step):
            blocks.append(Block(len(blocks), ti, start, min(start + step, t.numel)))
    return Plan(tensors, block_elems, tuple(blocks))


def batch_positions(batches: tuple[Batch, ...], n_blocks: int) -> tuple[np.ndarray, np.ndarray]:
    """int64 ``(blocks,)`` twice: each block's batch, and its position within that batch."""
    batch_of = np.zeros(n_blocks, np.int64)
    slot_of = np.zeros(n_blocks, np.int64)
    for batch in batches:
        batch_of[batch.first : batch.stop] = batch.index
        slot_of[batch.first : batch.stop] = np.arange(len(batch))
    return batch_of, slot_of


def widest(batches: tuple[Batch, ...]) -> int:
    """Blocks in the longest batch (at least 1): the rows of a per-batch chunk of block partials."""
    return max([1, *(len(b) for b in batches)])


def pack_batches(blocks: tuple[Block, ...], block_elems: int) -> tuple[Batch, ...]:
    """Greedy, in block order: a batch takes the next block while the packed masks fit."""
    batches: list[Batch] = []
    first, used = 0, 0
    for b in blocks:
        need = mask_bytes(b.size) * 8
        if b.index > first and used + need > block_elems:
            batches.append(Batch(len(batches), first, b.index))
            first, used = b.index, 0
        used += need
    if blocks:
        batches.append(Batch(len(batches), first, len(blocks)))
    return tuple(batches)


def sum_by_tensor(plan: Plan, partials: np.ndarray) -> np.ndarray:
    """Per-block partials ``(blocks, *shape)`` added up per tensor ``(tensors, *shape)``
    (tensors without blocks get zeros)."""
    totals = np.zeros((len(plan.tensors), *partials.shape[1:]), partials.dtype)
    if len(plan.blocks):
        np.add.at(totals, np.array([b.tensor for b in plan.blocks]), partials)
    return totals
