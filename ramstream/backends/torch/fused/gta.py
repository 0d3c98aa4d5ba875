"""The generalized task arithmetic merge of one tile in one Triton launch (task arithmetic, TIES
and breadcrumbs with their cuts evaluated in the tile, DARE with its draws), with the bytes of
``backends/numba/gta.py``: decode, each agent's weighted delta ``w_t * (tau_t * s_t)`` and
whether it survives (every element, magnitude cuts on the bits of |tau|, or the counter RNG's
draw below the agent's density), the sign election
by summed mass (``consensus="sum"``), the divisor, the division with ``normalize`` (IEEE), each
output's ``base + lambda_k * mixed``, the encode, the first NaN/Inf input and the outputs' NaN/Inf
flags. Grid: (element ranges, K outputs); the election decodes the agents a second time (from
the cache) rather than keeping N deltas per element.

Per element, in float32, in the Numba kernel's order: with no consensus ``mixed += alive ? d : 0``
from +0.0 and the divisor is the summed weights (``total_weight``); with consensus, ``r_t = alive ?
d_t : 0``, ``majority = sum r_t`` from +0.0, ``kept_t = (r_t > 0 and majority >= 0) or (r_t < 0 and
majority < 0)``, ``mixed += kept_t ? r_t : 0`` and ``divisor += kept_t ? w_t : 0`` from +0.0, a zero
divisor becoming 1.
"""

from __future__ import annotations

import torch
import triton
import triton.language as tl

from ramstream.backends.torch.fused import codecs
from ramstream.backends.torch.fused.ram import EXACT, layout, note_first, on_device, store_output

BLOCK = 1024
KEEP_ALL: tl.constexpr = tl.constexpr(0)
KEEP_CUTS: tl.constexpr = tl.constexpr(1)
KEEP_RANDOM: tl.constexpr = tl.constexpr(2)
KEEP_MULTIPLIERS: tl.constexpr = tl.constexpr(3)  # keep values given per element (DELLA's, ``della.py``)

# the counter RNG of ``backends.rng`` (SplitMix64's finaliser), in uint64 arithmetic
GOLDEN: tl.constexpr = tl.constexpr(0x9E3779B97F4A7C15)
MIX1: tl.constexpr = tl.constexpr(0xBF58476D1CE4E5B9)
MIX2: tl.constexpr = tl.constexpr(0x94D049BB133111EB)


@triton.jit
def in_lower(bits, positions, value, begin, end):
    """A cut's lower set: |tau| bits below ``value``, or equal to it at block positions [begin, end)."""
    return (bits < value) | ((bits == value) & (positions >= begin) & (positions < end))


@triton.jit
def kept_by_cuts(bits, positions, cut_value, cut_range, t):
    """Whether agent ``t``'s |tau| ``bits`` (int64) survive its cuts: in cut 1's lower set and not
    in cut 0's (``cut_value`` int64 (N, 2), ``cut_range`` int64 (N, 2, 2) block positions)."""
    upper = in_lower(bits, positions, tl.load(cut_value + 2 * t + 1), tl.load(cut_range + 4 * t + 2),
                     tl.load(cut_range + 4 * t + 3))  # fmt: skip
    lower = in_lower(bits, positions, tl.load(cut_value + 2 * t), tl.load(cut_range + 4 * t),
                     tl.load(cut_range + 4 * t + 1))  # fmt: skip
    return upper & ~lower


@triton.jit
def uniform(key, index):
    """float32 k / 2^24 draws of elements ``index`` (int64) of the stream ``key`` (uint64), as
    ``counter_rng.uniform``: the top 24 bits of mix64(key + (index + 1) * golden gamma)."""
    z = key + (index.to(tl.uint64) + 1) * GOLDEN
    z = (z ^ (z >> 30)) * MIX1
    z = (z ^ (z >> 27)) * MIX2
    z = z ^ (z >> 31)
    return (z >> 40).to(tl.float32) * 5.9604644775390625e-08


@triton.jit
def _delta(base, agents_at, agent_stride, t, b, offsets, mask, lo, weights, scale, cut_value, cut_range, keys,
           density, start, keep, keep_stride, AGENT: tl.constexpr, KEEP: tl.constexpr):  # fmt: skip
    """Agent t's weighted delta, whether it survives, and whether its value is NaN/Inf."""
    a = codecs.decode(base + agents_at + t * agent_stride, offsets, mask, AGENT)
    tau = codecs.task_vector(a, b, AGENT)
    if KEEP == KEEP_MULTIPLIERS:  # a kept element survives as (tau * k) * scale
        k = tl.load(keep + t * keep_stride + offsets, mask=mask, other=0.0)
        d = tl.load(weights + t) * ((tau * k) * tl.load(scale + t))
        alive = k != 0.0
    else:
        d = tl.load(weights + t) * (tau * tl.load(scale + t))
        if KEEP == KEEP_CUTS:
            bits = (tau.to(tl.uint32, bitcast=True) & 0x7FFFFFFF).to(tl.int64)
            alive = kept_by_cuts(bits, offsets.to(tl.int64) + lo, cut_value, cut_range, t)
        elif KEEP == KEEP_RANDOM:
            key = tl.load(keys + t).to(tl.uint64, bitcast=True)
            alive = uniform(key, offsets.to(tl.int64) + start) < tl.load(density + t)
        else:
            alive = mask | ~mask
    return d, alive, codecs.nonfinite(a)


@triton.jit
def gta_tile(
    base,  # uint8 pointer: the base's raw bytes; agent t's are at base + agents_at + t * agent_stride
    agents_at,
    agent_stride,
    m,
    lo,  # the tile's first element in its block (the cuts' tie ranges are block positions)
    weights,  # float32 (N,)
    scale,  # float32 (N,)
    cut_value,  # int64 (N, 2)
    cut_range,  # int64 (N, 2, 2)
    keys,  # int64 (N,): the random streams' keys (uint64 bits)
    density,  # float32 (N,)
    start,  # the tile's first element within its tensor (the draws' index)
    keep,  # float32 (N, keep_stride): KEEP_MULTIPLIERS' keep values
    keep_stride,
    total_weight,  # float32 (1,): the divisor without consensus
    lams,  # float32 (K,)
    out,
    out_stride,
    state,  # int64: [0] the first NaN/Inf input position (min), [1 + k] output k holds NaN/Inf (max)
    N_AGENTS: tl.constexpr,
    BASE: tl.constexpr,
    AGENT: tl.constexpr,
    OUT: tl.constexpr,
    KEEP: tl.constexpr,
    CONSENSUS: tl.constexpr,  # 0: none, 1: the sign of the summed mass
    NORMALIZE: tl.constexpr,
    BLOCK: tl.constexpr,
):
    k = tl.program_id(1)
    offsets = tl.program_id(0) * BLOCK + tl.arange(0, BLOCK)
    mask = offsets < m
    b = codecs.decode(base, offsets, mask, BASE)
    bad = codecs.nonfinite(b)
    mixed = tl.zeros((BLOCK,), tl.float32)
    if CONSENSUS == 0:
        for t in range(N_AGENTS):
            d, alive, odd = _delta(base, agents_at, agent_stride, t, b, offsets, mask, lo, weights, scale, cut_value,
                                   cut_range, keys, density, start, keep, keep_stride, AGENT, KEEP)  # fmt: skip
            bad = bad | odd
            mixed = mixed + tl.where(alive, d, 0.0)
        divisor = tl.zeros((BLOCK,), tl.float32) + tl.load(total_weight)
    else:
        majority = tl.zeros((BLOCK,), tl.float32)
        for t in range(N_AGENTS):
            d, alive, odd = _delta(base, agents_at, agent_stride, t, b, offsets, mask, lo, weights, scale, cut_value,
                                   cut_range, keys, density, start, keep, keep_stride, AGENT, KEEP)  # fmt: skip
            bad = bad | odd
            majority = majority + tl.where(alive, d, 0.0)
        divisor = tl.zeros((BLOCK,), tl.float32)
        for t in range(N_AGENTS):
            d, alive, odd = _delta(base, agents_at, agent_stride, t, b, offsets, mask, lo, weights, scale, cut_value,
                                   cut_range, keys, density, start, keep, keep_stride, AGENT, KEEP)  # fmt: skip
            r = tl.where(alive, d, 0.0)
            kept = ((r > 0.0) & (majority >= 0.0)) | ((r < 0.0) & (majority < 0.0))
            mixed = mixed + tl.where(kept, r, 0.0)
            divisor = divisor + tl.where(kept, tl.load(weights + t), 0.0)
        divisor = tl.where(divisor == 0.0, 1.0, divisor)
    if NORMALIZE:
        mixed = tl.math.div_rn(mixed, divisor)
    store_output(out + k * out_stride, offsets, mask, b + tl.load(lams + k) * mixed, state + 1 + k, OUT)
    if k == 0:
        note_first(state, bad, mask, offsets, lo)


def gta_tile_launch(
    raw: list[torch.Tensor],
    m: int,
    lo: int,
    start: int,
    constants: tuple[torch.Tensor, ...],
    out: torch.Tensor,
    state: torch.Tensor,
    codes: tuple[int, int, int],
    keep: int,
    consensus: int,
    normalize: bool,
    multipliers: torch.Tensor | None = None,
) -> None:
    """Queue the GTA merge of one tile: ``raw`` the staged inputs (base first, then the agents of
    one format at one stride), ``start`` the tile's first element within its tensor (the random
    draws' index), ``constants`` the device tensors weights, scale, cut values, cut ranges, random
    keys, densities, total weight and lambdas; ``out`` (K, m) in the output's carrier, ``state``
    (1 + K,); ``multipliers`` (N, m) float32 on the device, the keep values of ``KEEP_MULTIPLIERS``."""
    agents_at, stride = layout(raw)
    weights, scale, cut_value, cut_range, keys, density, total_weight, lams = constants
    given = weights if multipliers is None else multipliers
    with on_device(raw[0]):
        gta_tile[(triton.cdiv(m, BLOCK), out.shape[0])](
            raw[0], agents_at, stride, m, lo, weights, scale, cut_value, cut_range, keys, density, start, given,
            0 if multipliers is None else m, total_weight, lams, out, out.stride(0), state, N_AGENTS=len(raw) - 1,
            BASE=codes[0], AGENT=codes[1], OUT=codes[2], KEEP=keep, CONSENSUS=consensus, NORMALIZE=normalize,
            BLOCK=BLOCK, **EXACT,
        )  # fmt: skip
