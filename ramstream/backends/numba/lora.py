"""A LoRA agent's update over one piece of a block, ``blocks.lora``'s product, on all cores.

out[i, j] = float32(sum_k left[i, k] * right[k, j]) * float32(scale): each product rounded to
float32 and added in k order to a float32 accumulator starting at +0.0 (no fused multiply-add:
Numba compiles without fast-math, so LLVM keeps the multiply and the add apart), then scaled.
The bits are those of ``blocks.lora.numpy_product``; only the speed differs. Work is split into
(4 rows x 1024 columns) pieces, a balanced range of them per thread: the four accumulators stay in L1 while
each row of ``right``'s tile is read once for the four (numpy instead makes r passes over the
whole chunk, one thread).
"""

from __future__ import annotations

import numpy as np
from numba import njit

from ramstream.backends.numba.workers import run_parts

COLUMNS = 1024  # of a piece: its accumulators (4 x 4 KiB) stay in L1
ROWS = 4  # of a piece: each value of ``right`` read serves four rows


def lora_product(left, right, scale, out, workers=1) -> None:  # type: ignore[no-untyped-def]
    """``out`` (flat) <- (left @ right) * scale, its pieces shared by ``workers`` threads."""
    run_parts(_lora_product_part, workers, left, right, scale, out)


@njit(nogil=True, cache=True, error_model="numpy")
def _lora_product_part(left, right, scale, out, w, workers):  # type: ignore[no-untyped-def]
    rows, rank = left.shape
    cols = right.shape[1]
    tiles = (cols + COLUMNS - 1) // COLUMNS
    groups = (rows + ROWS - 1) // ROWS
    pieces = groups * tiles
    acc = np.zeros((ROWS, COLUMNS), np.float32)
    for piece in range(pieces * w // workers, pieces * (w + 1) // workers):
        first = (piece // tiles) * ROWS
        c0 = (piece % tiles) * COLUMNS
        width = min(cols, c0 + COLUMNS) - c0
        count = min(ROWS, rows - first)
        for q in range(ROWS):
            acc[q, :] = np.float32(0.0)
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
