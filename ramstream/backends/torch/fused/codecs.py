"""The codecs of ``backends/numba/codecs.py`` as Triton element functions, in integer ops.

``decode(pointer, offsets, mask, CODE)`` loads the elements ``offsets`` of a raw input (a uint8
pointer to its first byte) and gives their float32 values; ``encode(values, CODE)`` gives the
output format's carrier (int16 bits for BF16/F16, float32, float64); ``nonfinite(bits)`` says
where a float32 bit pattern is NaN/Inf. BF16 and F16 decode by shifting bit patterns (an F16
subnormal is its mantissa times 2^-24, exact: no subnormal float32 is ever an operand), and
encode with round-to-nearest-even done on the bit patterns, so that nothing depends on how the
hardware converts NaN payloads or flushes subnormals: the bits of the Numba codecs and of
``backends/torch/codecs.py`` for every pattern. F64 converts through the hardware (round to
nearest even; a NaN's payload may differ, as documented for the torch backend).
"""

from __future__ import annotations

import triton
import triton.language as tl

BF16: tl.constexpr = tl.constexpr(0)
F16: tl.constexpr = tl.constexpr(1)
F32: tl.constexpr = tl.constexpr(2)
F64: tl.constexpr = tl.constexpr(3)
TAU32: tl.constexpr = tl.constexpr(4)  # a float32 task vector in memory: decodes as F32

EXPONENT: tl.constexpr = tl.constexpr(0x7F800000)


@triton.jit
def decode(raw, offsets, mask, CODE: tl.constexpr):
    """float32 values of elements ``offsets`` of the input at ``raw`` (uint8 pointer); 0 where
    ``mask`` is false."""
    if CODE == BF16:
        half = tl.load(raw.to(tl.pointer_type(tl.uint16)) + offsets, mask=mask, other=0)
        values = (half.to(tl.uint32) << 16).to(tl.float32, bitcast=True)
    elif CODE == F16:
        half = tl.load(raw.to(tl.pointer_type(tl.uint16)) + offsets, mask=mask, other=0).to(tl.uint32)
        values = _decode_f16(half)
    elif CODE == F64:
        values = tl.load(raw.to(tl.pointer_type(tl.float64)) + offsets, mask=mask, other=0.0).to(tl.float32)
    else:  # F32, TAU32
        bits = tl.load(raw.to(tl.pointer_type(tl.uint32)) + offsets, mask=mask, other=0)
        values = bits.to(tl.float32, bitcast=True)
    return values


@triton.jit
def _decode_f16(h):
    sign = (h & 0x8000) << 16
    exponent = h & 0x7C00
    mantissa = h & 0x3FF
    normal = ((h & 0x7FFF) << 13) + (112 << 23)  # rebias the exponent 15 -> 127
    special = (mantissa << 13) | 0x7F800000  # Inf, NaN with its payload as it is
    # a subnormal: its mantissa times 2^-24, exact (a product of an integer and a power of two)
    subnormal = (mantissa.to(tl.float32) * 5.9604644775390625e-08).to(tl.uint32, bitcast=True)
    bits = tl.where(exponent == 0x7C00, special, tl.where(exponent == 0, subnormal, normal))
    return (bits | sign).to(tl.float32, bitcast=True)


@triton.jit
def encode(values, CODE: tl.constexpr):
    """``values`` (float32) in format ``CODE``'s carrier."""
    if CODE == BF16:
        out = _encode_bf16(values.to(tl.uint32, bitcast=True)).to(tl.uint16).to(tl.int16, bitcast=True)
    elif CODE == F16:
        out = _encode_f16(values.to(tl.uint32, bitcast=True)).to(tl.uint16).to(tl.int16, bitcast=True)
    elif CODE == F64:
        out = values.to(tl.float64)
    else:
        out = values
    return out


@triton.jit
def _encode_bf16(b):
    high = b >> 16
    rounded = (b + 0x7FFF + (high & 1)) >> 16
    is_nan = (b & 0x7FFFFFFF) > 0x7F800000
    return tl.where(is_nan, high | 0x40, rounded)


@triton.jit
def _encode_f16(b):
    sign = (b >> 16) & 0x8000
    ab = b & 0x7FFFFFFF
    mantissa = (ab >> 13) & 0x3FF
    special = tl.where(ab > 0x7F800000, mantissa | 0x200, mantissa) | 0x7C00  # Inf, quiet NaN
    m = ab - 0x38000000  # rebias the exponent 127 -> 15 (wraps below F16's normals: not used there)
    normal = tl.minimum((m + 0xFFF + ((m >> 13) & 1)) >> 13, 0x7C00)
    bits = tl.where(ab >= 0x7F800000, special, tl.where(ab < 0x38800000, _f16_subnormal(ab), normal))
    return bits | sign


@triton.jit
def _f16_subnormal(ab):
    """rint(|value| * 2^24) for |value| below F16's smallest normal, from the bits: the
    significand shifted right by 126 - exponent, rounded to nearest even."""
    exponent = ab >> 23
    significand = (ab & 0x7FFFFF) | tl.where(exponent > 0, 0x800000, 0).to(tl.uint32)
    shift = tl.minimum(126 - tl.maximum(exponent, 1), 30)  # >= 14 here; 30: rounds to 0
    quotient = significand >> shift
    remainder = significand & ((1 << shift) - 1)
    half = 1 << (shift - 1)
    up = (remainder > half) | ((remainder == half) & ((quotient & 1) == 1))
    return quotient + up.to(tl.uint32)


@triton.jit
def task_vector(a, b, AGENT: tl.constexpr):
    """An agent's task vector from its decoded values ``a`` and the base's ``b``: ``a - b``, or ``a``
    itself for an agent given as one (``TAU32``: value - (+0.0), bit for bit)."""
    if AGENT == TAU32:
        tau = a
    else:
        tau = a - b
    return tau


@triton.jit
def agent_weights(a, b, AGENT: tl.constexpr):
    """An agent's weights from its decoded values ``a``: ``a`` itself, or for an agent given as its
    task vector (``TAU32``) ``b + a``, the base's ``b`` plus tau in float32."""
    if AGENT == TAU32:
        weights = b + a
    else:
        weights = a
    return weights


@triton.jit
def nonfinite(values):
    """Where float32 ``values`` are NaN/Inf: the exponent field all ones, an integer test."""
    return (values.to(tl.uint32, bitcast=True) & EXPONENT) == EXPONENT


@triton.jit
def encoded_nonfinite(encoded, CODE: tl.constexpr):
    """Where an output carrier (``encode``'s) is NaN/Inf: its exponent field all ones."""
    if CODE == BF16:
        found = (encoded.to(tl.uint16, bitcast=True) & 0x7F80) == 0x7F80
    elif CODE == F16:
        found = (encoded.to(tl.uint16, bitcast=True) & 0x7C00) == 0x7C00
    elif CODE == F64:
        found = (encoded.to(tl.uint64, bitcast=True) & 0x7FF0000000000000) == 0x7FF0000000000000
    else:
        found = nonfinite(encoded)
    return found
