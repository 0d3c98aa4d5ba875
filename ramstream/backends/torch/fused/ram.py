"""The RAM / RAM+ merge of one tile in one Triton launch, with the bytes of
``backends/numba/merge_ram.py``: decode the base and every agent, their task vectors, the active
count and the sum of the active tau, each output's lambda-scaled sum, the merge, the encode to
the output format, the first NaN/Inf input position and whether each output holds NaN/Inf.

The grid is (programs over the tile's elements, K outputs): program (i, k) writes output k's
elements of its range and recomputes the counts it needs from the inputs (a sweep's K candidates
differ only in their lambdas; the second read of an input comes from the cache). Per element, in
float32, in the Numba kernel's order: ``total += active ? tau : 0`` and ``count += active ? 1 : 0``
over the agents from +0.0, ``scaled += active ? lambda * tau : 0``, ``mean = total / max(count, 1)``
(IEEE division), ``merged = count == 1 ? scaled : (count >= 2 ? mean : 0)``, ``base + merged``.
"""

from __future__ import annotations

from contextlib import AbstractContextManager, nullcontext

import torch
import triton
import triton.language as tl

from ramstream.backends.torch.fused import codecs

BLOCK = 1024  # elements per program
# compile options of every launch: no multiply-add contraction (triton's default contracts
# ``a * b + c`` into ``fma``, whose single rounding differs from the Numba kernels' two)
EXACT = {"enable_fp_fusion": False}
NOWHERE: tl.constexpr = tl.constexpr(1 << 62)  # ``probe.NOWHERE``: no non-finite value


@triton.jit
def store_output(out, offsets, mask, values, flag, OUT: tl.constexpr):
    """Encode ``values`` to format ``OUT``, store them at ``out + offsets`` and raise the int64 at
    ``flag`` (an atomic maximum) where one of them is NaN/Inf."""
    encoded = codecs.encode(values, OUT)
    tl.store(out + offsets, encoded, mask=mask)
    holds = tl.max((codecs.encoded_nonfinite(encoded, OUT) & mask).to(tl.int64))
    if holds > 0:
        tl.atomic_max(flag, holds)


@triton.jit
def decode_pair(base, agent_at, offsets, mask, BASE: tl.constexpr, AGENT: tl.constexpr):
    """The base's and one agent's float32 values (its raw bytes at ``base + agent_at``), and
    whether either is NaN/Inf."""
    b = codecs.decode(base, offsets, mask, BASE)
    a = codecs.decode(base + agent_at, offsets, mask, AGENT)
    return b, a, codecs.nonfinite(b) | codecs.nonfinite(a)


@triton.jit
def note_first(first, bad, mask, offsets, lo):
    """Lower the int64 at ``first`` (an atomic minimum) to the first block position ``lo +
    offsets`` where ``bad``."""
    position = tl.min(tl.where(bad & mask, offsets.to(tl.int64) + lo, NOWHERE))
    if position < NOWHERE:
        tl.atomic_min(first, position)


@triton.jit
def ram_tile(
    base,  # uint8 pointer: the base's raw bytes; agent t's are at base + agents_at + t * agent_stride
    agents_at,
    agent_stride,
    m,  # elements in the tile
    lo,  # the tile's first element in its block
    eps,  # float32
    lambdas,  # float32 (K, N_AGENTS)
    out,  # the outputs' carriers, (K, out_stride)
    out_stride,
    state,  # int64: [0] the first NaN/Inf input position (min), [1 + k] output k holds NaN/Inf (max)
    N_AGENTS: tl.constexpr,
    BASE: tl.constexpr,
    AGENT: tl.constexpr,
    OUT: tl.constexpr,
    BLOCK: tl.constexpr,
):
    k = tl.program_id(1)
    offsets = tl.program_id(0) * BLOCK + tl.arange(0, BLOCK)
    mask = offsets < m
    b = codecs.decode(base, offsets, mask, BASE)
    bad = codecs.nonfinite(b)
    total = tl.zeros((BLOCK,), tl.float32)
    count = tl.zeros((BLOCK,), tl.float32)
    scaled = tl.zeros((BLOCK,), tl.float32)
    for t in range(N_AGENTS):
        a = codecs.decode(base + agents_at + t * agent_stride, offsets, mask, AGENT)
        bad = bad | codecs.nonfinite(a)
        tau = codecs.task_vector(a, b, AGENT)
        on = (tl.abs(tau) > eps) & ~codecs.nonfinite(tau)
        total = total + tl.where(on, tau, 0.0)
        count = count + tl.where(on, 1.0, 0.0)
        lam = tl.load(lambdas + k * N_AGENTS + t)
        scaled = scaled + tl.where(on, lam * tau, 0.0)
    mean = tl.math.div_rn(total, tl.maximum(count, 1.0))
    merged = tl.where(count == 1.0, scaled, tl.where(count >= 2.0, mean, 0.0))
    store_output(out + k * out_stride, offsets, mask, b + merged, state + 1 + k, OUT)
    if k == 0:
        note_first(state, bad, mask, offsets, lo)


def merge_tile(
    raw: list[torch.Tensor],
    m: int,
    lo: int,
    eps: float,
    lambdas: torch.Tensor,
    out: torch.Tensor,
    state: torch.Tensor,
    codes: tuple[int, int, int],
) -> None:
    """Queue the merge of one tile: ``raw`` the staged inputs (base first, agents of one format
    at a regular stride in one buffer), ``lambdas`` (K, agents) float32, ``out`` (K, m) in the
    output's carrier, ``state`` (1 + K,) int64. ``codes``: base, agents, output."""
    agents_at, stride = layout(raw)
    grid = (triton.cdiv(m, BLOCK), out.shape[0])
    with on_device(raw[0]):
        ram_tile[grid](
            raw[0], agents_at, stride, m, lo, eps, lambdas, out, out.stride(0), state,
            N_AGENTS=len(raw) - 1, BASE=codes[0], AGENT=codes[1], OUT=codes[2], BLOCK=BLOCK, **EXACT,
        )  # fmt: skip


def on_device(tensor: torch.Tensor) -> AbstractContextManager[object]:
    """Launch on ``tensor``'s GPU (triton launches on the current device's current stream: the
    compute stream of the thread, as the torch ops)."""
    return torch.cuda.device(tensor.device) if tensor.is_cuda else nullcontext()


def layout(raw: list[torch.Tensor]) -> tuple[int, int]:
    """Byte offset of agent 0 from the base and between agents (the parts of one staged slot)."""
    start = raw[0].data_ptr()
    if len(raw) < 2:
        return 0, 0
    at = raw[1].data_ptr() - start
    stride = raw[2].data_ptr() - raw[1].data_ptr() if len(raw) > 2 else 0
    if any(r.data_ptr() - start != at + t * stride for t, r in enumerate(raw[1:])):
        raise ValueError("a fused kernel takes agents of one format, one after another in one staged buffer")
    return at, stride
