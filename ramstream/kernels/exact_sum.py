"""Exact, order-independent float64 sums (a "superaccumulator").

Statistics such as dot products and L1 norms must not depend on block size, thread count or
resume point, but float addition is not associative. Each value is split into an integer
mantissa and a power of two and added into the int64 bin of that power, which is exact; bins
are renormalised (carries moved 32 bins up) before they can overflow. Two accumulators combine
by adding bins, and ``finish`` rounds the exact total to the nearest float64 once.

Callers sum 64 consecutive elements in float64 first (a fixed, block-independent grouping: block
starts are multiples of 64) and feed those partial sums here, which keeps the cost low.
"""

from __future__ import annotations

import math
from fractions import Fraction

import numpy as np
from numba import njit

OFFSET = 1140  # bin of 2**0; mantissa units of float64 span 2**-1127 .. 2**971
BINS = OFFSET + 1100
CARRY_BITS = 32
RENORMALISE_EVERY = 256  # 256 * 2**53 < 2**63


def new_accumulator(count: int = 1) -> np.ndarray:
    """``count`` zeroed accumulators; slot ``BINS`` counts additions since the last renormalise."""
    return np.zeros((count, BINS + 1), np.int64)


@njit(inline="always", cache=True)
def add(acc, value):  # type: ignore[no-untyped-def]
    """Add float64 ``value`` exactly into the accumulator row ``acc``."""
    if value == 0.0:
        return
    mantissa, exponent = math.frexp(value)
    acc[exponent - 53 + OFFSET] += np.int64(mantissa * 9007199254740992.0)  # times 2**53: an integer
    acc[BINS] += 1
    if acc[BINS] >= RENORMALISE_EVERY:
        renormalise(acc)


@njit(cache=True)
def renormalise(acc):  # type: ignore[no-untyped-def]
    for i in range(BINS - CARRY_BITS):
        carry = acc[i] >> CARRY_BITS
        acc[i] -= carry << CARRY_BITS
        acc[i + CARRY_BITS] += carry
    acc[BINS] = 0


def combine(a: np.ndarray, b: np.ndarray) -> np.ndarray:
    """The accumulator of both sums (inputs are renormalised first, so the add cannot overflow)."""
    a, b = a.copy(), b.copy()
    for row in (a, b):
        renormalise(row)
    total = a + b
    total[BINS] = 2
    return total


def finish(acc: np.ndarray) -> float:
    """The exact sum, rounded once to the nearest float64."""
    total = Fraction(0)
    for i in np.flatnonzero(acc[:BINS]):
        total += Fraction(int(acc[i])) * Fraction(2) ** int(i - OFFSET)
    return float(total)
