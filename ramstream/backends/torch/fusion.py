"""arcee_fusion on a tile, as ``backends/numba/fusion.py`` defines it: d = b - a and the
importance |d| * scale[row] in float32 (one rounding per operation), its bit patterns for the
histograms, and the merge a + d * m with m = 1 where the importance reaches the threshold."""

from __future__ import annotations

import torch

from ramstream.backends.base import RowScale
from ramstream.backends.torch import codecs
from ramstream.format.dtypes import TAU32


class Importance:
    """The importance of a block's tiles: ``rows`` over the block (``scale``: their scales, on the
    device already), the inputs' ``codes`` (base, agent)."""

    def __init__(self, rows: RowScale, scale: torch.Tensor, codes: list[int], device: torch.device) -> None:
        self.scale = scale
        self.row_len, self.offset = rows.row_len, rows.offset
        self.codes = codes
        self.device = device

    def __call__(self, raw: list[torch.Tensor], lo: int, m: int) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
        """(a, d, importance) of the tile of ``m`` elements at block position ``lo``."""
        base, agent = (codecs.decode(r, c) for r, c in zip(raw, self.codes, strict=True))
        if self.codes[1] == TAU32:  # an agent given as its task vector: its weights, base + tau in float32
            agent = base + agent
        d = agent - base
        position = torch.arange(self.offset + lo, self.offset + lo + m, dtype=torch.int64, device=self.device)
        return base, d, d.abs() * self.scale[position // self.row_len]


def bits(importance: torch.Tensor) -> torch.Tensor:
    """int32 (1, m): the importance's bit patterns, sign bit cleared (their order is the values')."""
    return (importance.view(torch.int32) & 0x7FFFFFFF).unsqueeze(0)


def merge(base: torch.Tensor, d: torch.Tensor, importance: torch.Tensor, threshold: torch.Tensor) -> torch.Tensor:
    """a + d * m, m = 1.0 where importance >= threshold, else 0.0 (a NaN importance too)."""
    one = torch.ones((), dtype=torch.float32, device=base.device)
    zero = torch.zeros((), dtype=torch.float32, device=base.device)
    return base + d * torch.where(importance >= threshold, one, zero)
