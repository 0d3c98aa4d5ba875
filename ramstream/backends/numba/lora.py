"""A LoRA agent's update over one piece of a block, ``blocks.lora``'s product, on all cores.

out[i, j] = float32(sum_k left[i, k] * right[k, j]) * float32(scale): each product rounded to
float32 and added in k order to a float32 accumulator starting at +0.0 (no fused multiply-add:
Numba compiles without fast-math, so LLVM keeps the multiply and the add apart), then scaled.
The bits are those of ``blocks.lora.numpy_product``; only the speed differs. Work is split into
(4 rows x 1024 columns) pieces, one per thread at a time: the four accumulators stay in L1 while
each row of ``right``'s tile is read once for the four (numpy instead makes r passes over the
whole chunk, one thread).
"""

from __future__ import annotations

import numpy as np
from numba import njit, prange

COLUMNS = 1024  # of a piece: its accumulators (4 x 4 KiB) stay in L1
ROWS = 4  # of a piece: each value of ``right`` read serves four rows


@njit(parallel=True, nogil=True, cache=True, error_model="numpy")
def lora_product(left, right, scale, out):  # type: ignore[no-untyped-def]
    rows, rank = left.shape
    cols = right.shape[1]
    tiles = (cols + COLUMNS - 1) // COLUMNS
    groups = (rows + ROWS - 1) // ROWS
    for piece in prange(groups * tiles):
        first = (piece // tiles) * ROWS
        c0 = (piece % tiles) * COLUMNS
        width = min(cols, c0 + COLUMNS) - c0
        count = min(ROWS, rows - first)
        acc = np.zeros((ROWS, COLUMNS), np.float32)
        for k in range(rank):
            values = right[k, c0 : c0 + width]
            for q in range(count):
                weight = left[first + q, k]
                row = acc[q]
                for j in range(width):
                    row[j] += weight * values[j]
        for q in range(count):
            at = (first + q) * cols + c0
            target = out[at : at + width]
            row = acc[q]
            for j in range(width):
                target[j] = row[j] * scale
