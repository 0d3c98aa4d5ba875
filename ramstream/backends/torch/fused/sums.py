"""DARE's exact sums of one tile in one Triton launch (``abs_sums`` with random keeps), with the
numbers of ``backends/torch/exact_sums.py`` and so of the Numba kernels: per agent, the sum of
|tau| over every element and over the elements its random draw keeps (the counter RNG of
``gta.py``), each group of 64 elements (aligned in the tile: tiles start at multiples of 64)
summed in float64 in element order from +0.0, each group sum added exactly into the int64 bin of
its power of two (its 53-bit integer mantissa cut in a low 32-bit part and a high part
``CARRY_BITS`` bins up, as ``exact_sums.accumulate``) with integer atomics; the first NaN/Inf
|tau| position (an atomic minimum). A NaN/Inf |tau| counts as 0.
"""

from __future__ import annotations

import torch
import triton
import triton.language as tl

from ramstream.backends.exact_sum import BINS, CARRY_BITS, OFFSET
from ramstream.backends.torch.fused import codecs
from ramstream.backends.torch.fused.gta import uniform
from ramstream.backends.torch.fused.ram import EXACT, NOWHERE, layout, on_device

GROUPS = 16  # groups of 64 elements per program
ROW: tl.constexpr = tl.constexpr(BINS + 1)  # an accumulator's length
FIRST_BIN: tl.constexpr = tl.constexpr(OFFSET - 53 - 1022)  # the bin of biased exponent 0's units
CARRY: tl.constexpr = tl.constexpr(CARRY_BITS)


@triton.jit
def _accumulate(acc, sums, groups_mask):
    """Add the float64 ``sums`` (>= 0, normal or 0) exactly into the accumulator at ``acc``."""
    bits = sums.to(tl.int64, bitcast=True)
    units = (bits & 0xFFFFFFFFFFFFF) | 0x10000000000000  # the mantissa times 2^53 (frexp's)
    where = acc + FIRST_BIN + ((bits >> 52) & 0x7FF)
    counted = groups_mask & (sums != 0.0)
    tl.atomic_add(where, units & 0xFFFFFFFF, mask=counted, sem="relaxed")
    tl.atomic_add(where + CARRY, units >> 32, mask=counted, sem="relaxed")


@triton.jit
def sums_tile(
    base,  # uint8 pointer: the base's raw bytes; agent t's are at base + agents_at + t * agent_stride
    agents_at,
    agent_stride,
    m,
    lo,
    keys,  # int64 (N_AGENTS,): the random streams' keys (uint64 bits)
    density,  # float32 (N_AGENTS,)
    start,  # the tile's first element within its tensor (the draws' index)
    acc,  # int64 (2 * N_AGENTS, ROW): per agent, every element's sum then the kept elements'
    first,  # int64 (1,): the first NaN/Inf |tau| position (min)
    N_AGENTS: tl.constexpr,
    BASE: tl.constexpr,
    AGENT: tl.constexpr,
    GROUPS: tl.constexpr,
):
    groups = tl.program_id(0) * GROUPS + tl.arange(0, GROUPS)
    groups_mask = groups * 64 < m
    found = tl.full((GROUPS,), NOWHERE, tl.int64)
    for t in range(N_AGENTS):
        key = tl.load(keys + t).to(tl.uint64, bitcast=True)
        dens = tl.load(density + t)
        every = tl.zeros((GROUPS,), tl.float64)
        kept = tl.zeros((GROUPS,), tl.float64)
        for j in range(64):  # in element order within each group
            offsets = groups * 64 + j
            mask = offsets < m
            b = codecs.decode(base, offsets, mask, BASE)
            a = codecs.decode(base + agents_at + t * agent_stride, offsets, mask, AGENT)
            if AGENT == codecs.TAU32:
                size = tl.abs(a)
            else:
                size = tl.abs(a - b)
            odd = codecs.nonfinite(size) & mask
            found = tl.minimum(found, tl.where(odd, offsets.to(tl.int64) + lo, NOWHERE))
            value = tl.where(odd, 0.0, size).to(tl.float64)
            every = every + value
            drawn = uniform(key, offsets.to(tl.int64) + start) < dens
            kept = kept + tl.where(drawn, value, 0.0)
        _accumulate(acc + 2 * t * ROW, every, groups_mask)
        _accumulate(acc + (2 * t + 1) * ROW, kept, groups_mask)
    position = tl.min(found)
    if position < NOWHERE:
        tl.atomic_min(first, position)


def sums_launch(
    raw: list[torch.Tensor],
    m: int,
    lo: int,
    keys: torch.Tensor,
    density: torch.Tensor,
    start: int,
    acc: torch.Tensor,
    first: torch.Tensor,
    codes: tuple[int, int],
) -> None:
    """Queue the exact sums of one tile into ``acc`` (2 * agents, BINS + 1) int64 and ``first``
    (1,) int64; ``keys`` int64 and ``density`` float32 (agents,) on the device, ``start`` the
    tile's first element within its tensor."""
    agents_at, stride = layout(raw)
    with on_device(raw[0]):
        sums_tile[(triton.cdiv(m, 64 * GROUPS),)](
            raw[0], agents_at, stride, m, lo, keys, density, start, acc, first,
            N_AGENTS=len(raw) - 1, BASE=codes[0], AGENT=codes[1], GROUPS=GROUPS, **EXACT,
        )  # fmt: skip
