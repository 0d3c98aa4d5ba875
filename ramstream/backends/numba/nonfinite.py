"""NaN/Inf in a block: the first in a tile's inputs, for the merge kernels that report it (they
look only where a cheap test saw one), and whether a merged output holds any
(``count_exponent``: one parallel scan)."""

from __future__ import annotations

import numpy as np
from numba import njit, prange

from ramstream.backends.numba.addresses import decode_at
from ramstream.backends.numba.codecs import decode_tile

_EXPONENT = np.uint32(0x7F800000)


@njit(cache=True)
def first_nonfinite_in(base, base_code, agents, agent_codes, lo, m, bits):  # type: ignore[no-untyped-def]
    """The tile offset of the first NaN/Inf in the base or any agent (``agents``: their addresses)
    at positions [lo, lo + m), or -1."""
    decode_tile(base, lo, m, base_code, bits)
    first = _first_in_tile(bits, m, m)
    for t in range(len(agents)):
        decode_at(agents[t], lo, m, agent_codes[t], bits)
        first = _first_in_tile(bits, m, first)
    return first if first < m else -1


@njit(inline="always", cache=True)
def _first_in_tile(bits, m, first):  # type: ignore[no-untyped-def]
    """The first NaN/Inf among the decoded tile's first ``first`` positions, else ``first``."""
    if tile_nonfinite(bits, m):
        for i in range(min(first, m)):
            if (bits[i] & _EXPONENT) == _EXPONENT:
                return i
    return first


@njit(inline="always", cache=True)
def tile_nonfinite(bits, m):  # type: ignore[no-untyped-def]
    """Whether a decoded tile (float32 bits) holds NaN/Inf, an exponent of all ones: an integer
    OR, which vectorises."""
    found = np.uint32(0)
    for i in range(m):
        found |= np.uint32((bits[i] & _EXPONENT) == _EXPONENT)
    return found != np.uint32(0)


@njit(cache=True)
def lowest(firsts):  # type: ignore[no-untyped-def]
    """The smallest of the per-thread positions that found something (>= 0), or -1."""
    found = -1
    for w in range(firsts.shape[0]):
        if firsts[w] >= 0 and (found < 0 or firsts[w] < found):
            found = firsts[w]
    return found


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
