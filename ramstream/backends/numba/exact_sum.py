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

import numpy as np
from numba import njit

from ramstream.backends.exact_sum import BINS, CARRY_BITS, OFFSET, RENORMALISE_EVERY, finish, new_accumulator

__all__ = ["BINS", "add", "combine", "finish", "new_accumulator", "renormalise"]


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
