"""A LoRA agent's task vector over one block, computed from its factors (``format.lora``).

A block is a flat element range [start, stop) of a tensor W (rows x cols); it covers rows
start // cols to (stop - 1) // cols. Each element is computed in the order ``format.lora``
defines, whatever the block: delta[i, j] = float32(sum_k L[i, k] * R[k, j]) * float32(scale), the
products rounded to float32 and added in k order from +0.0 (numpy float32 ufuncs, one rounding
each, no fused multiply-add), where L = B (rows x r) and R = A (r x cols), or, when the tensor
stores the transpose (``transposed``), L = A^T and R = B^T. An element's value therefore never
depends on the block or on which backend reads it.

Only what the block needs is read: the rows of L it covers (for A^T: those columns of A, one run
per k), and R whole (r x cols: the factor on the layer's input side, small). Elements are
computed ``CHUNK`` at a time into the block's float32 output, so the temporary stays small; the
output itself is the agent's decoded input, which the plan's budget already counts.
"""

from __future__ import annotations

from collections.abc import Callable

import numpy as np

from ramstream.format import codecs
from ramstream.format.checkpoint import DeltaRef, TensorRef
from ramstream.format.dtypes import FLOAT_CODES
from ramstream.io.reader import InputFiles

CHUNK = 1 << 18  # elements computed at a time

# product(left (rows, r), right (r, cols), scale, out (rows * cols,), zeroed): out <- (left @ right)
# * scale in the order above. A backend may give a faster one with the same bits (Backend.lora_product).
Product = Callable[[np.ndarray, np.ndarray, np.float32, np.ndarray], None]


def numpy_product(left: np.ndarray, right: np.ndarray, scale: np.float32, out: np.ndarray) -> None:
    """out <- (left @ right) * scale, as the module docstring orders it (``out`` flat, zeroed):
    numpy, one thread, r passes over the chunk."""
    acc = out.reshape(left.shape[0], right.shape[1])
    term = np.empty_like(acc)
    for k in range(left.shape[1]):
        np.multiply(left[:, k : k + 1], right[k : k + 1, :], out=term)
        np.add(acc, term, out=acc)
    np.multiply(acc, scale, out=acc)


def delta_block(
    ref: DeltaRef, files: InputFiles, start: int, stop: int, product: Product = numpy_product
) -> np.ndarray:
    """float32 (stop - start,): elements [start, stop) of ``ref``'s task vector (zeros for a tensor
    the adapter leaves alone), each piece computed by ``product``."""
    out = np.zeros(stop - start, np.float32)
    a, b = ref.a, ref.b
    if a is None or b is None or stop <= start:
        return out
    cols = ref.shape[1]
    first, last = start // cols, (stop - 1) // cols + 1
    left = _left(a, b, ref.transposed, files, first, last)  # (last - first, r)
    right = np.ascontiguousarray(
        _read(files, b).reshape(cols, -1).T if ref.transposed else _read(files, a).reshape(-1, cols)
    )
    scale = np.float32(ref.scale)
    at = start
    while at < stop:
        i, j = divmod(at, cols)
        if j == 0 and stop - at >= cols and cols <= CHUNK:  # whole rows
            n_rows = min((stop - at) // cols, CHUNK // cols)
            piece = (i, i + n_rows, 0, cols)
        else:  # part of a row
            piece = (i, i + 1, j, min(cols, j + stop - at, j + CHUNK))
        r0, r1, c0, c1 = piece
        size = (r1 - r0) * (c1 - c0)
        columns = np.ascontiguousarray(right[:, c0:c1]) if c1 - c0 < cols else right
        product(left[r0 - first : r1 - first], columns, scale, out[at - start : at - start + size])
        at += size
    return out


def _left(a: TensorRef, b: TensorRef, transposed: bool, files: InputFiles, first: int, last: int) -> np.ndarray:
    """Rows [first, last) of L: rows of B, or (transposed) columns of A, one run per k."""
    if not transposed:
        rank = b.entry.shape[1]
        return _read(files, b, first * rank, last * rank).reshape(last - first, rank)
    rank, width = a.entry.shape
    runs = [_read(files, a, k * width + first, k * width + last) for k in range(rank)]
    return np.stack(runs, axis=1) if runs else np.zeros((last - first, 0), np.float32)


def _read(files: InputFiles, ref: TensorRef, start: int = 0, stop: int | None = None) -> np.ndarray:
    """Elements [start, stop) of a factor, decoded to float32 (a copy); its mapped pages released."""
    stop = ref.entry.numel if stop is None else stop
    values = codecs.decode(files.float_view(ref, start, stop), FLOAT_CODES[ref.entry.dtype])  # a new array
    files.release(ref, start, stop)
    return values
