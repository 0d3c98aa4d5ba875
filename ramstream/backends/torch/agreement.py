"""Agreement of every pair of agents over a tile, as ``backends/numba/agreement.py``.

Inactive elements enter the exact sums as +0.0 (whose product adds nothing), so a tile needs no
gather; counts are integer sums. Everything stays on the device until the block's end.
"""

from __future__ import annotations

from collections.abc import Sequence

import torch

from ramstream.backends.torch.vectors import add_products


def accumulate(
    acc: torch.Tensor, counts: torch.Tensor, taus: torch.Tensor, eps: torch.Tensor, pairs: Sequence[tuple[int, int]]
) -> None:
    """Add a tile's agreement into ``acc`` (flat int64, DIGITS per accumulator) and ``counts``
    (int64 (P, 2)); ``taus`` (N, m) float32 task vectors."""
    size = taus.abs()
    on = (size > eps) & (size < float("inf"))  # NaN/Inf tau: inactive
    zero = taus.new_zeros(())
    shared = on.sum(0) >= 2
    first = 3 * len(pairs)
    for t in range(taus.shape[0]):
        x = torch.where(on[t], taus[t], zero)
        add_products(acc, x, x, torch.where(shared, first + 2 * t + 1, first + 2 * t))
    signs = taus.view(torch.int32) < 0
    for p, (a, b) in enumerate(pairs):
        both = on[a] & on[b]
        x, y = torch.where(both, taus[a], zero), torch.where(both, taus[b], zero)
        counts[p, 0] += both.sum()
        counts[p, 1] += (both & (signs[a] == signs[b])).sum()
        slot = torch.full_like(both, 3 * p, dtype=torch.int64)
        add_products(acc, x, y, slot)
        add_products(acc, x, x, slot + 1)
        add_products(acc, y, y, slot + 2)
