"""arcee_fusion's importance and merge of one tile in one Triton launch, with the bytes of
``backends/numba/fusion.py``: decode the base and the agent (an agent given as its task vector is
``base + tau`` in float32), ``d = agent - base``, the importance ``|d| * scale[row]`` (the element's
row ``(offset + position) // row_len``), ``base + d * m`` with m = 1.0 where the importance
reaches the threshold (else 0.0, a NaN importance too), the encode, the first NaN/Inf input and
the output's NaN/Inf flag. ``importance`` is the element function the histogram kernels of
``magnitude.py`` use for the statistics.
"""

from __future__ import annotations

import torch
import triton
import triton.language as tl

from ramstream.backends.torch.fused import codecs
from ramstream.backends.torch.fused.ram import EXACT, decode_pair, layout, note_first, on_device, store_output

BLOCK = 1024  # elements per program


@triton.jit
def importance(b, a, positions, mask, scale, row_len, row_offset, AGENT: tl.constexpr):
    """(d, importance) of the decoded base ``b`` and agent ``a`` at block ``positions``."""
    d = codecs.agent_weights(a, b, AGENT) - b
    rows = (positions + row_offset) // row_len
    return d, tl.abs(d) * tl.load(scale + rows, mask=mask, other=0.0)


@triton.jit
def fusion_tile(
    base,  # uint8 pointer: the base's raw bytes; the agent's are at base + agent_at
    agent_at,
    m,
    lo,  # the tile's first element in its block
    scale,  # float32: the rows' factors over the block
    row_len,
    row_offset,  # the block's first element within its first row's span of ``scale``
    threshold,  # float32
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
    d, weight = importance(b, a, offsets.to(tl.int64) + lo, mask, scale, row_len, row_offset, AGENT)
    kept = tl.where(weight >= threshold, 1.0, 0.0)
    store_output(out, offsets, mask, b + d * kept, state + 1, OUT)
    note_first(state, bad, mask, offsets, lo)


def fusion_launch(
    raw: list[torch.Tensor],
    m: int,
    lo: int,
    scale: torch.Tensor,
    rows: tuple[int, int],
    threshold: float,
    out: torch.Tensor,
    state: torch.Tensor,
    codes: tuple[int, int, int],
) -> None:
    """Queue arcee_fusion's merge of one tile: ``raw`` the staged base and agent, ``scale`` the
    rows' float32 factors on the device, ``rows`` (row_len, offset) as ``RowScale``'s, ``out``
    (m,) in the output's carrier, ``state`` (2,) int64. ``codes``: base, agent, output."""
    agent_at, _ = layout(raw)
    with on_device(raw[0]):
        fusion_tile[(triton.cdiv(m, BLOCK),)](
            raw[0], agent_at, m, lo, scale, rows[0], rows[1], threshold, out, state, BASE=codes[0], AGENT=codes[1],
            OUT=codes[2], BLOCK=BLOCK, **EXACT,
        )  # fmt: skip
