"""Per-vector arithmetic of row- and column-wise nuslerp on a tile, as ``backends/numba/vectors.py``.

``add_products`` splits each exact product of two float32 values over three digits of its power
of two (``backends.vector_sums``) and adds them with ``index_add_``: integer additions, exact in
any order, so the accumulators equal the Numba kernel's once normalised. ``merge_vectors`` is one
rounding per torch op, from +0.0, in the kernel's order (see ``merges``: float32 tensors, never a
fused op).
"""

from __future__ import annotations

from collections.abc import Sequence

import torch

from ramstream.backends.vector_sums import DIGIT_BITS, DIGITS, LOW

LOW32 = 0xFFFFFFFF


def block_vectors(positions: torch.Tensor, div: int, mod: int, start: int) -> torch.Tensor:
    """int64: the block vector of each tensor position (``vector_sums.VectorLayout``)."""
    first = start // div % mod
    return torch.remainder(torch.div(positions, div, rounding_mode="floor") % mod - first, mod)


def _mantissas(values: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """(integer mantissa, exponent) of finite float32 values, int64: value = mantissa * 2**exponent."""
    bits = values.view(torch.int32).to(torch.int64)
    field = (bits >> 23) & 0xFF
    mantissa = bits & 0x7FFFFF
    normal = field != 0
    return torch.where(normal, mantissa | 0x800000, mantissa), torch.where(normal, field - 150, -149)


def add_products(acc: torch.Tensor, x: torch.Tensor, y: torch.Tensor, slots: torch.Tensor) -> None:
    """Add each exact product x[i] y[i] (finite float32) into the accumulator ``slots[i]`` of
    ``acc`` (flat int64, DIGITS per accumulator)."""
    mx, ex = _mantissas(x)
    my, ey = _mantissas(y)
    product = mx * my  # below 2**48: exact
    shift = ex + ey - LOW
    k, r = shift >> 5, shift & 31
    low = (product & LOW32) << r  # below 2**63
    high = (product >> DIGIT_BITS) << r  # below 2**47
    sign = torch.where((x.view(torch.int32) ^ y.view(torch.int32)) < 0, -1, 1)
    where = slots * DIGITS + k
    acc.index_add_(0, where, (low & LOW32) * sign)
    acc.index_add_(0, where + 1, ((low >> DIGIT_BITS) + (high & LOW32)) * sign)
    acc.index_add_(0, where + 2, (high >> DIGIT_BITS) * sign)


def merge_vectors(
    base: torch.Tensor,
    agents: Sequence[torch.Tensor],
    unders: Sequence[torch.Tensor],
    coefs: torch.Tensor,
    which: torch.Tensor,
    weights: bool,
) -> torch.Tensor:
    """``merge_vectors_block``'s element: ``agents`` are weights (``weights``; a task vector given
    as one already added to the base) or the agents whose task vectors are ``agent - under``."""
    picked = coefs[which]  # (m, K) float32: each element's coefficients
    total = torch.zeros_like(base)
    if weights:
        total = total + picked[:, 0] * base
        for t, agent in enumerate(agents):
            total = total + picked[:, 1 + t] * agent
        return total
    for t, (agent, under) in enumerate(zip(agents, unders, strict=True)):
        tau = agent - under
        total = total + picked[:, t] * tau
    return base + total
