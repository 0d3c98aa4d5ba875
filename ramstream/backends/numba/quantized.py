"""An FP8 weight's elements dequantized on all cores, ``blocks.quantized``'s ``Dequantize``.

One pass per element: the FP8 byte's float32 value from the 256-entry table, times its block's
float32 scale (one multiply; Numba compiles without fast-math, so there is no fused
multiply-add to contract it into), then encoded into the output's carrier by the backend's codecs
(``codecs.encode_at``: a copy for F32, the rounding to nearest even for BF16/F16). The bytes are
those of ``blocks.quantized.numpy_dequantize``; only the speed differs. Each thread takes a
balanced range of the elements and walks it by row and by column block, so the scale is looked up
once per run of ``bn`` columns and no element costs an integer division. One signature for every
FP8 format, block shape and output code: the codes and the output are passed by address.
"""

from __future__ import annotations

import numpy as np
from numba import carray, njit

from ramstream.backends.numba.addresses import voidptr
from ramstream.backends.numba.codecs import TILE, address, encode_at
from ramstream.backends.numba.workers import run_parts


def dequantize(codes, table, scales, offset, cols, bm, bn, out, out_code, workers=1) -> None:  # type: ignore[no-untyped-def]
    """``out`` (the raw carrier of ``out_code``) <- encode(table[codes] * scale): ``codes[k]`` is the
    element at flat position ``offset + k`` of rows whose band 0 has the scales ``scales[0]``
    (``blocks.quantized.ScaledCodes``)."""
    flat = np.ascontiguousarray(scales, np.float32).reshape(-1)
    run_parts(
        _dequantize_part, workers, address(codes), int(codes.size), np.ascontiguousarray(table, np.float32), flat,
        int(scales.shape[1]), int(offset), int(cols), int(bm), int(bn), address(out), int(out_code),
    )  # fmt: skip


@njit(nogil=True, cache=True, error_model="numpy")
def _dequantize_part(codes, n, table, scales, scale_cols, offset, cols, bm, bn, out, out_code, w, workers):  # type: ignore[no-untyped-def]
    lo, hi = n * w // workers, n * (w + 1) // workers
    if lo >= hi:
        return
    raw = carray(voidptr(codes), n, np.uint8)
    bits = np.empty(TILE, np.uint32)
    vals = bits.view(np.float32)
    row = (offset + lo) // cols
    col = offset + lo - row * cols
    in_band = row % bm  # the row's place in its band of bm rows
    band = (row // bm) * scale_cols  # the band's first scale
    block = col // bn  # the column block: its scale applies up to ``block_end``
    block_end = min(cols, (block + 1) * bn)
    for t0 in range(lo, hi, TILE):
        m = min(TILE, hi - t0)
        i = 0
        while i < m:
            k = min(m - i, block_end - col)
            scale = scales[band + block]
            src, dst = raw[t0 + i : t0 + i + k], vals[i : i + k]
            for j in range(k):
                dst[j] = table[src[j]] * scale
            i += k
            col += k
            if col == block_end:
                block += 1
                if col == cols:
                    col, block = 0, 0
                    in_band += 1
                    if in_band == bm:
                        in_band = 0
                        band += scale_cols
                block_end = min(cols, col + bn)
        encode_at(bits, out, t0, m, out_code)
