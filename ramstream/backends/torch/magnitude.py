"""Magnitude statistics of one tile, as ``backends/numba/magnitude.py`` defines them: histograms
of the bit patterns of |tau| (exact integer counts) and keep masks from cuts. Integer work only,
after one float32 subtraction per element.

Histograms are scatter-adds into one flat count buffer per worker (``torch.bincount`` waits for
the device twice per call and reduces twice more). No bin is hot: an element a histogram must
not count goes to one of ``SPREAD`` dummy bins past the end, chosen by its position, and the
elements whose |tau| is exactly 0 (most of a sparse task vector) are counted by a reduction, not
by a scatter of millions of ones onto one address.
"""

from __future__ import annotations

import torch

from ramstream.backends.base import HIGH_BINS, LOW_BINS


def abs_bits(agent: torch.Tensor, under: torch.Tensor) -> torch.Tensor:
    """int32 bit patterns of |agent - under| (float32; ``under`` the base, or 0 for a task vector,
    ``codecs.minus``): their order is the values' order."""
    return (agent - under).view(torch.int32) & 0x7FFFFFFF


SPREAD = 1024  # dummy bins past a flat histogram's end


def add_high_counts(flat: torch.Tensor, bits: torch.Tensor) -> None:
    """Add to ``flat`` (int64, N * HIGH_BINS + SPREAD: agent t's bins at t * HIGH_BINS) the high
    halves of ``bits`` (N, m) int32, agent by row."""
    n_agents, m = bits.shape
    device = bits.device
    rows = torch.arange(n_agents, device=device).unsqueeze(1) * HIGH_BINS
    zero = bits == 0
    dummy = n_agents * HIGH_BINS + torch.arange(m, device=device) % SPREAD
    index = torch.where(zero, dummy.unsqueeze(0), rows + (bits >> 16).to(torch.int64))
    flat.scatter_add_(0, index.reshape(-1), torch.ones(n_agents * m, dtype=torch.int64, device=device))
    flat.index_add_(0, rows[:, 0], zero.sum(dim=1))


def add_low_counts(flat: torch.Tensor, bits: torch.Tensor, agents: torch.Tensor, targets: torch.Tensor) -> None:
    """Add to ``flat`` (int64, N * C * LOW_BINS + SPREAD: agent t's cut c at (t * C + c) * LOW_BINS)
    the low halves of the elements of ``bits`` (K, m) int32 whose high half is their cut's target:
    row k is agent ``agents[k]`` (int64 (K,)), whose targets are ``targets[k]`` (int32 (K, C); -1
    matches nothing). Every agent and cut in one scatter."""
    k, m = bits.shape
    n_cuts = targets.shape[1]
    device = bits.device
    match = (bits >> 16).unsqueeze(1) == targets.unsqueeze(2)  # (K, C, m)
    zero = match & (bits == 0).unsqueeze(1)
    first_bin = (agents.unsqueeze(1) * n_cuts + torch.arange(n_cuts, device=device).unsqueeze(0)) * LOW_BINS
    dummy = flat.shape[0] - SPREAD + torch.arange(m, device=device) % SPREAD
    index = torch.where(match & ~zero, first_bin.unsqueeze(2) + (bits & 0xFFFF).to(torch.int64).unsqueeze(1), dummy)
    flat.scatter_add_(0, index.reshape(-1), torch.ones(k * n_cuts * m, dtype=torch.int64, device=device))
    flat.index_add_(0, first_bin.reshape(-1), zero.sum(dim=2).reshape(-1))


def kept_by_cuts(
    bits: torch.Tensor, position: torch.Tensor, values: list[int], ranges: list[list[int]]
) -> torch.Tensor:
    """bool: in cut 1's lower set and not in cut 0's, for one agent's |tau| ``bits`` (int32) at
    block ``position``s, its cuts' ``values`` (2,) and tie ``ranges`` (2, 2)."""
    wide = bits.to(torch.int64)
    (v0, v1), ((a0, e0), (a1, e1)) = values, ranges
    return in_lower(wide, position, v1, a1, e1) & ~in_lower(wide, position, v0, a0, e0)


def in_lower(bits: torch.Tensor, position: torch.Tensor, value: int, begin: int, end: int) -> torch.Tensor:
    """A cut's lower set: bits < value, or bits == value at block positions [begin, end) (``bits``
    int64: a cut value may be 0xFFFFFFFF)."""
    ties = (bits == value) & (position >= begin) & (position < end)
    return (bits < value) | ties
