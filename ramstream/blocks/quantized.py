"""A quantized tensor's float32 values over one block (``format.quantized``).

Element (i, j) of a 2-D FP8 weight W (rows x cols) with scales S is
``f32(W[i, j]) * f32(S[i // bm, j // bn])``, S read as ceil(rows / bm) x ceil(cols / bn) (a
per-tensor scale: one block of rows x cols; per-channel: blocks of 1 x cols): the FP8 value is
exact in float32 and the product is rounded once (numpy float32, no fused multiply-add), so an
element's value never depends on the block, the backend or the machine, and equals what
converting the checkpoint to float32 first gives. The block's elements are decoded into the
float32 array handed to the kernels (code F32): the input a block reads is that array, which the
plan's budget counts (``plan.bytes_per_element``).

Only what the block needs is read: its FP8 bytes and the rows of S its rows fall in; the pages
mapped for them are released at once.

A base read as bf16 or f16 (``--quantized-base-as``, ``Family.quantized_base_as``) has these
values rounded to that dtype, to nearest, ties to even: the values the base converted to that
dtype first holds, as the agents trained from it saw them. Such a block is handed out in that
dtype's 2-byte carrier (code BF16 or F16), as a bf16 base's block is, so the kernels read half
the bytes of a float32 one and decode them as they decode any bf16 input: the same values.

The FP8 decoding (table, scale, rounding) is a ``Dequantize`` the reader is given: the backend's
(``Backend.fp8_dequantize``: the Numba backend's runs on all cores, in one pass per element), by
default ``numpy_dequantize``; every one writes the same bytes. MXFP4 is decoded with numpy here
(gpt-oss's experts: a transpose per expert, which a per-element kernel would not make cheaper).
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

import numpy as np

from ramstream.format import codecs
from ramstream.format.checkpoint import QuantRef
from ramstream.format.dtypes import FLOAT_CODES, FloatCode
from ramstream.io.reader import InputFiles


def _fp8_table(exponent_bits: int, mantissa_bits: int, finite_only: bool) -> np.ndarray:
    """float32 (256,): the value of every FP8 byte (sign, exponent, mantissa; IEEE-like with
    subnormals). ``finite_only`` (E4M3 "fn"): no infinities, all-ones is NaN; else (E5M2) the top
    exponent holds the infinities and NaNs."""
    codes = np.arange(256, dtype=np.int64)
    sign = np.where(codes >> 7, -1.0, 1.0)
    exponent = (codes >> mantissa_bits) & ((1 << exponent_bits) - 1)
    mantissa = codes & ((1 << mantissa_bits) - 1)
    bias = (1 << (exponent_bits - 1)) - 1
    top = (1 << exponent_bits) - 1
    normal = (1.0 + mantissa / (1 << mantissa_bits)) * np.exp2(exponent - bias)
    subnormal = mantissa / (1 << mantissa_bits) * np.exp2(1 - bias)
    values = sign * np.where(exponent == 0, subnormal, normal)
    if finite_only:
        values[(exponent == top) & (mantissa == (1 << mantissa_bits) - 1)] = np.nan
    else:
        values[(exponent == top) & (mantissa == 0)] = sign[(exponent == top) & (mantissa == 0)] * np.inf
        values[(exponent == top) & (mantissa != 0)] = np.nan
    return values.astype(np.float32)


FP8_VALUES: dict[str, np.ndarray] = {
    "F8_E4M3": _fp8_table(4, 3, finite_only=True),
    "F8_E5M2": _fp8_table(5, 2, finite_only=False),
}


# FP4 E2M1 by its four bits (sign, two exponent bits, one mantissa bit), as float32.
FP4_VALUES = np.array([0, 0.5, 1, 1.5, 2, 3, 4, 6, -0.0, -0.5, -1, -1.5, -2, -3, -4, -6], np.float32)
E8M0_NAN = 255  # the one E8M0 scale that is no power of two


ROUND_CODES = {"f32": FloatCode.F32, "bf16": FloatCode.BF16, "f16": FloatCode.F16}
CARRIERS = {FloatCode.F32: np.float32, FloatCode.BF16: np.uint16, FloatCode.F16: np.uint16}
ROUND_CHUNK = 1 << 16  # elements decoded at a time by numpy: its temporaries stay small


@dataclass(frozen=True, eq=False)
class ScaledCodes:
    """A run of an FP8 weight's elements to dequantize: ``codes[k]`` is the element at flat position
    ``offset + k`` of the rows from band ``first`` on (``first`` = the band of ``bm`` rows the
    run starts in), and ``scales`` (float32, C-contiguous, (bands, scale_cols)) are the scales of
    those bands, so element (i, j) of the run's rows takes ``scales[i // bm, j // bn]``."""

    codes: np.ndarray  # uint8 (n,)
    table: np.ndarray  # float32 (256,): the value of each FP8 byte (``FP8_VALUES``)
    scales: np.ndarray  # float32 (bands, scale_cols)
    offset: int
    cols: int
    block: tuple[int, int]  # (bm, bn)


# dequantize(run, out, code): out (the carrier of ``code``: float32 for F32, uint16 for BF16/F16,
# the run's size) <- fp(table[codes] * scale), one float32 multiply per element (no fused
# multiply-add), encoded to ``code`` as ``format.codecs.encode`` does. A backend may give a faster
# one with the same bytes (``Backend.fp8_dequantize``).
Dequantize = Callable[[ScaledCodes, np.ndarray, int], None]


def numpy_dequantize(run: ScaledCodes, out: np.ndarray, code: int) -> None:
    """``Dequantize`` in numpy, ``ROUND_CHUNK`` elements at a time: a table lookup, the scales
    multiplied per band of rows, then the encoding (one thread, a few passes over each chunk)."""
    bm, bn = run.block
    per_band = run.cols * bm
    with np.errstate(over="ignore", invalid="ignore"):  # an Inf or NaN is named where the block is merged
        for lo in range(0, run.codes.size, ROUND_CHUNK):
            hi = min(lo + ROUND_CHUNK, run.codes.size)
            values = out[lo:hi] if code == FloatCode.F32 else np.empty(hi - lo, np.float32)
            np.take(run.table, run.codes[lo:hi], out=values)
            at, end = run.offset + lo, run.offset + hi
            for band in range(at // per_band, (end - 1) // per_band + 1):
                b0, b1 = max(at, band * per_band), min(end, (band + 1) * per_band)
                per_column = np.repeat(run.scales[band], bn)[: run.cols]
                _scale_run(values[b0 - at : b1 - at], b0 % run.cols, per_column)
            if code != FloatCode.F32:
                out[lo:hi] = codecs.encode(values, code)


def dequantized_block(
    ref: QuantRef,
    files: InputFiles,
    start: int,
    stop: int,
    as_dtype: str = "f32",
    dequantize: Dequantize = numpy_dequantize,
) -> np.ndarray:
    """Elements [start, stop) (flat, row-major) of ``ref``'s values in the carrier of
    ``as_dtype`` (``carrier_code``): float32 for f32, uint16 holding bf16 or f16 values."""
    code = carrier_code(as_dtype)
    out = np.empty(max(stop - start, 0), CARRIERS[code])
    if stop > start:
        if ref.layout == "mxfp4":
            values = np.empty(out.size, np.float32)
            _mxfp4_into(values, ref, files, start)
            out[:] = values if code == FloatCode.F32 else codecs.encode(values, code)
        else:
            dequantize(_scaled_codes(ref, files, start, stop), out, code)
            files.release(ref.weight, start, stop)
    return out


def carrier_code(as_dtype: str) -> FloatCode:
    """The format a quantized tensor read as ``as_dtype`` (f32, bf16, f16) is handed out in."""
    return ROUND_CODES[as_dtype]


def _scaled_codes(ref: QuantRef, files: InputFiles, start: int, stop: int) -> ScaledCodes:
    """Elements [start, stop) of an FP8 weight (mapped: the caller releases them once decoded) and
    the scales of the bands of rows they touch (a copy; their pages released here)."""
    weight, scale_ref = ref.weight, ref.scale
    cols = weight.entry.shape[1]
    bm, bn = ref.block
    scale_cols = -(-cols // bn)  # the scales as a 2-D array (a per-tensor one is 1 x 1, a per-row one rows x 1)
    codes = np.frombuffer(files.byte_range(weight, start, stop), np.uint8)  # FP8: one byte per element
    first, last = start // cols // bm, (stop - 1) // cols // bm  # the bands of bm rows the block touches
    scale_raw = files.float_view(scale_ref, first * scale_cols, (last + 1) * scale_cols)
    scales = codecs.decode(scale_raw, FLOAT_CODES[scale_ref.entry.dtype]).reshape(-1, scale_cols)
    del scale_raw
    files.release(scale_ref, first * scale_cols, (last + 1) * scale_cols)
    table, offset = FP8_VALUES[weight.entry.dtype], start - first * bm * cols
    return ScaledCodes(codes, table, np.ascontiguousarray(scales, np.float32), offset, cols, (bm, bn))


def _scale_run(values: np.ndarray, column: int, per_column: np.ndarray) -> None:
    """Multiply, in place, a run of row-major elements starting at ``column`` by their column's scale."""
    cols = per_column.size
    head = min(values.size, cols - column) if column else 0
    np.multiply(values[:head], per_column[column : column + head], out=values[:head])
    rest = values[head:]
    whole = rest.size // cols * cols
    rows = rest[:whole].reshape(-1, cols)
    np.multiply(rows, per_column, out=rows)
    tail = rest[whole:]
    np.multiply(tail, per_column[: tail.size], out=tail)


def _mxfp4_into(out: np.ndarray, ref: QuantRef, files: InputFiles, start: int) -> None:
    """Fill ``out`` with elements [start, start + out.size) of an MXFP4 tensor [E, H, R] (the
    transpose of its blocks' [E, R, H] values, ``QuantRef``), one expert's span at a time: the
    groups of 32 its rows h fall in are decoded for every r, multiplied by 2 ** (scale - 127)
    (exact: FP4 values have two significant bits), then transposed into place."""
    _, hidden, rows = ref.shape
    groups = hidden // 32
    per_expert = hidden * rows
    stop, at = start + out.size, start
    while at < stop:
        e = at // per_expert
        end = min(stop, (e + 1) * per_expert)
        h0, h1 = (at - e * per_expert) // rows, (end - 1 - e * per_expert) // rows + 1
        g0, g1 = h0 // 32, (h1 - 1) // 32 + 1
        nbytes = rows * groups * 16
        packed = np.frombuffer(files.byte_range(ref.weight, e * nbytes, (e + 1) * nbytes), np.uint8)
        exps = np.frombuffer(files.byte_range(ref.scale, e * rows * groups, (e + 1) * rows * groups), np.uint8)
        packed_groups = packed.reshape(rows, groups, 16)[:, g0:g1]
        values = np.empty((rows, g1 - g0, 32), np.float32)
        values[..., 0::2] = FP4_VALUES[packed_groups & 0x0F]
        values[..., 1::2] = FP4_VALUES[packed_groups >> 4]
        exponents = exps.reshape(rows, groups)[:, g0:g1]
        with np.errstate(over="ignore", invalid="ignore"):  # a NaN scale is named where the block is merged
            factor = np.ldexp(np.float32(1), exponents.astype(np.int32) - 127).astype(np.float32)
            factor[exponents == E8M0_NAN] = np.nan
            values *= factor[..., None]
        del packed, exps, packed_groups, exponents
        files.release(ref.weight, e * nbytes, (e + 1) * nbytes)
        files.release(ref.scale, e * rows * groups, (e + 1) * rows * groups)
        span = values.reshape(rows, (g1 - g0) * 32)[:, h0 - g0 * 32 : h1 - g0 * 32].T.reshape(-1)  # [h, r]
        first = at - e * per_expert - h0 * rows
        out[at - start : end - start] = span[first : first + end - at]
        at = end


def _positive_fp8(dtype: str) -> np.ndarray:
    """float32: the finite non-negative values of an FP8 format, by code (increasing)."""
    table = FP8_VALUES[dtype][:128]
    return table[np.isfinite(table)]


def encode_fp8(values: np.ndarray, dtype: str) -> np.ndarray:
    """uint8 FP8 codes of float32 ``values``, rounded to nearest, ties to even (the code whose
    last bit is 0), saturating at the format's largest finite value; NaN stays NaN."""
    positive = _positive_fp8(dtype)
    magnitude = np.minimum(np.abs(values), positive[-1])
    above = np.minimum(np.searchsorted(positive, magnitude), positive.size - 1)
    below = np.maximum(above - 1, 0)
    to_above, to_below = positive[above] - magnitude, magnitude - positive[below]
    tie = to_above == to_below
    code = np.where(to_below < to_above, below, above)
    code = np.where(tie, np.where(below % 2 == 0, below, above), code).astype(np.uint8)
    code |= np.signbit(values).astype(np.uint8) << 7
    nan = np.uint8(0x7F) if dtype == "F8_E4M3" else np.uint8(0x7E)
    return np.where(np.isnan(values), nan, code).astype(np.uint8)


def quantize_bands(
    values: np.ndarray, cols: int, block: tuple[int, int], dtype: str, scale_dtype: str = "F32"
) -> tuple[np.ndarray, np.ndarray]:
    """``(codes, scales)`` of whole rows of a tensor (float32, flat, starting at a band of
    ``block[0]`` rows): per block of bm x bn, scale = f32(max |v|) / f32(largest finite) (1 for
    an all-zero block), code = fp8(f32(v / scale)); scales (bands, ceil(cols / bn)) float32.
    A per-channel scale is a block of 1 x cols, a per-tensor one a block of rows x cols; either
    way a few rows are handled at a time, so a band as large as a whole tensor needs no
    temporaries of its size.

    ``scale_dtype`` (the base's scale tensors' dtype): the scales are rounded to it (to nearest,
    ties to even, kept within its positive finite range) before the codes are computed, so a
    code times its stored scale is the value a reader gets back."""
    bm, bn = block
    rows = values.size // cols
    bands, scale_cols = -(-rows // bm), -(-cols // bn)
    step = max(1, ROUND_CHUNK // max(cols, 1))  # rows at a time: the temporaries stay small
    amax = np.zeros((bands, scale_cols), np.float32)
    for r0 in range(0, rows, step):
        chunk = np.abs(values[r0 * cols : min(r0 + step, rows) * cols].reshape(-1, cols))
        per_group = np.maximum.reduceat(chunk, np.arange(0, cols, bn), axis=1)  # (chunk rows, scale_cols)
        np.maximum.at(amax, np.arange(r0, r0 + chunk.shape[0]) // bm, per_group)
    scales = np.where(amax > 0, amax / _positive_fp8(dtype)[-1], np.float32(1)).astype(np.float32)
    if scale_dtype != "F32":
        scales = _rounded_scales(scales, FLOAT_CODES[scale_dtype])
    codes = np.empty(values.size, np.uint8)
    for r0 in range(0, rows, step):
        r1 = min(r0 + step, rows)
        per_element = np.repeat(scales[np.arange(r0, r1) // bm], bn, axis=1)[:, :cols].reshape(-1)
        with np.errstate(over="ignore", invalid="ignore"):
            scaled = (values[r0 * cols : r1 * cols] / per_element).astype(np.float32)
        codes[r0 * cols : r1 * cols] = encode_fp8(scaled, dtype)
    return codes, scales


# The smallest and largest positive finite value of a 2-byte scale format (exact in float32).
SCALE_RANGE = {FloatCode.F16: (2.0**-24, 65504.0), FloatCode.BF16: (2.0**-133, (2 - 2.0**-7) * 2.0**127)}


def _rounded_scales(scales: np.ndarray, code: FloatCode) -> np.ndarray:
    """float32 ``scales`` rounded to format ``code`` and back, clamped to its smallest and largest
    positive finite values (an f16 scale underflowing to 0 would make every code NaN)."""
    rounded = codecs.decode(codecs.encode(scales, code), code)
    low, high = SCALE_RANGE.get(code, (0.0, np.inf))
    return np.clip(rounded, np.float32(low), np.float32(high)).astype(np.float32)
