"""The Numba backend's FP8 dequantization writes the bytes of numpy's (``blocks.quantized``), and
both those of a naive per-element twin: every FP8 code, scales from 0 through subnormals to
values that overflow, NaN and Inf, any block shape, any span of the tensor, 1 to 3 threads, and
each carrier a quantized input is handed out in (F32, BF16, F16)."""

from __future__ import annotations

import numpy as np
from hypothesis import given, settings
from hypothesis import strategies as st

from ramstream.backends.numba.quantized import dequantize
from ramstream.blocks.quantized import FP8_VALUES, ScaledCodes, numpy_dequantize
from ramstream.format import codecs
from ramstream.format.dtypes import FloatCode

CARRIERS = {FloatCode.F32: np.float32, FloatCode.BF16: np.uint16, FloatCode.F16: np.uint16}
SPECIAL_SCALES = np.array([0.0, -0.0, 1e-40, -3e-42, 3e38, np.inf, -np.inf, np.nan, 1.0], np.float32)


def _scales(rng: np.random.Generator, shape: tuple[int, int]) -> np.ndarray:
    """Magnitudes from 1e-46 (zero in float32) through subnormals to 1e39 (Inf), some special."""
    with np.errstate(over="ignore"):
        values = (10.0 ** rng.uniform(-46, 39, shape) * rng.choice([-1.0, 1.0], shape)).astype(np.float32)
    special = rng.random(shape) < 0.2
    values[special] = rng.choice(SPECIAL_SCALES, int(special.sum()))
    return values


def _naive(codes: np.ndarray, table: np.ndarray, scales: np.ndarray, start: int, cols: int, block: tuple[int, int]):  # type: ignore[no-untyped-def]
    """float32 values: each element's table value times the scale of its (row, column) block."""
    bm, bn = block
    i, j = np.divmod(np.arange(start, start + codes.size), cols)
    with np.errstate(over="ignore", invalid="ignore"):
        return table[codes] * scales[i // bm, j // bn]


@settings(max_examples=60, deadline=None)
@given(
    st.sampled_from(["F8_E4M3", "F8_E5M2"]),
    st.integers(1, 300),
    st.integers(1, 300),
    st.sampled_from(["128x128", "tensor", "channel", "odd"]),
    st.integers(0, 2**32 - 1),
    st.integers(1, 3),
    st.sampled_from([FloatCode.F32, FloatCode.BF16, FloatCode.F16]),
)
def test_the_numba_kernel_writes_numpys_bytes(
    dtype: str, rows: int, cols: int, kind: str, seed: int, threads: int, code: FloatCode
) -> None:
    rng = np.random.default_rng(seed)
    bm, bn = {
        "128x128": (128, 128),
        "tensor": (rows, cols),
        "channel": (1, cols),
        "odd": (int(rng.integers(1, 200)), int(rng.integers(1, 200))),
    }[kind]
    numel = rows * cols
    codes = rng.integers(0, 256, numel, dtype=np.uint8)
    if numel >= 256:  # every code, NaN, infinities and subnormals among them
        codes[rng.permutation(numel)[:256]] = np.arange(256, dtype=np.uint8)
    scales = _scales(rng, (-(-rows // bm), -(-cols // bn)))
    start = int(rng.integers(0, numel))
    stop = int(rng.integers(start + 1, numel + 1))
    first, last = start // cols // bm, (stop - 1) // cols // bm
    table = FP8_VALUES[dtype]
    run = ScaledCodes(
        codes[start:stop],
        table,
        np.ascontiguousarray(scales[first : last + 1]),
        start - first * bm * cols,
        cols,
        (bm, bn),
    )

    want = np.empty(stop - start, CARRIERS[code])
    numpy_dequantize(run, want, code)
    got = (
        np.full(stop - start, 0x5A5A, CARRIERS[code])
        if code != FloatCode.F32
        else np.full(stop - start, -7.0, np.float32)
    )
    dequantize(run.codes, table, run.scales, run.offset, cols, bm, bn, got, int(code), threads)
    assert got.view(np.uint8).tobytes() == want.view(np.uint8).tobytes()

    naive = _naive(codes[start:stop], table, scales, start, cols, (bm, bn))
    naive_carrier = naive if code == FloatCode.F32 else codecs.encode(naive, code)
    assert naive_carrier.view(np.uint8).tobytes() == want.view(np.uint8).tobytes()


def test_every_code_of_both_formats_once_per_carrier() -> None:
    """One row of all 256 codes under a scale of 1: the table itself, encoded, on both paths."""
    for dtype in ("F8_E4M3", "F8_E5M2"):
        table = FP8_VALUES[dtype]
        run = ScaledCodes(np.arange(256, dtype=np.uint8), table, np.ones((1, 1), np.float32), 0, 256, (1, 256))
        for code in (FloatCode.F32, FloatCode.BF16, FloatCode.F16):
            want, got = np.empty(256, CARRIERS[code]), np.empty(256, CARRIERS[code])
            numpy_dequantize(run, want, code)
            dequantize(run.codes, table, run.scales, 0, 256, 1, 256, got, int(code), 2)
            assert got.view(np.uint8).tobytes() == want.view(np.uint8).tobytes()
            expected = table if code == FloatCode.F32 else codecs.encode(table, code)
            assert want.view(np.uint8).tobytes() == np.asarray(expected).view(np.uint8).tobytes()
