"""NaN/Inf in a block: the first in a tile's inputs, for the merge kernels that report it (they
look only where a cheap test saw one), and whether a merged output holds any
(``count_exponent``: one scan, a part per thread)."""

from __future__ import annotations

import numpy as np
from numba import njit

from ramstream.backends.numba.codecs import decode_at
from ramstream.backends.numba.workers import run_parts

_EXPONENT = np.uint32(0x7F800000)


@njit(cache=True, nogil=True)
def first_nonfinite_in(base, base_code, agents, agent_codes, lo, m, bits):  # type: ignore[no-untyped-def]
    """The tile offset of the first NaN/Inf in the base or any agent (``base``, ``agents``: their
    addresses) at positions [lo, lo + m), or -1."""
    decode_at(base, lo, m, base_code, bits)
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


def count_exponent(values, mask, workers) -> int:  # type: ignore[no-untyped-def]
    """How many of ``values`` (an unsigned carrier) have every bit of ``mask`` set (an exponent
    field all ones: Inf or NaN)."""
    return sum(run_parts(_count_exponent_part, workers, values, mask))


@njit(nogil=True, cache=True)
def _count_exponent_part(values, mask, w, workers):  # type: ignore[no-untyped-def]
    n = values.shape[0]
    found = 0
    for i in range(n * w // workers, n * (w + 1) // workers):
        found += (values[i] & mask) == mask
    return found
