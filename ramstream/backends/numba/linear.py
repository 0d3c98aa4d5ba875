"""Linear merge kernel: a weighted sum of the agents' weights themselves (not of task vectors).

Per element, in float32: ``total = w_0 * f32(base) + sum_t w_t * f32(agent_t)`` (from +0.0, the
base first, then agents in order, each product rounded before the add; the base is not read and
takes no part when its weight is 0), then ``total / divisor`` when ``normalize`` (``divisor`` is
the float32 sum of the base weight and the agent weights, in that order), encoded to the output
format. Returns the block position of the first NaN/Inf input (base included, read for that
alone when its weight is 0), or -1.

An agent given as its task vector (``codecs.TAU32``: a LoRA agent) weighs in as its weights
``f32(base) + tau``, added in float32 before the product.
"""

from __future__ import annotations

import numpy as np
from numba import njit

from ramstream.backends.numba.codecs import TAU32, TILE, address, decode_at, encode_at
from ramstream.backends.numba.nonfinite import first_nonfinite_in
from ramstream.backends.numba.workers import lowest, run_parts

_EXPONENT = np.uint32(0x7F800000)


def merge_linear_block(
    base, base_code, base_weight, agents, agent_codes, weights, normalize, out, out_code, workers
) -> int:  # type: ignore[no-untyped-def]
    """The linear merge of one block on ``workers`` threads; the first NaN/Inf input's position or -1."""
    parts = run_parts(
        _merge_linear_part, workers, address(base), base.shape[0], base_code, base_weight, agents, agent_codes,
        weights, normalize, address(out), out_code,
    )  # fmt: skip
    return lowest(parts)


@njit(nogil=True, cache=True, error_model="numpy")
def _merge_linear_part(
    base, n, base_code, base_weight, agents, agent_codes, weights, normalize, out, out_code, w, workers
):  # type: ignore[no-untyped-def]
    n_agents = len(agents)
    n_tiles = (n + TILE - 1) // TILE
    w0 = np.float32(base_weight)
    divisor = np.float32(0.0) + w0
    for t in range(n_agents):
        divisor += weights[t]
    first = -1
    agent_bits = np.empty(TILE, np.uint32)
    base_bits = np.empty(TILE, np.uint32)
    total_bits = np.empty(TILE, np.uint32)
    agent_vals = agent_bits.view(np.float32)
    base_vals = base_bits.view(np.float32)
    total = total_bits.view(np.float32)
    for tile in range(n_tiles * w // workers, n_tiles * (w + 1) // workers):
        lo = tile * TILE
        m = min(TILE, n - lo)
        for i in range(m):
            total[i] = np.float32(0.0)
        found = np.uint32(0)
        decode_at(base, lo, m, base_code, base_bits)
        for i in range(m):
            found |= np.uint32((base_bits[i] & _EXPONENT) == _EXPONENT)
        if w0 != np.float32(0.0):
            for i in range(m):
                total[i] += w0 * base_vals[i]
        for t in range(n_agents):
            decode_at(agents[t], lo, m, agent_codes[t], agent_bits)
            wt = weights[t]
            for i in range(m):
                found |= np.uint32((agent_bits[i] & _EXPONENT) == _EXPONENT)
            if agent_codes[t] == TAU32:
                for i in range(m):
                    agent_vals[i] = base_vals[i] + agent_vals[i]
            for i in range(m):
                total[i] += wt * agent_vals[i]
        if normalize:
            for i in range(m):
                total[i] = total[i] / divisor
        encode_at(total_bits, out, lo, m, out_code)
        if found and first < 0:
            first = lo + first_nonfinite_in(base, base_code, agents, agent_codes, lo, m, agent_bits)
    return first
