"""The merge arithmetic of one tile, in float32, in the Numba kernels' order (``merge_ram.py``,
``gta.py``, ``linear.py`` in ``backends/numba``): one rounding per torch op, never a fused op.

Each line is one elementwise op, so nothing can be contracted into a fused multiply-add (torch
runs each op as its own kernel); per-agent constants are float32 tensors on the device, never
Python scalars, because a CUDA division by a CPU scalar is computed as a multiplication by its
reciprocal. Sums start from +0.0 and add every agent's term in agent order, zeros included, as
the kernels do. ``unders[t]`` is what agent t's task vector subtracts: the base, or +0.0 for an
input that is a task vector already (``codecs.minus``).
"""

from __future__ import annotations

from collections.abc import Sequence

import torch

ZERO = 0.0
MIN_DISTANCE = 1e-6  # nearswap: |base - agent| is raised to this (as float32)


def active(tau: torch.Tensor, eps: torch.Tensor) -> torch.Tensor:
    """eps < |tau| < Inf, compared in float32 (a NaN/Inf tau is inactive)."""
    magnitude = tau.abs()
    return (magnitude > eps) & (magnitude < torch.inf)


def ram_counts(
    base: torch.Tensor, agents: Sequence[torch.Tensor], unders: Sequence[torch.Tensor], eps: torch.Tensor
) -> tuple[torch.Tensor, torch.Tensor]:
    """RAM's per-element sum of the active tau (in agent order) and count of active agents."""
    zero = torch.zeros((), dtype=torch.float32, device=base.device)
    total = torch.zeros_like(base)
    count = torch.zeros_like(base)
    for agent, under in zip(agents, unders, strict=True):
        tau = agent - under
        on = active(tau, eps)
        total = total + torch.where(on, tau, zero)
        count = count + on.to(torch.float32)
    return total, count


def merge_ram(
    base: torch.Tensor,
    agents: Sequence[torch.Tensor],
    unders: Sequence[torch.Tensor],
    eps: torch.Tensor,
    lambdas: torch.Tensor,
    counts: tuple[torch.Tensor, torch.Tensor],
) -> torch.Tensor:
    """base; base + lambda_t tau_t where only t is active; base + (sum of active tau) / c, with
    ``counts`` from ``ram_counts`` (shared by the K outputs of one read: only the lambdas differ)."""
    zero = torch.zeros((), dtype=torch.float32, device=base.device)
    one = torch.ones((), dtype=torch.float32, device=base.device)
    total, count = counts
    scaled = torch.zeros_like(base)
    for t, (agent, under) in enumerate(zip(agents, unders, strict=True)):
        tau = agent - under
        scaled = scaled + torch.where(active(tau, eps), lambdas[t] * tau, zero)
    mean = total / torch.maximum(count, one)
    merged = torch.where(count == one, scaled, torch.where(count >= 2.0, mean, zero))
    return base + merged


def weighted_deltas(
    agent: torch.Tensor, under: torch.Tensor, weight: torch.Tensor, scale: torch.Tensor, keep: torch.Tensor | None
) -> tuple[torch.Tensor, torch.Tensor | None]:
    """``weight * sparse`` and where the element survives (None: wherever the caller says), as
    ``gta._weighted_deltas``: a keep multiplier k gives ``weight * (((agent - under) * k) * s)``."""
    tau = agent - under
    if keep is None:
        return weight * (tau * scale), None
    k = keep.to(torch.float32)
    return weight * ((tau * k) * scale), k != 0


def mix_gta(
    base: torch.Tensor,
    deltas: Sequence[tuple[torch.Tensor, torch.Tensor | None]],
    weights: torch.Tensor,
    consensus: str,
    normalize: bool,
    total_weight: torch.Tensor,
) -> torch.Tensor:
    """The mixed delta (divided by the divisor with ``normalize``), as ``gta.gta_merge_block``;
    output k is ``base + lams[k] * mixed``."""
    zero = torch.zeros((), dtype=torch.float32, device=base.device)
    one = torch.ones((), dtype=torch.float32, device=base.device)
    rows = [d if alive is None else torch.where(alive, d, zero) for d, alive in deltas]
    mixed = torch.zeros_like(base)
    if consensus == "none":
        for row in rows:
            mixed = mixed + row
        divisor = total_weight
    else:
        majority = torch.zeros_like(base)
        for row in rows:
            majority = majority + (row if consensus == "sum" else torch.sign(row))
        divisor = torch.zeros_like(base)
        positive, negative = majority >= zero, majority < zero  # a NaN majority is neither
        for t, row in enumerate(rows):
            kept = ((row > zero) & positive) | ((row < zero) & negative)
            mixed = mixed + torch.where(kept, row, zero)
            divisor = divisor + torch.where(kept, weights[t], zero)
        divisor = torch.where(divisor == zero, one, divisor)
    return mixed / divisor if normalize else mixed


def merge_linear(
    base: torch.Tensor | None,
    base_weight: torch.Tensor,
    agents: Sequence[torch.Tensor],
    weights: torch.Tensor,
    divisor: torch.Tensor | None,
) -> torch.Tensor:
    """(w0 base + sum_t w_t agent_t) from +0.0, divided by ``divisor`` when one is given; ``base``
    None: its weight is 0 and it takes no part."""
    total = torch.zeros_like(agents[0])
    if base is not None:
        total = total + base_weight * base
    for t, agent in enumerate(agents):
        total = total + weights[t] * agent
    return total / divisor if divisor is not None else total


def merge_nearswap(base: torch.Tensor, agent: torch.Tensor, t: torch.Tensor) -> torch.Tensor:
    """NearSwap, as ``nearswap.merge_nearswap_block``: w = (1 / max(|a - b|, 1e-6)) * t, then
    lowered to 1 and raised to +0.0 (``where``, so a NaN stays NaN as in the kernel), and
    w b + (1 - w) a."""
    zero = torch.zeros((), dtype=torch.float32, device=base.device)
    one = torch.ones((), dtype=torch.float32, device=base.device)
    floor = torch.full((), MIN_DISTANCE, dtype=torch.float32, device=base.device)
    distance = (base - agent).abs()
    distance = torch.where(distance < floor, floor, distance)
    weight = (one / distance) * t
    weight = torch.where(weight < zero, zero, weight)
    weight = torch.where(weight > one, one, weight)
    return weight * agent + (one - weight) * base
