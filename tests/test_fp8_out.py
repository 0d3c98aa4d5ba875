"""``--out-dtype fp8`` for every FP8 scheme ramstream reads: the merge written in the base's own
scheme, its scales recomputed from the merged values.

Each output is checked against a reference written here from the definition, in numpy, with no
ramstream code: per block of the base's scales (a row for per-channel scales, the whole tensor for
a per-tensor one), scale = f32(max |v|) / the format's largest finite value (448 for E4M3, 57344
for E5M2; 1 for an all-zero block) and code = the FP8 value nearest to f32(v / scale), ties to
the even code, saturating. The scale tensors keep the base's names, dtypes and shapes, config.json
keeps its ``quantization_config`` (and the base's static activation scales, which it names), and
ramstream reads the output back as a base holding code x scale.
"""

from __future__ import annotations

import json
import re
from pathlib import Path
from typing import Any

import numpy as np
import pytest

from ramstream.api import merge
from ramstream.blocks.quantized import quantize_bands
from ramstream.config import RunOptions
from ramstream.format import codecs
from ramstream.format.dtypes import FloatCode
from tests.checks import assert_bit_identical
from tests.families import Family, read_model_dir, read_safetensors
from tests.quantized_families import build_fp8_family, ct_config, quantization_config
from tests.reference import reference_merge
from tests.test_cli import as_process, assert_nothing_finished, in_process, ok, one_line_error

pytest.importorskip("torch")  # the families are quantized by torch

LARGEST = {"F8_E4M3": 448.0, "F8_E5M2": 57344.0}
FORMAT = {"F8_E4M3": (3, 7), "F8_E5M2": (2, 15)}  # mantissa bits, exponent bias


def fp8_magnitudes(dtype: str) -> np.ndarray:
    """float64 (128,): the magnitude of codes 0..127 (sign bit clear); inf where the code is no
    finite value (E4M3's NaN, E5M2's infinities and NaNs)."""
    mbits, bias = FORMAT[dtype]
    top = (1 << (7 - mbits)) - 1  # the largest exponent field
    values = []
    for code in range(128):
        exponent, mantissa = code >> mbits, code & ((1 << mbits) - 1)
        if exponent == 0:
            value = mantissa / 2**mbits * 2.0 ** (1 - bias)
        else:
            value = (1 + mantissa / 2**mbits) * 2.0 ** (exponent - bias)
        no_value = exponent == top and (dtype == "F8_E5M2" or mantissa == (1 << mbits) - 1)
        values.append(np.inf if no_value else value)
    return np.array(values)


def to_fp8(values: np.ndarray, dtype: str) -> np.ndarray:
    """uint8 codes of float32 ``values``: the nearest finite value (so beyond the largest: the
    largest), of two equally near the even code, the sign bit from the value's sign."""
    magnitudes = fp8_magnitudes(dtype)
    codes = np.empty(values.size, np.uint8)
    for lo in range(0, values.size, 4096):
        x = np.abs(values[lo : lo + 4096].astype(np.float64))
        distance = np.abs(x[:, None] - magnitudes[None, :])
        nearest = distance == distance.min(axis=1, keepdims=True)
        even = nearest & (np.arange(128) % 2 == 0)
        pick = np.where(even.any(axis=1), even.argmax(axis=1), nearest.argmax(axis=1))
        codes[lo : lo + 4096] = pick | (np.signbit(values[lo : lo + 4096]).astype(np.int64) << 7)
    return codes


def reference_fp8(values: np.ndarray, block: tuple[int, int], dtype: str) -> tuple[np.ndarray, np.ndarray]:
    """(codes (rows, cols), float32 scales (ceil(rows / bm), ceil(cols / bn))) of 2-D ``values``."""
    bm, bn = block
    rows, cols = values.shape
    scales = np.empty((-(-rows // bm), -(-cols // bn)), np.float32)
    codes = np.empty(values.shape, np.uint8)
    for i in range(scales.shape[0]):
        for j in range(scales.shape[1]):
            tile = values[i * bm : (i + 1) * bm, j * bn : (j + 1) * bn]
            amax = np.float32(np.abs(tile).max())
            scales[i, j] = amax / np.float32(LARGEST[dtype]) if amax > 0 else np.float32(1)
            codes[i * bm : (i + 1) * bm, j * bn : (j + 1) * bn] = to_fp8(
                (tile / scales[i, j]).astype(np.float32).ravel(), dtype
            ).reshape(tile.shape)
    return codes, scales


def fp8_value(codes: np.ndarray, dtype: str) -> np.ndarray:
    """float32 value of each code (finite codes only)."""
    magnitude = fp8_magnitudes(dtype)[codes & 0x7F]
    return np.where(codes & 0x80, -magnitude, magnitude).astype(np.float32)


def block_of(strategy: str | None, shape: tuple[int, ...]) -> tuple[int, int]:
    return {None: (128, 128), "block": (128, 128), "channel": (1, shape[1]), "tensor": (shape[0], shape[1])}[strategy]


def expected_output(fam: Family) -> tuple[dict[str, Any], dict[str, np.ndarray]]:
    """The RAM+ merge (base read as f32) written as --out-dtype fp8 writes it, by the reference;
    and per quantized tensor, the float32 values code x scale a reader gets back."""
    base = read_safetensors(fam.base / "model.safetensors")
    scheme = json.loads((fam.base / "config.json").read_text())["quantization_config"]
    ct = scheme.get("config_groups", {}).get("group_0", {}).get("weights", {}).get("strategy")
    merged = reference_merge(fam, out_dtype="f32")
    expected = reference_merge(fam, out_dtype="bf16")
    back: dict[str, np.ndarray] = {}
    expected.update({n: t for n, t in base.items() if n.endswith(".input_scale")})  # copied as they are
    for name, shape in fam.shapes.items():
        scale_name = next((name + s for s in ("_scale_inv", "_scale") if name + s in base), None)
        if scale_name is None:
            continue
        dtype, scale_shape = base[name][0], base[scale_name][1]
        codes, scales = reference_fp8(merged[name][2].reshape(shape), block_of(ct, shape), dtype)
        expected[name] = (dtype, shape, codes.ravel())
        expected[scale_name] = (base[scale_name][0], scale_shape, scales.ravel())
        rows = np.arange(shape[0]) // block_of(ct, shape)[0]
        cols = np.arange(shape[1]) // block_of(ct, shape)[1]
        back[name] = fp8_value(codes, dtype) * scales[rows][:, cols]
    return expected, back


def merge_fp8(fam: Family, out: Path, **run: Any) -> None:
    options = RunOptions(cache_dir=out.parent / "cache", quiet=True, **run)
    merge(fam.base, [str(a) for a in fam.agents], out=out, out_dtype="fp8", quantized_base_as="f32", options=options)


def read_back(out: Path, fam: Family, root: Path) -> dict[str, Any]:
    """``out`` as the base of a merge that writes it unchanged (task arithmetic with lambda 0, in
    float32): the values ramstream reads from it."""
    options = RunOptions(cache_dir=root / "cache-back", quiet=True)
    again = root / "back"
    given = {"lambda": 0.0}
    merge(out, [str(fam.agents[0])], out=again, method="task_arithmetic", method_options=given, out_dtype="f32",
          quantized_base_as="f32", options=options)  # fmt: skip
    return read_model_dir(again)


@pytest.mark.parametrize("strategy", ["tensor", "channel", "block"])
def test_compressed_tensors_base_is_written_in_its_scheme(tmp_path: Path, strategy: str) -> None:
    fam, _ = build_fp8_family(tmp_path / "fam", strategy=strategy, seed=5)
    expected, back = expected_output(fam)
    for block in (192, 1 << 16):  # blocks of one band (a row, 128 rows, the whole tensor) or several
        merge_fp8(fam, tmp_path / f"out-{block}", block_elems=block)
        assert_bit_identical(tmp_path / f"out-{block}", expected)
    out = tmp_path / "out-192"
    base = read_safetensors(fam.base / "model.safetensors")
    written = read_model_dir(out)
    for name in back:  # the scales as the base has them: name, dtype, shape
        assert written[name + "_scale"][:2] == base[name + "_scale"][:2]
    activation = [n for n in base if n.endswith(".input_scale")]  # static: named by quantization_config
    assert activation and all(written[n][2].tobytes() == base[n][2].tobytes() for n in activation)
    config = json.loads((out / "config.json").read_text())
    assert config["quantization_config"] == ct_config(strategy)
    card = (out / "README.md").read_text()
    assert "scales recomputed from the merged values" in card and "keeps its `quantization_config`" in card
    read = read_back(out, fam, tmp_path)
    for name, values in back.items():  # equal as numbers: lambda 0 adds +0, which turns a -0 into +0
        assert read[name][0] == "F32"
        assert np.array_equal(read[name][2], values.ravel()), name


def test_e5m2_base_is_written_in_e5m2(tmp_path: Path) -> None:
    fam, _ = build_fp8_family(tmp_path / "fam", fmt="e5m2", seed=4)
    expected, back = expected_output(fam)
    merge_fp8(fam, tmp_path / "out", block_elems=320)
    assert_bit_identical(tmp_path / "out", expected)
    assert {d for d, _, _ in read_model_dir(tmp_path / "out").values()} == {"F8_E5M2", "F32", "BF16"}
    config = json.loads((tmp_path / "out" / "config.json").read_text())
    assert config["quantization_config"] == quantization_config("e5m2")
    read = read_back(tmp_path / "out", fam, tmp_path)
    for name, values in back.items():
        assert np.array_equal(read[name][2], values.ravel()), name


def test_per_tensor_scales_need_the_whole_tensor_in_one_block(tmp_path: Path) -> None:
    wide = {"model.norm.weight": ((64,), False), "model.layers.0.mlp.up_proj.weight": ((256, 2400), True)}
    fam, _ = build_fp8_family(tmp_path / "fam", shapes=wide, densities=(0.3,), strategy="tensor")
    args = ["merge", fam.base, *fam.agents, "--out-dtype", "fp8", "--cache-dir", tmp_path / "c"]
    outcome = as_process(*args, "--out", tmp_path / "out", "--memory", "16MiB")
    assert outcome.code == 1
    line = one_line_error(outcome, "model.layers.0.mlp.up_proj.weight", "--out-dtype fp8", "one scale for the whole")
    assert_nothing_finished(tmp_path / "out")
    (memory,) = re.findall(r"pass --memory (\d+MiB)", line)
    ok(in_process(*args, "--out", tmp_path / "out", "--memory", memory))
    assert read_model_dir(tmp_path / "out")["model.layers.0.mlp.up_proj.weight_scale"][:2] == ("F32", (1,))


@pytest.mark.parametrize("scale_dtype", ["BF16", "F16"])
def test_scales_are_rounded_to_the_bases_scale_dtype_first(scale_dtype: str) -> None:
    """A base whose scales are bf16 or f16 gets its scales in that dtype: rounded (to nearest,
    ties to even) before the codes are computed, so code x stored scale is what a reader gets."""
    rng = np.random.default_rng(3)
    values = (rng.standard_normal((70, 50)) * 0.05).astype(np.float32)
    values[:3] = 0  # an all-zero row: scale 1
    codes, scales = quantize_bands(values.ravel(), 50, (1, 50), "F8_E4M3", scale_dtype)
    amax = np.abs(values).max(axis=1, keepdims=True)
    exact = np.where(amax > 0, amax / np.float32(448), np.float32(1)).astype(np.float32)
    if scale_dtype == "BF16":
        rounded = exact.astype(np.float64)  # to bf16 by hand: 8 significant bits, ties to even
        exponent = np.floor(np.log2(rounded))
        rounded = (np.round(rounded / 2.0 ** (exponent - 7)) * 2.0 ** (exponent - 7)).astype(np.float32)
    else:
        rounded = exact.astype(np.float16).astype(np.float32)
    assert np.array_equal(scales, rounded)
    code = FloatCode.BF16 if scale_dtype == "BF16" else FloatCode.F16
    assert np.array_equal(codecs.decode(codecs.encode(scales, code), code), scales)
    want = to_fp8((values / rounded).astype(np.float32).ravel(), "F8_E4M3")
    assert np.array_equal(codes, want)
