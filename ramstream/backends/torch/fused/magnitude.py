"""The magnitude histograms of one tile in one Triton launch each, with the counts of
``backends/numba/magnitude.py``: decode the base and every agent, the 31-bit pattern of
|tau| = |f32(agent) - f32(base)|, then

- ``high_tile``: per agent, how many elements have each high half (``bits >> 16``, 32768 bins);
- ``low_tile``: per agent and cut, how many elements whose high half is the cut's target (-1:
  none) have each low half (``bits & 0xFFFF``);
- ``tie_tile``: per query (an agent and a cut's value), where the agent's bits equal the value,
  bit-packed (bit ``i % 8`` of byte ``i // 8``: element ``i``, as numpy's little bit order);
- ``cut_keep_tile``: per agent, whether each element survives its two cuts (the keep mask that the
  L1 statistics of TIES and breadcrumbs sum over), one byte per element.

Counts are integers, so their order does not matter: every counted element is added to its bin
of the call's int32 accumulator (the Numba kernels' type: a block's count fits) with a native,
relaxed integer atomic (an add in the memory system, not a compare-and-swap loop). Nothing is
sent to a hot bin: the elements whose |tau| is exactly 0 (most of a sparse task vector) are
counted by a reduction in the program (at most ``BLOCK``) and added to bin 0 once; elements past
the tile are masked out of the atomics.
"""

from __future__ import annotations

import torch
import triton
import triton.language as tl

from ramstream.backends.base import HIGH_BINS, LOW_BINS
from ramstream.backends.torch.fused import codecs
from ramstream.backends.torch.fused.fusion import importance
from ramstream.backends.torch.fused.gta import kept_by_cuts
from ramstream.backends.torch.fused.ram import EXACT, layout, on_device

BLOCK = 1024  # elements per program
# arcee_fusion's rows for the importance key: (the tile's block position, the rows' float32
# factors on the device, row_len, offset)
Rows = tuple[int, torch.Tensor, int, int]


@triton.jit
def _abs_bits(base, agents_at, agent_stride, t, b, offsets, mask, AGENT: tl.constexpr):
    """int32 bit patterns of |tau| of agent ``t`` (``b`` the decoded base)."""
    a = codecs.decode(base + agents_at + t * agent_stride, offsets, mask, AGENT)
    return codecs.task_vector(a, b, AGENT).to(tl.int32, bitcast=True) & 0x7FFFFFFF


KEY_ABS: tl.constexpr = tl.constexpr(0)  # |tau| of each agent (TIES, breadcrumbs)
KEY_IMPORTANCE: tl.constexpr = tl.constexpr(1)  # arcee_fusion's importance of its one agent


@triton.jit
def _key_bits(base, agents_at, agent_stride, t, b, offsets, mask, lo, scale, row_len, row_offset,
              AGENT: tl.constexpr, KEY: tl.constexpr):  # fmt: skip
    """int32 bit patterns (sign cleared) of agent ``t``'s key: |tau|, or the importance."""
    if KEY == KEY_IMPORTANCE:
        a = codecs.decode(base + agents_at + t * agent_stride, offsets, mask, AGENT)
        _, weight = importance(b, a, offsets.to(tl.int64) + lo, mask, scale, row_len, row_offset, AGENT)
        return weight.to(tl.int32, bitcast=True) & 0x7FFFFFFF
    return _abs_bits(base, agents_at, agent_stride, t, b, offsets, mask, AGENT)


@triton.jit
def _add(counts, bins, counted, zero):
    """Add the elements ``counted`` to ``counts + bins``; those that are ``zero`` to bin 0, once."""
    zeros = tl.sum(zero.to(tl.int32))
    if zeros > 0:
        tl.atomic_add(counts, zeros, sem="relaxed")
    tl.atomic_add(counts + bins, tl.full(bins.shape, 1, tl.int32), mask=counted & ~zero, sem="relaxed")


@triton.jit
def high_tile(
    base,  # uint8 pointer: the base's raw bytes; agent t's are at base + agents_at + t * agent_stride
    agents_at,
    agent_stride,
    m,
    lo,  # KEY_IMPORTANCE: the tile's first element in its block, the rows' factors and layout
    scale,
    row_len,
    row_offset,
    counts,  # int32 (N_AGENTS, HIGH): the call's accumulator
    N_AGENTS: tl.constexpr,
    BASE: tl.constexpr,
    AGENT: tl.constexpr,
    KEY: tl.constexpr,
    HIGH: tl.constexpr,
    BLOCK: tl.constexpr,
):
    offsets = tl.program_id(0) * BLOCK + tl.arange(0, BLOCK)
    mask = offsets < m
    b = codecs.decode(base, offsets, mask, BASE)
    for t in range(N_AGENTS):
        bits = _key_bits(base, agents_at, agent_stride, t, b, offsets, mask, lo, scale, row_len, row_offset, AGENT,
                         KEY)  # fmt: skip
        _add(counts + t * HIGH, bits >> 16, mask, mask & (bits == 0))


@triton.jit
def low_tile(
    base,
    agents_at,
    agent_stride,
    m,
    lo,  # KEY_IMPORTANCE: as high_tile's
    scale,
    row_len,
    row_offset,
    targets,  # int32 (N_AGENTS, N_CUTS): the high half each cut counts (-1: none)
    counts,  # int32 (N_AGENTS, N_CUTS, LOW): the call's accumulator
    N_AGENTS: tl.constexpr,
    N_CUTS: tl.constexpr,
    BASE: tl.constexpr,
    AGENT: tl.constexpr,
    KEY: tl.constexpr,
    LOW: tl.constexpr,
    BLOCK: tl.constexpr,
):
    offsets = tl.program_id(0) * BLOCK + tl.arange(0, BLOCK)
    mask = offsets < m
    b = codecs.decode(base, offsets, mask, BASE)
    for t in range(N_AGENTS):
        bits = _key_bits(base, agents_at, agent_stride, t, b, offsets, mask, lo, scale, row_len, row_offset, AGENT,
                         KEY)  # fmt: skip
        for c in range(N_CUTS):
            target = tl.load(targets + t * N_CUTS + c)
            if target >= 0:
                match = mask & ((bits >> 16) == target)
                _add(counts + (t * N_CUTS + c) * LOW, bits & 0xFFFF, match, match & (bits == 0))


@triton.jit
def tie_tile(
    base,  # uint8 pointer: the base's raw bytes; staged agent j's are at base + agents_at + j * agent_stride
    agents_at,
    agent_stride,
    m,
    rows,  # int32 (queries,): the staged agent each query looks in
    values,  # int64 (queries,): the bits each query looks for
    ties,  # uint8 (queries, ceil(m / 8)): per query, the tile's packed mask
    BASE: tl.constexpr,
    AGENT: tl.constexpr,
    BLOCK: tl.constexpr,
):
    """One program per ``BLOCK`` elements and query (the grid's second axis)."""
    q = tl.program_id(1)
    offsets = tl.program_id(0) * BLOCK + tl.arange(0, BLOCK)
    mask = offsets < m
    b = codecs.decode(base, offsets, mask, BASE)
    bits = _abs_bits(base, agents_at, agent_stride, tl.load(rows + q), b, offsets, mask, AGENT)
    equal = mask & (bits.to(tl.int64) == tl.load(values + q))
    row_bytes = (m + 7) // 8
    bytes_at = tl.program_id(0) * (BLOCK // 8) + tl.arange(0, BLOCK // 8)
    weights = (1 << tl.arange(0, 8)).to(tl.int32)
    packed = tl.sum(tl.reshape(equal.to(tl.int32), (BLOCK // 8, 8)) * weights[None, :], axis=1)
    tl.store(ties + q * row_bytes + bytes_at, packed.to(tl.uint8), mask=bytes_at < row_bytes)


@triton.jit
def cut_keep_tile(
    base,  # uint8 pointer: the base's raw bytes; agent t's are at base + agents_at + t * agent_stride
    agents_at,
    agent_stride,
    m,
    lo,  # the tile's first element in its block (the cuts' tie ranges are block positions)
    cut_value,  # int64 (N_AGENTS, 2)
    cut_range,  # int64 (N_AGENTS, 2, 2)
    keep,  # uint8 (N_AGENTS, m): 1 where the agent keeps the element
    N_AGENTS: tl.constexpr,
    BASE: tl.constexpr,
    AGENT: tl.constexpr,
    BLOCK: tl.constexpr,
):
    """In cut 1's lower set and not in cut 0's, as ``magnitude.kept_by_cuts``."""
    offsets = tl.program_id(0) * BLOCK + tl.arange(0, BLOCK)
    mask = offsets < m
    b = codecs.decode(base, offsets, mask, BASE)
    positions = offsets.to(tl.int64) + lo
    for t in range(N_AGENTS):
        bits = _abs_bits(base, agents_at, agent_stride, t, b, offsets, mask, AGENT).to(tl.int64)
        kept = kept_by_cuts(bits, positions, cut_value, cut_range, t)
        tl.store(keep + t * m + offsets, kept.to(tl.uint8), mask=mask)


def high_launch(
    raw: list[torch.Tensor], m: int, counts: torch.Tensor, codes: tuple[int, int], rows: Rows | None = None
) -> None:
    """Queue the high-half histograms of one tile into ``counts`` (agents, HIGH_BINS) int32: of
    |tau|, or with ``rows`` (the tile's block position, the rows' float32 factors on the device,
    row_len and offset, as ``RowScale``'s) of arcee_fusion's importance."""
    agents_at, stride = layout(raw)
    lo, scale, row_len, row_offset = rows if rows is not None else (0, counts, 1, 0)
    with on_device(raw[0]):
        high_tile[(triton.cdiv(m, BLOCK),)](
            raw[0], agents_at, stride, m, lo, scale, row_len, row_offset, counts, N_AGENTS=len(raw) - 1,
            BASE=codes[0], AGENT=codes[1], KEY=KEY_ABS if rows is None else KEY_IMPORTANCE, HIGH=HIGH_BINS,
            BLOCK=BLOCK, **EXACT,
        )  # fmt: skip


def low_launch(
    raw: list[torch.Tensor],
    m: int,
    targets: torch.Tensor,
    counts: torch.Tensor,
    codes: tuple[int, int],
    rows: Rows | None = None,
) -> None:
    """Queue the low-half histograms of one tile into ``counts`` (agents, cuts, LOW_BINS) int32;
    ``targets`` (agents, cuts) int32 on the device; ``rows`` as ``high_launch``'s."""
    agents_at, stride = layout(raw)
    lo, scale, row_len, row_offset = rows if rows is not None else (0, counts, 1, 0)
    with on_device(raw[0]):
        low_tile[(triton.cdiv(m, BLOCK),)](
            raw[0], agents_at, stride, m, lo, scale, row_len, row_offset, targets, counts, N_AGENTS=len(raw) - 1,
            N_CUTS=targets.shape[1], BASE=codes[0], AGENT=codes[1], KEY=KEY_ABS if rows is None else KEY_IMPORTANCE,
            LOW=LOW_BINS, BLOCK=BLOCK, **EXACT,
        )  # fmt: skip


def tie_launch(
    raw: list[torch.Tensor],
    m: int,
    rows: torch.Tensor,
    values: torch.Tensor,
    ties: torch.Tensor,
    codes: tuple[int, int],
) -> None:
    """Queue the tie searches of one tile: ``raw`` the base and the agents looked in, ``rows``
    (queries,) int32 and ``values`` (queries,) int64 on the device, ``ties`` (queries, ceil(m / 8))
    uint8 on the device."""
    agents_at, stride = layout(raw)
    with on_device(raw[0]):
        tie_tile[(triton.cdiv(m, BLOCK), rows.shape[0])](
            raw[0], agents_at, stride, m, rows, values, ties, BASE=codes[0], AGENT=codes[1], BLOCK=BLOCK, **EXACT,
        )  # fmt: skip


def cut_keep_launch(
    raw: list[torch.Tensor], m: int, lo: int, cut_value: torch.Tensor, cut_range: torch.Tensor, keep: torch.Tensor,
    codes: tuple[int, int],
) -> None:  # fmt: skip
    """Queue one tile's keep mask into ``keep`` (agents, m) uint8 on the device; ``cut_value``
    (agents, 2) and ``cut_range`` (agents, 2, 2) int64 on the device."""
    agents_at, stride = layout(raw)
    with on_device(raw[0]):
        cut_keep_tile[(triton.cdiv(m, BLOCK),)](
            raw[0], agents_at, stride, m, lo, cut_value, cut_range, keep, N_AGENTS=len(raw) - 1, BASE=codes[0],
            AGENT=codes[1], BLOCK=BLOCK, **EXACT,
        )  # fmt: skip
