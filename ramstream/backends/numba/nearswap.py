"""NearSwap merge kernel: the base, moved to the agent where the two are already near.

Per element, in float32, with a = f32(base) and b = f32(agent) (``agents[0]``; an agent given
as its task vector, ``codecs.TAU32``, is ``b = a + tau``, added in float32 first):

    d = |a - b|, raised to 1e-6 where smaller (NaN stays NaN)
    w = (1 / d) * t, lowered to 1 where above, raised to +0.0 where below 0 (NaN stays NaN)
    merged = w * b + (1 - w) * a

each operation rounded to float32 (no fused multiply-add), then encoded to the output format.
``1 / d`` times t, not t / d: mergekit's ``t / tensor`` is torch's ``Tensor.__rtruediv__``,
``tensor.reciprocal() * t``, so this order gives its float32 values bit for bit. Returns the
block position of the first NaN/Inf input (base or agent), or -1.
"""

from __future__ import annotations

import numpy as np
from numba import njit

from ramstream.backends.numba.codecs import TAU32, TILE, address, decode_at, encode_at
from ramstream.backends.numba.nonfinite import first_nonfinite_in
from ramstream.backends.numba.workers import lowest, run_parts

_EXPONENT = np.uint32(0x7F800000)
MIN_DISTANCE = np.float32(1e-6)


def merge_nearswap_block(base, base_code, agents, agent_codes, t, out, out_code, workers) -> int:  # type: ignore[no-untyped-def]
    """NearSwap of one block on ``workers`` threads; the first NaN/Inf input's position or -1."""
    parts = run_parts(
        _merge_nearswap_part, workers, address(base), base.shape[0], base_code, agents, agent_codes, t, address(out),
        out_code,
    )  # fmt: skip
    return lowest(parts)


@njit(nogil=True, cache=True, error_model="numpy")
def _merge_nearswap_part(base, n, base_code, agents, agent_codes, t, out, out_code, w, workers):  # type: ignore[no-untyped-def]
    n_tiles = (n + TILE - 1) // TILE
    t32 = np.float32(t)
    one = np.float32(1.0)
    zero = np.float32(0.0)
    agent = agents[0]  # its address
    agent_code = agent_codes[0]
    first = -1
    agent_bits = np.empty(TILE, np.uint32)
    base_bits = np.empty(TILE, np.uint32)
    merged_bits = np.empty(TILE, np.uint32)
    b = agent_bits.view(np.float32)
    a = base_bits.view(np.float32)
    merged = merged_bits.view(np.float32)
    for tile in range(n_tiles * w // workers, n_tiles * (w + 1) // workers):
        lo = tile * TILE
        m = min(TILE, n - lo)
        found = np.uint32(0)
        decode_at(base, lo, m, base_code, base_bits)
        decode_at(agent, lo, m, agent_code, agent_bits)
        for i in range(m):
            found |= np.uint32((base_bits[i] & _EXPONENT) == _EXPONENT)
            found |= np.uint32((agent_bits[i] & _EXPONENT) == _EXPONENT)
        if agent_code == TAU32:
            for i in range(m):
                b[i] = a[i] + b[i]
        for i in range(m):
            d = abs(a[i] - b[i])
            if d < MIN_DISTANCE:
                d = MIN_DISTANCE
            weight = (one / d) * t32
            if weight < zero:
                weight = zero
            if weight > one:
                weight = one
            merged[i] = weight * b[i] + (one - weight) * a[i]
        encode_at(merged_bits, out, lo, m, out_code)
        if found and first < 0:
            first = lo + first_nonfinite_in(base, base_code, agents, agent_codes, lo, m, agent_bits)
    return first
