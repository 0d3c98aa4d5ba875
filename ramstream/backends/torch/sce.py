"""SCE's tile arithmetic, as ``backends/numba/sce.py`` defines it: the variance key (Welford in
float64, rounded to float32 once) and the merge (one rounding per torch op, never a fused op;
per-agent constants are device tensors, as in ``merges.py``)."""

from __future__ import annotations

from collections.abc import Sequence

import torch

from ramstream.backends.torch.magnitude import kept_by_cuts

MIN_DIVISOR = 1e-6


def variance(taus: Sequence[torch.Tensor]) -> torch.Tensor:
    """float32: the population variance of the ``taus`` (float32, agent order) per element."""
    mean = torch.zeros(taus[0].shape, dtype=torch.float64, device=taus[0].device)
    m2 = torch.zeros_like(mean)
    for t, tau in enumerate(taus):
        count = torch.full((), float(t + 1), dtype=torch.float64, device=tau.device)
        x = tau.to(torch.float64)
        d = x - mean
        mean = mean + d / count
        m2 = m2 + d * (x - mean)
    return (m2 / torch.full((), float(len(taus)), dtype=torch.float64, device=m2.device)).to(torch.float32)


def merge_sce(
    base: torch.Tensor,
    taus: Sequence[torch.Tensor],
    position: torch.Tensor,
    values: list[int],
    ranges: list[list[int]],
    weights: torch.Tensor,
) -> torch.Tensor:
    """base + the weighted mean of the kept tau that agree with the elected sign (divisor >= 1e-6)."""
    zero = torch.zeros((), dtype=torch.float32, device=base.device)
    floor = torch.full((), MIN_DIVISOR, dtype=torch.float32, device=base.device)
    kept = kept_by_cuts(variance(taus).view(torch.int32), position, values, ranges)
    rows = [torch.where(kept, tau, zero) for tau in taus]
    total = torch.zeros_like(base)
    for row in rows:
        total = total + row
    plus = total >= zero
    minus = ~plus  # a NaN sum elects minus, as mergekit's (sum >= 0) * 2 - 1
    mixed = torch.zeros_like(base)
    divisor = torch.zeros_like(base)
    for t, row in enumerate(rows):
        counts = ((row > zero) & plus) | ((row < zero) & minus)
        mixed = mixed + torch.where(counts, row * weights[t], zero)
        divisor = divisor + torch.where(counts, weights[t], zero)
    divisor = torch.where(divisor >= floor, divisor, floor)
    return base + mixed / divisor
