"""The exact-sum accumulator format every backend fills (a "superaccumulator").

Statistics such as dot products and L1 norms must not depend on block size, thread count,
backend or resume point, but float addition is not associative. Each float64 value is split into
an integer mantissa (times 2**53) and a power of two and added into the int64 bin of that power,
which is exact; bins are renormalised (carries moved ``CARRY_BITS`` bins up) before they can
overflow. Slot ``BINS`` counts additions since the last renormalisation. Accumulators combine by
adding bins, and ``finish`` rounds the exact total to the nearest float64 once.
"""

from __future__ import annotations

from fractions import Fraction

import numpy as np

OFFSET = 1140  # bin of 2**0; mantissa units of float64 span 2**-1127 .. 2**971
BINS = OFFSET + 1100
CARRY_BITS = 32
RENORMALISE_EVERY = 256  # 256 * 2**53 < 2**63


def new_accumulator(count: int = 1) -> np.ndarray:
    """``count`` zeroed accumulators."""
    return np.zeros((count, BINS + 1), np.int64)


def finish(acc: np.ndarray) -> float:
    """The exact sum, rounded once to the nearest float64."""
    total = Fraction(0)
    for i in np.flatnonzero(acc[:BINS]):
        total += Fraction(int(acc[i])) * Fraction(2) ** int(i - OFFSET)
    return float(total)


def renormalised(acc: np.ndarray) -> np.ndarray:
    """Accumulator rows (..., BINS + 1) as a renormalisation leaves them: the carry of each bin
    below ``BINS - CARRY_BITS`` moved ``CARRY_BITS`` bins up (in increasing order, so each bin ends
    in [0, 2**CARRY_BITS)), the counter zeroed.

    Bins ``CARRY_BITS`` apart form one base-2**CARRY_BITS number, which renormalising turns into
    its unique digits; so accumulators holding the same numbers are equal once renormalised,
    however their values were added (the Numba kernels add per thread and renormalise every
    ``RENORMALISE_EVERY`` additions; the torch backend adds a whole tile at once).
    """
    out = np.array(acc, np.int64)
    rows = out.reshape(-1, BINS + 1)
    for lo in range(0, BINS - CARRY_BITS, CARRY_BITS):
        carry = rows[:, lo : lo + CARRY_BITS] >> CARRY_BITS
        rows[:, lo : lo + CARRY_BITS] -= carry << CARRY_BITS
        rows[:, lo + CARRY_BITS : lo + 2 * CARRY_BITS] += carry
    rows[:, BINS] = 0
    return out
