"""SCE's variance key and its merge of one tile in one Triton launch, with the bytes of
``backends/numba/sce.py``: decode, each agent's tau, their population variance (Welford in
float64, rounded to float32 once; triton's float64 ``/`` is
the IEEE division, ``div.rn.f64``), the cut on the variance's bits (one row,
shared by every agent, ties by block position), the sign election on the kept tau's sum, the
weighted mean of the agreeing ones over a divisor of at least 1e-6 (IEEE division), the encode,
the first NaN/Inf input and the output's NaN/Inf flag. With ``MERGE`` off the kernel writes the
variance itself (the statistics pass's key).

The agents are decoded again for each sum (from the cache) rather than kept per element: N is a
compile-time constant but a kernel holds no list of tiles.
"""

from __future__ import annotations

import torch
import triton
import triton.language as tl

from ramstream.backends.torch.fused import codecs
from ramstream.backends.torch.fused.gta import in_lower
from ramstream.backends.torch.fused.ram import EXACT, layout, note_first, on_device, store_output

BLOCK = 1024  # elements per program
MIN_DIVISOR: tl.constexpr = tl.constexpr(1e-6)  # ``backends.numba.sce.MIN_DIVISOR``, as float32


@triton.jit
def _tau(base, agents_at, agent_stride, t, b, offsets, mask, AGENT: tl.constexpr):
    """Agent t's tau (float32) and whether its value is NaN/Inf."""
    a = codecs.decode(base + agents_at + t * agent_stride, offsets, mask, AGENT)
    return codecs.task_vector(a, b, AGENT), codecs.nonfinite(a)


@triton.jit
def sce_tile(
    base,  # uint8 pointer: the base's raw bytes; agent t's are at base + agents_at + t * agent_stride
    agents_at,
    agent_stride,
    m,
    lo,  # the tile's first element in its block (the cut's tie ranges are block positions)
    weights,  # float32 (N,)
    cut_value,  # int64 (2,)
    cut_range,  # int64 (2, 2)
    out,  # MERGE: the output's carrier (m,); else float32 (m,), the variance
    state,  # int64: [0] the first NaN/Inf input position (min), [1] the output holds NaN/Inf (max)
    N_AGENTS: tl.constexpr,
    BASE: tl.constexpr,
    AGENT: tl.constexpr,
    OUT: tl.constexpr,
    MERGE: tl.constexpr,
    BLOCK: tl.constexpr,
):
    offsets = tl.program_id(0) * BLOCK + tl.arange(0, BLOCK)
    mask = offsets < m
    b = codecs.decode(base, offsets, mask, BASE)
    bad = codecs.nonfinite(b)
    mean = tl.zeros((BLOCK,), tl.float64)
    m2 = tl.zeros((BLOCK,), tl.float64)
    for t in range(N_AGENTS):
        tau, odd = _tau(base, agents_at, agent_stride, t, b, offsets, mask, AGENT)
        bad = bad | odd
        x = tau.to(tl.float64)
        d = x - mean
        mean = mean + d / (tl.zeros((BLOCK,), tl.float64) + (t + 1))  # float64: div.rn.f64
        m2 = m2 + d * (x - mean)
    var = (m2 / (tl.zeros((BLOCK,), tl.float64) + N_AGENTS)).to(tl.float32)
    if MERGE:
        bits = var.to(tl.uint32, bitcast=True).to(tl.int64)
        positions = offsets.to(tl.int64) + lo
        upper = in_lower(bits, positions, tl.load(cut_value + 1), tl.load(cut_range + 2), tl.load(cut_range + 3))
        lower = in_lower(bits, positions, tl.load(cut_value), tl.load(cut_range), tl.load(cut_range + 1))
        kept = upper & ~lower
        total = tl.zeros((BLOCK,), tl.float32)
        for t in range(N_AGENTS):
            tau, odd = _tau(base, agents_at, agent_stride, t, b, offsets, mask, AGENT)
            total = total + tl.where(kept, tau, 0.0)
        plus = total >= 0.0  # a NaN sum elects minus
        mixed = tl.zeros((BLOCK,), tl.float32)
        divisor = tl.zeros((BLOCK,), tl.float32)
        for t in range(N_AGENTS):
            tau, odd = _tau(base, agents_at, agent_stride, t, b, offsets, mask, AGENT)
            r = tl.where(kept, tau, 0.0)
            counts = ((r > 0.0) & plus) | ((r < 0.0) & ~plus)
            w = tl.load(weights + t)
            mixed = mixed + tl.where(counts, r * w, 0.0)
            divisor = divisor + tl.where(counts, w, 0.0)
        divisor = tl.where(divisor >= MIN_DIVISOR, divisor, MIN_DIVISOR)
        store_output(out, offsets, mask, b + tl.math.div_rn(mixed, divisor), state + 1, OUT)
    else:
        tl.store(out + offsets, var, mask=mask)
    note_first(state, bad, mask, offsets, lo)


def sce_launch(
    raw: list[torch.Tensor],
    m: int,
    lo: int,
    weights: torch.Tensor,
    cut_value: torch.Tensor,
    cut_range: torch.Tensor,
    out: torch.Tensor,
    state: torch.Tensor,
    codes: tuple[int, int, int],
    merge: bool = True,
) -> None:
    """Queue SCE over one tile: ``raw`` the staged inputs (base first, then the agents of one
    format at one stride); ``weights`` (agents,) float32, ``cut_value`` (2,) and ``cut_range``
    (2, 2) int64 on the device (block positions); ``out`` (m,) in the output's carrier, or float32
    for the variance alone (``merge=False``); ``state`` (2,) int64. ``codes``: base, agents, output."""
    agents_at, stride = layout(raw)
    with on_device(raw[0]):
        sce_tile[(triton.cdiv(m, BLOCK),)](
            raw[0], agents_at, stride, m, lo, weights, cut_value, cut_range, out, state, N_AGENTS=len(raw) - 1,
            BASE=codes[0], AGENT=codes[1], OUT=codes[2], MERGE=merge, BLOCK=BLOCK, **EXACT,
        )  # fmt: skip
