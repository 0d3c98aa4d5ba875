"""A LoRA agent's update over one piece of a block, ``blocks.lora``'s product, on all cores.

out[i, j] = float32(sum_k left[i, k] * right[k, j]) * float32(scale): each product rounded to
float32 and added in k order to a float32 accumulator starting at +0.0 (no fused multiply-add:
Numba compiles without fast-math, so LLVM keeps the multiply and the add apart), then scaled.
The bits are those of ``blocks.lora.numpy_product``; only the speed differs: rows are split
between threads and each row is computed a column tile at a time, so its accumulator stays in
L1 and the tile of ``right`` in L2 across the rank's k.
"""

from __future__ import annotations

from numba import njit, prange

COLUMN_TILE = 1024


@njit(parallel=True, nogil=True, cache=True, error_model="numpy")
def lora_product(left, right, scale, out):  # type: ignore[no-untyped-def]
    rows, rank = left.shape
    cols = right.shape[1]
    tiles = (cols + COLUMN_TILE - 1) // COLUMN_TILE
    for piece in prange(rows * tiles):
        i = piece // tiles
        c0 = (piece % tiles) * COLUMN_TILE
        c1 = min(cols, c0 + COLUMN_TILE)
        at = i * cols
        for k in range(rank):
            weight = left[i, k]
            for j in range(c0, c1):
                out[at + j] += weight * right[k, j]
        for j in range(c0, c1):
            out[at + j] *= scale
