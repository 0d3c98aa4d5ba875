"""The probe of one tile in one Triton launch, with the numbers of ``backends/numba/probe.py``:
decode the base and every agent, each agent's active mask (eps < |tau| < Inf) bit-packed (bit
``i % 8`` of byte ``i // 8`` is element ``i``), the coverage counts (elements where exactly k
agents are active), the overlap counts (where agent t and exactly k agents are), and the first
NaN/Inf input position. Counts are integer sums per program added with integer atomics (exact,
in any order); the position is an atomic minimum. Nothing is read back until the call ends.
"""

from __future__ import annotations

import torch
import triton
import triton.language as tl

from ramstream.backends.torch.fused import codecs
from ramstream.backends.torch.fused.ram import EXACT, layout, note_first, on_device

BLOCK = 1024  # elements per program (a multiple of 8: a program packs whole bytes)


@triton.jit
def _active(base, agents_at, agent_stride, t, b, offsets, mask, eps, AGENT: tl.constexpr):
    a = codecs.decode(base + agents_at + t * agent_stride, offsets, mask, AGENT)
    tau = codecs.task_vector(a, b, AGENT)
    return (tl.abs(tau) > eps) & ~codecs.nonfinite(tau) & mask, codecs.nonfinite(a)


@triton.jit
def probe_tile(
    base,  # uint8 pointer: the base's raw bytes; agent t's are at base + agents_at + t * agent_stride
    agents_at,
    agent_stride,
    m,
    lo,
    eps,
    masks,  # uint8 (N_AGENTS, mask_stride): the tile's packed masks
    mask_stride,
    overlap,  # int64 (N_AGENTS, N_AGENTS): [t, k - 1]
    coverage,  # int64 (N_AGENTS + 1,)
    first,  # int64 (1,): the first NaN/Inf input position (min)
    N_AGENTS: tl.constexpr,
    BASE: tl.constexpr,
    AGENT: tl.constexpr,
    BLOCK: tl.constexpr,
):
    offsets = tl.program_id(0) * BLOCK + tl.arange(0, BLOCK)
    mask = offsets < m
    b = codecs.decode(base, offsets, mask, BASE)
    bad = codecs.nonfinite(b)
    count = tl.zeros((BLOCK,), tl.int32)
    for t in range(N_AGENTS):
        on, odd = _active(base, agents_at, agent_stride, t, b, offsets, mask, eps, AGENT)
        bad = bad | odd
        count = count + on.to(tl.int32)
    count = tl.where(mask, count, -1)  # past the tile: a count no k equals
    for k in range(N_AGENTS + 1):
        found = tl.sum((count == k).to(tl.int64))
        if found > 0:
            tl.atomic_add(coverage + k, found)
    bytes_at = tl.program_id(0) * (BLOCK // 8) + tl.arange(0, BLOCK // 8)
    weights = (1 << tl.arange(0, 8)).to(tl.int32)
    for t in range(N_AGENTS):
        on, odd = _active(base, agents_at, agent_stride, t, b, offsets, mask, eps, AGENT)
        packed = tl.sum(tl.reshape(on.to(tl.int32), (BLOCK // 8, 8)) * weights[None, :], axis=1)
        tl.store(masks + t * mask_stride + bytes_at, packed.to(tl.uint8), mask=bytes_at < mask_stride)
        for k in range(1, N_AGENTS + 1):
            found = tl.sum((on & (count == k)).to(tl.int64))
            if found > 0:
                tl.atomic_add(overlap + t * N_AGENTS + k - 1, found)
    note_first(first, bad, mask, offsets, lo)


def probe_tile_launch(
    raw: list[torch.Tensor],
    m: int,
    lo: int,
    eps: float,
    masks: torch.Tensor,
    overlap: torch.Tensor,
    coverage: torch.Tensor,
    first: torch.Tensor,
    codes: tuple[int, int],
) -> None:
    """Queue the probe of one tile: ``masks`` (agents, ceil(m / 8)) uint8, ``overlap`` (agents,
    agents) and ``coverage`` (agents + 1,) int64 accumulators, ``first`` (1,) int64."""
    agents_at, stride = layout(raw)
    with on_device(raw[0]):
        probe_tile[(triton.cdiv(m, BLOCK),)](
            raw[0], agents_at, stride, m, lo, eps, masks, masks.stride(0), overlap, coverage, first,
            N_AGENTS=len(raw) - 1, BASE=codes[0], AGENT=codes[1], BLOCK=BLOCK, **EXACT,
        )  # fmt: skip
