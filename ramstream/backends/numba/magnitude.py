"""Magnitude trimming kernels: exact |tau| thresholds from bit-pattern histograms, and keep masks.

For float32 values >= 0 the order of the bit patterns (as uint32) is the order of the values,
so the 31-bit pattern of |tau| = |f32(agent) - f32(base)| is split in two 16-bit halves:

- ``high_histogram``: per agent, how many elements have each high half (``bits >> 16``; the
  sign bit is clear, so 32768 bins);
- ``low_histogram``: per agent and cut, how many elements whose high half is the cut's target
  bin have each low half (``bits & 0xFFFF``): with the first, it pins the exact value at any
  rank of the ascending order;
- ``cut_keep``: the keep mask of a block from two cuts per agent. A cut (V, [a, b)) is the
  *lower set* {bits < V} plus the elements equal to V at block positions a <= i < b; agent t
  keeps element i when it lies in cut 1's lower set and not in cut 0's. V = 0 with an empty
  range is the empty set, V = 0xFFFFFFFF every element;
- ``find_tie``: the block position of the q-th element equal to V at or after a position, or
  how many there are (for tie positions that straddle blocks).

Work is split per thread as everywhere in ``ramstream.backends.numba``: each thread owns a contiguous
range of tiles and its own rows of partial counts, reduced serially by the caller.
"""

from __future__ import annotations

import numpy as np
from numba import njit

from ramstream.backends.base import ALL, HIGH_BINS, LOW_BINS, NONFINITE_BIN
from ramstream.backends.numba.codecs import TILE, address, decode_at, minus
from ramstream.backends.numba.workers import run_parts

__all__ = ["ALL", "HIGH_BINS", "LOW_BINS", "NONFINITE_BIN", "cut_keep", "find_tie", "high_histogram", "low_histogram"]

_ABS = np.uint32(0x7FFFFFFF)
_SHIFT = np.uint32(16)
_LOW = np.uint32(0xFFFF)


@njit(inline="always", cache=True)
def _abs_bits(agent_bits, under, agent_vals, m):  # type: ignore[no-untyped-def]
    """agent_bits[:m] <- bit pattern of |agent - under| (in place over the agent's tile; ``under``
    is the base, or zeros for a task vector: ``codecs.minus``)."""
    for i in range(m):
        agent_vals[i] = agent_vals[i] - under[i]
    for i in range(m):
        agent_bits[i] = agent_bits[i] & _ABS


def high_histogram(base, base_code, agents, agent_codes, counts) -> None:  # type: ignore[no-untyped-def]
    """counts: int32 (workers, N, HIGH_BINS) zeroed; adds each thread's elements to its row."""
    run_parts(
        _high_histogram_part, counts.shape[0], address(base), base.shape[0], base_code, agents, agent_codes, counts,
    )  # fmt: skip


@njit(nogil=True, cache=True, error_model="numpy")
def _high_histogram_part(base, n, base_code, agents, agent_codes, counts, w, workers):  # type: ignore[no-untyped-def]
    n_agents = len(agents)
    n_tiles = (n + TILE - 1) // TILE
    base_bits = np.empty(TILE, np.uint32)
    agent_bits = np.empty(TILE, np.uint32)
    base_vals = base_bits.view(np.float32)
    agent_vals = agent_bits.view(np.float32)
    zeros = np.zeros(TILE, np.float32)
    for tile in range(n_tiles * w // workers, n_tiles * (w + 1) // workers):
        lo = tile * TILE
        m = min(TILE, n - lo)
        decode_at(base, lo, m, base_code, base_bits)
        for t in range(n_agents):
            decode_at(agents[t], lo, m, agent_codes[t], agent_bits)
            _abs_bits(agent_bits, minus(agent_codes[t], base_vals, zeros), agent_vals, m)
            row = counts[w, t]
            for i in range(m):
                row[agent_bits[i] >> _SHIFT] += 1


def low_histogram(base, base_code, agents, agent_codes, targets, counts) -> None:  # type: ignore[no-untyped-def]
    """targets: int32 (N, C), a high half per agent and cut (-1: none).
    counts: int32 (workers, N, C, LOW_BINS) zeroed."""
    run_parts(
        _low_histogram_part, counts.shape[0], address(base), base.shape[0], base_code, agents, agent_codes, targets,
        counts,
    )  # fmt: skip


@njit(nogil=True, cache=True, error_model="numpy")
def _low_histogram_part(base, n, base_code, agents, agent_codes, targets, counts, w, workers):  # type: ignore[no-untyped-def]
    n_agents = len(agents)
    n_cuts = targets.shape[1]
    n_tiles = (n + TILE - 1) // TILE
    base_bits = np.empty(TILE, np.uint32)
    agent_bits = np.empty(TILE, np.uint32)
    base_vals = base_bits.view(np.float32)
    agent_vals = agent_bits.view(np.float32)
    zeros = np.zeros(TILE, np.float32)
    for tile in range(n_tiles * w // workers, n_tiles * (w + 1) // workers):
        lo = tile * TILE
        m = min(TILE, n - lo)
        decode_at(base, lo, m, base_code, base_bits)
        for t in range(n_agents):
            if targets[t].max() < 0:
                continue
            decode_at(agents[t], lo, m, agent_codes[t], agent_bits)
            _abs_bits(agent_bits, minus(agent_codes[t], base_vals, zeros), agent_vals, m)
            for c in range(n_cuts):
                target = targets[t, c]
                if target < 0:
                    continue
                high = np.uint32(target)
                row = counts[w, t, c]
                for i in range(m):
                    b = agent_bits[i]
                    if (b >> _SHIFT) == high:
                        row[b & _LOW] += 1


@njit(inline="always", cache=True)
def _in_lower(b, i, v, a, e):  # type: ignore[no-untyped-def]
    return b < v or (b == v and a <= i and i < e)


def cut_keep(base, base_code, agents, agent_codes, cut_v, cut_range, keep, workers) -> None:  # type: ignore[no-untyped-def]
    """keep: uint8 (N, n) <- 1 where agent t keeps element i (see the module docstring).

    cut_v: uint32 (N, 2); cut_range: int64 (N, 2, 2), the block positions [a, b) of the ties of
    each cut that belong to its lower set."""
    run_parts(
        _cut_keep_part, workers, address(base), base.shape[0], base_code, agents, agent_codes, cut_v, cut_range, keep,
    )  # fmt: skip


@njit(nogil=True, cache=True, error_model="numpy")
def _cut_keep_part(base, n, base_code, agents, agent_codes, cut_v, cut_range, keep, w, workers):  # type: ignore[no-untyped-def]
    n_agents = len(agents)
    n_tiles = (n + TILE - 1) // TILE
    base_bits = np.empty(TILE, np.uint32)
    agent_bits = np.empty(TILE, np.uint32)
    base_vals = base_bits.view(np.float32)
    agent_vals = agent_bits.view(np.float32)
    zeros = np.zeros(TILE, np.float32)
    for tile in range(n_tiles * w // workers, n_tiles * (w + 1) // workers):
        lo = tile * TILE
        m = min(TILE, n - lo)
        decode_at(base, lo, m, base_code, base_bits)
        for t in range(n_agents):
            dst = keep[t, lo : lo + m]
            v0, v1 = cut_v[t, 0], cut_v[t, 1]
            a0, e0 = cut_range[t, 0, 0] - lo, cut_range[t, 0, 1] - lo
            a1, e1 = cut_range[t, 1, 0] - lo, cut_range[t, 1, 1] - lo
            if v0 == np.uint32(0) and e0 <= a0 and v1 == ALL:
                for i in range(m):
                    dst[i] = 1
                continue
            if v1 == np.uint32(0) and e1 <= a1:
                for i in range(m):
                    dst[i] = 0
                continue
            decode_at(agents[t], lo, m, agent_codes[t], agent_bits)
            _abs_bits(agent_bits, minus(agent_codes[t], base_vals, zeros), agent_vals, m)
            for i in range(m):
                b = agent_bits[i]
                inside = _in_lower(b, i, v1, a1, e1) and not _in_lower(b, i, v0, a0, e0)
                dst[i] = np.uint8(1) if inside else np.uint8(0)


@njit(nogil=True, cache=True, error_model="numpy")
def _tie_count_part(base, n, base_code, agent, agent_code, v, begin, w, workers):  # type: ignore[no-untyped-def]
    """Part ``w``'s count of the elements equal to v among block positions >= begin (tiles split as usual)."""
    n_tiles = (n + TILE - 1) // TILE
    base_bits = np.empty(TILE, np.uint32)
    agent_bits = np.empty(TILE, np.uint32)
    base_vals = base_bits.view(np.float32)
    agent_vals = agent_bits.view(np.float32)
    zeros = np.zeros(TILE, np.float32)
    total = 0
    for tile in range(n_tiles * w // workers, n_tiles * (w + 1) // workers):
        lo = tile * TILE
        m = min(TILE, n - lo)
        if lo + m <= begin:
            continue
        decode_at(base, lo, m, base_code, base_bits)
        decode_at(agent, lo, m, agent_code, agent_bits)
        _abs_bits(agent_bits, minus(agent_code, base_vals, zeros), agent_vals, m)
        for i in range(max(begin - lo, 0), m):
            total += 1 if agent_bits[i] == v else 0
    return total


@njit(nogil=True, cache=True, error_model="numpy")
def _scan_tie(base, n, base_code, agent, agent_code, v, begin, stop, q):  # type: ignore[no-untyped-def]
    """The position of the q-th (1-based) element equal to v in [begin, stop), serially."""
    base_bits = np.empty(TILE, np.uint32)
    agent_bits = np.empty(TILE, np.uint32)
    base_vals = base_bits.view(np.float32)
    agent_vals = agent_bits.view(np.float32)
    zeros = np.zeros(TILE, np.float32)
    seen = 0
    for lo in range(begin - begin % TILE, stop, TILE):
        m = min(TILE, n - lo)
        decode_at(base, lo, m, base_code, base_bits)
        decode_at(agent, lo, m, agent_code, agent_bits)
        _abs_bits(agent_bits, minus(agent_code, base_vals, zeros), agent_vals, m)
        for i in range(max(begin - lo, 0), min(m, stop - lo)):
            if agent_bits[i] == v:
                seen += 1
                if seen == q:
                    return lo + i
    return -1


def find_tie(
    base: np.ndarray,
    base_code: int,
    agent: np.ndarray,
    agent_code: int,
    v: int,
    begin: int,
    q: int,
    workers: int,
) -> tuple[int, int]:
    """``(position, count)``: the block position of the q-th (1-based) element whose |tau| bit
    pattern is ``v`` among positions >= ``begin`` (-1 when there are fewer), and how many such
    elements there are in all. Threads only count; the position is found by a serial scan of one
    thread's range, so the answer never depends on the thread count."""
    n = base.shape[0]
    sources = (address(base), n, base_code, address(agent), agent_code, np.uint32(v))
    counts = run_parts(_tie_count_part, workers, *sources, begin)
    total = sum(counts)
    if q < 1 or q > total:
        return -1, total
    n_tiles = (n + TILE - 1) // TILE
    before = 0
    for w in range(workers):
        if before + counts[w] >= q:
            lo = max(begin, (n_tiles * w // workers) * TILE)
            hi = min(n, (n_tiles * (w + 1) // workers) * TILE)
            return int(_scan_tie(*sources, lo, hi, q - before)), total
        before += int(counts[w])
    raise AssertionError("unreachable: the counts add up to total")
