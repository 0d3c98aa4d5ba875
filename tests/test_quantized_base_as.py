"""What a quantized base stands for (``--quantized-base-as``): agents trained from its bf16 conversion.

Training frameworks dequantize an FP8 base to bf16 before training, so an element a bf16 agent
left holds bf16(dequant(base)), not dequant(base). Read as bf16 (what ``auto`` picks when every
agent is bf16), the FP8 base read in place must merge, byte for byte, as the base converted to
bf16 first (by torch, as the test writes it), and ``inspect`` must show the agents' own
densities; read as f32 it stays the dequantized float32 values (today's bytes, and the rounding
counted as updates). The index records the setting: one probed with another is refused (an
explicit ``--index``) or not reused (the cache).
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest
import torch

from ramstream.api import merge
from ramstream.config import RunOptions
from ramstream.format.family import open_family
from ramstream.index.store import open_index_store
from tests.families import Family, read_model_dir, read_safetensors, write_safetensors
from tests.quantized_families import (
    FP8_SHAPES,
    build_fp8_family,
    build_mxfp4_family,
    converted_dir,
    cut_blocks,
    torch_bf16,
    write_dir,
)
from tests.test_cli import in_process, ok, one_line_error
from tests.test_quantized import reference_density, same_tensors

DENSITIES = (0.05, 0.4, 0.5)
METHODS: list[tuple[str, dict[str, Any], list[str]]] = [
    ("ram+", {}, []),
    ("ties", {"density": 0.3}, ["--density", "0.3"]),
    ("task_arithmetic", {"lambda": 0.7}, ["--lambda", "0.7"]),
]
QUANTIZED = [name for name, (_, quantized) in FP8_SHAPES.items() if quantized]


@pytest.fixture(scope="module")
def trained(tmp_path_factory: pytest.TempPathFactory) -> tuple[Family, Path, Path]:
    """An FP8 base, bf16 agents trained from its bf16 conversion; that conversion; the f32 one."""
    root = tmp_path_factory.mktemp("bf16-trained")
    fam, as_f32 = build_fp8_family(root, densities=DENSITIES, trained_from="bf16")
    return fam, converted_dir(root, "bf16"), as_f32


def _cli_merge(base: Path, fam: Family, out: Path, flags: list[str], *more: str | Path) -> dict[str, Any]:
    args = ["merge", base, *fam.agents, "--out", out, "--out-dtype", "bf16", "--quiet", *flags, *more]
    ok(in_process(*args, "--cache-dir", out.parent / f"cache-{out.name}"))
    return read_model_dir(out)


def _api_merge(base: Path, fam: Family, out: Path, method: str, given: dict[str, Any], **run: Any) -> dict[str, Any]:
    base_as = run.pop("base_as", "auto")
    options = RunOptions(cache_dir=out.parent / "cache", quiet=True, **run)
    agents = [str(a) for a in fam.agents]
    settings = {"method": method, "method_options": given, "out_dtype": "bf16", "quantized_base_as": base_as}
    merge(base, agents, out=out, options=options, **settings)
    return read_model_dir(out)


@pytest.mark.parametrize(("method", "given", "flags"), METHODS, ids=[m for m, _, _ in METHODS])
def test_the_default_merges_as_the_bf16_conversion(
    trained: tuple[Family, Path, Path], tmp_path: Path, method: str, given: dict[str, Any], flags: list[str]
) -> None:
    fam, as_bf16, _ = trained
    expected = _cli_merge(as_bf16, fam, tmp_path / "bf16", ["--method", method, *flags])
    same_tensors(_cli_merge(fam.base, fam, tmp_path / "auto", ["--method", method, *flags]), expected)
    bf16 = ["--method", method, *flags, "--quantized-base-as", "bf16"]
    same_tensors(_cli_merge(fam.base, fam, tmp_path / "explicit", bf16, "--memory", "16MiB"), expected)
    for block in cut_blocks(method):
        got = _api_merge(fam.base, fam, tmp_path / f"api-{block}", method, given, base_as="bf16", block_elems=block)
        same_tensors(got, expected)
    card = (tmp_path / "auto" / "README.md").read_text()
    assert "then rounded to bf16 as its bf16 conversion holds them" in card


def test_torch_backend_merges_as_the_bf16_conversion(trained: tuple[Family, Path, Path], tmp_path: Path) -> None:
    fam, as_bf16, _ = trained
    expected = _api_merge(as_bf16, fam, tmp_path / "bf16", "ram+", {})
    same_tensors(_api_merge(fam.base, fam, tmp_path / "torch", "ram+", {}, backend="torch", block_elems=2048), expected)


def test_f32_keeps_the_dequantized_values(trained: tuple[Family, Path, Path], tmp_path: Path) -> None:
    fam, as_bf16, as_f32 = trained
    f32 = ["--quantized-base-as", "f32"]
    expected = _cli_merge(as_f32, fam, tmp_path / "as-f32", [])
    got = _cli_merge(fam.base, fam, tmp_path / "f32", f32)
    same_tensors(got, expected)
    other = _cli_merge(as_bf16, fam, tmp_path / "as-bf16", [])
    assert any(got[n][2].tobytes() != other[n][2].tobytes() for n in QUANTIZED), "the setting changes the merge"
    assert "rounded to" not in (tmp_path / "f32" / "README.md").read_text()


def _densities(index: Path) -> dict[str, list[float]]:
    shown = in_process("inspect", index, "--by", "tensor", "--json")
    assert shown.code == 0, shown.err
    return {t["key"]: [a["density"] for a in t["agents"]] for t in json.loads(shown.out)["tensors"]}


def test_inspect_shows_the_agents_own_densities(trained: tuple[Family, Path, Path], tmp_path: Path) -> None:
    fam, _, _ = trained
    members = [fam.base, *fam.agents]
    ok(in_process("probe", *members, "--index", tmp_path / "auto", "--quiet"))
    densities = _densities(tmp_path / "auto")
    for name in QUANTIZED:
        assert densities[name] == pytest.approx(reference_density(fam, name)), name  # against the bf16 conversion
        assert densities[name] == pytest.approx(list(DENSITIES), abs=0.05), name  # what the agents changed
    assert open_index_store(tmp_path / "auto").header.quantized_base_as == "bf16"
    assert "quantized base read as bf16" in ok(in_process("status", tmp_path / "auto")).out
    ok(in_process("probe", *members, "--index", tmp_path / "f32", "--quantized-base-as", "f32", "--quiet"))
    rounding = _densities(tmp_path / "f32")
    assert all(d > 0.7 for name in QUANTIZED for d in rounding[name]), "f32 counts the rounding as updates"
    assert open_index_store(tmp_path / "f32").header.quantized_base_as == "f32"
    shown = json.loads(ok(in_process("status", tmp_path / "f32", "--json")).out)
    assert shown["index_info"]["quantized_base_as"] == "f32"


def test_an_index_probed_with_another_setting_is_refused(trained: tuple[Family, Path, Path], tmp_path: Path) -> None:
    fam, _, _ = trained
    members, index = [fam.base, *fam.agents], tmp_path / "index"
    ok(in_process("probe", *members, "--index", index, "--quiet"))
    for command in (["probe"], ["merge", "--out", tmp_path / "out"]):
        outcome = in_process(*command, *members, "--index", index, "--quantized-base-as", "f32")
        one_line_error(outcome, str(index), "read as bf16, not as f32", "--quantized-base-as bf16")
    ok(in_process("merge", *members, "--out", tmp_path / "out2", "--index", index, "--quantized-base-as", "bf16"))
    cache = tmp_path / "cache"  # the cache keys an index by the setting: another setting, another index
    for setting in ("auto", "f32", "bf16"):
        ok(in_process("probe", *members, "--quantized-base-as", setting, "--cache-dir", cache, "--quiet"))
    indexes = sorted((cache / "index").glob("*.zarr"))
    assert sorted(open_index_store(p).header.quantized_base_as for p in indexes) == ["bf16", "f32"]


def _converted_agents(fam: Family, root: Path, dtype: str) -> list[Path]:
    """The family's agents saved in ``dtype`` (F32 or F16) by torch."""
    kind = {"F32": torch.float32, "F16": torch.float16}[dtype]
    paths = []
    for t, agent in enumerate(fam.agents):
        table = read_safetensors(agent / "model.safetensors")
        out = {}
        for name, (_, shape, _raw) in table.items():
            values = torch.from_numpy(fam.agent_values[t][name].copy()).to(kind)
            out[name] = (dtype, shape, values.numpy())
        path = root / f"agent{t}-{dtype}"
        path.mkdir(parents=True)
        (path / "config.json").write_text(json.dumps({"model_type": "deepseek_v3"}))
        write_safetensors(path / "model.safetensors", out)
        paths.append(path)
    return paths


def test_auto_follows_the_agents_dtype(trained: tuple[Family, Path, Path], tmp_path: Path) -> None:
    fam, as_bf16, _ = trained
    f32_agents, f16_agents = _converted_agents(fam, tmp_path, "F32"), _converted_agents(fam, tmp_path, "F16")
    assert open_family(fam.base, [str(a) for a in fam.agents]).quantized_base_as == "bf16"
    assert open_family(fam.base, [str(a) for a in f16_agents]).quantized_base_as == "f16"
    assert open_family(fam.base, [str(a) for a in f32_agents]).quantized_base_as == "f32"
    mixed = [str(f32_agents[0]), *map(str, fam.agents[1:])]
    assert open_family(fam.base, mixed).quantized_base_as == "f32"
    assert open_family(fam.base, mixed, quantized_base_as="bf16").quantized_base_as == "bf16"
    assert open_family(as_bf16, [str(a) for a in f16_agents]).quantized_base_as == "f32"  # no quantized base: moot


def test_f16_merges_as_the_f16_conversion(trained: tuple[Family, Path, Path], tmp_path: Path) -> None:
    fam, _, as_f32 = trained
    table = read_safetensors(as_f32 / "model.safetensors")
    as_f16 = {
        name: ("F16", shape, torch.from_numpy(raw.copy()).to(torch.float16).numpy())
        if dtype == "F32"
        else (dtype, shape, raw)
        for name, (dtype, shape, raw) in table.items()
    }
    base_f16 = write_dir(tmp_path / "base-f16", as_f16, {"model_type": "deepseek_v3", "torch_dtype": "float16"})
    expected = _cli_merge(base_f16, fam, tmp_path / "as-f16", [])
    same_tensors(_cli_merge(fam.base, fam, tmp_path / "f16", ["--quantized-base-as", "f16"]), expected)


def test_mxfp4_read_as_bf16(tmp_path: Path) -> None:
    """FP4 values times a power of two are bf16 values: the bf16 conversion of an MXFP4 base is
    exact, so its agents (bf16) are trained from the same values either way."""
    fam, as_f32 = build_mxfp4_family(tmp_path / "fam")
    table = read_safetensors(as_f32 / "model.safetensors")
    converted = {
        name: ("BF16", shape, torch_bf16(raw)) if dtype == "F32" else (dtype, shape, raw)
        for name, (dtype, shape, raw) in table.items()
    }
    as_bf16 = write_dir(tmp_path / "base-bf16", converted, {"model_type": "gpt_oss", "torch_dtype": "bfloat16"})
    expected = _api_merge(as_bf16, fam, tmp_path / "as-bf16", "ties", {"density": 0.3})
    for setting in ("auto", "bf16"):
        got = _api_merge(fam.base, fam, tmp_path / setting, "ties", {"density": 0.3}, base_as=setting, block_elems=192)
        same_tensors(got, expected)


def test_sweep_reads_the_base_as_told(trained: tuple[Family, Path, Path], tmp_path: Path) -> None:
    fam, as_bf16, as_f32 = trained
    members, cache = [fam.base, *fam.agents], tmp_path / "cache"
    for setting, converted in (("auto", as_bf16), ("f32", as_f32)):
        out = tmp_path / f"sweep-{setting}"
        grid = ["--grid", "ram+:r=0.1", "--out-dtype", "bf16", "--quantized-base-as", setting, "--quiet"]
        ok(in_process("sweep", *members, "--out", out, *grid, "--cache-dir", cache))
        (candidate,) = [p for p in out.iterdir() if p.is_dir() and not p.name.startswith(".")]
        same_tensors(read_model_dir(candidate), _cli_merge(converted, fam, tmp_path / f"as-{setting}", ["--r", "0.1"]))


def _set_header(index: Path, value: object) -> None:
    """The index's header with ``quantized_base_as`` set to ``value`` (None: without it)."""
    meta = json.loads((index / "zarr.json").read_text())
    header = meta["attributes"]["ramstream_index"]
    header.pop("quantized_base_as", None)
    if value is not None:
        header["quantized_base_as"] = value
    (index / "zarr.json").write_text(json.dumps(meta))


def test_an_index_without_the_setting_was_read_as_f32(trained: tuple[Family, Path, Path], tmp_path: Path) -> None:
    """An index written before the setting existed read a quantized base as f32; a damaged value is refused."""
    fam, _, _ = trained
    members, index = [fam.base, *fam.agents], tmp_path / "index"
    ok(in_process("probe", *members, "--index", index, "--quantized-base-as", "f32", "--quiet"))
    _set_header(index, None)
    assert open_index_store(index).header.quantized_base_as == "f32"
    ok(in_process("probe", *members, "--index", index, "--quantized-base-as", "f32", "--quiet"))
    one_line_error(in_process("probe", *members, "--index", index), "read as f32, not as bf16")
    _set_header(index, "fp4")
    one_line_error(in_process("probe", *members, "--index", index), str(index), "quantized_base_as", "'fp4'")
