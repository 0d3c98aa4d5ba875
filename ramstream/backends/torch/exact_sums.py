"""Exact sums on the device, in the ``backends.exact_sum`` format.

Each group of 64 elements (aligned in the tensor) is summed in float64 in element order from
+0.0, as ``backends/numba/exact_stats.py`` does: the groups of a tile are summed side by side,
one column at a time, so every group's additions keep their order (a torch ``sum`` would not).
A tail group shorter than 64 is padded with +0.0, which changes no sum (a sum from +0.0 is never
-0.0). Each group sum goes into the int64 bin of its power of two (``frexp``: the Numba kernels'
split), cut in a low 32-bit part and a high part added 32 bins up, so that adding a tile's
values in any order cannot overflow; ``exact_sum.renormalised`` then gives the Numba backend's
accumulator.
"""

from __future__ import annotations

import torch

from ramstream.backends.exact_sum import BINS, CARRY_BITS, OFFSET

GROUP = 64


def group_sums(values: torch.Tensor) -> torch.Tensor:
    """float64 (R, ceil(m / 64)): each row's groups of 64 values, summed in order from +0.0."""
    rows, m = values.shape
    groups = -(-m // GROUP)
    padded = torch.zeros((rows, groups * GROUP), dtype=torch.float64, device=values.device)
    padded[:, :m] = values
    columns = padded.view(rows, groups, GROUP)
    sums = torch.zeros((rows, groups), dtype=torch.float64, device=values.device)
    for j in range(GROUP):
        sums = sums + columns[:, :, j]
    return sums


def product_group_sums(x: torch.Tensor, y: torch.Tensor) -> torch.Tensor:
    """``group_sums`` of x * y, each product of two float32 values exact in float64."""
    return group_sums(x.to(torch.float64) * y.to(torch.float64))


def accumulate(acc: torch.Tensor, sums: torch.Tensor) -> None:
    """Add float64 ``sums`` (R, G) exactly into the rows of ``acc`` (R, BINS + 1) int64."""
    rows = sums.shape[0]
    mantissa, exponent = torch.frexp(sums)
    units = (mantissa * 2.0**53).to(torch.int64)  # an integer: the mantissa times 2**53
    first = torch.arange(rows, device=sums.device).unsqueeze(1) * (BINS + 1)
    where = first + (exponent.to(torch.int64) + (OFFSET - 53))
    flat = acc.view(-1)
    flat.index_add_(0, where.reshape(-1), (units & 0xFFFFFFFF).reshape(-1))
    flat.index_add_(0, (where + CARRY_BITS).reshape(-1), (units >> CARRY_BITS).reshape(-1))
