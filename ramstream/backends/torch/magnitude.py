"""Magnitude statistics of one tile, as ``backends/numba/magnitude.py`` defines them: histograms
of the bit patterns of |tau| (exact integer counts) and keep masks from cuts. Integer work only,
after one float32 subtraction per element.

Histograms count into one flat ``bincount`` per tile: an element that a histogram must not count
goes to an extra bin past the end, which is dropped, so no boolean indexing (and no wait for the
device) is needed.
"""

from __future__ import annotations

import torch

from ramstream.backends.base import HIGH_BINS, LOW_BINS


def abs_bits(agent: torch.Tensor, base: torch.Tensor) -> torch.Tensor:
    """int32 bit patterns of |agent - base| (float32): their order is the values' order."""
    return (agent - base).view(torch.int32) & 0x7FFFFFFF


def high_counts(bits: torch.Tensor) -> torch.Tensor:
    """int64 (N, HIGH_BINS): per agent row of ``bits`` (N, m), elements per high half."""
    n_agents = bits.shape[0]
    rows = torch.arange(n_agents, device=bits.device).unsqueeze(1) * HIGH_BINS
    flat = (rows + (bits >> 16)).reshape(-1)
    return torch.bincount(flat, minlength=n_agents * HIGH_BINS).view(n_agents, HIGH_BINS)


def low_counts(bits: torch.Tensor, target: int) -> torch.Tensor:
    """int64 (LOW_BINS,): the low halves of the elements of ``bits`` (m,) whose high half is ``target``."""
    flat = torch.where((bits >> 16) == target, bits & 0xFFFF, LOW_BINS)
    return torch.bincount(flat, minlength=LOW_BINS + 1)[:LOW_BINS]


def in_lower(bits: torch.Tensor, position: torch.Tensor, value: int, begin: int, end: int) -> torch.Tensor:
    """A cut's lower set: bits < value, or bits == value at block positions [begin, end) (``bits``
    int64: a cut value may be 0xFFFFFFFF)."""
    ties = (bits == value) & (position >= begin) & (position < end)
    return (bits < value) | ties
