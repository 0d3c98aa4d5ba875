"""The linear merge of one tile in one Triton launch, with the bytes of
``backends/numba/linear.py``: decode the base and every agent (an agent given as its task vector
weighs in as ``base + tau`` in float32), ``total = +0.0 (+ w0 * base) + w_t * agent_t`` in agent
order, divided by the weights' float32 sum with ``normalize`` (IEEE division), the encode to the
output format, the first NaN/Inf input position (an atomic minimum) and whether the output holds
NaN/Inf (an atomic maximum).
"""

from __future__ import annotations

import torch
import triton
import triton.language as tl

from ramstream.backends.torch.fused import codecs
from ramstream.backends.torch.fused.ram import EXACT, layout, note_first, on_device, store_output

BLOCK = 1024  # elements per program


@triton.jit
def linear_tile(
    base,  # uint8 pointer: the base's raw bytes; agent t's are at base + agents_at + t * agent_stride
    agents_at,
    agent_stride,
    m,
    lo,
    weights,  # float32 (N_AGENTS,)
    base_weight,  # float32
    divisor,  # float32: the weights' sum (the base's first), with NORMALIZE
    out,  # the output's carrier, (m,)
    state,  # int64: [0] the first NaN/Inf input position (min), [1] the output holds NaN/Inf (max)
    N_AGENTS: tl.constexpr,
    BASE: tl.constexpr,
    AGENT: tl.constexpr,
    OUT: tl.constexpr,
    USES_BASE: tl.constexpr,
    NORMALIZE: tl.constexpr,
    BLOCK: tl.constexpr,
):
    offsets = tl.program_id(0) * BLOCK + tl.arange(0, BLOCK)
    mask = offsets < m
    b = codecs.decode(base, offsets, mask, BASE)
    bad = codecs.nonfinite(b)
    total = tl.zeros((BLOCK,), tl.float32)
    if USES_BASE:
        total = total + base_weight * b
    for t in range(N_AGENTS):
        a = codecs.decode(base + agents_at + t * agent_stride, offsets, mask, AGENT)
        bad = bad | codecs.nonfinite(a)
        total = total + tl.load(weights + t) * codecs.agent_weights(a, b, AGENT)
    if NORMALIZE:
        total = tl.math.div_rn(total, tl.full((BLOCK,), divisor, tl.float32))
    store_output(out, offsets, mask, total, state + 1, OUT)
    note_first(state, bad, mask, offsets, lo)


def linear_launch(
    raw: list[torch.Tensor],
    m: int,
    lo: int,
    weights: torch.Tensor,
    base_weight: float,
    divisor: float | None,
    out: torch.Tensor,
    state: torch.Tensor,
    codes: tuple[int, int, int],
) -> None:
    """Queue the linear merge of one tile: ``weights`` (agents,) float32 on the device,
    ``base_weight`` and ``divisor`` (None: no normalising) float32 values, ``out`` (m,) in the
    output's carrier, ``state`` (2,) int64. ``codes``: base, agents, output."""
    agents_at, stride = layout(raw)
    with on_device(raw[0]):
        linear_tile[(triton.cdiv(m, BLOCK),)](
            raw[0], agents_at, stride, m, lo, weights, base_weight, 1.0 if divisor is None else divisor, out, state,
            N_AGENTS=len(raw) - 1, BASE=codes[0], AGENT=codes[1], OUT=codes[2], USES_BASE=base_weight != 0.0,
            NORMALIZE=divisor is not None, BLOCK=BLOCK, **EXACT,
        )  # fmt: skip
