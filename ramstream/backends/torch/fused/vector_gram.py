"""The per-vector Gram sums of one tile in one Triton launch (``vector_gram``: the norms and dot
products of row- and column-wise nuslerp), with the numbers of the torch-op path
(``backends/torch/vectors.add_products``) and so of the Numba kernel.

Each element belongs to one vector of its tensor (``backends.vector_sums.VectorLayout``); every
product of two of the pair's vectors (the agents' task vectors, or the base and the agents'
weights) is split exactly into ``backends.vector_sums``' digits (``digits.py``) and added into
its vector's accumulator of the pair. A program whose elements all lie in one vector (rows longer
than a program: the usual case of row vectors) sums its parts per pair and digit before one atomic
each, as the agreement kernel does; a program spanning several vectors (columns: every element
its own) adds each product on its own, into accumulators that are then spread, not hot.
"""

from __future__ import annotations

import torch
import triton
import triton.language as tl

from ramstream.backends.torch.fused import codecs
from ramstream.backends.torch.fused.digits import add_each, add_rows, products
from ramstream.backends.torch.fused.ram import EXACT, NOWHERE, layout, on_device
from ramstream.backends.torch.fused.sums import gram_vector

BLOCK = 128  # elements per program: its (vectors, vectors, BLOCK) products


@triton.jit
def vector_gram_tile(
    base,  # uint8 pointer: the base's raw bytes; agent t's are at base + agents_at + t * agent_stride
    agents_at,
    agent_stride,
    m,
    lo,
    position,  # the tile's first element's position in its tensor
    div,  # the layout: element p of the tensor is in vector (p // div) % mod
    mod,
    first_vector,  # the vector of the block's first element: vectors count from it
    acc,  # int64 (count * pairs * DIGITS,): per block vector, the pairs (a <= b), DIGITS each
    first,  # int64 (1,): the first NaN/Inf value's position (min)
    N_VECTORS: tl.constexpr,
    VECTORS: tl.constexpr,  # N_VECTORS rounded up to a power of two
    BASE: tl.constexpr,
    AGENT: tl.constexpr,
    WEIGHTS: tl.constexpr,
    BLOCK: tl.constexpr,
):
    offsets = tl.program_id(0) * BLOCK + tl.arange(0, BLOCK)
    inside = offsets < m
    v = tl.arange(0, VECTORS)[:, None]
    mask = (v < N_VECTORS) & inside[None, :]
    b = codecs.decode(base, offsets, inside, BASE)
    x, odd = gram_vector(base, agents_at, agent_stride, v, offsets[None, :], mask, b[None, :], BASE, AGENT, WEIGHTS)
    odd = odd & mask
    found = tl.min(tl.min(tl.where(odd, offsets[None, :].to(tl.int64) + lo, NOWHERE), axis=1), axis=0)
    if found < NOWHERE:
        tl.atomic_min(first, found)
    x = tl.where(odd | ~mask, 0.0, x)
    vector = (position + offsets.to(tl.int64)) // div % mod - first_vector
    vector = tl.where(vector < 0, vector + mod, vector)  # the block's vectors count from its first
    a = tl.arange(0, VECTORS)[:, None]
    c = tl.arange(0, VECTORS)[None, :]
    n_pairs = N_VECTORS * (N_VECTORS + 1) // 2
    pair = a * N_VECTORS - (a * (a - 1)) // 2 + (c - a)  # the place of the pair (a, c), a <= c
    valid = (a <= c) & (c < N_VECTORS)
    digit, p0, p1, p2, nonzero = products(x[:, None, :], x[None, :, :])
    counted = nonzero & valid[:, :, None] & inside[None, None, :]
    lowest = tl.min(tl.where(inside, vector, mod))
    highest = tl.max(tl.where(inside, vector, -1))
    if lowest == highest:
        add_rows(acc, lowest * n_pairs + pair, digit, p0, p1, p2, counted, 2)
    else:
        rows = vector[None, None, :] * n_pairs + pair[:, :, None]
        add_each(acc, rows, digit, p0, p1, p2, counted)


def vector_gram_launch(
    raw: list[torch.Tensor], m: int, lo: int, position: int, div: int, mod: int, first_vector: int,
    acc: torch.Tensor, first: torch.Tensor, codes: tuple[int, int], weights: bool,
) -> None:  # fmt: skip
    """Queue one tile's per-vector Gram sums into ``acc`` (count * pairs * DIGITS,) int64 and
    ``first`` (1,) int64, added to what they hold; ``position`` is the tile's first element's place
    in its tensor, ``div``, ``mod`` and ``first_vector`` the block's layout."""
    agents_at, stride = layout(raw)
    n_vectors = len(raw) - 1 + (1 if weights else 0)
    with on_device(raw[0]):
        vector_gram_tile[(triton.cdiv(m, BLOCK),)](
            raw[0], agents_at, stride, m, lo, position, div, mod, first_vector, acc, first, N_VECTORS=n_vectors,
            VECTORS=triton.next_power_of_2(n_vectors), BASE=codes[0], AGENT=codes[1], WEIGHTS=weights, BLOCK=BLOCK,
            **EXACT,
        )  # fmt: skip
