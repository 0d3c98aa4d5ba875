"""Per-vector kernels of row- and column-wise nuslerp: exact Gram sums per vector, and the merge
with one set of coefficients per vector.

The vectors of a block are ``backends.vector_sums.VectorLayout``'s: element i (tensor position
p = start + i) belongs to block vector ((p // div) % mod - (start // div) % mod) mod mod.

``vector_gram_block``: per block vector and pair a <= b ((0,0), (0,1), ...), the exact sum of
x_a x_b over its elements, in ``vector_sums``' format: each product goes into the digits of its
power of two (integer mantissas, no rounding), so the order of additions is free. The values are
the task vectors (V = N) or with ``weights`` the weights themselves, the base first (V = N + 1),
as ``exact_stats.gram_block``; a NaN/Inf value counts as 0 and is reported.

``merge_vectors_block``: per element, with c = coefs[its block vector] (float32), in float32 from
+0.0, each product rounded before the add (no fused multiply-add):

    weights form:       out = c[0] f32(base) + sum_t c[1 + t] f32(agent_t)
    task-vector form:   out = f32(base) + (sum_t c[t] tau_t)

the orders of ``linear.merge_linear_block`` (base weight non-zero) and ``gta.gta_merge_block``
(weights c, no consensus, no normalisation, lambda 1), so a tensor whose vectors all share one
set of coefficients gets those kernels' bytes.
"""

from __future__ import annotations

import numpy as np
from numba import njit

from ramstream.backends.numba.codecs import TAU32, TILE, address, decode_at, encode_at, minus
from ramstream.backends.numba.nonfinite import first_nonfinite_in
from ramstream.backends.numba.workers import lowest, run_parts
from ramstream.backends.vector_sums import DIGIT_BITS, DIGITS, LOW

_EXPONENT = np.uint32(0x7F800000)
_LOW32 = np.int64(0xFFFFFFFF)


@njit(inline="always", cache=True)
def _vector(p, div, mod, first):  # type: ignore[no-untyped-def]
    v = (p // div) % mod - first
    return v + mod if v < 0 else v


@njit(inline="always", cache=True)
def _mantissa(bits):  # type: ignore[no-untyped-def]
    """(integer mantissa, exponent) of a finite float32's bits: value = mantissa * 2**exponent."""
    field = np.int64((bits >> np.uint32(23)) & np.uint32(0xFF))
    mantissa = np.int64(bits & np.uint32(0x7FFFFF))
    if field == 0:
        return mantissa, np.int64(-149)
    return mantissa | np.int64(0x800000), field - np.int64(150)


@njit(inline="always", cache=True)
def add_product(acc, x, y):  # type: ignore[no-untyped-def]
    """Add the exact product of the finite float32 values of bits ``x``, ``y`` into ``acc`` (DIGITS,)."""
    mx, ex = _mantissa(x)
    my, ey = _mantissa(y)
    if mx == 0 or my == 0:
        return
    product = mx * my  # below 2**48: exact
    shift = ex + ey - LOW
    k = shift >> 5
    r = shift & 31
    low = (product & _LOW32) << r  # below 2**63
    high = (product >> DIGIT_BITS) << r  # below 2**47
    d0 = low & _LOW32
    d1 = (low >> DIGIT_BITS) + (high & _LOW32)
    d2 = high >> DIGIT_BITS
    if ((x ^ y) >> np.uint32(31)) != 0:
        d0, d1, d2 = -d0, -d1, -d2
    acc[k] += d0
    acc[k + 1] += d1
    acc[k + 2] += d2


def vector_gram_block(base, base_code, agents, agent_codes, weights, start, div, mod, acc, nonfinite) -> None:  # type: ignore[no-untyped-def]
    """acc: int64 (workers, count, V (V + 1) / 2, DIGITS) zeroed; nonfinite: int64 (workers,)."""
    run_parts(
        _vector_gram_part, acc.shape[0], address(base), base.shape[0], base_code, agents, agent_codes, weights,
        start, div, mod, acc, nonfinite,
    )  # fmt: skip


@njit(nogil=True, cache=True, error_model="numpy")
def _vector_gram_part(base, n, base_code, agents, agent_codes, weights, start, div, mod, acc, nonfinite, w, workers):  # type: ignore[no-untyped-def]
    n_agents = len(agents)
    lead = 1 if weights else 0
    n_vectors = n_agents + lead
    n_tiles = (n + TILE - 1) // TILE
    first = (start // div) % mod
    zero = np.float32(0.0)
    base_bits = np.empty(TILE, np.uint32)
    agent_bits = np.empty(TILE, np.uint32)
    base_vals = base_bits.view(np.float32)
    agent_vals = agent_bits.view(np.float32)
    zeros = np.zeros(TILE, np.float32)
    rows = np.empty((n_vectors, TILE), np.uint32)
    values = rows.view(np.float32)
    first_bad = -1
    for tile in range(n_tiles * w // workers, n_tiles * (w + 1) // workers):
        lo = tile * TILE
        m = min(TILE, n - lo)
        decode_at(base, lo, m, base_code, base_bits)
        if weights:
            for i in range(m):
                value = base_vals[i]
                if value - value != zero:
                    first_bad = lo + i if first_bad < 0 or lo + i < first_bad else first_bad
                    value = zero
                values[0, i] = value
        for t in range(n_agents):
            decode_at(agents[t], lo, m, agent_codes[t], agent_bits)
            under = minus(agent_codes[t], base_vals, zeros)
            held = agent_codes[t] == TAU32
            for i in range(m):
                if weights:
                    value = base_vals[i] + agent_vals[i] if held else agent_vals[i]
                else:
                    value = agent_vals[i] - under[i]
                if value - value != zero:
                    first_bad = lo + i if first_bad < 0 or lo + i < first_bad else first_bad
                    value = zero
                values[lead + t, i] = value
        for i in range(m):
            v = _vector(start + lo + i, div, mod, first)
            pair = 0
            for a in range(n_vectors):
                for b in range(a, n_vectors):
                    add_product(acc[w, v, pair], rows[a, i], rows[b, i])
                    pair += 1
    nonfinite[w] = first_bad


@njit(cache=True)
def reduce_normalised(acc):  # type: ignore[no-untyped-def]
    """The sum over the workers (axis 0) of ``acc`` (workers, ..., DIGITS), normalised."""
    flat = acc.reshape(acc.shape[0], -1, DIGITS)
    total = np.zeros((flat.shape[1], DIGITS), np.int64)
    for w in range(flat.shape[0]):
        for r in range(flat.shape[1]):
            for k in range(DIGITS):
                total[r, k] += flat[w, r, k]
    for r in range(total.shape[0]):
        for k in range(DIGITS - 1):
            carry = total[r, k] >> DIGIT_BITS
            total[r, k] -= carry << DIGIT_BITS
            total[r, k + 1] += carry
    return total


def merge_vectors_block(
    base, base_code, agents, agent_codes, weights, start, div, mod, coefs, out, out_code, workers
) -> int:  # type: ignore[no-untyped-def]
    """The per-vector merge of one block on ``workers`` threads; the first NaN/Inf input's position or -1."""
    parts = run_parts(
        _merge_vectors_part, workers, address(base), base.shape[0], base_code, agents, agent_codes, weights,
        start, div, mod, coefs, address(out), out_code,
    )  # fmt: skip
    return lowest(parts)


@njit(nogil=True, cache=True, error_model="numpy")
def _merge_vectors_part(
    base, n, base_code, agents, agent_codes, weights, start, div, mod, coefs, out, out_code, w, workers
):  # type: ignore[no-untyped-def]
    n_agents = len(agents)
    n_tiles = (n + TILE - 1) // TILE
    first = (start // div) % mod
    first_bad = -1
    agent_bits = np.empty(TILE, np.uint32)
    base_bits = np.empty(TILE, np.uint32)
    total_bits = np.empty(TILE, np.uint32)
    agent_vals = agent_bits.view(np.float32)
    base_vals = base_bits.view(np.float32)
    total = total_bits.view(np.float32)
    zeros = np.zeros(TILE, np.float32)
    which = np.empty(TILE, np.int64)
    for tile in range(n_tiles * w // workers, n_tiles * (w + 1) // workers):
        lo = tile * TILE
        m = min(TILE, n - lo)
        for i in range(m):
            total[i] = np.float32(0.0)
            which[i] = _vector(start + lo + i, div, mod, first)
        found = np.uint32(0)
        decode_at(base, lo, m, base_code, base_bits)
        for i in range(m):
            found |= np.uint32((base_bits[i] & _EXPONENT) == _EXPONENT)
        if weights:
            for i in range(m):
                total[i] += coefs[which[i], 0] * base_vals[i]
        for t in range(n_agents):
            decode_at(agents[t], lo, m, agent_codes[t], agent_bits)
            for i in range(m):
                found |= np.uint32((agent_bits[i] & _EXPONENT) == _EXPONENT)
            if weights:
                if agent_codes[t] == TAU32:  # a task vector: its weights are f32(base) + tau
                    for i in range(m):
                        agent_vals[i] = base_vals[i] + agent_vals[i]
                for i in range(m):
                    total[i] += coefs[which[i], 1 + t] * agent_vals[i]
            else:
                under = minus(agent_codes[t], base_vals, zeros)
                for i in range(m):
                    total[i] += coefs[which[i], t] * (agent_vals[i] - under[i])
        if not weights:
            for i in range(m):
                total[i] = base_vals[i] + total[i]
        encode_at(total_bits, out, lo, m, out_code)
        if found and first_bad < 0:
            first_bad = lo + first_nonfinite_in(base, base_code, agents, agent_codes, lo, m, agent_bits)
    return first_bad
