"""FP8 checkpoints with block scales, read in place.

A base stored as DeepSeek-V3 ships it (FP8 weights, ``weight_scale_inv`` per 128 x 128 block)
merged with bf16 agents read as its dequantized float32 values (``--quantized-base-as f32``: these
families' agents were derived from those values) must give, byte for byte, what merging the same
base converted to float32 first gives (``--out-dtype bf16``), for every budget (blocks that start
mid-row, mid-band) and method, and the dense reference's bytes; the output is bf16 without the
scheme in config.json. (The default, agents trained from the base's bf16 conversion:
tests/test_quantized_base_as.py.)
A scheme ramstream does not read, or scales that do not fit their weights, are refused in one
line before any pass.
"""

from __future__ import annotations

import json
import shutil
from dataclasses import replace
from pathlib import Path
from typing import Any

import numpy as np
import pytest

from ramstream.api import merge
from ramstream.config import RunOptions
from ramstream.index.store import open_index_store
from tests.checks import assert_bit_identical
from tests.families import Family, read_model_dir, read_safetensors, write_safetensors
from tests.quantized_families import (
    FP8_SHAPES,
    build_fp8_family,
    build_mxfp4_family,
    cut_blocks,
    quantization_config,
    quantize,
    write_dir,
)
from tests.reference import reference_merge
from tests.test_cli import as_process, assert_nothing_finished, in_process, ok, one_line_error
from tests.test_resume import cli, killed_then_rerun, renamed_to, run_ok

METHODS: list[tuple[str, dict[str, Any]]] = [
    ("ram+", {}),
    ("ties", {"density": 0.3}),
    ("task_arithmetic", {"lambda": 0.7}),
    ("della", {"density": 0.5, "epsilon": 0.1, "seed": 1}),
    ("dare_ties", {"density": 0.5, "seed": 3}),
    ("breadcrumbs", {"density": 0.5, "gamma": 0.05}),
    ("linear", {"weights": [0.5, 1.0, 2.0]}),
    ("model_stock", {}),
    ("sce", {}),
]


@pytest.fixture(scope="module")
def fp8(tmp_path_factory: pytest.TempPathFactory) -> tuple[Family, Path]:
    return build_fp8_family(tmp_path_factory.mktemp("fp8"))


def _merge(
    base: Path, fam: Family, out: Path, method: str, given: dict[str, Any], base_as: Any = "f32", **run: Any
) -> dict[str, Any]:
    """Merge with ``--quantized-base-as base_as`` (f32: the values these families' agents were derived from)."""
    options = RunOptions(cache_dir=out.parent / "cache", quiet=True, **run)
    merge(
        base,
        [str(a) for a in fam.agents],
        out=out,
        method=method,
        method_options=given,
        out_dtype="bf16",
        quantized_base_as=base_as,
        options=options,
    )
    return read_model_dir(out)


def same_tensors(got: dict[str, Any], expected: dict[str, Any]) -> None:
    """The same tensors, dtypes, shapes and bytes (``read_model_dir``'s view of two outputs)."""
    assert sorted(got) == sorted(expected)
    for name in expected:
        assert got[name][:2] == expected[name][:2], name
        assert got[name][2].tobytes() == expected[name][2].tobytes(), name


@pytest.mark.parametrize(("method", "given"), METHODS, ids=[m for m, _ in METHODS])
def test_fp8_base_merges_as_its_f32_conversion(
    fp8: tuple[Family, Path], tmp_path: Path, method: str, given: dict[str, Any]
) -> None:
    fam, as_f32 = fp8
    converted = _merge(as_f32, fam, tmp_path / "f32", method, given)
    for block in cut_blocks(method):
        quantized = _merge(fam.base, fam, tmp_path / f"fp8-{block}", method, given, block_elems=block)
        same_tensors(quantized, converted)
    assert not any(name.endswith("_scale_inv") for name in converted)


def test_fp8_base_matches_the_dense_reference(fp8: tuple[Family, Path], tmp_path: Path) -> None:
    fam, _ = fp8
    _merge(fam.base, fam, tmp_path / "out", "ram+", {}, block_elems=256)
    assert_bit_identical(tmp_path / "out", reference_merge(fam, out_dtype="bf16"))


def test_e5m2_base(tmp_path: Path) -> None:
    fam, as_f32 = build_fp8_family(tmp_path / "fam", fmt="e5m2", seed=4)
    quantized = _merge(fam.base, fam, tmp_path / "fp8", "ram+", {}, block_elems=320)
    same_tensors(quantized, _merge(as_f32, fam, tmp_path / "f32", "ram+", {}))
    assert_bit_identical(tmp_path / "fp8", reference_merge(fam, out_dtype="bf16"))


def test_cli_writes_bf16_without_the_scheme(fp8: tuple[Family, Path], tmp_path: Path) -> None:
    fam, _ = fp8
    out = tmp_path / "out"
    args = ["merge", fam.base, *fam.agents, "--out", out, "--memory", "16MiB", "--quantized-base-as", "f32"]
    ok(in_process(*args, "--cache-dir", tmp_path / "c"))
    config = json.loads((out / "config.json").read_text())
    assert "quantization_config" not in config and config["torch_dtype"] == "bfloat16"
    assert {dtype for dtype, _, _ in read_model_dir(out).values()} == {"BF16"}
    card = (out / "README.md").read_text()
    assert "stored quantized (fp8 (e4m3, one scale per 128 x 128 block))" in card
    assert "`quantization_config` is dropped" in card
    assert_bit_identical(out, reference_merge(fam, out_dtype="bf16"))


# -- refusals, before any pass --------------------------------------------------------------------


def _damaged(fam: Family, root: Path, tensors: Any = None, config: Any = None) -> Path:
    """A copy of the family's base with its tensors and/or its config.json's quantization_config changed."""
    base = root / "base"
    shutil.copytree(fam.base, base)
    if tensors is not None:
        table = read_safetensors(fam.base / "model.safetensors")
        write_safetensors(base / "model.safetensors", tensors(table))
    if config is not None:
        doc = json.loads((fam.base / "config.json").read_text())
        doc["quantization_config"] = config
        if config == "absent":
            del doc["quantization_config"]
        (base / "config.json").write_text(json.dumps(doc))
    return base


Q = "model.layers.0.self_attn.q_proj.weight"


def _wrong_scale_shape(t: dict[str, Any]) -> dict[str, Any]:
    dtype, _, raw = t[Q + "_scale_inv"]
    return {**t, Q + "_scale_inv": (dtype, (6,), raw)}


def _without(name: str) -> Any:
    return lambda t: {k: v for k, v in t.items() if k != name}


def _renamed_weight(t: dict[str, Any]) -> dict[str, Any]:
    return {("model.other.weight" if k == Q else k): v for k, v in t.items()}


REFUSALS: dict[str, tuple[dict[str, Any], tuple[str, ...]]] = {
    "scale-shape": ({"tensors": _wrong_scale_shape}, (Q + "_scale_inv", "[6]", "[3, 2]")),
    "weight-without-scale": ({"tensors": _without(Q + "_scale_inv")}, (Q, "F8_E4M3", "_scale_inv")),
    "scale-without-weight": ({"tensors": _renamed_weight}, (Q + "_scale_inv", "no weight")),
    "no-scheme": ({"config": "absent"}, (Q, "no quantization_config")),
    "unknown-method": ({"config": {"quant_method": "gptq", "bits": 4}}, ("config.json", "'gptq'")),
    "block-size": ({"config": {**quantization_config(), "weight_block_size": [128]}}, ("weight_block_size",)),
    "other-format": ({"config": quantization_config("e5m2")}, (Q, "F8_E4M3", "F8_E5M2")),
    "unknown-format": ({"config": {**quantization_config(), "fmt": "e3m4"}}, ("fmt", "'e3m4'")),
}


@pytest.mark.parametrize("case", list(REFUSALS))
def test_bad_quantization_is_refused_in_one_line(fp8: tuple[Family, Path], tmp_path: Path, case: str) -> None:
    fam, _ = fp8
    change, needles = REFUSALS[case]
    base = _damaged(fam, tmp_path, **change)
    out, cache = tmp_path / "out", tmp_path / "cache"
    outcome = as_process("merge", base, *fam.agents, "--out", out, "--cache-dir", cache)
    one_line_error(outcome, *needles)
    assert_nothing_finished(out)
    assert not cache.exists() or not any(cache.rglob("*.json")), "no pass ran"


def test_an_agent_saved_with_its_bases_scheme_is_read_as_bf16(fp8: tuple[Family, Path], tmp_path: Path) -> None:
    """Agents trained from an FP8 base often keep its config.json, scheme included: a scheme
    that quantizes none of their tensors is moot."""
    fam, _ = fp8
    agent = tmp_path / "agent"
    shutil.copytree(fam.agents[0], agent)
    doc = json.loads((agent / "config.json").read_text())
    (agent / "config.json").write_text(json.dumps({**doc, "quantization_config": quantization_config()}))
    args = ["merge", fam.base, agent, *fam.agents[1:], "--out", tmp_path / "out", "--quantized-base-as", "f32"]
    ok(in_process(*args, "--cache-dir", tmp_path / "c"))
    assert np.array_equal(read_model_dir(tmp_path / "out")[Q][2], reference_merge(fam, out_dtype="bf16")[Q][2])


# -- the torch backend ----------------------------------------------------------------------------

TORCH_METHODS = [m for m in METHODS if m[0] in ("ram+", "ties", "della", "task_arithmetic", "dare_ties")]


@pytest.mark.parametrize(("method", "given"), TORCH_METHODS, ids=[m for m, _ in TORCH_METHODS])
def test_torch_backend_writes_the_bytes_of_the_f32_conversion(
    fp8: tuple[Family, Path], tmp_path: Path, method: str, given: dict[str, Any]
) -> None:
    pytest.importorskip("torch")
    fam, as_f32 = fp8
    converted = _merge(as_f32, fam, tmp_path / "f32", method, given)
    same_tensors(_merge(fam.base, fam, tmp_path / "torch", method, given, backend="torch", block_elems=2048), converted)


# -- a DeepSeek-shaped mixture of experts: many FP8 experts, many batches, kill -9 and resume -------


def deepseek_shapes(
    layers: int, experts: int, rows: int = 160, hidden: int = 96
) -> dict[str, tuple[tuple[int, ...], bool]]:
    """DeepSeek-V3's names: bf16 embeddings, norms and router; FP8 attention and expert projections."""
    shapes: dict[str, tuple[tuple[int, ...], bool]] = {"model.embed_tokens.weight": ((64, hidden), False)}
    for layer in range(layers):
        p = f"model.layers.{layer}."
        shapes[p + "input_layernorm.weight"] = ((hidden,), False)
        shapes[p + "self_attn.q_a_proj.weight"] = ((hidden, hidden), True)
        shapes[p + "mlp.gate.weight"] = ((experts, hidden), False)
        for e in range(experts):
            shapes[p + f"mlp.experts.{e}.gate_proj.weight"] = ((rows, hidden), True)
            shapes[p + f"mlp.experts.{e}.up_proj.weight"] = ((rows, hidden), True)
            shapes[p + f"mlp.experts.{e}.down_proj.weight"] = ((hidden, rows), True)
    shapes["model.norm.weight"] = ((hidden,), False)
    shapes["lm_head.weight"] = ((64, hidden), False)
    return shapes


@pytest.fixture(scope="module")
def deepseek(tmp_path_factory: pytest.TempPathFactory) -> tuple[Family, Path]:
    """~760 k elements per checkpoint in 2 x 24 x 3 FP8 experts: under --memory 16MiB (blocks of
    262144 elements) three batches of fifty tensors or so."""
    root = tmp_path_factory.mktemp("deepseek")
    return build_fp8_family(root, shapes=deepseek_shapes(2, 24), densities=(0.05, 0.4), seed=7)


def test_deepseek_moe_every_budget_and_backend(deepseek: tuple[Family, Path], tmp_path: Path) -> None:
    fam, as_f32 = deepseek
    given = {"density": 0.3}
    converted = _merge(as_f32, fam, tmp_path / "f32", "ties", given)
    for block in (4096, 1 << 18):  # blocks that cut rows and bands of 128 rows; many tensors a block
        same_tensors(_merge(fam.base, fam, tmp_path / f"fp8-{block}", "ties", given, block_elems=block), converted)
    pytest.importorskip("torch")
    on_torch = _merge(fam.base, fam, tmp_path / "torch", "ties", given, backend="torch", block_elems=1 << 16)
    same_tensors(on_torch, converted)


@pytest.fixture(scope="module")
def deepseek_channel(tmp_path_factory: pytest.TempPathFactory) -> tuple[Family, Path]:
    """The same experts in compressed-tensors' FP8 with a scale per channel (row)."""
    root = tmp_path_factory.mktemp("deepseek-channel")
    return build_fp8_family(root, shapes=deepseek_shapes(2, 24), densities=(0.05, 0.4), seed=7, strategy="channel")


KILLS = {
    "probe": ("ram+", "progress/probe/c.1", [], "deepseek"),
    "merge": ("ties", "journal/merge/c.1", [], "deepseek"),
    "merge-fp8-out": ("ties", "journal/merge/c.1", ["--out-dtype", "fp8"], "deepseek"),
    "merge-fp8-out-channel": ("ties", "journal/merge/c.1", ["--out-dtype", "fp8"], "deepseek_channel"),
}


@pytest.mark.slow  # three CLI processes per case
@pytest.mark.parametrize("where", list(KILLS))
def test_killed_mid_pass_the_rerun_gives_the_same_bytes(
    request: pytest.FixtureRequest, tmp_path: Path, where: str
) -> None:
    method, step, more, family = KILLS[where]
    fam, _ = request.getfixturevalue(family)
    opts = ["--method", method, *(["--density", "0.3"] if method == "ties" else []), "--memory", "16MiB", "--quiet"]
    opts += more
    members = [fam.base, *fam.agents]
    run_ok(cli("merge", *members, "--out", tmp_path / "ref", *opts, "--cache-dir", tmp_path / "cache-ref"))
    out = tmp_path / "out"
    args: list[str | Path] = ["merge", *members, "--out", out, *opts, "--cache-dir", tmp_path / "cache"]
    assert killed_then_rerun(args, renamed_to(step), out) == (tmp_path / "ref" / "model.safetensors").read_bytes()
    if where == "probe":  # bf16 agents: the base was read as bf16 (the default, auto), the probe resumed so
        (index,) = (tmp_path / "cache" / "index").glob("*.zarr")
        assert open_index_store(index).header.quantized_base_as == "bf16"


def test_fp8_agents_are_read_dequantized_too(fp8: tuple[Family, Path], tmp_path: Path) -> None:
    """An agent stored in FP8 (its own scales, its own config) is its dequantized values."""
    fam, _ = fp8
    tensors: dict[str, tuple[str, tuple[int, ...], np.ndarray]] = {}
    values = dict(fam.agent_values[0])
    for name, (shape, quantized) in FP8_SHAPES.items():
        if quantized:
            q, scale, values[name] = quantize(fam.agent_values[0][name].reshape(shape), "e4m3")
            values[name] = values[name].ravel()
            tensors[name], tensors[name + "_scale_inv"] = ("F8_E4M3", shape, q), ("F32", scale.shape, scale)
        else:
            tensors[name] = read_safetensors(fam.agents[0] / "model.safetensors")[name]
    agent = write_dir(
        tmp_path / "agent", tensors, {"model_type": "deepseek_v3", "quantization_config": quantization_config()}
    )
    mixed = replace(fam, agents=[agent, *fam.agents[1:]], agent_values=[values, *fam.agent_values[1:]])
    _merge(fam.base, mixed, tmp_path / "out", "ram+", {}, block_elems=512)
    assert_bit_identical(tmp_path / "out", reference_merge(mixed, out_dtype="bf16"))


# -- compressed-tensors: per-tensor and per-channel scales ---------------------------------------


@pytest.mark.parametrize("strategy", ["tensor", "channel", "block"])
def test_compressed_tensors_scales(tmp_path: Path, strategy: str) -> None:
    fam, as_f32 = build_fp8_family(tmp_path / "fam", strategy=strategy, seed=5)
    for method, given in (("ram+", {}), ("ties", {"density": 0.3})):
        converted = _merge(as_f32, fam, tmp_path / f"f32-{method}", method, given)
        same_tensors(_merge(fam.base, fam, tmp_path / f"fp8-{method}", method, given, block_elems=320), converted)
    assert_bit_identical(tmp_path / "fp8-ram+", reference_merge(fam, out_dtype="bf16"))
    config = json.loads((tmp_path / "fp8-ram+" / "config.json").read_text())
    assert "quantization_config" not in config
    card = (tmp_path / "fp8-ram+" / "README.md").read_text()
    assert f"compressed-tensors fp8 (e4m3, per-{strategy} scales)" in card


@pytest.mark.parametrize(
    ("change", "needles"),
    [
        ({"format": "pack-quantized"}, ("compressed-tensors", "'pack-quantized'")),
        ({"strategy": "group"}, ("config_groups.group_0.weights", "strategy")),
        ({"zero_point": True}, (Q + "_zero_point", "asymmetric")),
        ({"scale_shape": (1, 300)}, (Q + "_scale", "[1, 300]", "[300, 1]")),
    ],
    ids=["format", "strategy", "zero-point", "scale-shape"],
)
def test_compressed_tensors_refusals(tmp_path: Path, change: dict[str, Any], needles: tuple[str, ...]) -> None:
    fam, _ = build_fp8_family(tmp_path / "fam", strategy="channel", shapes=FP8_SHAPES, densities=(0.3,))
    config = json.loads((fam.base / "config.json").read_text())
    scheme = config["quantization_config"]
    if "format" in change:
        scheme["format"] = change["format"]
    if "strategy" in change:
        scheme["config_groups"]["group_0"]["weights"]["strategy"] = change["strategy"]
    (fam.base / "config.json").write_text(json.dumps(config))
    table = read_safetensors(fam.base / "model.safetensors")
    if change.get("zero_point"):
        table[Q + "_zero_point"] = ("F32", (300, 1), np.zeros(300, np.float32))
    if "scale_shape" in change:
        dtype, _, raw = table[Q + "_scale"]
        table[Q + "_scale"] = (dtype, change["scale_shape"], raw)
    write_safetensors(fam.base / "model.safetensors", table)
    outcome = as_process("merge", fam.base, *fam.agents, "--out", tmp_path / "out", "--cache-dir", tmp_path / "c")
    one_line_error(outcome, *needles)
    assert_nothing_finished(tmp_path / "out")


def test_a_nan_in_an_fp8_weight_is_named(fp8: tuple[Family, Path], tmp_path: Path) -> None:
    fam, _ = fp8

    def with_nan(table: dict[str, Any]) -> dict[str, Any]:
        dtype, shape, raw = table[Q]
        raw = raw.copy()
        raw[201] = 0x7F  # E4M3's NaN: row 1, column 1
        return {**table, Q: (dtype, shape, raw)}

    base = _damaged(fam, tmp_path, tensors=with_nan)
    outcome = as_process("merge", base, *fam.agents, "--out", tmp_path / "out", "--cache-dir", tmp_path / "c")
    one_line_error(outcome, Q, "nan", "[1, 1]")
    assert_nothing_finished(tmp_path / "out")


# -- MXFP4 (gpt-oss's experts) -------------------------------------------------------------------


@pytest.fixture(scope="module")
def mxfp4(tmp_path_factory: pytest.TempPathFactory) -> tuple[Family, Path]:
    return build_mxfp4_family(tmp_path_factory.mktemp("mxfp4"))


@pytest.mark.parametrize(("method", "given"), METHODS[:4], ids=[m for m, _ in METHODS[:4]])
def test_mxfp4_base_merges_as_its_f32_conversion(
    mxfp4: tuple[Family, Path], tmp_path: Path, method: str, given: dict[str, Any]
) -> None:
    fam, as_f32 = mxfp4
    converted = _merge(as_f32, fam, tmp_path / "f32", method, given)
    for block in (192, 1 << 16):  # blocks that cut an expert's rows and groups of 32; whole tensors
        same_tensors(_merge(fam.base, fam, tmp_path / f"mx-{block}", method, given, block_elems=block), converted)
    assert not any(name.endswith(("_blocks", "_scales")) for name in converted)
    if method == "ram+":
        assert_bit_identical(tmp_path / "mx-192", reference_merge(fam, out_dtype="bf16"))
        config = json.loads((tmp_path / "mx-192" / "config.json").read_text())
        assert "quantization_config" not in config
    pytest.importorskip("torch")
    same_tensors(_merge(fam.base, fam, tmp_path / "torch", method, given, backend="torch", block_elems=320), converted)


GATE_UP = "model.layers.0.mlp.experts.gate_up_proj"


@pytest.mark.parametrize(
    ("change", "needles"),
    [
        (lambda t: {k: v for k, v in t.items() if k != GATE_UP + "_scales"}, (GATE_UP + "_blocks", "_scales")),
        (lambda t: {**t, GATE_UP + "_scales": ("U8", (3, 32, 2), t[GATE_UP + "_scales"][2])}, ("[3, 32, 2]",)),
    ],
    ids=["no-scales", "scale-shape"],
)
def test_mxfp4_refusals(mxfp4: tuple[Family, Path], tmp_path: Path, change: Any, needles: tuple[str, ...]) -> None:
    fam, _ = mxfp4
    base = _damaged(fam, tmp_path, tensors=change)
    outcome = as_process("merge", base, *fam.agents, "--out", tmp_path / "out", "--cache-dir", tmp_path / "c")
    one_line_error(outcome, *needles)
    assert_nothing_finished(tmp_path / "out")


# -- inspect ----------------------------------------------------------------------------------------


def test_inspect_lists_quantized_tensors_without_their_scales(
    fp8: tuple[Family, Path], mxfp4: tuple[Family, Path], tmp_path: Path
) -> None:
    for (fam, _), stored in ((fp8, "F8_E4M3"), (mxfp4, "F32")):
        index = tmp_path / f"index-{stored}"
        args = ["probe", fam.base, *fam.agents, "--index", index, "--quantized-base-as", "f32"]
        ok(in_process(*args, "--cache-dir", tmp_path / "c"))
        shown = in_process("inspect", index, "--by", "tensor", "--json")
        assert shown.code == 0, shown.err
        tensors = {t["key"]: t for t in json.loads(shown.out)["tensors"]}
        assert set(tensors) == set(fam.shapes)  # no _scale_inv, _blocks or _scales
        quantized = [n for n, t in tensors.items() if t["dtypes"][0] == stored]
        assert quantized and all(tensors[n]["dtypes"][1:] == ["BF16"] * len(fam.agents) for n in quantized)
        for name in quantized:
            assert tensors[name]["shape"] == list(fam.shapes[name])
            density = reference_density(fam, name)
            assert [a["density"] for a in tensors[name]["agents"]] == pytest.approx(density)


def reference_density(fam: Family, name: str, eps: float = 1e-5) -> list[float]:
    """Each agent's share of elements with float32(eps) < |tau| (tau against the dequantized base)."""
    return [float(np.mean(np.abs(fam.task_vector(t, name)) > np.float32(eps))) for t in range(len(fam.agents))]


# -- --out-dtype fp8: the base's scheme, scales recomputed per block -------------------------------


def _fp8_reference(fam: Family) -> dict[str, tuple[str, tuple[int, ...], np.ndarray]]:
    """The RAM+ merge as the test quantizes it: per 128 x 128 block, scale = f32(max |v|) / 448 (1
    for an all-zero block), codes = torch's float8_e4m3fn of f32(v / scale)."""
    import torch

    merged = reference_merge(fam, out_dtype="f32")
    expected = reference_merge(fam, out_dtype="bf16")
    for name, (shape, quantized) in FP8_SHAPES.items():
        if not quantized:
            continue
        values = torch.from_numpy(merged[name][2].reshape(shape).copy())
        rows, cols = shape
        padded = torch.zeros(-(-rows // 128) * 128, -(-cols // 128) * 128)
        padded[:rows, :cols] = values
        amax = padded.reshape(padded.shape[0] // 128, 128, padded.shape[1] // 128, 128).abs().amax(dim=(1, 3))
        scale = torch.where(amax > 0, amax / torch.tensor(448.0), torch.tensor(1.0))
        expanded = scale.repeat_interleave(128, 0)[:rows].repeat_interleave(128, 1)[:, :cols]
        codes = (values / expanded).to(torch.float8_e4m3fn).view(torch.uint8).numpy().ravel()
        expected[name] = ("F8_E4M3", shape, codes)
        expected[name + "_scale_inv"] = ("F32", tuple(scale.shape), scale.numpy().ravel())
    return expected


def test_out_dtype_fp8_writes_the_bases_scheme(fp8: tuple[Family, Path], tmp_path: Path) -> None:
    pytest.importorskip("torch")
    fam, _ = fp8
    expected = _fp8_reference(fam)
    for block, backend in ((192, "numba"), (1 << 16, "numba"), (4096, "torch")):
        out = tmp_path / f"out-{block}-{backend}"
        options = RunOptions(cache_dir=tmp_path / "cache", quiet=True, block_elems=block, backend=backend)
        agents = [str(a) for a in fam.agents]
        merge(fam.base, agents, out=out, out_dtype="fp8", quantized_base_as="f32", options=options)
        assert_bit_identical(out, expected)
    config = json.loads((out / "config.json").read_text())
    assert config["quantization_config"] == quantization_config()
    card = (out / "README.md").read_text()
    assert "scales recomputed from the merged values (one per block, channel or tensor" in card
    again = tmp_path / "again"  # the output is an FP8 base like the one it came from
    ok(in_process("merge", out, *fam.agents, "--out", again, "--cache-dir", tmp_path / "c"))


def test_out_dtype_fp8_is_refused_for_other_bases(mxfp4: tuple[Family, Path], tmp_path: Path) -> None:
    fam, as_f32 = mxfp4
    for base, needle in ((fam.base, "mxfp4"), (as_f32, "not stored quantized")):
        outcome = as_process("merge", base, *fam.agents, "--out", tmp_path / "out", "--out-dtype", "fp8")
        one_line_error(outcome, "--out-dtype fp8", needle)
        assert_nothing_finished(tmp_path / "out")


def test_out_dtype_fp8_refuses_a_budget_below_one_band(tmp_path: Path) -> None:
    wide = {"model.norm.weight": ((64,), False), "model.layers.0.mlp.up_proj.weight": ((128, 2400), True)}
    fam, _ = build_fp8_family(tmp_path / "fam", shapes=wide, densities=(0.3,))
    args = ["merge", fam.base, *fam.agents, "--out-dtype", "fp8", "--cache-dir", tmp_path / "c"]
    outcome = as_process(*args, "--out", tmp_path / "out", "--memory", "16MiB")
    one_line_error(outcome, "model.layers.0.mlp.up_proj.weight", "--out-dtype fp8", "--memory 19MiB")
    assert_nothing_finished(tmp_path / "out")
    ok(in_process(*args, "--out", tmp_path / "out", "--memory", "19MiB"))
