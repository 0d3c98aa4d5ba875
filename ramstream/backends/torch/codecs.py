"""BF16/F16/F32/F64 raw bytes to float32 and back, in integer tensor ops: the bits of
``backends/numba/codecs.py`` for every input pattern, NaNs included, on any device.

Why not torch's own casts: they are bit-exact for numbers, but a NaN's payload (and whether a
signalling NaN is quieted) depends on the hardware, and F16 subnormals would go through float
arithmetic that a GPU may flush. Integer ops mean the same bits everywhere. Carriers: raw
``uint8`` in, ``int16`` out for BF16/F16 (the same two bytes as numpy's ``uint16``).

An input of code ``TAU32`` (a LoRA agent's task vector, ``format.lora``) decodes like F32 and is
tau itself: its task vector is ``value - minus(base, code)``, +0.0 subtracted (bit for bit the
value), as in ``backends/numba/codecs.py``.
"""

from __future__ import annotations

import torch

from ramstream.format.dtypes import TAU32, FloatCode

ITEMSIZE = {FloatCode.BF16: 2, FloatCode.F16: 2, FloatCode.F32: 4, FloatCode.F64: 8, TAU32: 4}

_F16_SUBNORMAL_UNIT = 2.0**-24  # an F16 subnormal is its mantissa times this, exactly in float32


def decode(raw: torch.Tensor, code: int) -> torch.Tensor:
    """float32 values of ``raw`` (uint8 bytes of format ``code``). F32 is a view of ``raw``:
    callers never write into a decoded tensor."""
    if code == FloatCode.BF16:
        return (raw.view(torch.int16).to(torch.int32) << 16).view(torch.float32)
    if code == FloatCode.F16:
        return _decode_f16(raw.view(torch.int16).to(torch.int32) & 0xFFFF)
    if code in (FloatCode.F32, TAU32):
        return raw.view(torch.float32)
    return raw.view(torch.float64).to(torch.float32)


def minus(base: torch.Tensor, code: int) -> torch.Tensor:
    """What an input of format ``code`` subtracts to give its task vector: the base's values, or
    +0.0 for an input that is a task vector already (``TAU32``)."""
    return base.new_zeros(()) if code == TAU32 else base


def unders(values: list[torch.Tensor], codes: list[int]) -> list[torch.Tensor]:
    """``minus`` of every agent of decoded ``values`` (base first) with their ``codes``."""
    return [minus(values[0], c) for c in codes[1:]]


def _decode_f16(h: torch.Tensor) -> torch.Tensor:
    sign = (h & 0x8000) << 16
    exponent = h & 0x7C00
    mantissa = h & 0x3FF
    normal = ((h & 0x7FFF) << 13) + (112 << 23)  # rebias the exponent 15 -> 127
    special = (mantissa << 13) | 0x7F800000  # Inf, NaN with its payload as it is
    subnormal = (mantissa.to(torch.float32) * _F16_SUBNORMAL_UNIT).view(torch.int32)
    bits = torch.where(exponent == 0x7C00, special, torch.where(exponent == 0, subnormal, normal))
    return (bits | sign).view(torch.float32)


def encode(values: torch.Tensor, code: int) -> torch.Tensor:
    """``values`` (float32) in format ``code``'s carrier: int16 for BF16/F16, float32, float64.
    BF16 and F16 round to nearest, ties to even; a NaN stays a quiet NaN."""
    if code == FloatCode.BF16:
        return _encode_bf16(values.view(torch.int32))
    if code == FloatCode.F16:
        return _encode_f16(values.view(torch.int32))
    if code == FloatCode.F32:
        return values
    return values.to(torch.float64)


def _encode_bf16(b: torch.Tensor) -> torch.Tensor:
    """In int32: the low 16 bits of each step are those of the uint32 arithmetic (a sum can only
    leave int32 for NaN patterns, which take the other branch)."""
    high = b >> 16
    rounded = (b + (0x7FFF + (high & 1))) >> 16
    is_nan = (b & 0x7FFFFFFF) > 0x7F800000
    return torch.where(is_nan, high | 0x40, rounded).to(torch.int16)


def _encode_f16(b: torch.Tensor) -> torch.Tensor:
    sign = (b >> 16) & 0x8000
    ab = b & 0x7FFFFFFF
    mantissa = (ab >> 13) & 0x3FF
    special = torch.where(ab > 0x7F800000, mantissa | 0x200, mantissa) | 0x7C00  # Inf, quiet NaN
    m = ab - 0x38000000  # rebias the exponent 127 -> 15
    normal = torch.clamp_max((m + (0xFFF + ((m >> 13) & 1))) >> 13, 0x7C00)
    bits = torch.where(ab >= 0x7F800000, special, torch.where(ab < 0x38800000, _f16_subnormal(ab), normal))
    return (bits | sign).to(torch.int16)


def _f16_subnormal(ab: torch.Tensor) -> torch.Tensor:
    """rint(|value| * 2**24) for |value| below F16's smallest normal, from the bits: the
    significand shifted right by 126 - exponent, rounded to nearest even."""
    exponent = ab >> 23
    significand = (ab & 0x7FFFFF) | ((exponent > 0).to(torch.int32) << 23)  # the implicit bit
    shift = torch.clamp(126 - torch.clamp_min(exponent, 1), max=30)  # >= 14 here; 30: rounds to 0
    quotient = significand >> shift
    remainder = significand & ((1 << shift) - 1)
    half = 1 << (shift - 1)
    up = (remainder > half) | ((remainder == half) & ((quotient & 1) == 1))
    return quotient + up.to(torch.int32)
