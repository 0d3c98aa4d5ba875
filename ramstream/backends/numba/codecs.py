"""Decode BF16/F16/F32/F64 tiles to float32 and encode float32 back, bit-exactly.

A tile lives in a ``uint32`` scratch buffer ``bits``; ``bits.view(float32)`` is its value.
Branches on the format code sit outside the element loops so the loops vectorise. The tile
functions are called, not inlined: a call per 2048-element tile costs nothing measurable, and
inlining them into every call site made the kernels' first compile 35-55 % slower.
F32 -> BF16 and F32 -> F16 round to nearest, ties to even (as numpy's and torch's casts).

``TAU32`` is an input, not a format: a float32 task vector held in memory (a LoRA agent's update,
``format.lora``). It decodes like F32, and a kernel forms its task vector as ``value - under[i]``
with ``under = minus(code, base_vals, zeros)``: the base for a weight, +0.0 for a task vector
(x - 0.0 is x, bit for bit), so that each kernel's arithmetic stays one expression.
"""

from __future__ import annotations

import numpy as np
from numba import njit

BF16 = 0
F16 = 1
F32 = 2
F64 = 3
TAU32 = 4  # ``format.dtypes.TAU32``

TILE = 2048  # elements per tile: a multiple of 64 that keeps scratch rows in L1/L2

_F16_TO_F32_SCALE = np.float32(2.0**112)


@njit(cache=True)
def decode_tile(raw, lo, m, code, bits):  # type: ignore[no-untyped-def]
    """Decode ``raw[lo:lo+m]`` (format ``code``) into ``bits.view(float32)[:m]``."""
    src = raw[lo : lo + m]  # a slice with known bounds lets LLVM vectorise the loops
    vals = bits.view(np.float32)
    if code == BF16:
        for i in range(m):
            bits[i] = np.uint32(src[i]) << np.uint32(16)
    elif code == F16:
        for i in range(m):
            bits[i] = (np.uint32(src[i]) & np.uint32(0x7FFF)) << np.uint32(13)
        for i in range(m):
            vals[i] = vals[i] * _F16_TO_F32_SCALE
        for i in range(m):
            h = np.uint32(src[i])
            sign = (h & np.uint32(0x8000)) << np.uint32(16)
            special = sign | np.uint32(0x7F800000) | ((h & np.uint32(0x3FF)) << np.uint32(13))
            bits[i] = special if (h & np.uint32(0x7C00)) == np.uint32(0x7C00) else bits[i] | sign
    else:
        for i in range(m):
            vals[i] = np.float32(src[i])


@njit(cache=True)
def encode_tile(bits, lo, m, code, out):  # type: ignore[no-untyped-def]
    """Encode ``bits.view(float32)[:m]`` into ``out[lo:lo+m]`` in format ``code``."""
    dst = out[lo : lo + m]
    vals = bits.view(np.float32)
    if code == BF16:
        for i in range(m):
            b = bits[i]
            quiet_nan = (b >> np.uint32(16)) | np.uint32(0x40)
            rounded = (b + np.uint32(0x7FFF) + ((b >> np.uint32(16)) & np.uint32(1))) >> np.uint32(16)
            is_nan = (b & np.uint32(0x7FFFFFFF)) > np.uint32(0x7F800000)
            dst[i] = np.uint16(quiet_nan if is_nan else rounded)
    elif code == F16:
        for i in range(m):
            dst[i] = _f32_bits_to_f16(bits[i], vals[i])
    else:
        for i in range(m):
            dst[i] = vals[i]


@njit(cache=True)
def decode_bytes(raw, lo, m, code, bits):  # type: ignore[no-untyped-def]
    """``decode_tile`` for raw bytes (a ``uint8`` row read from a file), viewed by format."""
    if code == F32 or code == TAU32:
        decode_tile(raw.view(np.float32), lo, m, code, bits)
    elif code == F64:
        decode_tile(raw.view(np.float64), lo, m, code, bits)
    else:
        decode_tile(raw.view(np.uint16), lo, m, code, bits)


@njit(inline="always", cache=True)
def minus(code, base_vals, zeros):  # type: ignore[no-untyped-def]
    """What an input's task vector subtracts: the base's values, or ``zeros`` (a float32 tile of
    +0.0) for an input that is a task vector already (``TAU32``)."""
    return zeros if code == TAU32 else base_vals


@njit(cache=True)
def encode_bytes(bits, lo, m, code, out):  # type: ignore[no-untyped-def]
    """``encode_tile`` into raw bytes (``out`` a ``uint8`` view of the output), viewed by format."""
    if code == F32:
        encode_tile(bits, lo, m, code, out.view(np.float32))
    elif code == F64:
        encode_tile(bits, lo, m, code, out.view(np.float64))
    else:
        encode_tile(bits, lo, m, code, out.view(np.uint16))


@njit(inline="always", cache=True)
def _f32_bits_to_f16(b, value):  # type: ignore[no-untyped-def]
    sign = np.uint32((b >> np.uint32(16)) & np.uint32(0x8000))
    ab = b & np.uint32(0x7FFFFFFF)
    if ab >= np.uint32(0x7F800000):  # inf or nan
        mant = (ab >> np.uint32(13)) & np.uint32(0x3FF)
        if ab > np.uint32(0x7F800000):
            mant = mant | np.uint32(0x200)
        return np.uint16(sign | np.uint32(0x7C00) | mant)
    if ab < np.uint32(0x38800000):  # below the smallest normal f16: subnormal or zero
        scaled = np.float32(abs(value) * np.float32(16777216.0))  # exact: times 2**24
        return np.uint16(sign | np.uint32(np.rint(scaled)))
    m = ab - np.uint32(0x38000000)  # rebias exponent 127 -> 15
    rounded = (m + np.uint32(0xFFF) + ((m >> np.uint32(13)) & np.uint32(1))) >> np.uint32(13)
    if rounded >= np.uint32(0x7C00):
        rounded = np.uint32(0x7C00)
    return np.uint16(sign | rounded)


@njit(cache=True)
def decode_array(raw, code):  # type: ignore[no-untyped-def]
    """Decode a whole (small) array to float32: for tests and the mixed-dtype fallback."""
    n = raw.shape[0]
    out = np.empty(n, np.float32)
    bits = np.empty(TILE, np.uint32)
    vals = bits.view(np.float32)
    for lo in range(0, n, TILE):
        m = min(TILE, n - lo)
        decode_tile(raw, lo, m, code, bits)
        for i in range(m):
            out[lo + i] = vals[i]
    return out


@njit(cache=True)
def encode_array(values, code, out):  # type: ignore[no-untyped-def]
    """Encode a float32 array into ``out`` (uint16 for BF16/F16, float32 for F32)."""
    n = values.shape[0]
    bits = np.empty(TILE, np.uint32)
    vals = bits.view(np.float32)
    for lo in range(0, n, TILE):
        m = min(TILE, n - lo)
        for i in range(m):
            vals[i] = values[lo + i]
        encode_tile(bits, lo, m, code, out)
