"""Exact sums of float32 products in ``backends.vector_sums``' digits, inside a Triton program.

A product of two float32 values is an integer below 2^48 times a power of two: ``products`` splits
it, in integer arithmetic (no float multiply), into three signed parts below 2^32 of adjacent
int64 digits, as ``backends/torch/vectors.add_products`` does. Integer additions are exact in any
grouping, so ``add_rows`` first sums a program's parts per accumulator and per digit (over the
few digits its products reach; the others are skipped) and only then adds each sum with one
atomic: the same numbers as adding every element on its own, without every element of a block
hitting the same few addresses. Used by the agreement kernel (``agreement.py``) and the per-vector
Gram sums (``vector_gram.py``).
"""

from __future__ import annotations

import triton
import triton.language as tl

from ramstream.backends.vector_sums import DIGIT_BITS, DIGITS, LOW

N_DIGITS: tl.constexpr = tl.constexpr(DIGITS)
LOWEST: tl.constexpr = tl.constexpr(LOW)
HALF: tl.constexpr = tl.constexpr(DIGIT_BITS)
LOW32: tl.constexpr = tl.constexpr(0xFFFFFFFF)


@triton.jit
def _mantissa(values):
    """(integer mantissa, exponent) of finite float32 ``values``, int64: value = mantissa * 2^exponent."""
    bits = values.to(tl.int32, bitcast=True).to(tl.int64)
    field = (bits >> 23) & 0xFF
    mantissa = bits & 0x7FFFFF
    normal = field != 0
    return tl.where(normal, mantissa | 0x800000, mantissa), tl.where(normal, field - 150, -149)


@triton.jit
def products(x, y):
    """Each exact product x y (finite float32, +0.0 where it adds nothing) as the digit of its
    lowest part and its three parts, signed (``vectors.add_products``)."""
    mx, ex = _mantissa(x)
    my, ey = _mantissa(y)
    product = mx * my  # below 2^48: exact
    shift = ex + ey - LOWEST
    digit = shift >> 5
    r = shift & 31
    low = (product & LOW32) << r  # below 2^63
    high = (product >> HALF) << r  # below 2^47
    negative = (x.to(tl.int32, bitcast=True) ^ y.to(tl.int32, bitcast=True)) < 0
    sign = tl.where(negative, -1, 1).to(tl.int64)
    parts0 = (low & LOW32) * sign
    parts1 = ((low >> HALF) + (high & LOW32)) * sign
    parts2 = (high >> HALF) * sign
    return digit, parts0, parts1, parts2, product != 0


@triton.jit
def add_rows(acc, rows, digit, parts0, parts1, parts2, counted, AXIS: tl.constexpr):
    """Add the products' parts into the accumulators ``rows`` (shaped as the block without its
    ``AXIS``, the elements' axis) where ``counted``: per digit the block reaches, one sum and one
    atomic per accumulator and part."""
    lowest = tl.min(tl.where(counted, digit, N_DIGITS))
    highest = tl.max(tl.where(counted, digit, -1))
    for q in range(N_DIGITS):  # products of similar size reach two or three digits
        if (q >= lowest) & (q <= highest):
            at = counted & (digit == q)
            where = acc + rows * N_DIGITS + q
            total = tl.sum(tl.where(at, parts0, 0), axis=AXIS)
            tl.atomic_add(where, total, mask=total != 0, sem="relaxed")
            total = tl.sum(tl.where(at, parts1, 0), axis=AXIS)
            tl.atomic_add(where + 1, total, mask=total != 0, sem="relaxed")
            total = tl.sum(tl.where(at, parts2, 0), axis=AXIS)
            tl.atomic_add(where + 2, total, mask=total != 0, sem="relaxed")


@triton.jit
def add_each(acc, rows, digit, parts0, parts1, parts2, counted):
    """Add every product's parts on its own into its accumulator ``rows`` (the block's shape):
    for products spread over many accumulators, where a sum per program would be no fewer atomics."""
    where = acc + rows * N_DIGITS + digit
    tl.atomic_add(where, parts0, mask=counted & (parts0 != 0), sem="relaxed")
    tl.atomic_add(where + 1, parts1, mask=counted & (parts1 != 0), sem="relaxed")
    tl.atomic_add(where + 2, parts2, mask=counted & (parts2 != 0), sem="relaxed")
