"""The keys of the counter-based random generator (the draws themselves are a backend's).

The draw for (seed, agent, tensor, element) is a pure function of those four numbers, so random
methods (DARE, DELLA) give identical bytes whatever the block size, thread count, backend or
resume point. Element i of stream ``key`` draws the SplitMix64 finaliser of
``key + (i + 1) * GOLDEN`` (mod 2**64), whose top 24 bits give a float32 uniform k / 2**24.
"""

from __future__ import annotations

import hashlib

import numpy as np

GOLDEN = np.uint64(0x9E3779B97F4A7C15)
MIX1 = np.uint64(0xBF58476D1CE4E5B9)
MIX2 = np.uint64(0x94D049BB133111EB)


def stream_key(seed: int, agent: int, tensor_name: str) -> np.uint64:
    """The 64-bit key of one agent's draws over one tensor."""
    digest = hashlib.sha256(f"{seed}\x00{agent}\x00{tensor_name}".encode()).digest()
    return np.uint64(int.from_bytes(digest[:8], "little"))


def random_keys(seed: int, n_agents: int, tensor_name: str) -> np.ndarray:
    """The stream keys (N,) uint64 of every agent over one tensor."""
    return np.array([stream_key(seed, t, tensor_name) for t in range(n_agents)], np.uint64)
