"""Exact sums of float32 products per vector of a tensor (row- and column-wise nuslerp's Gram).

The per-tensor format (``backends.exact_sum``, 2241 bins) is far too large to keep one per row of
a model. Products of two float32 values need much less: x = mx 2**ex and y = my 2**ey with
integer mantissas mx, my < 2**24 and exponents >= -149, so x y = (mx my) 2**(ex + ey) is an
integer below 2**48 times a power of two at least 2**-298, and below 2**256. An accumulator is
``DIGITS`` int64 digits, digit k weighing 2**(32 k + LOW): each product is split over three
adjacent digits (each part below 2**32), with the sign of x y; a block of fewer than 2**31
elements cannot overflow a digit. ``normalise`` then leaves digits 0 .. DIGITS - 2 in [0, 2**32)
and the signed rest in the top digit, a representation unique to the exact value, so partials
of any block split, thread count or backend are equal, add without overflow, and ``finish`` rounds
the exact total to float64 once. A NaN/Inf value counts as 0 (the kernels report it).

Which vector an element belongs to (``VectorLayout``): a tensor's element p is in vector
(p // div) % mod: rows (``div`` = the last dimension's length, ``mod`` = the number of rows) or
columns (``div`` = 1, ``mod`` = the number of columns, numel / shape[0]). A block addresses its
vectors relative to the vector of its first element, (vector(p) - vector(start)) mod ``mod``.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import numpy as np

DIGITS = 20
DIGIT_BITS = 32
LOW = -298  # the weight of digit 0's lowest bit: the smallest product of two float32 values


@dataclass(frozen=True)
class VectorLayout:
    """The vectors of a block: element i (tensor position start + i) is in block vector
    ``((start + i) // div % mod - (start // div) % mod) mod mod``, below ``count``."""

    start: int
    div: int
    mod: int
    count: int


def vector_layout(shape: tuple[int, ...], start: int, stop: int, row_wise: bool) -> VectorLayout:
    """The layout of the block ``[start, stop)`` of a tensor of ``shape``: mergekit's vectors
    along dim -1 (``row_wise`` False: each row) or along dim 0 (True: each column). A tensor
    of one dimension (or none) is one vector either way."""
    numel = math.prod(shape)
    if len(shape) < 2:
        return VectorLayout(start, max(numel, 1), 1, 1)
    if row_wise:
        columns = numel // shape[0]
        return VectorLayout(start, 1, columns, min(columns, stop - start))
    width = shape[-1]
    rows = numel // width
    return VectorLayout(start, width, rows, (stop - 1) // width - start // width + 1)


def vector_ids(layout: VectorLayout) -> np.ndarray:
    """int64 (count,): the tensor vector of each of the block's vectors."""
    first = layout.start // layout.div % layout.mod
    return (first + np.arange(layout.count, dtype=np.int64)) % layout.mod


def normalise(acc: np.ndarray) -> np.ndarray:
    """Accumulators (..., DIGITS) with each digit's carry moved up, the top digit signed."""
    out = np.array(acc, np.int64)
    for k in range(DIGITS - 1):
        carry = out[..., k] >> DIGIT_BITS
        out[..., k] -= carry << DIGIT_BITS
        out[..., k + 1] += carry
    return out


def finish(acc: np.ndarray) -> np.ndarray:
    """float64 (...,): each accumulator's exact value rounded once (``acc`` (..., DIGITS))."""
    flat = np.asarray(acc, np.int64).reshape(-1, DIGITS)
    out = np.empty(len(flat), np.float64)
    for r, digits in enumerate(flat.tolist()):
        total = 0
        for k in range(DIGITS - 1, -1, -1):
            total = (total << DIGIT_BITS) + digits[k]
        # an integer of at most a few hundred bits converts correctly rounded; the power of two
        # then scales exactly (the result is far from float64's subnormals)
        out[r] = math.ldexp(float(total), LOW)
    return out.reshape(np.shape(acc)[:-1])
