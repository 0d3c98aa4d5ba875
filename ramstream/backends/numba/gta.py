"""Generalized task arithmetic (GTA): the combine kernel shared by task arithmetic, DARE, TIES,
breadcrumbs, DELLA and model stock.

``gta_merge_block(base, base_code, agents, agent_codes, weights, scale, keep_mode, keep, keys,
density, start, cut_value, cut_range, consensus, normalize, lams, out_addresses, out_code, workers)``
returns the block position of the first NaN/Inf in any input (-1: none), found while merging, so
a merge reads each input once per block.

Inputs (as the passes hand them over; see ``ramstream.blocks.BlockArrays``):

- ``base``, ``base_code``: the base's raw block (n,) and its format code (codecs.BF16 ...);
- ``agents``, ``agent_codes``: the addresses of N raw blocks (n,) (``addresses``), int64 (N,) each;
- ``weights``: float32 (N,), agent t's weight w_t;
- ``scale``: float32 (N,), the rescale factor s_t of agent t's surviving elements (1 for none);
- which elements of each delta survive (``keep_mode``; the modes and the placeholders for the
  arguments a mode does not read are in ``ramstream.backends.numba.keep``):
  - ``KEEP_ALL``: every element;
  - ``KEEP_ARRAY``: ``keep`` is (N, n), C-contiguous uint8 or float32, aligned with the block:
    element i of agent t is dropped where ``keep[t, i] == 0``, otherwise it survives as
    ``(tau * keep[t, i]) * s_t`` (a 0/1 mask, or any float32 multiplier);
  - ``KEEP_RANDOM``: element i of agent t survives where
    ``counter_rng.uniform(keys[t], start + i) < density[t]`` (float32 comparison; ``start`` is the
    block's first element within its tensor), so the draws never depend on the block split;
  - ``KEEP_CUTS``: magnitude trimming, decided in the tile from |tau| itself: a cut (V, [a, b)) is
    the lower set {|tau| bits < V} plus the elements equal to V at block positions a <= i < b
    (``cut_value`` uint32 (N, 2), ``cut_range`` int64 (N, 2, 2)); element i of agent t survives
    when it lies in cut 1's lower set and not in cut 0's (exactly ``magnitude.cut_keep``'s mask).
  Survivors other than ``KEEP_ARRAY``'s are ``tau * s_t``. DELLA's MAGPRUNE, which ranks whole
  rows, has its own kernel (``della.della_merge_block``) over the same tile function.
- ``consensus``: ``CONSENSUS_NONE`` or ``CONSENSUS_SUM`` (TIES: majority sign = sign of the sum of
  the weighted deltas, a sum >= 0 counts as +);
- ``normalize``: divide the mixed delta by the summed weights (see below);
- ``lams``: float32 (K,), output k's lambda, the final multiplier of the mixed delta;
- ``out_addresses``, ``out_code``: the K output blocks' addresses (int64 (K,); raw bytes of the
  block's size, kept alive by the caller) and their format code: one read and one mix for all K;
- ``workers``: parts, one per thread (``workers.run_parts``; each takes a contiguous range of tiles).

Per element, all in float32, agents in order t = 0..N-1:

    tau_t = f32(agent_t) - f32(base)
    d_t   = w_t * sparse_t          (sparse_t = surviving tau_t times its rescale, as above;
                                     a dropped element contributes nothing anywhere)
    no consensus:  mixed = sum_t d_t;                 divisor = sum_t w_t  (all agents; |divisor| < 1e-8 -> 1)
    consensus:     kept_t = d_t != 0 and sign(d_t) == majority sign
                   mixed = sum_t kept_t d_t;          divisor = sum_t kept_t w_t  (0 -> 1)
    if normalize:  mixed = mixed / divisor
    out_k = encode(base + lams[k] * mixed)

Sums start from +0.0 and add in agent order; no fused multiply-add (Numba's default). These are
mergekit's generalized task arithmetic semantics (``generalized_task_arithmetic.py``), in float32.
"""

from __future__ import annotations

import numpy as np
from numba import njit

from ramstream.backends.numba.codecs import TILE, address, decode_at, encode_at, minus
from ramstream.backends.numba.counter_rng import uniform
from ramstream.backends.numba.keep import KEEP_ARRAY, KEEP_CUTS, KEEP_RANDOM
from ramstream.backends.numba.nonfinite import first_nonfinite_in, tile_nonfinite
from ramstream.backends.numba.workers import lowest, run_parts

CONSENSUS_NONE = 0
CONSENSUS_SUM = 1

_ABS = np.uint32(0x7FFFFFFF)


def gta_merge_block(  # type: ignore[no-untyped-def]
    base, base_code, agents, agent_codes, weights, scale, keep_mode, keep, keys, density, start, cut_value,
    cut_range, consensus, normalize, lams, out_addresses, out_code, workers,
) -> int:  # fmt: skip
    """The GTA merge of one block on ``workers`` threads; the first NaN/Inf input's position or -1."""
    parts = run_parts(
        _gta_merge_part, workers, address(base), base.shape[0], base_code, agents, agent_codes, weights, scale,
        keep_mode, keep, keys, density, start, cut_value, cut_range, consensus, normalize, lams, out_addresses,
        out_code,
    )  # fmt: skip
    return lowest(parts)


@njit(nogil=True, cache=True, error_model="numpy")
def _gta_merge_part(  # type: ignore[no-untyped-def]
    base, n, base_code, agents, agent_codes, weights, scale, keep_mode, keep, keys, density, start, cut_value,
    cut_range, consensus, normalize, lams, out_addresses, out_code, w, workers,
):  # fmt: skip
    n_tiles = (n + TILE - 1) // TILE
    total_weight = summed_weight(weights)
    scratch = tile_scratch(len(agents), consensus)
    first = -1
    for tile in range(n_tiles * w // workers, n_tiles * (w + 1) // workers):
        lo = tile * TILE
        bad = merge_tile(
            base, base_code, agents, agent_codes, lo, min(TILE, n - lo), n, weights, scale, total_weight, keep_mode,
            keep, lo, keys, density, start + lo, cut_value, cut_range, consensus, normalize, lams, out_addresses,
            out_code, first < 0, scratch,
        )  # fmt: skip
        if bad >= 0 and first < 0:
            first = lo + bad
    return first


@njit(cache=True, nogil=True)
def summed_weight(weights):  # type: ignore[no-untyped-def]
    """The float32 sum of the weights in order, 1 where it is below 1e-8 in magnitude."""
    total = np.float32(0.0)
    for t in range(weights.shape[0]):
        total += weights[t]
    return np.float32(1.0) if abs(total) < np.float32(1e-8) else total


@njit(cache=True, nogil=True)
def tile_scratch(n_agents, consensus):  # type: ignore[no-untyped-def]
    """One thread's tile buffers: base, agent and result bits (uint32), then mixed, divisor,
    majority, a tile of zeros (float32: ``codecs.minus``) and the per-agent deltas the sign
    election needs."""
    bits = np.empty((3, TILE), np.uint32)
    floats = np.zeros((4, TILE), np.float32)
    deltas = np.empty((n_agents if consensus != CONSENSUS_NONE else 0, TILE), np.float32)
    return bits, floats, deltas


@njit(cache=True, nogil=True, error_model="numpy")
def merge_tile(  # type: ignore[no-untyped-def]
    base, base_code, agents, agent_codes, lo, m, n, weights, scale, total_weight,
    keep_mode, keep, keep_lo, keys, density, first, cut_value, cut_range,
    consensus, normalize, lams, out_addresses, out_code, check, scratch,
):  # fmt: skip
    """Merge block positions [lo, lo + m) of the base at address ``base`` (``agents``: the agents'
    addresses) into the K outputs; ``keep`` column ``keep_lo`` is
    position ``lo``, ``first`` its element index in the tensor. With ``check``, returns the
    tile offset of the first NaN/Inf input (-1: none)."""
    bits, floats, deltas = scratch
    base_bits, agent_bits, result_bits = bits[0], bits[1], bits[2]
    base_vals, agent_vals, result_vals = (
        base_bits.view(np.float32),
        agent_bits.view(np.float32),
        result_bits.view(np.float32),
    )
    mixed, divisor, majority, zeros = floats[0], floats[1], floats[2], floats[3]
    zero = np.float32(0.0)
    decode_at(base, lo, m, base_code, base_bits)
    bad = tile_nonfinite(base_bits, m) if check else False
    for i in range(m):
        mixed[i] = zero
        divisor[i] = total_weight
    for t in range(len(agents)):
        decode_at(agents[t], lo, m, agent_codes[t], agent_bits)
        if check:
            bad = bad or tile_nonfinite(agent_bits, m)
        # agent_vals[i] <- w_t * sparse_t (0 where dropped), and a 0/1 survival flag in majority
        _weighted_deltas(
            agent_vals,
            agent_bits,
            minus(agent_codes[t], base_vals, zeros),
            m,
            t,
            weights[t],
            scale[t],
            keep_mode,
            keep,
            keep_lo,
            keys,
            density,
            first,
            cut_value,
            cut_range,
            lo,
            majority,
        )
        if consensus == CONSENSUS_NONE:
            for i in range(m):
                mixed[i] += agent_vals[i] if majority[i] != zero else zero
        else:
            row = deltas[t]
            for i in range(m):
                row[i] = agent_vals[i] if majority[i] != zero else zero
    if consensus != CONSENSUS_NONE:
        _elect(deltas, weights, m, majority, mixed, divisor)
    for i in range(m):
        mixed[i] = mixed[i] / divisor[i] if normalize else mixed[i]
    for k in range(lams.shape[0]):
        lam32 = lams[k]
        for i in range(m):
            result_vals[i] = base_vals[i] + lam32 * mixed[i]
        encode_at(result_bits, out_addresses[k], lo, m, out_code)
    return first_nonfinite_in(base, base_code, agents, agent_codes, lo, m, agent_bits) if bad else -1


@njit(inline="always", cache=True)
def _in_lower(b, i, v, a, e):  # type: ignore[no-untyped-def]
    return (b < v) | ((b == v) & (a <= i) & (i < e))  # bitwise: no branch per element


@njit(inline="always", cache=True)
def _weighted_deltas(  # type: ignore[no-untyped-def]
    vals,
    vbits,
    base_vals,
    m,
    t,
    weight,
    s,
    keep_mode,
    keep,
    keep_lo,
    keys,
    density,
    first,
    cut_value,
    cut_range,
    lo,
    alive,
):
    """vals[i] <- weight * sparse_t[i]; alive[i] <- 1 where element i survives, else 0."""
    zero, one = np.float32(0.0), np.float32(1.0)
    if keep_mode == KEEP_ARRAY:
        row = keep[t, keep_lo : keep_lo + m]
        for i in range(m):
            k = np.float32(row[i])
            vals[i] = weight * (((vals[i] - base_vals[i]) * k) * s)
            alive[i] = one if k != zero else zero
    elif keep_mode == KEEP_RANDOM:
        key = keys[t]
        d = density[t]
        for i in range(m):
            vals[i] = weight * ((vals[i] - base_vals[i]) * s)
            alive[i] = one if uniform(key, first + i) < d else zero
    elif keep_mode == KEEP_CUTS:
        v0, v1 = cut_value[t, 0], cut_value[t, 1]
        a0, e0 = cut_range[t, 0, 0] - lo, cut_range[t, 0, 1] - lo
        a1, e1 = cut_range[t, 1, 0] - lo, cut_range[t, 1, 1] - lo
        for i in range(m):
            vals[i] = vals[i] - base_vals[i]
        for i in range(m):
            b = vbits[i] & _ABS
            inside = _in_lower(b, i, v1, a1, e1) & ~_in_lower(b, i, v0, a0, e0)
            alive[i] = one if inside else zero
        for i in range(m):
            vals[i] = weight * (vals[i] * s)
    else:
        for i in range(m):
            vals[i] = weight * ((vals[i] - base_vals[i]) * s)
            alive[i] = one


@njit(inline="always", cache=True)
def _elect(deltas, weights, m, majority, mixed, divisor):  # type: ignore[no-untyped-def]
    """TIES sign election over the weighted deltas (N, m), by summed mass: mixed and divisor of
    the kept ones."""
    zero, one = np.float32(0.0), np.float32(1.0)
    n_agents = deltas.shape[0]
    for i in range(m):
        majority[i] = zero
        divisor[i] = zero
    for t in range(n_agents):
        row = deltas[t]
        for i in range(m):
            majority[i] += row[i]
    for t in range(n_agents):
        row = deltas[t]
        wt = weights[t]
        for i in range(m):
            v = row[i]
            # bitwise, not short-circuit: a branch per element mispredicts on random signs (7x slower)
            kept = ((v > zero) & (majority[i] >= zero)) | ((v < zero) & (majority[i] < zero))
            mixed[i] += v if kept else zero
            divisor[i] += wt if kept else zero
    for i in range(m):
        divisor[i] = one if divisor[i] == zero else divisor[i]
