"""NearSwap of one tile in one Triton launch, with the bytes of ``backends/numba/nearswap.py``:
decode the base and the agent (an agent given as its task vector is ``base + tau`` in float32),
``d = |base - agent|`` raised to 1e-6 (NaN stays NaN), ``w = (1 / d) * t`` (IEEE division)
lowered to 1 and raised to +0.0, ``w * agent + (1 - w) * base``, the encode, the first NaN/Inf
input position and whether the output holds NaN/Inf.
"""

from __future__ import annotations

import torch
import triton
import triton.language as tl

from ramstream.backends.torch.fused import codecs
from ramstream.backends.torch.fused.ram import EXACT, decode_pair, layout, note_first, on_device, store_output

BLOCK = 1024  # elements per program
MIN_DISTANCE: tl.constexpr = tl.constexpr(1e-6)  # ``backends.numba.nearswap.MIN_DISTANCE``, as float32


@triton.jit
def nearswap_tile(
    base,  # uint8 pointer: the base's raw bytes; the agent's are at base + agent_at
    agent_at,
    m,
    lo,
    t,  # float32
    out,  # the output's carrier, (m,)
    state,  # int64: [0] the first NaN/Inf input position (min), [1] the output holds NaN/Inf (max)
    BASE: tl.constexpr,
    AGENT: tl.constexpr,
    OUT: tl.constexpr,
    BLOCK: tl.constexpr,
):
    offsets = tl.program_id(0) * BLOCK + tl.arange(0, BLOCK)
    mask = offsets < m
    b, a, bad = decode_pair(base, agent_at, offsets, mask, BASE, AGENT)
    a = codecs.agent_weights(a, b, AGENT)
    distance = tl.abs(b - a)
    distance = tl.where(distance < MIN_DISTANCE, MIN_DISTANCE, distance)
    weight = tl.math.div_rn(tl.zeros((BLOCK,), tl.float32) + 1.0, distance) * t
    weight = tl.where(weight < 0.0, 0.0, weight)
    weight = tl.where(weight > 1.0, 1.0, weight)
    store_output(out, offsets, mask, weight * a + (1.0 - weight) * b, state + 1, OUT)
    note_first(state, bad, mask, offsets, lo)


def nearswap_launch(
    raw: list[torch.Tensor],
    m: int,
    lo: int,
    t: float,
    out: torch.Tensor,
    state: torch.Tensor,
    codes: tuple[int, int, int],
) -> None:
    """Queue NearSwap over one tile: ``raw`` the staged base and agent, ``t`` a float32 value,
    ``out`` (m,) in the output's carrier, ``state`` (2,) int64. ``codes``: base, agent, output."""
    agent_at, _ = layout(raw)
    with on_device(raw[0]):
        nearswap_tile[(triton.cdiv(m, BLOCK),)](
            raw[0], agent_at, m, lo, t, out, state, BASE=codes[0], AGENT=codes[1], OUT=codes[2], BLOCK=BLOCK, **EXACT,
        )  # fmt: skip
