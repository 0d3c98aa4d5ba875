"""NaN/Inf in a block: the first in the inputs, for merges that skip the probe pass (which checks
too), and whether a merged output holds any (``count_exponent``: one parallel scan)."""

from __future__ import annotations

import numpy as np
from numba import njit, prange

from ramstream.backends.numba.codecs import TILE, decode_tile


@njit(parallel=True, nogil=True, cache=True, error_model="numpy")
def first_nonfinite(base, base_code, agents, agent_codes, workers):  # type: ignore[no-untyped-def]
    """The lowest element index at which the base or any agent is NaN or Inf, or -1."""
    n = base.shape[0]
    n_tiles = (n + TILE - 1) // TILE
    firsts = np.full(workers, -1, np.int64)
    zero = np.float32(0.0)
    for w in prange(workers):
        bits = np.empty(TILE, np.uint32)
        vals = bits.view(np.float32)
        for tile in range(n_tiles * w // workers, n_tiles * (w + 1) // workers):
            lo = tile * TILE
            m = min(TILE, n - lo)
            first = m
            for k in range(len(agents) + 1):
                if k == 0:
                    decode_tile(base, lo, m, base_code, bits)
                else:
                    decode_tile(agents[k - 1], lo, m, agent_codes[k - 1], bits)
                bad = np.int32(0)
                for i in range(m):
                    bad += np.int32(vals[i] - vals[i] != zero)
                if bad:
                    for i in range(min(first, m)):
                        if vals[i] - vals[i] != zero:
                            first = i
                            break
            if first < m:
                firsts[w] = lo + first
                break
    for w in range(workers):
        if firsts[w] >= 0:
            return firsts[w]
    return -1


@njit(parallel=True, nogil=True, cache=True)
def count_exponent(values, mask, workers):  # type: ignore[no-untyped-def]
    """How many of ``values`` (an unsigned carrier) have every bit of ``mask`` set (an exponent
    field all ones: Inf or NaN)."""
    n = values.shape[0]
    counts = np.zeros(workers, np.int64)
    for w in prange(workers):
        found = 0
        for i in range(n * w // workers, n * (w + 1) // workers):
            found += (values[i] & mask) == mask
        counts[w] = found
    return counts.sum()
