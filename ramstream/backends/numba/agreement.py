"""Agreement of every pair of agents over one block (``backends.agreement``'s layout).

Per tile: decode the base, each agent's task vector tau = agent - under (float32, as the probe)
and its active flag eps < |tau| < Inf; then per element with c active agents, each active
agent's tau^2 goes to its unique (c = 1) or shared (c >= 2) accumulator, and each pair active
there counts the element, counts it again when the sign bits agree, and adds tau_i tau_j,
tau_i^2, tau_j^2. Products go into ``vectors.add_product``'s exact digits, so the order of the
additions (threads, tiles, blocks) never shows; each worker fills its own rows.
"""

from __future__ import annotations

import numpy as np
from numba import njit

from ramstream.backends.numba.codecs import TILE, address, decode_at, minus
from ramstream.backends.numba.vectors import add_product
from ramstream.backends.numba.workers import run_parts

_SIGN = np.uint32(31)


def agreement_block(base, base_code, agents, agent_codes, eps, counts, acc) -> None:  # type: ignore[no-untyped-def]
    """counts: int64 (workers, P, 2) zeroed; acc: int64 (workers, 3 P + 2 N, DIGITS) zeroed."""
    run_parts(
        _agreement_block_part, acc.shape[0], address(base), base.shape[0], base_code, agents, agent_codes, eps,
        counts, acc,
    )  # fmt: skip


@njit(nogil=True, cache=True, error_model="numpy")
def _agreement_block_part(base, n, base_code, agents, agent_codes, eps, counts, acc, w, workers):  # type: ignore[no-untyped-def]
    n_agents = len(agents)
    n_pairs = counts.shape[1]
    n_tiles = (n + TILE - 1) // TILE
    eps32 = np.float32(eps)
    inf = np.float32(np.inf)
    base_bits = np.empty(TILE, np.uint32)
    agent_bits = np.empty(TILE, np.uint32)
    base_vals = base_bits.view(np.float32)
    agent_vals = agent_bits.view(np.float32)
    zeros = np.zeros(TILE, np.float32)
    rows = np.empty((n_agents, TILE), np.uint32)
    values = rows.view(np.float32)
    active = np.empty((n_agents, TILE), np.uint8)
    count = np.empty(TILE, np.int64)
    for tile in range(n_tiles * w // workers, n_tiles * (w + 1) // workers):
        lo = tile * TILE
        m = min(TILE, n - lo)
        decode_at(base, lo, m, base_code, base_bits)
        for i in range(m):
            count[i] = 0
        for t in range(n_agents):
            decode_at(agents[t], lo, m, agent_codes[t], agent_bits)
            under = minus(agent_codes[t], base_vals, zeros)
            for i in range(m):
                d = agent_vals[i] - under[i]
                size = abs(d)
                act = np.uint8((size > eps32) & (size < inf))  # NaN/Inf tau: inactive
                values[t, i] = d
                active[t, i] = act
                count[i] += act
        for i in range(m):
            c = count[i]
            if c == 0:
                continue
            shared = 1 if c >= 2 else 0
            for t in range(n_agents):
                if active[t, i]:
                    add_product(acc[w, 3 * n_pairs + 2 * t + shared], rows[t, i], rows[t, i])
            if c < 2:
                continue
            p = 0
            for a in range(n_agents):
                for b in range(a + 1, n_agents):
                    if active[a, i] and active[b, i]:
                        x, y = rows[a, i], rows[b, i]
                        counts[w, p, 0] += 1
                        if ((x ^ y) >> _SIGN) == 0:
                            counts[w, p, 1] += 1
                        add_product(acc[w, 3 * p], x, y)
                        add_product(acc[w, 3 * p + 1], x, x)
                        add_product(acc[w, 3 * p + 2], y, y)
                    p += 1
