"""A counter-based random generator: the draw for (seed, agent, tensor, element) is a pure
function of those four numbers, so random methods (DARE, DELLA) give identical bytes whatever
the block size, thread count or resume point.

The stream key mixes seed, agent and a stable 64-bit hash of the tensor name; each element's
draw is the SplitMix64 finaliser of ``key + (index + 1) * golden gamma``, whose top 24 bits give
a float32 uniform in [0, 1) on the exact grid k / 2**24.
"""

from __future__ import annotations

import hashlib

import numpy as np
from numba import njit

GOLDEN = np.uint64(0x9E3779B97F4A7C15)
_M1 = np.uint64(0xBF58476D1CE4E5B9)
_M2 = np.uint64(0x94D049BB133111EB)
_INV_2_24 = np.float32(1.0 / 16777216.0)


@njit(inline="always", cache=True)
def mix64(z):  # type: ignore[no-untyped-def]
    z = (z ^ (z >> np.uint64(30))) * _M1
    z = (z ^ (z >> np.uint64(27))) * _M2
    return z ^ (z >> np.uint64(31))


def stream_key(seed: int, agent: int, tensor_name: str) -> np.uint64:
    """The 64-bit key of one agent's draws over one tensor."""
    digest = hashlib.sha256(f"{seed}\x00{agent}\x00{tensor_name}".encode()).digest()
    return np.uint64(int.from_bytes(digest[:8], "little"))


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
