"""The counter RNG of ``backends.rng`` in int64 tensor ops: the same uniform as the Numba kernels'
for every (key, element).

torch has no uint64 arithmetic, but int64 addition and multiplication wrap modulo 2**64 like
uint64's (two's complement), so only the right shifts differ: an arithmetic shift is made
logical by masking off the copied sign bits.
"""

from __future__ import annotations

import numpy as np
import torch

from ramstream.backends.rng import GOLDEN, MIX1, MIX2

_INV_2_24 = 1.0 / 16777216.0


def _signed(value: int | np.uint64) -> int:
    """The int64 with the bits of the uint64 ``value``."""
    value = int(value) & 0xFFFFFFFFFFFFFFFF
    return value - (1 << 64) if value >= 1 << 63 else value


_GOLDEN, _MIX1, _MIX2 = _signed(GOLDEN), _signed(MIX1), _signed(MIX2)


def _shr(z: torch.Tensor, bits: int) -> torch.Tensor:
    """Logical right shift of int64 carriers of uint64 values."""
    return (z >> bits) & ((1 << (64 - bits)) - 1)


def uniform(key: int, index: torch.Tensor) -> torch.Tensor:
    """float32 (k / 2**24) draws of elements ``index`` (int64) of the stream ``key`` (a uint64)."""
    z = (index + 1) * _GOLDEN + _signed(key)
    z = (z ^ _shr(z, 30)) * _MIX1
    z = (z ^ _shr(z, 27)) * _MIX2
    z = z ^ _shr(z, 31)
    return _shr(z, 40).to(torch.float32) * _INV_2_24
