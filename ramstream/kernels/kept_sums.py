"""Exact L1 norms of task vectors before and after a keep mask (for L1 norm-matching rescales).

Same fixed grouping as ``ramstream.kernels.exact_stats``: each group of 64 consecutive elements
(groups start at multiples of 64 within the tensor; the caller hands arrays that start at such a
multiple) is summed in float64, in element order from 0.0, and the group sum is added exactly
into an ``exact_sum`` accumulator that only its thread writes.
"""

from __future__ import annotations

import numpy as np
from numba import njit, prange

from ramstream.kernels.codecs import TILE, decode_tile
from ramstream.kernels.exact_sum import add

GROUP = 64


@njit(parallel=True, nogil=True, cache=True, error_model="numpy")
def kept_abs_sums(base, base_code, agents, agent_codes, keep, acc, nonfinite):  # type: ignore[no-untyped-def]
    """acc: int64 (workers, N, 2, BINS + 1) zeroed; row 0 += sum |tau|, row 1 += sum of |tau|
    where ``keep[t, i] != 0``. nonfinite[w] <- the first element whose |tau| is NaN/Inf, or -1."""
    n = base.shape[0]
    n_agents = len(agents)
    workers = acc.shape[0]
    n_tiles = (n + TILE - 1) // TILE
    zero = np.float32(0.0)
    for w in prange(workers):
        base_bits = np.empty(TILE, np.uint32)
        agent_bits = np.empty(TILE, np.uint32)
        base_vals = base_bits.view(np.float32)
        agent_vals = agent_bits.view(np.float32)
        first_bad = -1
        for tile in range(n_tiles * w // workers, n_tiles * (w + 1) // workers):
            lo = tile * TILE
            m = min(TILE, n - lo)
            decode_tile(base, lo, m, base_code, base_bits)
            for t in range(n_agents):
                decode_tile(agents[t], lo, m, agent_codes[t], agent_bits)
                row = keep[t, lo : lo + m]
                for i in range(m):
                    tau = abs(agent_vals[i] - base_vals[i])
                    if tau - tau != zero and first_bad < 0:
                        first_bad = lo + i
                    agent_vals[i] = tau
                for g in range(0, m, GROUP):
                    total = 0.0
                    kept = 0.0
                    for i in range(g, min(g + GROUP, m)):
                        total += np.float64(agent_vals[i])
                        kept += np.float64(agent_vals[i]) if row[i] != 0 else 0.0
                    add(acc[w, t, 0], total)
                    add(acc[w, t, 1], kept)
        nonfinite[w] = first_bad
