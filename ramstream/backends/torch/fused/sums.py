"""The exact sums of one tile in one Triton launch (``abs_sums``: DARE's random keeps, the keep
arrays of the magnitude and SCE statistics, their squares), with the numbers of
``backends/torch/exact_sums.py`` and so of the Numba kernels: per agent, the sum of |tau| (or of
tau^2, exact in float64) over every element and over the elements kept (the counter RNG of
``gta.py``'s draw, or a nonzero byte of the agent's keep row), each group of 64 elements (aligned
in the tile: tiles start at multiples of 64) summed in float64 in element order from +0.0, each
group sum added exactly into the int64 bin of its power of two (its 53-bit integer mantissa cut
in a low 32-bit part and a high part ``CARRY_BITS`` bins up, as ``exact_sums.accumulate``) with
integer atomics; the first NaN/Inf |tau| position (an atomic minimum). A NaN/Inf |tau| counts as 0.
"""

from __future__ import annotations

import torch
import triton
import triton.language as tl

from ramstream.backends.exact_sum import BINS, CARRY_BITS, OFFSET
from ramstream.backends.torch.fused import codecs
from ramstream.backends.torch.fused.gta import uniform
from ramstream.backends.torch.fused.ram import EXACT, NOWHERE, layout, on_device

GROUPS = 32  # groups of 64 elements per program
ROW: tl.constexpr = tl.constexpr(BINS + 1)  # an accumulator's length
FIRST_BIN: tl.constexpr = tl.constexpr(OFFSET - 53 - 1022)  # the bin of biased exponent 0's units
CARRY: tl.constexpr = tl.constexpr(CARRY_BITS)
KEEP_ALL: tl.constexpr = tl.constexpr(0)
KEEP_RANDOM: tl.constexpr = tl.constexpr(1)
KEEP_ARRAY: tl.constexpr = tl.constexpr(2)
KEEP_FLOATS: tl.constexpr = tl.constexpr(3)  # a keep array of float32 values (DELLA's): kept where not 0


@triton.jit
def _accumulate(acc, sums, counted):
    """Add the float64 ``sums`` (normal or 0, of either sign) exactly into the accumulators at
    ``acc`` (each row's pointer), where ``counted``."""
    bits = sums.to(tl.int64, bitcast=True)
    units = (bits & 0xFFFFFFFFFFFFF) | 0x10000000000000  # the mantissa times 2^53 (frexp's)
    units = tl.where(bits < 0, -units, units)
    where = acc + FIRST_BIN + ((bits >> 52) & 0x7FF)
    counted = counted & (sums != 0.0)
    tl.atomic_add(where, units & 0xFFFFFFFF, mask=counted, sem="relaxed")
    tl.atomic_add(where + CARRY, units >> 32, mask=counted, sem="relaxed")


@triton.jit
def sums_tile(
    base,  # uint8 pointer: the base's raw bytes; agent t's are at base + agents_at + t * agent_stride
    agents_at,
    agent_stride,
    keep_at,  # KEEP_ARRAY / KEEP_FLOATS: agent t's keep row at base + keep_at + t * keep_stride
    keep_stride,
    m,
    lo,
    keys,  # int64 (N_AGENTS,): the random streams' keys (uint64 bits)
    density,  # float32 (N_AGENTS,)
    start,  # the tile's first element within its tensor (the draws' index)
    acc,  # int64 (2 * N_AGENTS, ROW): per agent, every element's sum then the kept elements'
    first,  # int64 (1,): the first NaN/Inf |tau| position (min)
    N_AGENTS: tl.constexpr,
    AGENTS: tl.constexpr,  # N_AGENTS rounded up to a power of two: the rows of the program's blocks
    BASE: tl.constexpr,
    AGENT: tl.constexpr,
    KEEP: tl.constexpr,
    SQUARES: tl.constexpr,
    GROUPS: tl.constexpr,
):
    # blocks of (agents, groups): each element of the group loop is decoded for every agent at once
    groups = tl.program_id(0) * GROUPS + tl.arange(0, GROUPS)
    agent = tl.arange(0, AGENTS)[:, None]
    is_agent = agent < N_AGENTS
    agent_raw = base + agents_at + agent * agent_stride
    if KEEP == KEEP_RANDOM:
        key = tl.load(keys + agent, mask=is_agent, other=0).to(tl.uint64, bitcast=True)
        dens = tl.load(density + agent, mask=is_agent, other=0.0)
    found = tl.full((AGENTS, GROUPS), NOWHERE, tl.int64)
    every = tl.zeros((AGENTS, GROUPS), tl.float64)
    kept = tl.zeros((AGENTS, GROUPS), tl.float64)
    for j in range(64):  # in element order within each group
        offsets = (groups * 64 + j)[None, :]
        mask = is_agent & (offsets < m)
        a = codecs.decode(agent_raw, offsets, mask, AGENT)
        size = tl.abs(codecs.task_vector(a, codecs.decode(base, offsets, offsets < m, BASE), AGENT))
        odd = codecs.nonfinite(size) & mask
        found = tl.minimum(found, tl.where(odd, offsets.to(tl.int64) + lo, NOWHERE))
        value = tl.where(odd, 0.0, size).to(tl.float64)
        if SQUARES:
            value = value * value  # exact: a float32's square fits float64's mantissa
        every = every + value
        if KEEP == KEEP_RANDOM:
            drawn = uniform(key, offsets.to(tl.int64) + start) < dens
        elif KEEP == KEEP_ARRAY:
            drawn = tl.load(base + keep_at + agent * keep_stride + offsets, mask=mask, other=0) != 0
        elif KEEP == KEEP_FLOATS:
            row = (base + keep_at + agent * keep_stride).to(tl.pointer_type(tl.float32))
            drawn = tl.load(row + offsets, mask=mask, other=0.0) != 0.0
        else:
            drawn = mask | ~mask
        kept = kept + tl.where(drawn, value, 0.0)
    counted = is_agent & (groups * 64 < m)[None, :]
    _accumulate(acc + 2 * agent * ROW, every, counted)
    _accumulate(acc + (2 * agent + 1) * ROW, kept, counted)
    position = tl.min(tl.min(found, axis=1), axis=0)
    if position < NOWHERE:
        tl.atomic_min(first, position)


@triton.jit
def gram_vector(base, agents_at, agent_stride, v, offsets, mask, b, BASE: tl.constexpr, AGENT: tl.constexpr,
            WEIGHTS: tl.constexpr):  # fmt: skip
    """Vector ``v`` of a Gram matrix at ``offsets`` (rows of ``v``: one vector per row): agent v's
    task vector, or with ``WEIGHTS`` the base (v = 0) and agent v - 1's weights (a task vector's
    as f32(base) + tau); and whether it is NaN/Inf."""
    if WEIGHTS:
        agent = codecs.decode(base + agents_at + (v - 1) * agent_stride, offsets, mask & (v > 0), AGENT)
        value = tl.where(v == 0, b, codecs.agent_weights(agent, b, AGENT))
    else:
        agent = codecs.decode(base + agents_at + v * agent_stride, offsets, mask, AGENT)
        value = codecs.task_vector(agent, b, AGENT)
    return value, codecs.nonfinite(value)


@triton.jit
def gram_tile(
    base,  # uint8 pointer: the base's raw bytes; agent t's are at base + agents_at + t * agent_stride
    agents_at,
    agent_stride,
    m,
    lo,
    acc,  # int64 (pairs, ROW): the pairs (a, b <= a ... N_VECTORS - 1) of the vectors, row by row
    first,  # int64 (1,): the first NaN/Inf value's position (min)
    N_VECTORS: tl.constexpr,
    VECTORS: tl.constexpr,  # N_VECTORS rounded up to a power of two: the rows of the program's blocks
    BASE: tl.constexpr,
    AGENT: tl.constexpr,
    WEIGHTS: tl.constexpr,
    GROUPS: tl.constexpr,
):
    """Per pair of vectors, the sum of their products (each exact in float64) over each group of
    64 elements in element order from +0.0, added exactly into the pair's accumulator; NaN/Inf
    values count as 0. Each vector is decoded once per element, and every product of two formed
    in a (vectors, vectors, groups) block."""
    groups = tl.program_id(0) * GROUPS + tl.arange(0, GROUPS)
    v = tl.arange(0, VECTORS)[:, None]
    is_vector = v < N_VECTORS
    found = tl.full((VECTORS, GROUPS), NOWHERE, tl.int64)
    sums = tl.zeros((VECTORS, VECTORS, GROUPS), tl.float64)
    for j in range(64):  # in element order within each group
        offsets = (groups * 64 + j)[None, :]
        inside = offsets < m
        mask = is_vector & inside
        b = codecs.decode(base, offsets, inside, BASE)
        x, odd = gram_vector(base, agents_at, agent_stride, v, offsets, mask, b, BASE, AGENT, WEIGHTS)
        odd = odd & mask
        found = tl.minimum(found, tl.where(odd, offsets.to(tl.int64) + lo, NOWHERE))
        x = tl.where(odd | ~mask, 0.0, x).to(tl.float64)
        sums = sums + x[:, None, :] * x[None, :, :]
    a = tl.arange(0, VECTORS)[:, None, None]
    c = tl.arange(0, VECTORS)[None, :, None]
    pair = a * N_VECTORS - (a * (a - 1)) // 2 + (c - a)  # the row of (a, c) in the pairs' order
    _accumulate(acc + pair * ROW, sums, (a <= c) & (c < N_VECTORS) & (groups * 64 < m)[None, None, :])
    position = tl.min(tl.min(found, axis=1), axis=0)
    if position < NOWHERE:
        tl.atomic_min(first, position)


def gram_launch(
    raw: list[torch.Tensor],
    m: int,
    lo: int,
    acc: torch.Tensor,
    first: torch.Tensor,
    codes: tuple[int, int],
    weights: bool,
) -> None:
    """Queue the Gram sums of one tile into ``acc`` (pairs, BINS + 1) int64, the pairs (a, b) of
    the vectors with a <= b in order (the agents' task vectors, or with ``weights`` the base then
    the agents' weights), and ``first`` (1,) int64."""
    agents_at, stride = layout(raw)
    n_vectors = len(raw) - 1 + (1 if weights else 0)
    with on_device(raw[0]):
        gram_tile[(triton.cdiv(m, 64 * GROUPS),)](
            raw[0], agents_at, stride, m, lo, acc, first, N_VECTORS=n_vectors,
            VECTORS=triton.next_power_of_2(n_vectors), BASE=codes[0], AGENT=codes[1], WEIGHTS=weights, GROUPS=GROUPS,
            **EXACT,
        )  # fmt: skip


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
    keep: int,
    squares: bool = False,
) -> None:
    """Queue the exact sums of one tile into ``acc`` (2 * agents, BINS + 1) int64 and ``first``
    (1,) int64. ``keep``: ``KEEP_RANDOM`` (``keys`` int64 and ``density`` float32 (agents,) on
    the device, ``start`` the tile's first element within its tensor), ``KEEP_ARRAY`` (``raw``
    holds, after the agents, one keep row of one byte per element per agent, one after another),
    ``KEEP_FLOATS`` (the same with float32 rows) or ``KEEP_ALL``; ``squares``: sums of tau^2 instead of |tau|."""
    arrays = keep in (int(KEEP_ARRAY), int(KEEP_FLOATS))
    n_agents = (len(raw) - 1) // 2 if arrays else len(raw) - 1
    agents_at, stride = layout(raw[: 1 + n_agents])
    keep_at, keep_stride = layout([raw[0], *raw[1 + n_agents :]]) if arrays else (0, 0)
    with on_device(raw[0]):
        sums_tile[(triton.cdiv(m, 64 * GROUPS),)](
            raw[0], agents_at, stride, keep_at, keep_stride, m, lo, keys, density, start, acc, first,
            N_AGENTS=n_agents, AGENTS=triton.next_power_of_2(n_agents), BASE=codes[0], AGENT=codes[1], KEEP=keep,
            SQUARES=squares, GROUPS=GROUPS, **EXACT,
        )  # fmt: skip
