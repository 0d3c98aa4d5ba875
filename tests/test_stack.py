"""Stacks of layers (mergekit's ``passthrough``: frankenmerges), end to end through the CLI.

Small bf16 models are written by hand (tests/families.py's writer), stacked by ``ramstream merge
--config X.yml``, and every output tensor is compared with an independent reference built here
from the input files: names renumbered, bytes equal, the tensors before the layers from the first
slice's model and those after from the last's; scaled tensors are the float32 products rounded to
bf16. Refusals are one line and leave nothing that looks finished. Parity with mergekit itself is
``test_stack_matches_mergekit`` (slow).
"""

from __future__ import annotations

import importlib.util
import json
import subprocess
import sys
from pathlib import Path
from typing import Any

import numpy as np
import pytest

from ramstream import mergekit_config
from ramstream.demo.samples import FamilyShape
from ramstream.errors import ConfigError
from tests.families import (
    bf16_to_f32,
    build_family,
    f32_to_bf16,
    read_elements,
    read_model_dir,
    write_safetensors,
    write_safetensors_chunked,
)
from tests.mergekit_runs import run_mergekit
from tests.test_cli import assert_nothing_finished, in_process, ok, one_line_error

H, V, INTER = 16, 40, 24
BEFORE = ("model.embed_tokens.weight", "model.position_ids")
AFTER = ("model.norm.weight", "lm_head.weight")
Tensors = dict[str, tuple[str, tuple[int, ...], np.ndarray]]


def layer_shapes(i: int) -> list[tuple[str, tuple[int, ...]]]:
    p = f"model.layers.{i}."
    return [
        (p + "input_layernorm.weight", (H,)),
        (p + "self_attn.q_proj.weight", (H, H)),
        (p + "self_attn.o_proj.weight", (H, H)),
        (p + "mlp.up_proj.weight", (INTER, H)),
        (p + "mlp.down_proj.weight", (H, INTER)),
    ]


def write_model(path: Path, layers: int, seed: int) -> Path:
    """A Qwen2-shaped bf16 model with ``layers`` layers, an integer buffer, a config.json whose
    ``layer_types`` names each layer (``<model>-<layer>``) and a tokenizer that names the model."""
    rng = np.random.default_rng(seed)
    shapes = [("model.embed_tokens.weight", (V, H))]
    for i in range(layers):
        shapes += layer_shapes(i)
    shapes += [("model.norm.weight", (H,)), ("lm_head.weight", (V, H))]
    tensors: Tensors = {}
    for name, shape in shapes:
        values = rng.standard_normal(int(np.prod(shape))).astype(np.float32)
        tensors[name] = ("BF16", shape, f32_to_bf16(values))
    tensors["model.position_ids"] = ("I64", (8,), np.arange(8, dtype=np.int64) + seed)
    path.mkdir(parents=True)
    write_safetensors(path / "model.safetensors", tensors)
    config = {
        "architectures": ["Qwen2ForCausalLM"],
        "model_type": "qwen2",
        "hidden_size": H,
        "num_hidden_layers": layers,
        "layer_types": [f"{path.name}-{i}" for i in range(layers)],
        "torch_dtype": "bfloat16",
    }
    (path / "config.json").write_text(json.dumps(config))
    (path / "tokenizer.json").write_text(json.dumps({"model": path.name}))
    return path


@pytest.fixture
def models(tmp_path: Path) -> dict[str, Path]:
    return {"a": write_model(tmp_path / "a", 4, seed=1), "b": write_model(tmp_path / "b", 5, seed=2)}


def config(path: Path, doc: dict[str, Any]) -> Path:
    path.write_text(json.dumps(doc))  # JSON is YAML
    return path


def passthrough(*slices: tuple[Path, int, int], **extra: Any) -> dict[str, Any]:
    return {
        "merge_method": "passthrough",
        "slices": [{"sources": [{"model": str(m), "layer_range": [a, b]}]} for m, a, b in slices],
        **extra,
    }


def stack(tmp_path: Path, doc: dict[str, Any], *flags: str, out: str = "out") -> Path:
    target = tmp_path / out
    ok(in_process("merge", "--config", config(tmp_path / f"{out}.yml", doc), "--out", target, *flags))
    return target


def reference(slices: list[tuple[Path, int, int]], scale: Any = None) -> Tensors:
    """The stack from the input files: layers renumbered in order, the tensors before the layers
    from the first slice's model, after them from the last's; ``scale(name, slice, t)`` gives a
    float tensor's factor (t = 0 outside the layers, offset / (layers - 1) in a slice)."""
    read = {m: read_model_dir(m) for m, _, _ in slices}

    def take(model: Path, name: str, k: int, t: float) -> tuple[str, tuple[int, ...], np.ndarray]:
        dtype, shape, raw = read[model][name]
        if scale is not None and dtype == "BF16":
            raw = f32_to_bf16(bf16_to_f32(raw) * np.float32(scale(name, k, t)))
        return dtype, shape, raw

    out = {n: take(slices[0][0], n, 0, 0.0) for n in BEFORE}
    j = 0
    for k, (model, start, end) in enumerate(slices):
        for offset, i in enumerate(range(start, end)):
            t = offset / (end - start - 1) if end > start + 1 else 1.0
            for name, _shape in layer_shapes(i):
                out[name.replace(f"layers.{i}.", f"layers.{j}.")] = take(model, name, k, t)
            j += 1
    out.update({n: take(slices[-1][0], n, len(slices) - 1, 0.0) for n in AFTER})
    return out


def assert_tensors(directory: Path, expected: Tensors) -> None:
    got = read_model_dir(directory)
    assert sorted(got) == sorted(expected)
    for name, (dtype, shape, raw) in expected.items():
        assert got[name][:2] == (dtype, shape), name
        assert got[name][2].tobytes() == raw.tobytes(), name


# -- stacks ---------------------------------------------------------------------------------


def test_frankenmerge_of_two_models(tmp_path: Path, models: dict[str, Path]) -> None:
    a, b = models["a"], models["b"]
    slices = [(a, 0, 3), (b, 1, 5)]
    out = stack(tmp_path, passthrough(*slices), "--shard-size", "4KB")
    assert_tensors(out, reference(slices))
    assert len(json.loads((out / "model.safetensors.index.json").read_text())["weight_map"]) == 7 * 5 + 4
    config = json.loads((out / "config.json").read_text())
    assert config["num_hidden_layers"] == 7
    assert config["layer_types"] == ["a-0", "a-1", "a-2", "b-1", "b-2", "b-3", "b-4"]
    assert json.loads((out / "tokenizer.json").read_text()) == {"model": "a"}  # the first slice's model's
    record = json.loads((out / "ramstream_merge.json").read_text())
    assert [(s["model"], s["layers"], s["output_start"]) for s in record["slices"]] == [
        (str(a), [0, 3], 0),
        (str(b), [1, 5], 3),
    ]
    card = (out / "README.md").read_text()
    assert "Stack of 7 layers from 2 slices" in card and "passthrough" in card
    assert not (out / ".ramstream").exists()


def test_base_model_gives_config_and_tokenizer(tmp_path: Path, models: dict[str, Path]) -> None:
    a, b = models["a"], models["b"]
    out = stack(tmp_path, passthrough((a, 1, 2), (b, 0, 2), base_model=str(b)))
    assert_tensors(out, reference([(a, 1, 2), (b, 0, 2)]))
    config = json.loads((out / "config.json").read_text())
    assert (config["num_hidden_layers"], config["layer_types"]) == (3, ["a-1", "b-0", "b-1"])
    assert json.loads((out / "tokenizer.json").read_text()) == {"model": "b"}


def test_self_merge_with_overlapping_ranges(tmp_path: Path, models: dict[str, Path]) -> None:
    a = models["a"]
    slices = [(a, 0, 3), (a, 1, 4), (a, 3, 4)]
    out = stack(tmp_path, passthrough(*slices, dtype="bfloat16"))
    assert_tensors(out, reference(slices))
    assert json.loads((out / "config.json").read_text())["layer_types"] == [f"a-{i}" for i in (0, 1, 2, 1, 2, 3, 3)]


def test_gpt2_names_and_layer_count(tmp_path: Path) -> None:
    """GPT-2's layers (``transformer.h.N.``) and its ``n_layer``: the embeddings from the first
    slice's model, the final norm (``ln_f``) from the last's."""
    rng = np.random.default_rng(5)
    paths = []
    for name in ("g1", "g2"):
        shapes = {"transformer.wte.weight": (V, H), "transformer.wpe.weight": (8, H), "transformer.ln_f.weight": (H,)}
        for i in range(3):
            shapes |= {f"transformer.h.{i}.ln_1.weight": (H,), f"transformer.h.{i}.mlp.c_fc.weight": (H, INTER)}
        tensors: Tensors = {
            n: ("BF16", shape, f32_to_bf16(rng.standard_normal(int(np.prod(shape))).astype(np.float32)))
            for n, shape in shapes.items()
        }
        (tmp_path / name).mkdir()
        write_safetensors(tmp_path / name / "model.safetensors", tensors)
        (tmp_path / name / "config.json").write_text(json.dumps({"model_type": "gpt2", "n_layer": 3}))
        paths.append(tmp_path / name)
    g1, g2 = paths
    out = stack(tmp_path, passthrough((g1, 0, 2), (g2, 0, 1)))
    got, first, last = read_model_dir(out), read_model_dir(g1), read_model_dir(g2)
    assert sorted(got) == sorted(first)
    expected = {
        "transformer.wte.weight": first["transformer.wte.weight"],
        "transformer.wpe.weight": first["transformer.wpe.weight"],
        "transformer.h.1.mlp.c_fc.weight": first["transformer.h.1.mlp.c_fc.weight"],
        "transformer.h.2.ln_1.weight": last["transformer.h.0.ln_1.weight"],
        "transformer.ln_f.weight": last["transformer.ln_f.weight"],
    }
    for name, (_dtype, _shape, raw) in expected.items():
        assert got[name][2].tobytes() == raw.tobytes(), name
    config = json.loads((out / "config.json").read_text())
    assert config["n_layer"] == 3 and "num_hidden_layers" not in config


def test_scale_with_filters_and_a_gradient(tmp_path: Path, models: dict[str, Path]) -> None:
    """Conditions tried in order against the tensor's name in its model, then the top-level
    gradient (over each slice's layers: t = offset / (layers - 1); t = 0 outside the layers);
    the integer buffer is copied as it is, as mergekit copies it."""
    a, b = models["a"], models["b"]
    doc = passthrough((a, 0, 2), (b, 1, 4), parameters={"scale": [0.2, 1.4]})
    doc["slices"][0]["parameters"] = {
        "scale": [{"filter": "o_proj", "value": 0.5}, {"filter": "down_proj", "value": 0.3}]
    }
    out = stack(tmp_path, doc)

    def factor(name: str, k: int, t: float) -> float:
        if k == 0 and "o_proj" in name:
            return 0.5
        if k == 0 and "down_proj" in name:
            return 0.3
        return (1 - t) * 0.2 + t * 1.4

    assert_tensors(out, reference([(a, 0, 2), (b, 1, 4)], scale=factor))
    assert json.loads((out / "ramstream_merge.json").read_text())["slices"][1]["scale"] == [0.2, 1.4]


def test_models_form_with_a_scale(tmp_path: Path, models: dict[str, Path]) -> None:
    """passthrough over models: one model, all its layers, one slice (its own parameters first)."""
    a = models["a"]
    doc = {
        "merge_method": "passthrough",
        "base_model": str(a),
        "models": [{"model": str(a), "parameters": {"scale": [{"filter": "mlp", "value": 0.75}]}}],
        "parameters": {"scale": 1.5},
        "out_dtype": "float32",
    }
    out = stack(tmp_path, doc)
    expected = reference([(a, 0, 4)], scale=lambda name, _k, _t: 0.75 if "mlp" in name else 1.5)
    got = read_model_dir(out)
    assert sorted(got) == sorted(expected)
    for name, (dtype, shape, raw) in expected.items():
        if dtype == "BF16":  # the product, rounded to bf16 (the dtype mergekit scales it in), then widened
            assert got[name][:2] == ("F32", shape), name
            assert np.array_equal(got[name][2].view(np.uint32), raw.astype(np.uint32) << 16), name
        else:
            assert got[name][2].tobytes() == raw.tobytes(), name
    config = json.loads((out / "config.json").read_text())
    assert (config["num_hidden_layers"], config["torch_dtype"]) == (4, "float32")


def test_dtype_converts_and_out_dtype_flag(tmp_path: Path, models: dict[str, Path]) -> None:
    """dtype: float16 is the dtype mergekit reads the tensors in: each bf16 value rounded to f16;
    --out-dtype adds to a config that sets no out_dtype."""
    a = models["a"]
    out = stack(tmp_path, passthrough((a, 2, 4), dtype="float16"))
    got = read_model_dir(out)
    for name, (dtype, shape, raw) in reference([(a, 2, 4)]).items():
        if dtype == "BF16":
            assert got[name][:2] == ("F16", shape), name
            assert got[name][2].tobytes() == bf16_to_f32(raw).astype(np.float16).tobytes(), name
    assert json.loads((out / "config.json").read_text())["torch_dtype"] == "float16"
    widened = stack(tmp_path, passthrough((a, 2, 4)), "--out-dtype", "f32", out="widened")
    assert read_model_dir(widened)["lm_head.weight"][0] == "F32"


def test_pieces_and_batches_never_change_a_byte(tmp_path: Path, models: dict[str, Path]) -> None:
    """Tensors cut into pieces of 64 elements, or batched whole: the same bytes."""
    from ramstream import api
    from ramstream.config import RunOptions

    a, b = models["a"], models["b"]
    slices = [
        mergekit_config.StackSlice(a, 0, 2, scale=[{"filter": "q_proj", "value": 0.7}]),
        mergekit_config.StackSlice(b, 3, 5),
    ]
    outs = []
    for name, block in (("small", 64), ("large", None)):
        options = RunOptions(block_elems=block, cache_dir=tmp_path / "cache", quiet=True)
        result = api.stack(slices, out=tmp_path / name, options=options)
        assert (result.layers, result.slices, result.resumed_finished) == (4, 2, False)
        outs.append(read_model_dir(tmp_path / name))
    assert {n: v[2].tobytes() for n, v in outs[0].items()} == {n: v[2].tobytes() for n, v in outs[1].items()}


def test_rerun_force_and_another_stack(tmp_path: Path, models: dict[str, Path]) -> None:
    a, b = models["a"], models["b"]
    doc = passthrough((a, 0, 2), (b, 0, 2))
    out = stack(tmp_path, doc)
    again = ok(in_process("merge", "--config", tmp_path / "out.yml", "--out", out))
    assert again.out.startswith("already stacked:")
    other = config(tmp_path / "other.yml", passthrough((b, 0, 1)))
    one_line_error(in_process("merge", "--config", other, "--out", out), str(out), "--force")
    ok(in_process("merge", "--config", other, "--out", out, "--force"))
    assert_tensors(out, reference([(b, 0, 1)]))
    # a stack cut short (its work area left behind) is started over by the same command
    (out / ".ramstream").mkdir()
    (out / ".ramstream" / "run.json").write_text(json.dumps({"cut": "short"}))
    one_line_error(in_process("merge", "--config", other, "--out", out), "unfinished", "--force")


def test_interrupted_stack_starts_over(
    tmp_path: Path, models: dict[str, Path], monkeypatch: pytest.MonkeyPatch
) -> None:
    """A run stopped (Ctrl-C) once its shards are written but before they are moved into place
    leaves its work area only: nothing looks finished, and the same command writes it again."""
    from ramstream.output import directory as output_dir

    a, b = models["a"], models["b"]
    path = config(tmp_path / "stack.yml", passthrough((a, 0, 2), (b, 2, 5)))
    out = tmp_path / "out"

    def interrupted(*args: Any, **kwargs: Any) -> None:
        raise KeyboardInterrupt

    with monkeypatch.context() as patch:
        patch.setattr(output_dir, "finalize", interrupted)
        assert in_process("merge", "--config", path, "--out", out).code == 130
    assert (out / ".ramstream" / "run.json").is_file() and list((out / ".ramstream").glob("*.partial"))
    assert_nothing_finished(out)
    ok(in_process("merge", "--config", path, "--out", out))
    assert_tensors(out, reference([(a, 0, 2), (b, 2, 5)]))


# -- refusals -------------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("change", "needles"),
    [
        ({"slices": [{"sources": [{"model": "{a}", "layer_range": [2, 5]}]}]}, ["slices[0].sources[0]", "4 layers"]),
        ({"slices": [{"sources": [{"model": "{a}", "layer_range": [2, 2]}]}]}, ["slices[0].sources[0]", "no layer"]),
        (
            {
                "slices": [
                    {"sources": [{"model": "{a}", "layer_range": [0, 2]}]},
                    {"sources": [{"model": "{a}", "layer_range": [0, 2]}, {"model": "{b}", "layer_range": [0, 2]}]},
                ]
            },
            ["slices[1]", "one source per slice", "2"],
        ),
        ({"slices": None, "models": [{"model": "{a}"}, {"model": "{b}"}]}, ["one model under models", "lists 2"]),
        ({"base_model": "{b}", "slices": None, "models": [{"model": "{a}"}]}, ["base_model", "two inputs"]),
        ({"parameters": {"weight": 0.5}}, ["parameters.weight", "passthrough has no parameter", "scale"]),
        (
            {"slices": [{"sources": [{"model": "{a}", "layer_range": [0, 1]}], "base_model": "{a}"}]},
            ["slices[0]", "'base_model'"],
        ),
        ({"parameters": {"scale": "lots"}}, ["parameters.scale", "number"]),
        ({"parameters": {"scale": [{"filter": "mlp", "weight": 1}]}}, ["parameters.scale", "filter: TEXT"]),
        ({"merges": []}, ["unknown key", "merges"]),
        ({"slices": [{"sources": [{"model": "{a}+lora", "layer_range": [0, 1]}]}]}, ["LoRA"]),
    ],
)
def test_config_refusals_are_one_line(
    tmp_path: Path, models: dict[str, Path], change: dict[str, Any], needles: list[str]
) -> None:
    doc = passthrough((models["a"], 0, 2))
    text = json.dumps({**doc, **change}).replace("{a}", str(models["a"])).replace("{b}", str(models["b"]))
    doc = {k: v for k, v in json.loads(text).items() if v is not None}
    path = config(tmp_path / "bad.yml", doc)
    one_line_error(in_process("merge", "--config", path, "--out", tmp_path / "out"), str(path), *needles)
    assert not (tmp_path / "out").exists()


def test_job_refusals_are_one_line(tmp_path: Path, models: dict[str, Path]) -> None:
    """What only the checkpoints show: unlike layers, a head in one end model only, a filter that
    matches nothing, a flag that a stack does not read."""
    a = models["a"]
    wide = tmp_path / "wide"
    wide.mkdir()
    tensors = read_model_dir(a)
    tensors["model.layers.1.mlp.up_proj.weight"] = ("BF16", (INTER + 8, H), np.zeros((INTER + 8) * H, np.uint16))
    write_safetensors(wide / "model.safetensors", tensors)
    (wide / "config.json").write_text((a / "config.json").read_text())
    tied = tmp_path / "tied"
    tied.mkdir()
    write_safetensors(tied / "model.safetensors", {n: v for n, v in read_model_dir(a).items() if n != "lm_head.weight"})
    (tied / "config.json").write_text((a / "config.json").read_text())
    cases = [
        (passthrough((a, 0, 2), (wide, 0, 2)), ["layer 1", "up_proj", "shape"]),
        (passthrough((a, 0, 2), (tied, 0, 2)), ["lm_head.weight", "not in"]),
        (passthrough((a, 0, 2), parameters={"scale": [{"filter": "experts", "value": 2}]}), ["experts", "no tensor"]),
    ]
    for k, (doc, needles) in enumerate(cases):
        path = config(tmp_path / f"case{k}.yml", doc)
        one_line_error(in_process("merge", "--config", path, "--out", tmp_path / f"out{k}"), *needles)
        assert_nothing_finished(tmp_path / f"out{k}")
    path = config(tmp_path / "flags.yml", passthrough((a, 0, 2)))
    one_line_error(in_process("merge", "--config", path, "--out", tmp_path / "o", "--density", "0.5"), "--density")
    one_line_error(in_process("merge", "--config", path, "--out", tmp_path / "o", "--index", tmp_path / "i"), "--index")


def test_a_sweep_or_a_merge_config_refuses_passthrough() -> None:
    doc = {"merge_method": "passthrough", "models": [{"model": "a"}]}
    with pytest.raises(ConfigError, match="a sweep cannot"):
        mergekit_config.parse(doc, Path("x.yml"))
    parsed = mergekit_config.parse_stack(doc, Path("x.yml"))
    assert parsed.slices == (mergekit_config.StackSlice(Path("a"), 0, None, None),)


def test_scale_precedence_source_then_slice_then_top() -> None:
    doc = {
        "merge_method": "passthrough",
        "slices": [
            {
                "sources": [
                    {"model": "a", "layer_range": [0, 2], "parameters": {"scale": {"filter": "q", "value": 3}}}
                ],
                "parameters": {"scale": [{"filter": "k", "value": 2}]},
            },
            {"sources": [{"model": "b", "layer_range": [1, 3]}]},
        ],
        "parameters": {"scale": "1e-1"},
        "dtype": "bfloat16",
        "out_dtype": "float32",
    }
    parsed = mergekit_config.parse_stack(doc, Path("x.yml"))
    assert parsed.slices[0].scale == [
        {"filter": "q", "value": 3.0},
        {"filter": "k", "value": 2.0},
        {"value": 0.1},
    ]
    assert parsed.slices[1] == mergekit_config.StackSlice(Path("b"), 1, 3, 0.1)
    assert parsed.settings == {"dtype": "bf16", "out_dtype": "f32"}


# -- parity with mergekit 0.1.5 -------------------------------------------------------------

PARITY_SHAPE = FamilyShape(hidden=128, layers=4, vocab=1024, intermediate=352, kv_hidden=32)


def parity_cases(a: Path, b: Path) -> dict[str, dict[str, Any]]:
    def slices(*parts: tuple[Path, int, int, Any]) -> list[dict[str, Any]]:
        out = []
        for model, start, end, scale in parts:
            entry: dict[str, Any] = {"sources": [{"model": str(model), "layer_range": [start, end]}]}
            if scale is not None:
                entry["parameters"] = {"scale": scale}
            out.append(entry)
        return out

    filters = [{"filter": "o_proj", "value": 0.3}, {"filter": "down_proj", "value": 0.7}, {"value": [0.9, 1.13]}]
    return {
        "frankenmerge": {"slices": slices((a, 0, 3, None), (b, 1, 4, None))},
        "self-merge": {"slices": slices((a, 0, 3, None), (a, 1, 4, None), (a, 3, 4, None)), "dtype": "bfloat16"},
        "scaled": {"slices": slices((a, 0, 2, filters), (b, 2, 4, 0.6)), "parameters": {"scale": 1.07}},
        "scaled-float32": {
            "slices": slices((b, 1, 4, [0.37, 1.91])),
            "dtype": "float32",
            "out_dtype": "bfloat16",
        },
        "float16-scaled": {"slices": slices((a, 1, 3, 0.81), (b, 0, 1, None)), "dtype": "float16"},
        "models-scaled": {"models": [{"model": str(b), "parameters": {"scale": [{"filter": "mlp", "value": 0.55}]}}]},
    }


@pytest.fixture(scope="module")
def parity(tmp_path_factory: pytest.TempPathFactory) -> dict[str, tuple[Path, Path]]:
    """Each case's config run by mergekit (as ``mergekit-yaml`` runs it) and by ``ramstream merge --config``."""
    if importlib.util.find_spec("mergekit") is None:
        pytest.skip("mergekit is not installed: pip install torch==2.13.0 mergekit==0.1.5 (make test does)")
    root = tmp_path_factory.mktemp("stack-parity")
    # Llama-shaped: mergekit 0.1.5 cannot stack a Qwen2 model (transformers derives its layer_types,
    # which mergekit leaves at the input's length, and refuses to save the config).
    shapes = {n: shape for n, shape in PARITY_SHAPE.tensors() if not n.endswith(".bias")}
    fam = build_family(root / "family", densities=(0.5,), shapes=shapes, seed=11)
    llama = {**PARITY_SHAPE.config(), "architectures": ["LlamaForCausalLM"], "model_type": "llama"}
    for member in (fam.base, *fam.agents):
        (member / "config.json").write_text(json.dumps(llama))
        (member / "tokenizer.json").unlink()  # a placeholder, not a tokenizer mergekit could load
    outputs, jobs = {}, []
    for name, body in parity_cases(fam.base, fam.agents[0]).items():
        path = config(root / f"{name}.yml", {"merge_method": "passthrough", **body})
        theirs, ours = root / "mergekit" / name, root / "ramstream" / name
        jobs.append((path, theirs, False))
        ok(in_process("merge", "--config", path, "--out", ours, "--cache-dir", root / "cache"))
        outputs[name] = (ours, theirs)
    run_mergekit(jobs, seed=0, timeout=600)
    return outputs


@pytest.mark.slow
@pytest.mark.parametrize(
    "name", ["frankenmerge", "self-merge", "scaled", "scaled-float32", "float16-scaled", "models-scaled"]
)
def test_stack_matches_mergekit(parity: dict[str, tuple[Path, Path]], name: str, record_property: Any) -> None:
    ours_dir, theirs_dir = parity[name]
    ours, theirs = read_model_dir(ours_dir), read_model_dir(theirs_dir)
    assert sorted(ours) == sorted(theirs)
    total = identical = 0
    for tensor, (dtype, shape, raw) in theirs.items():
        assert ours[tensor][:2] == (dtype, shape), tensor
        total += raw.size
        bits = f"u{raw.itemsize}"
        identical += int((ours[tensor][2].view(bits) == raw.view(bits)).sum())
    line = f"{name}: {identical}/{total} elements identical ({100 * identical / total:.4f} %)"
    print("\n" + line)
    record_property("parity", line)
    assert identical / total >= (1.0 if "scaled" not in name else 0.9999), line
    layers = [json.loads((d / "config.json").read_text())["num_hidden_layers"] for d in (ours_dir, theirs_dir)]
    assert layers[0] == layers[1], layers


# -- memory ---------------------------------------------------------------------------------


@pytest.mark.slow
def test_stack_of_a_tensor_twice_the_budget_stays_within_budget(tmp_path: Path) -> None:
    """A 128 MiB embedding, scaled (decoded, multiplied, encoded a piece at a time) with
    ``--memory 64MiB``: the peak RSS of the run stays within the budget and the margin, over the
    same run on a model with an 8-row embedding (the interpreter, the libraries: measured)."""
    from tests.test_memory import BUDGET, MARGIN, MEASURE, MiB

    def values(indices: np.ndarray) -> np.ndarray:
        return ((indices % 1000).astype(np.float32) - np.float32(500)) / np.float32(300)

    def chunk(name: str, start: int, stop: int) -> np.ndarray:
        return f32_to_bf16(values(np.arange(start, stop)))

    def peak_of(name: str, embed_rows: int) -> tuple[Path, int]:
        model = tmp_path / name
        model.mkdir()
        specs = [("model.embed_tokens.weight", "BF16", (embed_rows, 2048))]
        specs += [(tensor, "BF16", shape) for tensor, shape in layer_shapes(0) + layer_shapes(1)]
        write_safetensors_chunked(model / "model.safetensors", specs, chunk)
        (model / "config.json").write_text(json.dumps({"model_type": "llama", "num_hidden_layers": 2}))
        doc = passthrough((model, 0, 2), (model, 1, 2), parameters={"scale": 0.5})
        path = config(tmp_path / f"{name}.yml", doc)
        out = tmp_path / f"{name}-out"
        run = [sys.executable, "-m", "ramstream.cli", "merge", "--config", str(path), "--out", str(out)]
        run += ["--memory", "64MiB", "--quiet"]
        done = subprocess.run([sys.executable, "-c", MEASURE, *run], capture_output=True, text=True, timeout=300)
        assert done.returncode == 0, done.stderr
        return out, int(done.stdout.strip().splitlines()[-1]) * 1024  # ru_maxrss is in KiB on Linux

    _, overhead = peak_of("tiny", 8)
    out, peak = peak_of("big", 32768)
    line = f"peak RSS {peak / MiB:.0f} MiB, {(peak - overhead) / MiB:.0f} MiB over the tiny run, budget 64 MiB"
    print("\n" + line)
    assert peak - overhead < BUDGET + MARGIN, line
    picks = np.array([0, 12_345_678, 32768 * 2048 - 1])
    embed = read_elements(out / "model.safetensors", "model.embed_tokens.weight", picks)
    assert np.array_equal(embed, f32_to_bf16(bf16_to_f32(f32_to_bf16(values(picks))) * np.float32(0.5)))
