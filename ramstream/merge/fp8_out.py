"""Merged tensors written back in the base's FP8 scheme (``--out-dtype fp8``).

A tensor the base stores as FP8 with scales is written the same way, in the base's own layout:
DeepSeek's ``_scale_inv`` per bm x bn block, or compressed-tensors' ``_scale`` per block, per
channel (a block of 1 x cols) or per tensor (a block of rows x cols). Its merged float32 values, a
block of the plan at a time (blocks hold whole bands of bm rows, so every scale's elements are in
one block; a per-tensor scale's band is the whole tensor), get a scale per block, f32(max |v|)
divided by the format's largest finite value (448 for E4M3, 57344 for E5M2; 1 for an all-zero
block), and each value is written as fp8(f32(v / scale)), rounded to nearest, ties to even
(``blocks.quantized.quantize_bands``, the one place that arithmetic lives). The scales go to the
base's scale tensor (its name, dtype and shape), their rows written with the block's bytes, so a
block is still written whole at its offsets and a resumed merge writes the same bytes.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from ramstream.blocks.quantized import quantize_bands
from ramstream.format import codecs
from ramstream.format.checkpoint import QuantRef
from ramstream.format.dtypes import FLOAT_CODES, ITEMSIZE
from ramstream.io.writer import Run, ShardWriter
from ramstream.plan import Block


@dataclass(frozen=True)
class Fp8Tensor:
    """A tensor written in FP8 as the base stores it: its name and 2-D shape, the block one scale
    covers, the FP8 dtype, and its scale tensor's name, shape and dtype (the base's)."""

    name: str
    shape: tuple[int, ...]
    block: tuple[int, int]
    dtype: str
    scale_name: str
    scale_shape: tuple[int, ...]
    scale_dtype: str

    @classmethod
    def like(cls, ref: QuantRef) -> Fp8Tensor:
        """Written as the base stores ``ref``: the same FP8 format, scale name, shape and dtype."""
        scale = ref.scale.entry
        return cls(ref.name, ref.shape, ref.block, ref.weight.entry.dtype, scale.name, scale.shape, scale.dtype)

    @property
    def scale_cols(self) -> int:
        return -(-self.shape[1] // self.block[1])

    @property
    def scale_nbytes(self) -> int:
        return -(-self.shape[0] // self.block[0]) * self.scale_cols * ITEMSIZE[self.scale_dtype]

    def bands(self, block: Block) -> tuple[int, int]:
        """The bands of scales (rows of the scale tensor as a 2-D grid) a plan block covers (it
        starts at a band)."""
        band = self.block[0] * self.shape[1]
        return block.start // band, -(-block.stop // band)


def runs(writer: ShardWriter, tensor: Fp8Tensor, block: Block) -> list[Run]:
    """The block's two runs: its FP8 bytes (one an element) and its rows of scales."""
    first, last = tensor.bands(block)
    itemsize = ITEMSIZE[tensor.scale_dtype]
    scale_bytes = itemsize * tensor.scale_cols
    return [
        writer.run_of(tensor.name, block.start, block.size, 1),
        writer.run_of(tensor.scale_name, first * scale_bytes, (last - first) * scale_bytes, itemsize),
    ]


def quantize_into(tensor: Fp8Tensor, values: np.ndarray, codes: np.ndarray, scales: np.ndarray) -> None:
    """Write the block's FP8 codes into ``codes`` and its scales into ``scales`` (staged bytes)."""
    quantized, scale_rows = quantize_bands(values, tensor.shape[1], tensor.block, tensor.dtype, tensor.scale_dtype)
    codes[:] = quantized
    raw = codecs.encode(scale_rows.reshape(-1), FLOAT_CODES[tensor.scale_dtype]).view(np.uint8)
    scales[: raw.size] = raw  # a following block's bytes may share the run
