"""Merged tensors written back in the base's FP8 scheme (``--out-dtype fp8``).

A tensor the base stores as FP8 with a ``_scale_inv`` per bm x bn block is written the same way:
its merged float32 values, a block of the plan at a time (blocks hold whole bands of bm rows, so
every scale's elements are in one block), get a scale per bm x bn block, f32(max |v|) divided by
the format's largest finite value (448 for E4M3; 1 for an all-zero block), and each value is
written as fp8(f32(v / scale)), rounded to nearest, ties to even (``blocks.quantized``). The
scales go to ``<name>_scale_inv`` (float32), their rows written with the block's bytes, so a
block is still written whole at its offsets and a resumed merge writes the same bytes.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from ramstream.blocks.quantized import quantize_bands
from ramstream.io.writer import Run, ShardWriter
from ramstream.plan import Block

SCALE_SUFFIX = "_scale_inv"


@dataclass(frozen=True)
class Fp8Tensor:
    """A tensor written in FP8: its name and 2-D shape, the block one scale covers, the FP8 dtype."""

    name: str
    shape: tuple[int, ...]
    block: tuple[int, int]
    dtype: str

    @property
    def scale_cols(self) -> int:
        return -(-self.shape[1] // self.block[1])

    def bands(self, block: Block) -> tuple[int, int]:
        """The bands of scales (rows of ``_scale_inv``) a plan block covers (it starts at a band)."""
        band = self.block[0] * self.shape[1]
        return block.start // band, -(-block.stop // band)


def runs(writer: ShardWriter, tensor: Fp8Tensor, block: Block) -> list[Run]:
    """The block's two runs: its FP8 bytes (one an element) and its rows of scales (float32)."""
    first, last = tensor.bands(block)
    scale_bytes = 4 * tensor.scale_cols
    return [
        writer.run_of(tensor.name, block.start, block.size, 1),
        writer.run_of(tensor.name + SCALE_SUFFIX, first * scale_bytes, (last - first) * scale_bytes, 4),
    ]


def quantize_into(tensor: Fp8Tensor, values: np.ndarray, codes: np.ndarray, scales: np.ndarray) -> None:
    """Write the block's FP8 codes into ``codes`` and its scales into ``scales`` (staged bytes)."""
    quantized, scale_rows = quantize_bands(values, tensor.shape[1], tensor.block, tensor.dtype)
    codes[:] = quantized
    raw = scale_rows.reshape(-1).view(np.uint8)
    scales[: raw.size] = raw  # a following block's bytes may share the run
