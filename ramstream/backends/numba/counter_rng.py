"""A counter-based random generator: the draw for (seed, agent, tensor, element) is a pure
function of those four numbers, so random methods (DARE, DELLA) give identical bytes whatever
the block size, thread count or resume point.

The stream key mixes seed, agent and a stable 64-bit hash of the tensor name; each element's
draw is the SplitMix64 finaliser of ``key + (index + 1) * golden gamma``, whose top 24 bits give
a float32 uniform in [0, 1) on the exact grid k / 2**24.
"""

from __future__ import annotations

import numpy as np
from numba import njit

from ramstream.backends.rng import GOLDEN, stream_key
from ramstream.backends.rng import MIX1 as _M1
from ramstream.backends.rng import MIX2 as _M2

__all__ = ["mix64", "stream_key", "uniform", "uniforms"]
_INV_2_24 = np.float32(1.0 / 16777216.0)


@njit(inline="always", cache=True)
def mix64(z):  # type: ignore[no-untyped-def]
    z = (z ^ (z >> np.uint64(30))) * _M1
    z = (z ^ (z >> np.uint64(27))) * _M2
    return z ^ (z >> np.uint64(31))


@njit(inline="always", cache=True)
def uniform(key, index):  # type: ignore[no-untyped-def]
    """The float32 uniform in [0, 1) of element ``index`` of the stream ``key``."""
    bits = mix64(key + (np.uint64(index) + np.uint64(1)) * GOLDEN)
    return np.float32(bits >> np.uint64(40)) * _INV_2_24


@njit(cache=True)
def uniforms(key, start, count):  # type: ignore[no-untyped-def]
    """Draws for elements ``start .. start + count - 1`` (for tests and small tensors)."""
    out = np.empty(count, np.float32)
    for i in range(count):
        out[i] = uniform(key, start + i)
    return out
