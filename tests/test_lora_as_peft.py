"""LoRA adapters read as PEFT reads them, field by field, against PEFT's own ``merge_and_unload``.

Adapters are written by peft on tiny Llama and GPT-2 models, some configs then edited as a user
(or another tool) would; ramstream's merge of the adapter alone (task arithmetic, weight 1, f32
output) must equal PEFT's merged model up to its matmul's rounding, or be refused by name where
PEFT refuses or would read the adapter otherwise.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import numpy as np
import pytest

pytest.importorskip("peft")
torch = pytest.importorskip("torch")
transformers = pytest.importorskip("transformers")

from peft import LoraConfig, PeftModel, get_peft_model  # noqa: E402

from tests.families import decode, read_model_dir  # noqa: E402
from tests.test_cli import assert_nothing_finished, in_process, ok, one_line_error  # noqa: E402
from tests.test_lora import LLAMA, quiet, write_adapter  # noqa: E402

GPT2 = {"vocab_size": 64, "n_positions": 32, "n_embd": 32, "n_layer": 2, "n_head": 2}


def saved_model(factory: pytest.TempPathFactory, model: Any, seed: int) -> Path:
    """A tiny random model (``model()`` builds it, after seeding torch) saved in bf16, as a base."""
    path = factory.mktemp("base") / "base"
    torch.manual_seed(seed)
    with quiet():
        model().to(torch.bfloat16).save_pretrained(path)
    return path


@pytest.fixture(scope="module")
def llama(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return saved_model(tmp_path_factory, lambda: transformers.LlamaForCausalLM(transformers.LlamaConfig(**LLAMA)), 0)


@pytest.fixture(scope="module")
def gpt2(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return saved_model(tmp_path_factory, lambda: transformers.GPT2LMHeadModel(transformers.GPT2Config(**GPT2)), 1)


def model_class(base: Path) -> Any:
    kind = json.loads((base / "config.json").read_text())["model_type"]
    return transformers.GPT2LMHeadModel if kind == "gpt2" else transformers.LlamaForCausalLM


def adapter(base: Path, dest: Path, seed: int = 3, **config: Any) -> Path:
    with quiet():
        model = model_class(base).from_pretrained(base)
    return write_adapter(model, dest, LoraConfig(r=4, lora_alpha=8, **config), seed=seed)


def edit_config(path: Path, **fields: Any) -> Path:
    doc = json.loads((path / "adapter_config.json").read_text())
    (path / "adapter_config.json").write_text(json.dumps({**doc, **fields}))
    return path


def ours(base: Path, lora: Path, out: Path) -> dict[str, np.ndarray]:
    args = ("merge", base, lora, "--out", out, "--method", "task_arithmetic", "--out-dtype", "f32", "--quiet")
    ok(in_process(*args, "--cache-dir", out.parent / "cache"))
    return {name: decode(raw, dtype) for name, (dtype, _, raw) in read_model_dir(out).items()}


def peft_merged(base: Path, lora: Path) -> dict[str, np.ndarray]:
    with quiet():
        model = model_class(base).from_pretrained(base, dtype=torch.float32)
        merged = PeftModel.from_pretrained(model, lora).merge_and_unload().state_dict()
    return {name: value.numpy().ravel() for name, value in merged.items()}


def assert_as_peft(base: Path, lora: Path, out: Path) -> dict[str, np.ndarray]:
    got, want = ours(base, lora, out), peft_merged(base, lora)
    for name, value in got.items():
        np.testing.assert_allclose(value, want[name], rtol=0, atol=2e-6, err_msg=name)
    return got


def changed(base: Path, merged: dict[str, np.ndarray]) -> set[str]:
    original = {name: decode(raw, dtype) for name, (dtype, _, raw) in read_model_dir(base).items()}
    return {name for name, value in merged.items() if not np.array_equal(value, original[name])}


# -- fan_in_fan_out: what PEFT makes of it, from the target's type -------------------------------


def test_fan_in_fan_out_on_a_linear_layer_is_reset_as_peft_resets_it(llama: Path, tmp_path: Path) -> None:
    """q_proj and o_proj are square: a transposed update fits their shape and was merged silently."""
    lora = edit_config(adapter(llama, tmp_path / "lora", target_modules=["q_proj", "o_proj"]), fan_in_fan_out=True)
    merged = assert_as_peft(llama, lora, tmp_path / "out")
    assert any("q_proj" in n for n in changed(llama, merged))


def test_a_conv1d_layer_is_transposed_whatever_fan_in_fan_out_says(gpt2: Path, tmp_path: Path) -> None:
    lora = adapter(gpt2, tmp_path / "lora", target_modules=["c_attn", "c_proj"], fan_in_fan_out=True)
    edit_config(lora, fan_in_fan_out=False)  # PEFT sets it back to True on a Conv1D
    merged = assert_as_peft(gpt2, lora, tmp_path / "out")
    assert {"transformer.h.0.attn.c_proj.weight", "transformer.h.1.mlp.c_proj.weight"} <= changed(gpt2, merged)


# -- which modules: target_modules, exclude_modules, layers_to_transform, layers_pattern ---------

TARGETS: dict[str, dict[str, Any]] = {
    "names": {"target_modules": ["q_proj", "v_proj", "down_proj"]},
    "regex": {"target_modules": r"model\.layers\.1\.self_attn\.(q|k)_proj"},
    "exclude": {"target_modules": ["q_proj", "v_proj"], "exclude_modules": ["model.layers.0.self_attn.v_proj"]},
    "layers": {"target_modules": ["q_proj", "up_proj"], "layers_to_transform": [1], "layers_pattern": "layers"},
}


@pytest.mark.parametrize("case", list(TARGETS))
def test_targets_are_those_peft_adapts(llama: Path, tmp_path: Path, case: str) -> None:
    lora = adapter(llama, tmp_path / "lora", **TARGETS[case])
    assert_as_peft(llama, lora, tmp_path / "out")


UNTARGETED: dict[str, tuple[str, dict[str, Any], str]] = {
    # (the adapter written, the config as edited, the module whose factors it no longer targets)
    "dropped-from-target_modules": ("names", {"target_modules": ["q_proj", "down_proj"]}, "v_proj"),
    "excluded": ("names", {"exclude_modules": ["model.layers.1.mlp.down_proj"]}, "layers.1.mlp.down_proj"),
    "other-layers": ("layers", {"layers_to_transform": [0]}, "model.layers.1."),
    "regex-narrowed": ("regex", {"target_modules": r"model\.layers\.1\.self_attn\.q_proj"}, "k_proj"),
}


@pytest.mark.parametrize("case", list(UNTARGETED))
def test_factors_of_a_module_the_config_does_not_target_are_refused(llama: Path, tmp_path: Path, case: str) -> None:
    written, edited, module = UNTARGETED[case]
    lora = edit_config(adapter(llama, tmp_path / "lora", **TARGETS[written]), **edited)
    out = tmp_path / "out"
    one_line_error(in_process("merge", llama, lora, "--out", out), module, "does not target it", "adapter_config.json")
    assert_nothing_finished(out)


def test_target_modules_matching_nothing_is_refused_as_peft_refuses(llama: Path, tmp_path: Path) -> None:
    lora = edit_config(adapter(llama, tmp_path / "lora", target_modules=["q_proj"]), target_modules=["qkv_proj"])
    with quiet(), pytest.raises(ValueError, match="not found in the base model"):
        PeftModel.from_pretrained(transformers.LlamaForCausalLM.from_pretrained(llama), lora)
    out = tmp_path / "out"
    one_line_error(in_process("merge", llama, lora, "--out", out), "targets no module of the base", "qkv_proj")
    assert_nothing_finished(out)


# -- init_lora_weights that rebuild the base -----------------------------------------------------


RESIDUAL = [("pissa", "PiSSA"), ("pissa_niter_4", "PiSSA"), ("olora", "OLoRA"), ("corda", "CorDA"), ("loftq", "LoftQ")]


@pytest.mark.parametrize(("init", "kind"), RESIDUAL)
def test_an_unconverted_residual_adapter_is_refused_by_name(llama: Path, tmp_path: Path, init: str, kind: str) -> None:
    lora = edit_config(adapter(llama, tmp_path / "lora", target_modules=["q_proj"]), init_lora_weights=init)
    out = tmp_path / "out"
    message = one_line_error(in_process("merge", llama, lora, "--out", out), kind, "init_lora_weights")
    assert "path_initial_model_for_weight_conversion" in message and "merge_and_unload" in message
    assert_nothing_finished(out)


def test_a_pissa_adapter_is_refused_and_its_conversion_merges_as_peft_does(llama: Path, tmp_path: Path) -> None:
    """A real PiSSA adapter: initialised by PEFT (which rebuilds the base as a residual), trained
    (its factors moved), saved as it is (refused) and converted to plain LoRA (merged)."""
    with quiet():
        model = get_peft_model(
            transformers.LlamaForCausalLM.from_pretrained(llama, dtype=torch.float32),
            LoraConfig(r=4, lora_alpha=4, target_modules=["q_proj", "v_proj"], init_lora_weights="pissa"),
        )
        model.save_pretrained(tmp_path / "initial")
        with torch.no_grad():  # "training": the factors move away from their initial values
            for name, param in model.named_parameters():
                if "lora_" in name:
                    param.add_(torch.randn(param.shape, generator=torch.Generator().manual_seed(9)) * 0.01)
        model.save_pretrained(tmp_path / "pissa")
        model.save_pretrained(
            tmp_path / "converted", path_initial_model_for_weight_conversion=str(tmp_path / "initial")
        )
    out = tmp_path / "out"
    one_line_error(in_process("merge", llama, tmp_path / "pissa", "--out", out), "PiSSA", "init_lora_weights")
    assert_nothing_finished(out)
    assert_as_peft(llama, tmp_path / "converted", tmp_path / "converted-out")


# -- an adapter directory missing its config -----------------------------------------------------


def test_a_directory_without_adapter_config_is_named_an_adapter_missing_its_config(llama: Path, tmp_path: Path) -> None:
    lora = adapter(llama, tmp_path / "lora", target_modules=["q_proj"])
    (lora / "adapter_config.json").unlink()
    out = tmp_path / "out"
    message = one_line_error(in_process("merge", llama, lora, "--out", out), "adapter_model.safetensors")
    assert "no adapter_config.json" in message and "lm_head" not in message
    assert_nothing_finished(out)
