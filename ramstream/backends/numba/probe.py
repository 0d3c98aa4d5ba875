"""Probe kernel: read -> decode -> task vectors -> active masks -> overlap counts, fused per tile.

The block's inputs are read by the kernel itself (``kernels/sources.py``: ``fds``, ``offsets``,
``codes``, base first; ``n`` elements). It writes each agent's bit-packed mask (bit ``i % 8`` of
byte ``i // 8`` is element ``i``, numpy's ``bitorder="little"``) and per-thread partial counts:
``overlap[w, t, k-1]`` = elements where agent t is active (eps < |tau| < Inf: a NaN/Inf tau is
inactive) and exactly k agents are active, ``coverage[w, k]`` = elements where exactly k agents
are active, ``nonfinite[w]`` = the first element index whose base or agent value is NaN/Inf (or
-1), and ``failed[w]`` = -1 or the input whose read failed (the file is shorter than its header
said: it changed under us).
"""

from __future__ import annotations

import numpy as np
from numba import njit

from ramstream.backends.numba.codecs import TILE, decode_at, minus
from ramstream.backends.numba.sources import read_buffer, read_tile, reads_of, row_address
from ramstream.backends.numba.workers import run_parts


def probe_block(fds, offsets, codes, n, eps, masks, overlap, coverage, nonfinite, failed) -> None:  # type: ignore[no-untyped-def]
    """The probe of one block, one part per row of the partial results (``overlap.shape[0]``).
    ``masks`` (agents, bytes) is usually a column range of a batch's buffer, and C-contiguous when
    the block fills the buffer: the kernel takes it as one flat run of bytes and a row stride,
    whose Numba type is the same either way (a C and a strided array are two compiles)."""
    flat, row = flat_rows(masks)
    run_parts(
        _probe_part, overlap.shape[0], fds, offsets, codes, n, eps, flat, row, overlap, coverage, nonfinite, failed
    )


def flat_rows(rows: np.ndarray) -> tuple[np.ndarray, int]:
    """A 2-D uint8 array whose rows are contiguous, as a 1-D view from its first byte to its last
    and the byte distance between its rows: row ``t`` is ``flat[t * stride : t * stride + width]``."""
    if rows.ndim != 2 or rows.dtype != np.uint8 or (rows.shape[1] > 1 and rows.strides[1] != 1):
        raise ValueError("the masks must be a 2-D uint8 array with contiguous rows")
    stride = int(rows.strides[0]) if rows.shape[0] > 1 else rows.shape[1]
    length = (rows.shape[0] - 1) * stride + rows.shape[1] if rows.size else 0
    return np.lib.stride_tricks.as_strided(rows, shape=(length,), strides=(1,)), stride


@njit(nogil=True, cache=True, error_model="numpy")
def _probe_part(fds, offsets, codes, n, eps, masks, row_stride, overlap, coverage, nonfinite, failed, w, workers):  # type: ignore[no-untyped-def]
    n_inputs = fds.shape[0]
    n_agents = n_inputs - 1
    n_reads = reads_of(n)
    eps32 = np.float32(eps)
    zero, inf = np.float32(0.0), np.float32(np.inf)
    raw = read_buffer(n_inputs)
    base_bits = np.empty(TILE, np.uint32)
    agent_bits = np.empty(TILE, np.uint32)
    zeros = np.zeros(TILE, np.float32)
    active = np.empty((n_agents, TILE), np.uint8)
    count = np.empty(TILE, np.uint8)
    equal = np.empty((n_agents + 1, TILE), np.uint8)
    base_vals = base_bits.view(np.float32)
    agent_vals = agent_bits.view(np.float32)
    first_bad = -1
    failed[w] = -1
    for read in range(n_reads * w // workers, n_reads * (w + 1) // workers):
        read_lo, read_m, failed[w] = read_tile(fds, offsets, codes, n, read, raw)
        if failed[w] >= 0:
            break
        for sub in range(0, read_m, TILE):
            lo = read_lo + sub
            m = min(TILE, read_m - sub)
            decode_at(row_address(raw, 0), sub, m, codes[0], base_bits)
            bad = np.int32(0)
            for i in range(m):
                count[i] = 0
                bad += np.int32(base_vals[i] - base_vals[i] != zero)
            for t in range(n_agents):
                decode_at(row_address(raw, t + 1), sub, m, codes[t + 1], agent_bits)
                under = minus(codes[t + 1], base_vals, zeros)
                row = active[t]
                for i in range(m):
                    a = agent_vals[i]
                    bad += np.int32(a - a != zero)
                    d = abs(a - under[i])
                    act = np.uint8((d > eps32) & (d < inf))  # NaN/Inf tau: inactive
                    row[i] = act
                    count[i] += act
            if bad and first_bad < 0:
                first_bad = lo + first_nonfinite_of(raw, codes, sub, m, agent_bits)
            _pad(active, count, m)
            _pack(active, lo, m, masks, row_stride)
            _count(active, count, equal, m, overlap[w], coverage[w])
    nonfinite[w] = first_bad


# (w * PACK_MULTIPLIER) >> 56 gathers the low bits of the 8 bytes of w into one byte, byte k -> bit k;
# (w * BYTE_SUM) >> 56 adds up the 8 bytes of w (each 0 or 1 here).
PACK_MULTIPLIER = np.uint64(0x0102040810204080)
BYTE_SUM = np.uint64(0x0101010101010101)
SHIFT = np.uint64(56)


@njit(inline="always", cache=True)
def _pad(active, count, m):  # type: ignore[no-untyped-def]
    """Past the end of a partial tile: no agent active, and a count no k can equal."""
    for i in range(m, (m + 7) // 8 * 8):
        count[i] = 255
        for t in range(active.shape[0]):
            active[t, i] = 0


@njit(inline="always", cache=True)
def _pack(active, lo, m, masks, row_stride):  # type: ignore[no-untyped-def]
    byte0 = lo // 8
    n_words = (m + 7) // 8
    for t in range(active.shape[0]):
        words = active[t].view(np.uint64)
        dst = masks[t * row_stride + byte0 : t * row_stride + byte0 + n_words]
        for j in range(n_words):
            dst[j] = np.uint8((words[j] * PACK_MULTIPLIER) >> SHIFT)


@njit(inline="always", cache=True)
def _count(active, count, equal, m, overlap_w, coverage_w):  # type: ignore[no-untyped-def]
    """Add this tile's coverage and overlap counts, eight elements per 64-bit word."""
    n_agents = active.shape[0]
    n_words = (m + 7) // 8
    for k in range(n_agents + 1):
        kk = np.uint8(k)
        eq = equal[k]
        for i in range(n_words * 8):
            eq[i] = np.uint8(count[i] == kk)
        words = eq.view(np.uint64)
        s = np.uint64(0)
        for j in range(n_words):
            s += (words[j] * BYTE_SUM) >> SHIFT
        coverage_w[k] += s
    for t in range(n_agents):
        rows = active[t].view(np.uint64)
        for k in range(1, n_agents + 1):
            eqs = equal[k].view(np.uint64)
            s = np.uint64(0)
            for j in range(n_words):
                s += ((rows[j] & eqs[j]) * BYTE_SUM) >> SHIFT
            overlap_w[t, k - 1] += s


@njit(cache=True, nogil=True)
def first_nonfinite_of(raw, codes, lo, m, bits):  # type: ignore[no-untyped-def]
    """Offset within the tile of the first non-finite value (base or any agent), decoding the
    read tiles again into ``bits``."""
    first = m
    vals = bits.view(np.float32)
    for k in range(codes.shape[0]):
        decode_at(row_address(raw, k), lo, m, codes[k], bits)
        for i in range(min(first, m)):
            if not np.isfinite(vals[i]):
                first = i
                break
    return first
