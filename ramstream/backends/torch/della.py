"""DELLA's MAGPRUNE keep values of one tile of whole slices, as ``backends/numba/della.py``.

Within a slice (``rows x inner`` elements), the elements ranked together are those that share
their index along the dimensions after dim 1: a view (slices, rows, inner) sorted along dim 1,
stably (ties: lower index first), gives each element its rank; p = lo + (rank / (rows - 1)) *
width in float32, and the element survives where the counter-RNG draw of its tensor position is
below p.
"""

from __future__ import annotations

import torch

from ramstream.backends.base import KEEP_EVERYTHING, PRUNE
from ramstream.backends.torch.rng import uniform


def keep_values(
    magnitude_bits: torch.Tensor,
    position: torch.Tensor,
    slice_size: int,
    rows: int,
    key: int,
    mode: int,
    lo: torch.Tensor,
    width: torch.Tensor,
    inverse: bool,
) -> torch.Tensor:
    """float32 (m,): 0 where dropped, 1 (or 1/p with ``inverse``) where kept. ``magnitude_bits``
    int32 (m,) bit patterns of |tau|, m a whole number of slices; ``position`` int64 (m,), the
    elements' positions in their tensor."""
    device = magnitude_bits.device
    if mode != PRUNE:
        fill = 1.0 if mode == KEEP_EVERYTHING else 0.0
        return torch.full(magnitude_bits.shape, fill, dtype=torch.float32, device=device)
    grouped = magnitude_bits.view(-1, rows, slice_size // rows)
    order = torch.sort(grouped, dim=1, stable=True).indices
    rank = torch.arange(rows, dtype=torch.float32, device=device)
    if rows > 1:
        norm = rank / torch.full((), rows - 1, dtype=torch.float32, device=device)  # a fill, not a copy from the host
    else:
        norm = torch.full_like(rank, 0.5)
    p_of_rank = lo + norm * width  # (rows,)
    p = torch.empty_like(grouped, dtype=torch.float32)
    p.scatter_(1, order, p_of_rank.view(1, rows, 1).expand_as(grouped).contiguous())
    p = p.view(-1)
    survives = uniform(key, position) < p
    one = torch.ones((), dtype=torch.float32, device=device)
    kept = one / p if inverse else torch.ones_like(p)
    return torch.where(survives, kept, torch.zeros((), dtype=torch.float32, device=device))
