"""Generalized task arithmetic (GTA): the combine kernel shared by task arithmetic, DARE, TIES,
breadcrumbs, DELLA and model stock.

``gta_merge_block(base, base_code, agents, agent_codes, weights, scale, keep_mode, keep, keys,
density, start, consensus, normalize, lams, out_addresses, out_code, workers)``

Inputs (as the passes hand them over; see ``ramstream.blocks.BlockArrays``):

- ``base``, ``base_code``: the base's raw block (n,) and its format code (codecs.BF16 ...);
- ``agents``, ``agent_codes``: a tuple of N raw blocks (n,) in one carrier, int64 codes (N,);
- ``weights``: float32 (N,), agent t's weight w_t;
- ``scale``: float32 (N,), the rescale factor s_t of agent t's surviving elements (1 for none);
- ``keep_mode``, ``keep``, ``keys``, ``density``, ``start``: which elements of each delta survive:
  - ``KEEP_ALL``: every element (``keep``, ``keys``, ``density`` are not read);
  - ``KEEP_ARRAY``: ``keep`` is (N, n), C-contiguous uint8 or float32, aligned with the block
    (column i is the block's element i, whatever ``start`` is): element i of
    agent t is dropped where ``keep[t, i] == 0``, otherwise it survives as ``(tau * keep[t, i]) * s_t``
    (a 0/1 mask for magnitude trimming or drops computed elsewhere; any float32 multiplier for
    per-element rescaling);
  - ``KEEP_RANDOM``: element i of agent t survives where
    ``counter_rng.uniform(keys[t], start + i) < density[t]`` (float32 comparison; ``start`` is the
    block's first element within its tensor, ``keys[t]`` = ``counter_rng.stream_key(seed, t, tensor)``),
    so the draws never depend on the block split; survivors are ``tau * s_t``.
  The modes and the placeholders for the arrays a mode does not read (``NO_KEEP``, ``NO_KEYS``,
  ``NO_DENSITY``: all modes share one compiled signature; a float32 ``keep`` compiles a second
  one) are in ``ramstream.backends.numba.keep``.
- ``consensus``: ``CONSENSUS_NONE``, ``CONSENSUS_SUM`` (TIES: majority sign = sign of the sum of the
  weighted deltas, a sum >= 0 counts as +) or ``CONSENSUS_COUNT`` (sign of the sum of their signs);
- ``normalize``: divide the mixed delta by the summed weights (see below);
- ``lams``: float32 (K,), output k's lambda, the final multiplier of the mixed delta;
- ``out_addresses``, ``out_code``: the K output blocks' addresses (int64 (K,); raw bytes of the
  block's size, kept alive by the caller) and their format code: one read and one mix for all K;
- ``workers``: prange iterations (one per thread; each takes a contiguous range of tiles).

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
from numba import carray, njit, prange

from ramstream.backends.numba.codecs import TILE, decode_tile, encode_bytes
from ramstream.backends.numba.counter_rng import uniform
from ramstream.backends.numba.keep import KEEP_ARRAY, KEEP_RANDOM
from ramstream.backends.numba.sources import ITEMSIZES, voidptr

CONSENSUS_NONE = 0
CONSENSUS_SUM = 1
CONSENSUS_COUNT = 2


@njit(parallel=True, nogil=True, cache=True, error_model="numpy")
def gta_merge_block(  # type: ignore[no-untyped-def]
    base,
    base_code,
    agents,
    agent_codes,
    weights,
    scale,
    keep_mode,
    keep,
    keys,
    density,
    start,
    consensus,
    normalize,
    lams,
    out_addresses,
    out_code,
    workers,
):
    n = base.shape[0]
    n_agents = len(agents)
    n_outputs = lams.shape[0]
    out_nbytes = n * ITEMSIZES[out_code]
    n_tiles = (n + TILE - 1) // TILE
    zero, one = np.float32(0.0), np.float32(1.0)
    total_weight = zero
    for t in range(n_agents):
        total_weight += weights[t]
    if abs(total_weight) < np.float32(1e-8):
        total_weight = one
    for w in prange(workers):
        base_bits = np.empty(TILE, np.uint32)
        agent_bits = np.empty(TILE, np.uint32)
        base_vals = base_bits.view(np.float32)
        agent_vals = agent_bits.view(np.float32)
        result_bits = np.empty(TILE, np.uint32)
        result_vals = result_bits.view(np.float32)
        mixed = np.empty(TILE, np.float32)
        divisor = np.empty(TILE, np.float32)
        majority = np.empty(TILE, np.float32)
        deltas = np.empty((n_agents if consensus != CONSENSUS_NONE else 0, TILE), np.float32)
        for tile in range(n_tiles * w // workers, n_tiles * (w + 1) // workers):
            lo = tile * TILE
            m = min(TILE, n - lo)
            decode_tile(base, lo, m, base_code, base_bits)
            for i in range(m):
                mixed[i] = zero
                divisor[i] = total_weight
            for t in range(n_agents):
                decode_tile(agents[t], lo, m, agent_codes[t], agent_bits)
                # agent_vals[i] <- w_t * sparse_t (0 where dropped), and a 0/1 survival flag in majority
                _weighted_deltas(
                    agent_vals,
                    base_vals,
                    m,
                    t,
                    weights[t],
                    scale[t],
                    keep_mode,
                    keep,
                    keys,
                    density,
                    start + lo,
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
                _elect(deltas, weights, m, consensus, majority, mixed, divisor)
            for i in range(m):
                mixed[i] = mixed[i] / divisor[i] if normalize else mixed[i]
            for k in range(n_outputs):
                lam32 = lams[k]
                for i in range(m):
                    result_vals[i] = base_vals[i] + lam32 * mixed[i]
                out = carray(voidptr(out_addresses[k]), out_nbytes, np.uint8)
                encode_bytes(result_bits, lo, m, out_code, out)


@njit(inline="always", cache=True)
def _weighted_deltas(vals, base_vals, m, t, weight, s, keep_mode, keep, keys, density, first, lo, alive):  # type: ignore[no-untyped-def]
    """vals[i] <- weight * sparse_t[i]; alive[i] <- 1 where element i survives, else 0."""
    zero, one = np.float32(0.0), np.float32(1.0)
    if keep_mode == KEEP_ARRAY:
        row = keep[t, lo : lo + m]
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
    else:
        for i in range(m):
            vals[i] = weight * ((vals[i] - base_vals[i]) * s)
            alive[i] = one


@njit(inline="always", cache=True)
def _elect(deltas, weights, m, consensus, majority, mixed, divisor):  # type: ignore[no-untyped-def]
    """TIES sign election over the weighted deltas (N, m): mixed and divisor of the kept ones."""
    zero, one = np.float32(0.0), np.float32(1.0)
    n_agents = deltas.shape[0]
    for i in range(m):
        majority[i] = zero
        divisor[i] = zero
    for t in range(n_agents):
        row = deltas[t]
        if consensus == CONSENSUS_SUM:
            for i in range(m):
                majority[i] += row[i]
        else:
            for i in range(m):
                majority[i] += np.float32(np.sign(row[i]))
    for t in range(n_agents):
        row = deltas[t]
        wt = weights[t]
        for i in range(m):
            v = row[i]
            kept = (v > zero and majority[i] >= zero) or (v < zero and majority[i] < zero)
            mixed[i] += v if kept else zero
            divisor[i] += wt if kept else zero
    for i in range(m):
        divisor[i] = one if divisor[i] == zero else divisor[i]
