"""Whether a raw output block holds NaN/Inf: the exponent field all ones, per output format.

Every merged block is checked right after it is computed (``merge.finite``), so the check is a
backend operation: the Numba backend scans the block once, in parallel (``numba/nonfinite.py``);
``has_nonfinite`` here is the plain numpy version (two max reductions, no copy), for the others.
"""

from __future__ import annotations

import numpy as np

from ramstream.format.dtypes import FloatCode

# Per output format: the unsigned carrier and the exponent mask (all ones: Inf or NaN).
EXPONENT: dict[int, tuple[type[np.unsignedinteger], int]] = {
    FloatCode.BF16: (np.uint16, 0x7F80),
    FloatCode.F16: (np.uint16, 0x7C00),
    FloatCode.F32: (np.uint32, 0x7F800000),
    FloatCode.F64: (np.uint64, 0x7FF0000000000000),
}

# The signed carrier and the smallest non-finite pattern with the sign bit clear (as the signed
# integer) and set (as the unsigned): positive Inf/NaN are the largest signed values, negative
# ones the largest unsigned.
_PATTERNS: dict[int, tuple[type[np.signedinteger], type[np.unsignedinteger], int, int]] = {
    FloatCode.BF16: (np.int16, np.uint16, 0x7F80, 0xFF80),
    FloatCode.F16: (np.int16, np.uint16, 0x7C00, 0xFC00),
    FloatCode.F32: (np.int32, np.uint32, 0x7F800000, 0xFF800000),
    FloatCode.F64: (np.int64, np.uint64, 0x7FF0000000000000, 0xFFF0000000000000),
}


def has_nonfinite(out: np.ndarray, out_code: int) -> bool:
    """True when the raw output block ``out`` (format ``out_code``) holds a NaN or Inf."""
    if not out.size:
        return False
    signed, unsigned, positive, negative = _PATTERNS[out_code]
    return bool(out.view(signed).max() >= positive or out.view(unsigned).max() >= negative)
