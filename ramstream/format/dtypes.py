"""Safetensors dtypes: their sizes, which ones the kernels decode, and their raw numpy carriers.

numpy has no bfloat16, so BF16 and F16 travel as ``uint16`` and are decoded in the kernels.
"""

from __future__ import annotations

from enum import IntEnum

import numpy as np


class FloatCode(IntEnum):
    """The float encodings the kernels decode and encode (passed to them as plain ints)."""

    BF16 = 0
    F16 = 1
    F32 = 2
    F64 = 3


# An input code, not a file or output format: a float32 task vector held in memory (a LoRA agent's
# update computed from its factors, ``format.lora``). Decoded like F32, it is tau itself: the
# kernels never subtract the base from it (and add the base to it where they need the weights).
TAU32 = 4

ITEMSIZE: dict[str, int] = {
    "BOOL": 1,
    "U8": 1,
    "I8": 1,
    "F8_E4M3": 1,
    "F8_E5M2": 1,
    "I16": 2,
    "U16": 2,
    "F16": 2,
    "BF16": 2,
    "I32": 4,
    "U32": 4,
    "F32": 4,
    "I64": 8,
    "U64": 8,
    "F64": 8,
}

FLOAT_CODES: dict[str, FloatCode] = {
    "BF16": FloatCode.BF16,
    "F16": FloatCode.F16,
    "F32": FloatCode.F32,
    "F64": FloatCode.F64,
}

# Float formats we cannot decode alone: merging them would be a silent lie, so they are refused,
# unless the checkpoint's quantization_config names their scales (``format.quantized``): then the
# tensor is read dequantized, as float32 (``blocks.quantized``).
UNDECODABLE_FLOATS = frozenset({"F8_E4M3", "F8_E5M2"})
FP8_FLOATS = UNDECODABLE_FLOATS

RAW_CARRIER: dict[FloatCode, type[np.generic]] = {
    FloatCode.BF16: np.uint16,
    FloatCode.F16: np.uint16,
    FloatCode.F32: np.float32,
    FloatCode.F64: np.float64,
}

OUT_DTYPES: dict[str, str] = {"bf16": "BF16", "f16": "F16", "f32": "F32"}
TORCH_NAMES: dict[str, str] = {"BF16": "bfloat16", "F16": "float16", "F32": "float32", "F64": "float64"}


def is_float(dtype: str) -> bool:
    """True for the dtypes the kernels decode."""
    return dtype in FLOAT_CODES


def is_merged(dtype: str) -> bool:
    """True for the dtypes that are merged (the others are copied from the base): the float ones,
    and FP8, which reaches a family only with its scales (``format.quantized``) and is merged as
    its dequantized float32 values."""
    return dtype in FLOAT_CODES or dtype in FP8_FLOATS
