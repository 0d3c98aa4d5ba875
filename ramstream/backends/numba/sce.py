"""SCE (select, calculate, erase) kernels: the variance key and the merge.

Per element, agents in order t = 0..N-1 (an input that is a task vector already, ``codecs.TAU32``,
is tau itself):

    tau_t = f32(agent_t) - f32(base)
    var   = population variance of the tau_t: Welford in float64 (n += 1; d = x - mean;
            mean += d / n; m2 += d * (x - mean)), then m2 / N rounded to float32 once: torch's
            CPU ``var(unbiased=False)`` to the bit
    kept  = var's bit pattern lies in cut 1's lower set and not in cut 0's (``magnitude.py``'s cuts:
            one row, shared by every agent); m_t = tau_t where kept, else 0
    plus  = (sum_t m_t) >= 0                       (float32 from +0.0, in order)
    c_t   = (m_t > 0 and plus) or (m_t < 0 and not plus)
    mixed = sum_t (c_t ? m_t * w_t : 0);  divisor = max(sum_t (c_t ? w_t : 0), 1e-6)
    out   = encode(base + mixed / divisor)

all in float32 (but the variance), no fused multiply-add. ``variance_block`` writes the key;
``merge_sce_block`` returns the block position of the first NaN/Inf input (-1: none).
"""

from __future__ import annotations

import numpy as np
from numba import njit

from ramstream.backends.numba.codecs import TILE, address, decode_at, encode_at, minus
from ramstream.backends.numba.nonfinite import first_nonfinite_in, tile_nonfinite
from ramstream.backends.numba.workers import lowest, run_parts

MIN_DIVISOR = np.float32(1e-6)


@njit(cache=True, nogil=True, error_model="numpy")
def _tile_taus(base, base_code, agents, agent_codes, lo, m, base_bits, agent_bits, zeros, taus, var):  # type: ignore[no-untyped-def]
    """taus[t, :m] <- tau_t, var[:m] <- their variance (float32); True where an input held NaN/Inf."""
    base_vals = base_bits.view(np.float32)
    agent_vals = agent_bits.view(np.float32)
    n_agents = len(agents)
    decode_at(base, lo, m, base_code, base_bits)
    bad = tile_nonfinite(base_bits, m)
    for t in range(n_agents):
        decode_at(agents[t], lo, m, agent_codes[t], agent_bits)
        bad = bad or tile_nonfinite(agent_bits, m)
        under = minus(agent_codes[t], base_vals, zeros)
        row = taus[t]
        for i in range(m):
            row[i] = agent_vals[i] - under[i]
    for i in range(m):
        mean = 0.0
        m2 = 0.0
        for t in range(n_agents):
            x = np.float64(taus[t, i])
            d = x - mean
            mean = mean + d / np.float64(t + 1)
            m2 = m2 + d * (x - mean)
        var[i] = np.float32(m2 / np.float64(n_agents))
    return bad


def variance_block(base, base_code, agents, agent_codes, out, workers) -> None:  # type: ignore[no-untyped-def]
    """out: float32 (n,) <- the variance of the agents' tau per element."""
    run_parts(_variance_part, workers, address(base), base.shape[0], base_code, agents, agent_codes, out)


@njit(nogil=True, cache=True, error_model="numpy")
def _variance_part(base, n, base_code, agents, agent_codes, out, w, workers):  # type: ignore[no-untyped-def]
    n_tiles = (n + TILE - 1) // TILE
    base_bits = np.empty(TILE, np.uint32)
    agent_bits = np.empty(TILE, np.uint32)
    zeros = np.zeros(TILE, np.float32)
    taus = np.empty((len(agents), TILE), np.float32)
    var = np.empty(TILE, np.float32)
    for tile in range(n_tiles * w // workers, n_tiles * (w + 1) // workers):
        lo = tile * TILE
        m = min(TILE, n - lo)
        _tile_taus(base, base_code, agents, agent_codes, lo, m, base_bits, agent_bits, zeros, taus, var)
        for i in range(m):
            out[lo + i] = var[i]


@njit(inline="always", cache=True)
def _in_lower(b, i, v, a, e):  # type: ignore[no-untyped-def]
    return (b < v) | ((b == v) & (a <= i) & (i < e))


def merge_sce_block(base, base_code, agents, agent_codes, weights, cut_value, cut_range, out, out_code, workers) -> int:  # type: ignore[no-untyped-def]
    """out: the raw output carrier (n,). ``cut_value`` uint32 (2,), ``cut_range`` int64 (2, 2):
    block positions, as ``magnitude.cut_keep``'s row of one agent."""
    parts = run_parts(
        _merge_sce_part, workers, address(base), base.shape[0], base_code, agents, agent_codes, weights, cut_value,
        cut_range, address(out), out_code,
    )  # fmt: skip
    return lowest(parts)


@njit(nogil=True, cache=True, error_model="numpy")
def _merge_sce_part(base, n, base_code, agents, agent_codes, weights, cut_value, cut_range, out, out_code, w, workers):  # type: ignore[no-untyped-def]
    n_agents = len(agents)
    n_tiles = (n + TILE - 1) // TILE
    zero = np.float32(0.0)
    v0, v1 = cut_value[0], cut_value[1]
    first = -1
    base_bits = np.empty(TILE, np.uint32)
    agent_bits = np.empty(TILE, np.uint32)
    result_bits = np.empty(TILE, np.uint32)
    base_vals = base_bits.view(np.float32)
    result = result_bits.view(np.float32)
    zeros = np.zeros(TILE, np.float32)
    taus = np.empty((n_agents, TILE), np.float32)
    var = np.empty(TILE, np.float32)
    total = np.empty(TILE, np.float32)
    divisor = np.empty(TILE, np.float32)
    for tile in range(n_tiles * w // workers, n_tiles * (w + 1) // workers):
        lo = tile * TILE
        m = min(TILE, n - lo)
        bad = _tile_taus(base, base_code, agents, agent_codes, lo, m, base_bits, agent_bits, zeros, taus, var)
        var_bits = var.view(np.uint32)
        a0, e0 = cut_range[0, 0] - lo, cut_range[0, 1] - lo
        a1, e1 = cut_range[1, 0] - lo, cut_range[1, 1] - lo
        for i in range(m):
            b = var_bits[i]
            kept = _in_lower(b, i, v1, a1, e1) & ~_in_lower(b, i, v0, a0, e0)
            total[i] = zero
            if not kept:
                for t in range(n_agents):
                    taus[t, i] = zero
        for t in range(n_agents):
            row = taus[t]
            for i in range(m):
                total[i] += row[i]
        for i in range(m):
            result[i] = zero
            divisor[i] = zero
        for t in range(n_agents):
            row = taus[t]
            wt = weights[t]
            for i in range(m):
                v = row[i]
                plus = total[i] >= zero
                counts = ((v > zero) and plus) or ((v < zero) and not plus)
                result[i] += v * wt if counts else zero
                divisor[i] += wt if counts else zero
        for i in range(m):
            d = divisor[i] if divisor[i] >= MIN_DIVISOR else MIN_DIVISOR
            result[i] = base_vals[i] + result[i] / d
        encode_at(result_bits, out, lo, m, out_code)
        if bad and first < 0:
            first = lo + first_nonfinite_in(base, base_code, agents, agent_codes, lo, m, agent_bits)
    return first
