"""Probe kernel: decode -> task vectors -> active masks -> overlap counts, fused per tile.

For one block it writes each agent's bit-packed mask (bit ``i % 8`` of byte ``i // 8`` is
element ``i``, numpy's ``bitorder="little"``) and per-thread partial counts:
``overlap[w, t, k-1]`` = elements where agent t is active and exactly k agents are active,
``coverage[w, k]`` = elements where exactly k agents are active, and ``nonfinite[w]`` = the
first element index whose base or agent value is NaN/Inf (or -1).
"""

from __future__ import annotations

import numba
import numpy as np
from numba import njit, prange

from ramstream.kernels.codecs import TILE, decode_tile


@njit(parallel=True, cache=True)
def probe_block(base, base_code, agents, agent_codes, eps, masks, overlap, coverage, nonfinite):  # type: ignore[no-untyped-def]
    n = base.shape[0]
    n_agents = len(agents)
    workers = overlap.shape[0]
    n_tiles = (n + TILE - 1) // TILE
    eps32 = np.float32(eps)
    for w in prange(workers):
        base_bits = np.empty(TILE, np.uint32)
        agent_bits = np.empty(TILE, np.uint32)
        active = np.empty((n_agents, TILE), np.uint8)
        count = np.empty(TILE, np.uint8)
        base_vals = base_bits.view(np.float32)
        agent_vals = agent_bits.view(np.float32)
        first_bad = -1
        for tile in range(n_tiles * w // workers, n_tiles * (w + 1) // workers):
            lo = tile * TILE
            m = min(TILE, n - lo)
            decode_tile(base, lo, m, base_code, base_bits)
            bad = 0
            for i in range(m):
                count[i] = 0
                bad += base_vals[i] - base_vals[i] != 0
            for t in range(n_agents):
                decode_tile(agents[t], lo, m, agent_codes[t], agent_bits)
                for i in range(m):
                    a = agent_vals[i]
                    bad += a - a != 0
                    act = np.uint8(abs(a - base_vals[i]) > eps32)
                    active[t, i] = act
                    count[i] += act
            if bad and first_bad < 0:
                first_bad = lo + _first_nonfinite(base_vals, agents, agent_codes, lo, m, agent_bits)
            _pack(active, lo, m, masks)
            _count(active, count, m, overlap[w], coverage[w])
        nonfinite[w] = first_bad


@njit(inline="always", cache=True)
def _pack(active, lo, m, masks):  # type: ignore[no-untyped-def]
    byte0 = lo // 8
    for t in range(active.shape[0]):
        for j in range((m + 7) // 8):
            v = np.uint8(0)
            for k in range(8):
                i = 8 * j + k
                if i < m:
                    v |= active[t, i] << np.uint8(k)
            masks[t, byte0 + j] = v


@njit(inline="always", cache=True)
def _count(active, count, m, overlap_w, coverage_w):  # type: ignore[no-untyped-def]
    n_agents = active.shape[0]
    for k in range(n_agents + 1):
        s = 0
        for i in range(m):
            s += count[i] == k
        coverage_w[k] += s
    for t in range(n_agents):
        for k in range(1, n_agents + 1):
            s = 0
            for i in range(m):
                s += active[t, i] & (count[i] == k)
            overlap_w[t, k - 1] += s


@njit(cache=True)
def _first_nonfinite(base_vals, agents, agent_codes, lo, m, bits):  # type: ignore[no-untyped-def]
    """Offset within the tile of the first non-finite value (base or any agent)."""
    first = m
    for i in range(m):
        if not np.isfinite(base_vals[i]):
            first = i
            break
    vals = bits.view(np.float32)
    for t in range(len(agents)):
        decode_tile(agents[t], lo, m, agent_codes[t], bits)
        for i in range(min(first, m)):
            if not np.isfinite(vals[i]):
                first = i
                break
    return first


def workers() -> int:
    """Partial-result rows per kernel call: one per Numba thread."""
    return int(numba.get_num_threads())
