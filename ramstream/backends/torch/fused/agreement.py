"""The agreement of every pair of agents over one tile in one Triton launch, with the numbers of
``backends/torch/agreement.py`` and so of the Numba kernel (``backends.agreement``'s layout).

Each product of two float32 values is split exactly into three int64 digits of
``backends.vector_sums`` (``digits.py``), which a program sums per accumulator and digit before
one integer atomic each: every element of the block would otherwise add into the same few hundred
addresses, the hottest atomics a kernel can have. The counts (both active, same sign) are summed
per program too.
"""

from __future__ import annotations

import torch
import triton
import triton.language as tl

from ramstream.backends.torch.fused import codecs
from ramstream.backends.torch.fused.digits import add_rows, products
from ramstream.backends.torch.fused.ram import EXACT, layout, on_device

BLOCK = 128  # elements per program: its (agents, agents, BLOCK) products


@triton.jit
def agreement_tile(
    base,  # uint8 pointer: the base's raw bytes; agent t's are at base + agents_at + t * agent_stride
    agents_at,
    agent_stride,
    m,
    eps,  # float32
    acc,  # int64 (sum_rows(N_AGENTS) * DIGITS,): the accumulators, DIGITS each
    counts,  # int64 (pairs, 2): both active, same sign
    N_AGENTS: tl.constexpr,
    AGENTS: tl.constexpr,  # N_AGENTS rounded up to a power of two
    BASE: tl.constexpr,
    AGENT: tl.constexpr,
    BLOCK: tl.constexpr,
):
    """Per block of BLOCK elements and AGENTS agents: the task vectors, who is active (eps < |tau|
    < Inf), the shared elements (two or more active), then every accumulator's exact products and
    every pair's counts, each summed in the program before its atomic."""
    offsets = tl.program_id(0) * BLOCK + tl.arange(0, BLOCK)
    inside = offsets < m
    agent = tl.arange(0, AGENTS)
    is_agent = (agent < N_AGENTS)[:, None]
    mask = is_agent & inside[None, :]
    b = codecs.decode(base, offsets, inside, BASE)
    a = codecs.decode(base + agents_at + agent[:, None] * agent_stride, offsets[None, :], mask, AGENT)
    tau = codecs.task_vector(a, b[None, :], AGENT)
    on = (tl.abs(tau) > eps) & ~codecs.nonfinite(tau) & mask  # NaN/Inf tau: inactive
    x = tl.where(on, tau, 0.0)
    shared = (tl.sum(on.to(tl.int32), axis=0) >= 2)[None, :]
    n_pairs = N_AGENTS * (N_AGENTS - 1) // 2
    # every agent's squares over its unique elements, then over its shared ones
    digit, p0, p1, p2, nonzero = products(x, x)
    add_rows(acc, 3 * n_pairs + 2 * agent, digit, p0, p1, p2, nonzero & ~shared, 1)
    add_rows(acc, 3 * n_pairs + 2 * agent + 1, digit, p0, p1, p2, nonzero & shared, 1)
    # every pair: tau_i tau_j, tau_i^2 and tau_j^2 over the elements active in both
    i = agent[:, None]
    j = agent[None, :]
    valid = (i < N_AGENTS) & (j < N_AGENTS)
    pair = i * N_AGENTS - (i * (i + 1)) // 2 + (j - i - 1)  # the place of the pair (i, j), i < j
    swapped = j * N_AGENTS - (j * (j + 1)) // 2 + (i - j - 1)  # of the pair (j, i), j < i
    upper = valid & (i < j)
    both = on[:, None, :] & on[None, :, :]
    xi = tl.where(both, x[:, None, :], 0.0)
    digit, p0, p1, p2, nonzero = products(xi, tl.where(both, x[None, :, :], 0.0))
    add_rows(acc, 3 * pair, digit, p0, p1, p2, nonzero & upper[:, :, None], 2)
    # tau_i^2 over both: the pair's second sum where i < j, its third where j < i
    digit, p0, p1, p2, nonzero = products(xi, xi)
    square_row = tl.where(i < j, 3 * pair + 1, 3 * swapped + 2)
    add_rows(acc, square_row, digit, p0, p1, p2, nonzero & (valid & (i != j))[:, :, None], 2)
    signs = tau.to(tl.int32, bitcast=True) < 0
    agree = both & (signs[:, None, :] == signs[None, :, :])
    both_count = tl.sum(both.to(tl.int64), axis=2)
    agree_count = tl.sum(agree.to(tl.int64), axis=2)
    tl.atomic_add(counts + 2 * pair, both_count, mask=upper & (both_count != 0), sem="relaxed")
    tl.atomic_add(counts + 2 * pair + 1, agree_count, mask=upper & (agree_count != 0), sem="relaxed")


def agreement_launch(
    raw: list[torch.Tensor], m: int, eps: float, acc: torch.Tensor, counts: torch.Tensor,
    codes: tuple[int, int],
) -> None:  # fmt: skip
    """Queue one tile's agreement into ``acc`` (sum_rows * DIGITS,) and ``counts`` (pairs, 2),
    both int64, added to what they hold; ``eps`` a float32 number."""
    agents_at, stride = layout(raw)
    n_agents = len(raw) - 1
    with on_device(raw[0]):
        agreement_tile[(triton.cdiv(m, BLOCK),)](
            raw[0], agents_at, stride, m, float(eps), acc, counts, N_AGENTS=n_agents,
            AGENTS=triton.next_power_of_2(n_agents), BASE=codes[0], AGENT=codes[1], BLOCK=BLOCK, **EXACT,
        )  # fmt: skip
