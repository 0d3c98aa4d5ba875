"""arcee_fusion kernels: histograms of the importance's bit patterns, and the fused merge.

Per element, in float32, with a = f32(base) and b = f32(agent) (``agents[0]``; an agent given as
its task vector, ``codecs.TAU32``, is b = a + tau, added in float32 first):

    d          = b - a
    importance = |d| * scale[row]      row = (offset + i) // row_len (the row's KL, float32)

one rounding per operation. The histograms count the bit pattern of the importance with its sign
bit cleared (a non-negative float32 orders as its bits; a NaN lands at or past
``NONFINITE_BIN``), as ``magnitude.py`` does for |tau|: the high halves, and the low halves of the
elements whose high half is a target. The merge keeps d where the importance reaches the
threshold: m = 1 where importance >= threshold (else 0, a NaN included), merged = a + d * m,
encoded to the output format; it returns the block position of the first NaN/Inf input.

Threads each own a contiguous range of tiles and their own rows of counts (reduced by the
caller), as everywhere in ``ramstream.backends.numba``.
"""

from __future__ import annotations

import numpy as np
from numba import njit

from ramstream.backends.numba.codecs import TAU32, TILE, address, decode_at, encode_at
from ramstream.backends.numba.nonfinite import first_nonfinite_in, tile_nonfinite
from ramstream.backends.numba.workers import lowest, run_parts

_ABS = np.uint32(0x7FFFFFFF)
_SHIFT = np.uint32(16)
_LOW = np.uint32(0xFFFF)


@njit(inline="always", cache=True)
def _importance(a, b, agent_code, scale, row_len, position, m, d, importance):  # type: ignore[no-untyped-def]
    """d[:m] <- b - a and importance[:m] <- |d| * scale[row] for the tile whose first element
    lies at ``position`` (offset + tile start); b is overwritten by a + tau for a TAU32 agent."""
    if agent_code == TAU32:
        for i in range(m):
            b[i] = a[i] + b[i]
    for i in range(m):
        d[i] = b[i] - a[i]
    row = position // row_len
    col = position - row * row_len
    for i in range(m):
        importance[i] = abs(d[i]) * scale[row]
        col += 1
        if col == row_len:
            col = 0
            row += 1


def importance_histograms(base, base_code, agent, agent_code, scale, row_len, offset, targets, high, low) -> None:  # type: ignore[no-untyped-def]
    """high: int32 (workers, HIGH_BINS) zeroed, or (workers, 0) for none; low: int32 (workers, C,
    LOW_BINS) zeroed, for the target high halves ``targets`` (int32 (C,); -1 matches nothing)."""
    run_parts(
        _importance_histograms_part, high.shape[0], address(base), base.shape[0], base_code, address(agent),
        agent_code, scale, row_len, offset, targets, high, low,
    )  # fmt: skip


@njit(nogil=True, cache=True, error_model="numpy")
def _importance_histograms_part(
    base, n, base_code, agent, agent_code, scale, row_len, offset, targets, high, low, w, workers
):  # type: ignore[no-untyped-def]
    n_tiles = (n + TILE - 1) // TILE
    want_high = high.shape[1] > 0
    n_cuts = targets.shape[0]
    base_bits = np.empty(TILE, np.uint32)
    agent_bits = np.empty(TILE, np.uint32)
    d = np.empty(TILE, np.float32)
    bits = np.empty(TILE, np.uint32)
    for tile in range(n_tiles * w // workers, n_tiles * (w + 1) // workers):
        lo = tile * TILE
        m = min(TILE, n - lo)
        decode_at(base, lo, m, base_code, base_bits)
        decode_at(agent, lo, m, agent_code, agent_bits)
        _importance(
            base_bits.view(np.float32),
            agent_bits.view(np.float32),
            agent_code,
            scale,
            row_len,
            offset + lo,
            m,
            d,
            bits.view(np.float32),
        )
        for i in range(m):
            bits[i] = bits[i] & _ABS
        if want_high:
            counts = high[w]
            for i in range(m):
                counts[bits[i] >> _SHIFT] += 1
        for c in range(n_cuts):
            if targets[c] < 0:
                continue
            target = np.uint32(targets[c])
            counts = low[w, c]
            for i in range(m):
                if (bits[i] >> _SHIFT) == target:
                    counts[bits[i] & _LOW] += 1


def merge_fusion_block(
    base, base_code, agents, agent_codes, scale, row_len, offset, threshold, out, out_code, workers
) -> int:  # type: ignore[no-untyped-def]
    """arcee_fusion's merge of one block on ``workers`` threads; the first NaN/Inf input's position or -1."""
    parts = run_parts(
        _merge_fusion_part, workers, address(base), base.shape[0], base_code, agents, agent_codes, scale, row_len,
        offset, threshold, address(out), out_code,
    )  # fmt: skip
    return lowest(parts)


@njit(nogil=True, cache=True, error_model="numpy")
def _merge_fusion_part(
    base, n, base_code, agents, agent_codes, scale, row_len, offset, threshold, out, out_code, w, workers
):  # type: ignore[no-untyped-def]
    n_tiles = (n + TILE - 1) // TILE
    limit = np.float32(threshold)
    one = np.float32(1.0)
    zero = np.float32(0.0)
    agent = agents[0]  # its address
    agent_code = agent_codes[0]
    first = -1
    base_bits = np.empty(TILE, np.uint32)
    agent_bits = np.empty(TILE, np.uint32)
    merged_bits = np.empty(TILE, np.uint32)
    d = np.empty(TILE, np.float32)
    importance = np.empty(TILE, np.float32)
    a = base_bits.view(np.float32)
    merged = merged_bits.view(np.float32)
    for tile in range(n_tiles * w // workers, n_tiles * (w + 1) // workers):
        lo = tile * TILE
        m = min(TILE, n - lo)
        decode_at(base, lo, m, base_code, base_bits)
        decode_at(agent, lo, m, agent_code, agent_bits)
        found = tile_nonfinite(base_bits, m) or tile_nonfinite(agent_bits, m)
        _importance(a, agent_bits.view(np.float32), agent_code, scale, row_len, offset + lo, m, d, importance)
        for i in range(m):
            keep = one if importance[i] >= limit else zero
            merged[i] = a[i] + d[i] * keep
        encode_at(merged_bits, out, lo, m, out_code)
        if found and first < 0:
            first = lo + first_nonfinite_in(base, base_code, agents, agent_codes, lo, m, agent_bits)
    return first
