"""The per-vector exact sums (``backends.vector_sums``): against Python's exact fractions over
float32 values of every magnitude (subnormals to near the largest), from the Numba kernel and the
torch arithmetic alike, whatever the split of the vectors into blocks."""

from __future__ import annotations

from fractions import Fraction

import numpy as np
import pytest

from ramstream.backends.numba import vectors as numba_vectors
from ramstream.backends.numba.addresses import addresses_of
from ramstream.backends.vector_sums import DIGITS, finish, normalise, vector_ids, vector_layout
from ramstream.format.dtypes import FloatCode


def extreme_values(rng: np.random.Generator, n: int) -> np.ndarray:
    """float32 values whose exponents span the whole range, with zeros, subnormals and signs."""
    bits = rng.integers(0, 0x7F800000, n, dtype=np.int64).astype(np.uint32)
    bits |= rng.integers(0, 2, n, dtype=np.int64).astype(np.uint32) << np.uint32(31)
    bits[::17] = 0
    bits[3::23] = rng.integers(1, 1 << 23, len(bits[3::23]), dtype=np.int64).astype(np.uint32)  # subnormals
    bits[5::29] = 0x7F7FFFFF  # the largest finite value
    return bits.view(np.float32)


def exact(x: np.ndarray, y: np.ndarray) -> float:
    return float(sum((Fraction(float(a)) * Fraction(float(b)) for a, b in zip(x, y, strict=True)), Fraction(0)))


def gram_by_blocks(base: np.ndarray, agent: np.ndarray, shape: tuple[int, ...], row_wise: bool, cut: int) -> np.ndarray:
    """float64 (vectors, 3): the Numba kernel's sums over blocks of ``cut`` elements, added."""
    numel = base.size
    vectors = vector_layout(shape, 0, numel, row_wise).mod
    total = np.zeros((vectors, 3, DIGITS), np.int64)
    for start in range(0, numel, cut):
        stop = min(start + cut, numel)
        layout = vector_layout(shape, start, stop, row_wise)
        acc = np.zeros((2, layout.count, 3, DIGITS), np.int64)
        bad = np.empty(2, np.int64)
        piece, codes = agent[start:stop], np.array([FloatCode.F32], np.int64)
        numba_vectors.vector_gram_block(
            base[start:stop], int(FloatCode.F32), addresses_of([piece], piece.size), codes,
            True, start, layout.div, layout.mod, acc, bad,
        )  # fmt: skip
        total[vector_ids(layout)] += numba_vectors.reduce_normalised(acc).reshape(layout.count, 3, DIGITS)
    return finish(total)


@pytest.mark.parametrize("row_wise", [False, True])
@pytest.mark.parametrize("cut", [64, 320, 4096])
def test_numba_sums_are_exact_per_row_and_column(row_wise: bool, cut: int) -> None:
    rng = np.random.default_rng(3)
    shape = (24, 40)
    x, y = (extreme_values(rng, 960) for _ in range(2))
    sums = gram_by_blocks(x, y, shape, row_wise, cut)
    a, b = x.reshape(shape), y.reshape(shape)
    if row_wise:
        a, b = a.T, b.T
    for v in range(len(a)):
        assert list(sums[v]) == [exact(a[v], a[v]), exact(a[v], b[v]), exact(b[v], b[v])]


def test_torch_accumulators_equal_the_numba_kernels() -> None:
    torch = pytest.importorskip("torch")
    from ramstream.backends.torch import vectors as torch_vectors

    rng = np.random.default_rng(4)
    x, y = extreme_values(rng, 4096), extreme_values(rng, 4096)
    layout = vector_layout((64, 64), 0, 4096, True)
    acc = np.zeros((1, layout.count, 3, DIGITS), np.int64)
    numba_vectors.vector_gram_block(
        x,
        int(FloatCode.F32),
        addresses_of([y], 4096),
        np.array([FloatCode.F32], np.int64),
        True,
        0,
        1,
        64,
        acc,
        np.empty(1, np.int64),
    )
    want = numba_vectors.reduce_normalised(acc).reshape(layout.count, 3, DIGITS)
    got = torch.zeros(layout.count * 3 * DIGITS, dtype=torch.int64)
    which = torch_vectors.block_vectors(torch.arange(4096), layout.div, layout.mod, 0)
    tx, ty = torch.from_numpy(x.copy()), torch.from_numpy(y.copy())
    for k, (p, q) in enumerate([(tx, tx), (tx, ty), (ty, ty)]):
        torch_vectors.add_products(got, p, q, which * 3 + k)
    assert np.array_equal(normalise(got.numpy().reshape(layout.count, 3, DIGITS)), want)
