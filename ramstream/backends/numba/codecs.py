"""Decode BF16/F16/F32/F64 tiles to float32 and encode float32 back, bit-exactly.

A tile lives in a ``uint32`` scratch buffer ``bits``; ``bits.view(float32)`` is its value.
Every input and output reaches the codecs as an address (int64) and a format code, never as a
typed array: ``decode_at`` and ``encode_at`` each compile once, for every format, and a kernel
that calls them carries no copy of a codec per carrier type. (Typed carriers compiled every
codec three times, once per uint16/float32/float64 view, and each kernel once per base dtype:
most of a first run's compile time.) Branches on the format code sit outside the element loops
so the loops vectorise. F32 -> BF16 and F32 -> F16 round to nearest, ties to even (as numpy's
and torch's casts).

``TAU32`` is an input, not a format: a float32 task vector held in memory (a LoRA agent's update,
``format.lora``). It decodes like F32, and a kernel forms its task vector as ``value - under[i]``
with ``under = minus(code, base_vals, zeros)``: the base for a weight, +0.0 for a task vector
(x - 0.0 is x, bit for bit), so that each kernel's arithmetic stays one expression.
"""

from __future__ import annotations

import numpy as np
from numba import carray, njit

from ramstream.backends.numba.addresses import voidptr

BF16 = 0
F16 = 1
F32 = 2
F64 = 3
TAU32 = 4  # ``format.dtypes.TAU32``

TILE = 2048  # elements per tile: a multiple of 64 that keeps scratch rows in L1/L2
ITEMSIZES = np.array([2, 2, 4, 8, 4], np.int64)  # bytes per element, by format code (TAU32 last)

_F16_TO_F32_SCALE = np.float32(2.0**112)


@njit(cache=True, nogil=True)
def decode_at(address, lo, m, code, bits):  # type: ignore[no-untyped-def]
    """Decode elements [lo, lo + m) of the raw block at ``address`` (format ``code``) into
    ``bits.view(float32)[:m]``."""
    vals = bits.view(np.float32)
    if code == BF16:
        half = carray(voidptr(address + 2 * lo), m, np.uint16)
        for i in range(m):
            bits[i] = np.uint32(half[i]) << np.uint32(16)
    elif code == F16:
        half = carray(voidptr(address + 2 * lo), m, np.uint16)
        for i in range(m):
            bits[i] = (np.uint32(half[i]) & np.uint32(0x7FFF)) << np.uint32(13)
        for i in range(m):
            vals[i] = vals[i] * _F16_TO_F32_SCALE
        for i in range(m):
            h = np.uint32(half[i])
            sign = (h & np.uint32(0x8000)) << np.uint32(16)
            special = sign | np.uint32(0x7F800000) | ((h & np.uint32(0x3FF)) << np.uint32(13))
            bits[i] = special if (h & np.uint32(0x7C00)) == np.uint32(0x7C00) else bits[i] | sign
    elif code == F64:
        wide = carray(voidptr(address + 8 * lo), m, np.float64)
        for i in range(m):
            vals[i] = np.float32(wide[i])
    else:  # F32, TAU32
        single = carray(voidptr(address + 4 * lo), m, np.uint32)
        for i in range(m):
            bits[i] = single[i]


@njit(cache=True, nogil=True)
def encode_at(bits, address, lo, m, code):  # type: ignore[no-untyped-def]
    """Encode ``bits.view(float32)[:m]`` into elements [lo, lo + m) of the raw block at
    ``address`` in format ``code``."""
    vals = bits.view(np.float32)
    if code == BF16:
        half = carray(voidptr(address + 2 * lo), m, np.uint16)
        for i in range(m):
            b = bits[i]
            quiet_nan = (b >> np.uint32(16)) | np.uint32(0x40)
            rounded = (b + np.uint32(0x7FFF) + ((b >> np.uint32(16)) & np.uint32(1))) >> np.uint32(16)
            is_nan = (b & np.uint32(0x7FFFFFFF)) > np.uint32(0x7F800000)
            half[i] = np.uint16(quiet_nan if is_nan else rounded)
    elif code == F16:
        half = carray(voidptr(address + 2 * lo), m, np.uint16)
        for i in range(m):
            half[i] = _f32_bits_to_f16(bits[i], vals[i])
    elif code == F64:
        wide = carray(voidptr(address + 8 * lo), m, np.float64)
        for i in range(m):
            wide[i] = vals[i]
    else:
        single = carray(voidptr(address + 4 * lo), m, np.uint32)
        for i in range(m):
            single[i] = bits[i]


@njit(inline="always", cache=True)
def minus(code, base_vals, zeros):  # type: ignore[no-untyped-def]
    """What an input's task vector subtracts: the base's values, or ``zeros`` (a float32 tile of
    +0.0) for an input that is a task vector already (``TAU32``)."""
    return zeros if code == TAU32 else base_vals


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


def address(array: np.ndarray) -> int:
    """The address of a C-contiguous array's data, as the kernels take their blocks."""
    if not array.flags.c_contiguous:
        raise ValueError("a kernel reads and writes C-contiguous blocks only")
    return int(array.ctypes.data)


def decode_array(raw: np.ndarray, code: int) -> np.ndarray:
    """Decode a whole (small) array to float32: for tests and the mixed-dtype fallback."""
    raw = np.ascontiguousarray(raw)
    out = np.empty(raw.shape[0], np.float32)
    _decode_all(address(raw), raw.shape[0], code, out.view(np.uint32))
    return out


def encode_array(values: np.ndarray, code: int, out: np.ndarray) -> None:
    """Encode a float32 array into ``out`` (uint16 for BF16/F16, float32 for F32, float64 for F64)."""
    bits = np.ascontiguousarray(values, np.float32).view(np.uint32)
    _encode_all(bits, values.shape[0], code, address(out))


@njit(cache=True, nogil=True)
def _decode_all(source, n, code, bits):  # type: ignore[no-untyped-def]
    for lo in range(0, n, TILE):
        decode_at(source, lo, min(TILE, n - lo), code, bits[lo:])


@njit(cache=True, nogil=True)
def _encode_all(bits, n, code, target):  # type: ignore[no-untyped-def]
    for lo in range(0, n, TILE):
        encode_at(bits[lo:], target, lo, min(TILE, n - lo), code)
