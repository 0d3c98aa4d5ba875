"""The probe of one tile, as ``backends/numba/probe.py``: active masks bit-packed (little bit
order), overlap and coverage counts, and where the first NaN/Inf input is, all without reading
anything back from the device (the counts and that position stay there until the block ends)."""

from __future__ import annotations

from collections.abc import Sequence

import torch

from ramstream.backends.torch.merges import active

NOWHERE = 1 << 62  # "no non-finite value": larger than any position


def actives(unders: Sequence[torch.Tensor], agents: Sequence[torch.Tensor], eps: torch.Tensor) -> torch.Tensor:
    """bool (N, m): eps < |agent - under| < Inf (``under``: the base, or 0 for a task vector)."""
    return torch.stack([active(agent - under, eps) for agent, under in zip(agents, unders, strict=True)])


def pack(on: torch.Tensor) -> torch.Tensor:
    """uint8 (N, ceil(m / 8)): bit i % 8 of byte i // 8 is element i, zero past m."""
    n_agents, m = on.shape
    padded = torch.zeros((n_agents, -(-m // 8) * 8), dtype=torch.uint8, device=on.device)
    padded[:, :m] = on
    # 1, 2, 4... made on the device (a host list would be a copy, and a wait, per tile)
    weights = torch.ones(8, dtype=torch.int32, device=on.device) << torch.arange(8, dtype=torch.int32, device=on.device)
    return (padded.view(n_agents, -1, 8).to(torch.int32) * weights).sum(dim=2, dtype=torch.int32).to(torch.uint8)


def counts(on: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """int64 overlap (N, N): [t, k-1] elements where t and exactly k agents are active, and
    coverage (N+1,): [k] elements where exactly k agents are active (integer sums of masks: exact,
    and no atomics). One k at a time: an (N, m) temporary, never (N, N, m), so many agents stay
    within the tile's budget."""
    n_agents = on.shape[0]
    count = on.sum(dim=0)  # int64 (m,)
    coverage = torch.stack([(count == k).sum() for k in range(n_agents + 1)])
    overlap = torch.stack([(on & (count == k)).sum(dim=1) for k in range(1, n_agents + 1)], dim=1)
    return overlap, coverage


def first_nonfinite(values: Sequence[torch.Tensor]) -> torch.Tensor:
    """int64 0-d: the first position where any of ``values`` is NaN/Inf, or ``NOWHERE``."""
    bad = ~torch.isfinite(values[0])
    for v in values[1:]:
        bad = bad | ~torch.isfinite(v)
    first = torch.argmax(bad.to(torch.uint8))  # the first maximum
    return torch.where(bad.any(), first, NOWHERE)  # a reduction, not an index: no wait for the device
