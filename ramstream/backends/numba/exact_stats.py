"""Exact per-block sums over task vectors, for statistics whose totals must not depend on the split.

Values are float32 task vectors tau = f32(agent) - f32(base) (an input that is a task vector
already, ``codecs.TAU32``, is tau itself). Each group of 64 consecutive
elements (groups start at multiples of 64 within the tensor: block starts and tiles are
multiples of 64) is summed in float64, in element order starting from 0.0, and that group sum
is added exactly into an ``exact_sum`` accumulator. Each thread owns its accumulators; a serial
reduction then adds them, so the partial of a block is the same whatever the thread count.

``abs_sums_block``: per agent, sum |tau| (or tau * tau: SCE's weights) over all elements and over
the elements kept, which are either those DARE keeps
(``KEEP_RANDOM``: ``counter_rng.uniform(keys[t], start + i) < density[t]``) or those a keep mask
marks (``KEEP_ARRAY``: ``keep[t, i] != 0``; magnitude ranks, DELLA's draws, SCE's variance cut);
the modes of ``ramstream.backends.numba.keep``.
``gram_block``: per pair a <= b (in the order (0,0), (0,1), ..., (0,N-1), (1,1), ...),
sum tau_a * tau_b (the product of two float32 values is exact in float64); or the same sums over
the weights themselves, the base's first (the spherical methods).

Both record in ``nonfinite[w]`` the first element whose value (task vector or weight) is NaN/Inf (or -1), and
count such elements as 0, so an accumulator never sees a non-finite value.
"""

from __future__ import annotations

import numpy as np
from numba import njit

from ramstream.backends.numba.codecs import TAU32, TILE, address, decode_at, minus
from ramstream.backends.numba.counter_rng import uniform
from ramstream.backends.numba.exact_sum import BINS, add, renormalise
from ramstream.backends.numba.keep import KEEP_RANDOM
from ramstream.backends.numba.workers import run_parts

GROUP = 64


def abs_sums_block(
    base, base_code, agents, agent_codes, keep_mode, keys, density, start, keep, square, acc, nonfinite
) -> None:  # type: ignore[no-untyped-def]
    """acc: int64 (workers, N, 2, BINS + 1) zeroed; row 0 = sum |tau|, row 1 = sum |tau| kept
    (with ``square``, of tau * tau in float64).
    ``keys``/``density``/``start`` serve ``KEEP_RANDOM``, ``keep`` (N, n) serves ``KEEP_ARRAY``;
    the other mode's arguments are not read (give ``keep.NO_*``)."""
    run_parts(
        _abs_sums_block_part, acc.shape[0], address(base), base.shape[0], base_code, agents, agent_codes, keep_mode,
        keys, density, start, keep, square, acc, nonfinite,
    )  # fmt: skip


@njit(nogil=True, cache=True, error_model="numpy")
def _abs_sums_block_part(
    base, n, base_code, agents, agent_codes, keep_mode, keys, density, start, keep, square, acc, nonfinite, w, workers
):  # type: ignore[no-untyped-def]
    n_agents = len(agents)
    n_tiles = (n + TILE - 1) // TILE
    zero = np.float32(0.0)
    base_bits = np.empty(TILE, np.uint32)
    agent_bits = np.empty(TILE, np.uint32)
    base_vals = base_bits.view(np.float32)
    agent_vals = agent_bits.view(np.float32)
    zeros = np.zeros(TILE, np.float32)
    kept = np.empty(TILE, np.float32)
    sums = np.empty(TILE // GROUP, np.float64)
    first_bad = -1
    for tile in range(n_tiles * w // workers, n_tiles * (w + 1) // workers):
        lo = tile * TILE
        m = min(TILE, n - lo)
        decode_at(base, lo, m, base_code, base_bits)
        for t in range(n_agents):
            decode_at(agents[t], lo, m, agent_codes[t], agent_bits)
            under = minus(agent_codes[t], base_vals, zeros)
            for i in range(m):
                tau = abs(agent_vals[i] - under[i])
                if tau - tau != zero:
                    first_bad = lo + i if first_bad < 0 or lo + i < first_bad else first_bad
                    tau = zero
                agent_vals[i] = tau
            # The mode is chosen outside the element loops, which then vectorise: chosen per
            # element, DARE's statistics pass ran at half the speed.
            if keep_mode == KEEP_RANDOM:
                key, d, first = keys[t], density[t], start + lo
                for i in range(m):
                    kept[i] = agent_vals[i] if uniform(key, first + i) < d else zero
            else:
                row = keep[t, lo : lo + m]
                for i in range(m):
                    kept[i] = agent_vals[i] if row[i] != 0 else zero
            for g in range(_group_sums(agent_vals, agent_vals, square, m, sums)):
                add(acc[w, t, 0], sums[g])
            for g in range(_group_sums(kept, kept, square, m, sums)):
                add(acc[w, t, 1], sums[g])
    nonfinite[w] = first_bad


def gram_block(base, base_code, agents, agent_codes, weights, acc, nonfinite) -> None:  # type: ignore[no-untyped-def]
    """acc: int64 (workers, V (V + 1) / 2, BINS + 1) zeroed, over V = N task vectors, or with
    ``weights`` over the V = N + 1 weights themselves (the base first, then the agents)."""
    run_parts(
        _gram_block_part, acc.shape[0], address(base), base.shape[0], base_code, agents, agent_codes, weights, acc,
        nonfinite,
    )  # fmt: skip


@njit(nogil=True, cache=True, error_model="numpy")
def _gram_block_part(base, n, base_code, agents, agent_codes, weights, acc, nonfinite, w, workers):  # type: ignore[no-untyped-def]
    n_agents = len(agents)
    first = 1 if weights else 0
    n_vectors = n_agents + first
    n_tiles = (n + TILE - 1) // TILE
    zero = np.float32(0.0)
    base_bits = np.empty(TILE, np.uint32)
    agent_bits = np.empty(TILE, np.uint32)
    base_vals = base_bits.view(np.float32)
    agent_vals = agent_bits.view(np.float32)
    zeros = np.zeros(TILE, np.float32)
    rows = np.empty((n_vectors, TILE), np.float32)
    sums = np.empty(TILE // GROUP, np.float64)
    first_bad = -1
    for tile in range(n_tiles * w // workers, n_tiles * (w + 1) // workers):
        lo = tile * TILE
        m = min(TILE, n - lo)
        decode_at(base, lo, m, base_code, base_bits)
        if weights:
            row = rows[0]
            for i in range(m):
                value = base_vals[i]
                if value - value != zero:
                    first_bad = lo + i if first_bad < 0 or lo + i < first_bad else first_bad
                    value = zero
                row[i] = value
        for t in range(n_agents):
            decode_at(agents[t], lo, m, agent_codes[t], agent_bits)
            under = minus(agent_codes[t], base_vals, zeros)
            held = agent_codes[t] == TAU32  # a task vector: its weights are f32(base) + tau
            row = rows[first + t]
            for i in range(m):
                if weights:
                    value = base_vals[i] + agent_vals[i] if held else agent_vals[i]
                else:
                    value = agent_vals[i] - under[i]
                if value - value != zero:
                    first_bad = lo + i if first_bad < 0 or lo + i < first_bad else first_bad
                    value = zero
                row[i] = value
        pair = 0
        for a in range(n_vectors):
            for b in range(a, n_vectors):
                for g in range(_group_sums(rows[a], rows[b], True, m, sums)):
                    add(acc[w, pair], sums[g])
                pair += 1
    nonfinite[w] = first_bad


@njit(inline="always", cache=True)
def _group_sums(x, y, product, m, sums):  # type: ignore[no-untyped-def]
    """sums[g] <- float64 sum, in element order from 0.0, of group g of the first m values
    (x[i], or x[i] * y[i] in float64 with ``product``); returns the number of groups.

    The groups of a tile are summed side by side (one add chain per group, so the chains
    overlap); each group's own additions keep their order, so results are the plain loop's.
    """
    full = m // GROUP
    for g in range(full):
        sums[g] = 0.0
    for j in range(GROUP):
        if product:
            for g in range(full):
                sums[g] += np.float64(x[g * GROUP + j]) * np.float64(y[g * GROUP + j])
        else:
            for g in range(full):
                sums[g] += np.float64(x[g * GROUP + j])
    if full * GROUP == m:
        return full
    tail = 0.0
    for i in range(full * GROUP, m):
        tail += np.float64(x[i]) * np.float64(y[i]) if product else np.float64(x[i])
    sums[full] = tail
    return full + 1


@njit(cache=True)
def reduce_workers(acc):  # type: ignore[no-untyped-def]
    """The sum over the first axis of renormalised accumulators (rows ``acc.shape[1:]``), renormalised."""
    rows = acc[0].reshape(-1, BINS + 1).shape[0]
    flat = acc.reshape(acc.shape[0], rows, BINS + 1)
    total = np.zeros((rows, BINS + 1), np.int64)
    for w in range(flat.shape[0]):
        for r in range(rows):
            renormalise(flat[w, r])
            for i in range(BINS):
                total[r, i] += flat[w, r, i]
    for r in range(rows):
        renormalise(total[r])
    return total
