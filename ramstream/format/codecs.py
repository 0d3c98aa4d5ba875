"""Decode BF16/F16/F32/F64 raw carriers to float32 and encode float32 back, in plain numpy.

For the few values read outside the backends (naming the NaN in an error, writing sample
checkpoints): the same bits as the backends' codecs. F32 -> BF16 and F32 -> F16 round to
nearest, ties to even; a NaN stays a (quiet) NaN.
"""

from __future__ import annotations

import numpy as np

from ramstream.format.dtypes import FloatCode


def decode(raw: np.ndarray, code: int) -> np.ndarray:
    """float32 values of ``raw`` (its carrier: uint16 for BF16/F16, float32, float64)."""
    if code == FloatCode.BF16:
        return (np.asarray(raw, np.uint16).astype(np.uint32) << np.uint32(16)).view(np.float32)
    if code == FloatCode.F16:
        return np.asarray(raw, np.uint16).view(np.float16).astype(np.float32)
    return np.asarray(raw).astype(np.float32)


def encode(values: np.ndarray, code: int) -> np.ndarray:
    """``values`` (float32) in format ``code``'s carrier."""
    values = np.ascontiguousarray(values, np.float32)
    if code == FloatCode.BF16:
        bits = values.view(np.uint32)
        rounded = (bits + np.uint32(0x7FFF) + ((bits >> np.uint32(16)) & np.uint32(1))) >> np.uint32(16)
        quiet_nan = (bits >> np.uint32(16)) | np.uint32(0x40)
        is_nan = (bits & np.uint32(0x7FFFFFFF)) > np.uint32(0x7F800000)
        return np.where(is_nan, quiet_nan, rounded).astype(np.uint16)
    if code == FloatCode.F16:
        with np.errstate(over="ignore", invalid="ignore"):
            half = values.astype(np.float16).view(np.uint16)
        bits = values.view(np.uint32)
        quiet_nan = (
            ((bits >> np.uint32(16)) & np.uint32(0x8000))
            | np.uint32(0x7E00)
            | ((bits >> np.uint32(13)) & np.uint32(0x3FF))
        )
        return np.where(np.isnan(values), quiet_nan, half).astype(np.uint16)
    if code == FloatCode.F64:
        return values.astype(np.float64)
    return values.copy()
