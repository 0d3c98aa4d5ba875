"""The per-vector merge of one tile in one Triton launch (slerp, nuslerp, multislerp, karcher once
their per-vector coefficients are known), with the bytes of ``merge_vectors_block`` in
``backends/numba/vectors.py``: each element's block vector from its tensor position
(``vector_sums.VectorLayout``), its coefficients from the table, then in float32 from +0.0, in
agent order, either the weights form ``c0 * base + c_(1+t) * agent_t`` (an agent given as its
task vector weighs in as ``base + tau``) or the task-vector form ``base + sum c_t * tau_t``; the
encode, the first NaN/Inf input position and whether the output holds NaN/Inf.
"""

from __future__ import annotations

import torch
import triton
import triton.language as tl

from ramstream.backends.torch.fused import codecs
from ramstream.backends.torch.fused.ram import EXACT, layout, note_first, on_device, store_output

BLOCK = 1024  # elements per program


@triton.jit
def vectors_tile(
    base,  # uint8 pointer: the base's raw bytes; agent t's are at base + agents_at + t * agent_stride
    agents_at,
    agent_stride,
    m,
    lo,
    start,  # the block's first tensor position
    div,
    mod,
    coefs,  # float32 (vectors, coef_stride): each block vector's coefficients
    coef_stride,
    out,  # the output's carrier, (m,)
    state,  # int64: [0] the first NaN/Inf input position (min), [1] the output holds NaN/Inf (max)
    N_AGENTS: tl.constexpr,
    BASE: tl.constexpr,
    AGENT: tl.constexpr,
    OUT: tl.constexpr,
    WEIGHTS: tl.constexpr,
    BLOCK: tl.constexpr,
):
    offsets = tl.program_id(0) * BLOCK + tl.arange(0, BLOCK)
    mask = offsets < m
    first_vector = (start // div) % mod
    which = ((start + lo + offsets.to(tl.int64)) // div % mod - first_vector + mod) % mod
    row = coefs + which * coef_stride
    b = codecs.decode(base, offsets, mask, BASE)
    bad = codecs.nonfinite(b)
    total = tl.zeros((BLOCK,), tl.float32)
    if WEIGHTS:
        total = total + tl.load(row, mask=mask, other=0.0) * b
    for t in range(N_AGENTS):
        a = codecs.decode(base + agents_at + t * agent_stride, offsets, mask, AGENT)
        bad = bad | codecs.nonfinite(a)
        if WEIGHTS:
            total = total + tl.load(row + 1 + t, mask=mask, other=0.0) * codecs.agent_weights(a, b, AGENT)
        else:
            total = total + tl.load(row + t, mask=mask, other=0.0) * codecs.task_vector(a, b, AGENT)
    if not WEIGHTS:
        total = b + total
    store_output(out, offsets, mask, total, state + 1, OUT)
    note_first(state, bad, mask, offsets, lo)


def vectors_launch(
    raw: list[torch.Tensor],
    m: int,
    lo: int,
    where: tuple[int, int, int],
    coefs: torch.Tensor,
    weights: bool,
    out: torch.Tensor,
    state: torch.Tensor,
    codes: tuple[int, int, int],
) -> None:
    """Queue the per-vector merge of one tile: ``where`` the layout's (start, div, mod),
    ``coefs`` (vectors, K) float32 on the device, ``out`` (m,) in the output's carrier, ``state``
    (2,) int64. ``codes``: base, agents, output."""
    agents_at, stride = layout(raw)
    start, div, mod = where
    with on_device(raw[0]):
        vectors_tile[(triton.cdiv(m, BLOCK),)](
            raw[0], agents_at, stride, m, lo, start, div, mod, coefs, coefs.stride(0), out, state,
            N_AGENTS=len(raw) - 1, BASE=codes[0], AGENT=codes[1], OUT=codes[2], WEIGHTS=weights, BLOCK=BLOCK,
            **EXACT,
        )  # fmt: skip
