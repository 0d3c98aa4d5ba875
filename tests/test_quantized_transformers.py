"""The merge of an FP8 base loads where the base loads: in transformers.

A tiny Qwen3 (Qwen3's FP8 releases use DeepSeek-V3's scheme: FP8 E4M3 linear weights, a
``weight_scale_inv`` per 128 x 128 block, ``quant_method: "fp8"``) is made by transformers itself;
the test quantizes its linear weights, writes bf16 agents trained from it, merges them with the
real CLI, and loads the output with ``AutoModelForCausalLM``: the bf16 output (``quantization_config``
dropped) and the ``--out-dtype fp8`` one (transformers dequantizes it on a machine without a GPU)
both load with no missing or unexpected weight, hold what ramstream wrote, and run a forward pass.
The same model with compressed-tensors' per-channel scales is loaded the same way where the
``compressed-tensors`` package (through which transformers reads that scheme) is installed.
"""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from click.testing import CliRunner

from ramstream.cli import main

torch = pytest.importorskip("torch")
transformers = pytest.importorskip("transformers")
safetensors_torch = pytest.importorskip("safetensors.torch")

BLOCK = 128
SCHEME = {"quant_method": "fp8", "fmt": "e4m3", "weight_block_size": [BLOCK, BLOCK], "activation_scheme": "dynamic"}


def _quantize(weight: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """(FP8 weight, scale_inv per block, the dequantized float32 weight)."""
    rows, cols = weight.shape
    grid = (-(-rows // BLOCK), -(-cols // BLOCK))
    padded = torch.zeros(grid[0] * BLOCK, grid[1] * BLOCK)
    padded[:rows, :cols] = weight
    scale = torch.clamp(padded.reshape(grid[0], BLOCK, grid[1], BLOCK).abs().amax(dim=(1, 3)) / 448.0, min=1e-12)
    expanded = scale.repeat_interleave(BLOCK, 0)[:rows].repeat_interleave(BLOCK, 1)[:, :cols]
    q = (weight / expanded).to(torch.float8_e4m3fn)
    return q, scale, q.to(torch.float32) * expanded


def _write(directory: Path, tensors: dict[str, torch.Tensor], config: dict[str, object]) -> Path:
    directory.mkdir(parents=True)
    safetensors_torch.save_file({k: v.contiguous() for k, v in tensors.items()}, str(directory / "model.safetensors"))
    (directory / "config.json").write_text(json.dumps(config))
    return directory


@pytest.fixture(scope="module")
def family(tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, list[Path]]:
    root = tmp_path_factory.mktemp("qwen3-fp8")
    config = transformers.Qwen3Config(
        vocab_size=512, hidden_size=256, intermediate_size=384, num_hidden_layers=2, num_attention_heads=4,
        num_key_value_heads=2, head_dim=64, max_position_embeddings=128,
    )  # fmt: skip
    torch.manual_seed(0)
    weights = {k: v.float() for k, v in transformers.Qwen3ForCausalLM(config).state_dict().items()}
    base, values = {}, {}
    for name, weight in weights.items():
        if weight.ndim == 2 and ".layers." in name:
            q, scale, values[name] = _quantize(weight)
            base[name], base[name + "_scale_inv"] = q, scale
        else:
            base[name] = weight.to(torch.bfloat16)
            values[name] = base[name].float()
    plain = {**config.to_dict(), "torch_dtype": "bfloat16"}
    base_dir = _write(root / "base", base, {**plain, "quantization_config": SCHEME})
    generator = torch.Generator().manual_seed(1)
    agents = []
    for t, density in enumerate((0.05, 0.3, 0.4)):
        agent = {}
        for name, value in values.items():
            start = value.to(torch.bfloat16).float()  # trained from the base's bf16 conversion
            changed = torch.rand(value.shape, generator=generator) < density
            delta = 0.01 * torch.randn(value.shape, generator=generator)
            agent[name] = torch.where(changed, start + delta, start).to(torch.bfloat16)
        agents.append(_write(root / f"agent{t}", agent, plain))
    return base_dir, agents


def _load(directory: Path) -> torch.nn.Module:
    model, info = transformers.AutoModelForCausalLM.from_pretrained(str(directory), output_loading_info=True)
    assert not info["missing_keys"] and not info["unexpected_keys"], info
    assert torch.isfinite(model(torch.tensor([[1, 2, 3, 4]])).logits).all()
    return model


def test_the_bf16_merge_of_an_fp8_base_loads_in_transformers(family: tuple[Path, list[Path]], tmp_path: Path) -> None:
    base, agents = family
    out = tmp_path / "merged"
    args = ["merge", str(base), *map(str, agents), "--out", str(out), "--cache-dir", str(tmp_path / "index")]
    result = CliRunner().invoke(main, args)
    assert result.exit_code == 0, result.output
    assert "quantization_config" not in json.loads((out / "config.json").read_text())
    model = _load(out)
    written = safetensors_torch.load_file(str(out / "model.safetensors"))
    loaded = model.state_dict()
    for name, tensor in written.items():
        assert tensor.dtype == torch.bfloat16
        assert torch.equal(loaded[name], tensor), name


def test_the_fp8_merge_loads_in_transformers_as_ramstream_reads_it(
    family: tuple[Path, list[Path]], tmp_path: Path
) -> None:
    base, agents = family
    out = tmp_path / "merged-fp8"
    args = ["merge", str(base), *map(str, agents), "--out", str(out), "--cache-dir", str(tmp_path / "index")]
    result = CliRunner().invoke(main, [*args, "--out-dtype", "fp8"])
    assert result.exit_code == 0, result.output
    assert json.loads((out / "config.json").read_text())["quantization_config"]["quant_method"] == "fp8"
    loaded = _load(out).state_dict()  # no GPU here: transformers dequantizes the FP8 weights to bf16
    written = safetensors_torch.load_file(str(out / "model.safetensors"))
    name = "model.layers.1.mlp.down_proj.weight"
    assert written[name].dtype == torch.float8_e4m3fn
    scale = written[name + "_scale_inv"]
    rows, cols = written[name].shape
    expanded = scale.repeat_interleave(BLOCK, 0)[:rows].repeat_interleave(BLOCK, 1)[:, :cols]
    ours = (written[name].to(torch.float32) * expanded).to(torch.bfloat16)
    assert torch.equal(loaded[name], ours)


CT_WEIGHTS = {"num_bits": 8, "type": "float", "strategy": "channel", "symmetric": True, "dynamic": False}
CT_ACTIVATIONS = {"num_bits": 8, "type": "float", "strategy": "token", "symmetric": True, "dynamic": True}
CT_SCHEME = {
    "quant_method": "compressed-tensors",
    "format": "float-quantized",
    "quantization_status": "compressed",
    "config_groups": {
        "group_0": {"targets": ["Linear"], "weights": CT_WEIGHTS, "input_activations": CT_ACTIVATIONS},
    },
    "ignore": ["lm_head"],
}


def test_the_fp8_merge_of_a_compressed_tensors_base_loads_in_transformers(
    family: tuple[Path, list[Path]], tmp_path: Path
) -> None:
    """The same model with compressed-tensors' per-channel scales (activations quantized
    dynamically, so no input scales): its FP8 merge loads and holds what ramstream wrote."""
    pytest.importorskip(
        "compressed_tensors", reason="transformers reads compressed-tensors checkpoints through that package"
    )
    base, agents = family
    tensors = safetensors_torch.load_file(str(base / "model.safetensors"))
    ct: dict[str, torch.Tensor] = {}
    for name, tensor in tensors.items():
        if name.endswith("_scale_inv"):
            continue
        if tensor.dtype != torch.float8_e4m3fn:
            ct[name] = tensor
            continue
        rows, cols = tensor.shape
        scale = tensors[name + "_scale_inv"].repeat_interleave(BLOCK, 0)[:rows].repeat_interleave(BLOCK, 1)[:, :cols]
        value = tensor.to(torch.float32) * scale
        per_row = torch.clamp(value.abs().amax(dim=1, keepdim=True) / 448.0, min=1e-12)
        ct[name], ct[name + "_scale"] = (value / per_row).to(torch.float8_e4m3fn), per_row
    config = {**json.loads((base / "config.json").read_text()), "quantization_config": CT_SCHEME}
    ct_base = _write(tmp_path / "ct-base", ct, config)
    out = tmp_path / "merged-ct"
    args = ["merge", str(ct_base), *map(str, agents), "--out", str(out), "--cache-dir", str(tmp_path / "index")]
    result = CliRunner().invoke(main, [*args, "--out-dtype", "fp8"])
    assert result.exit_code == 0, result.output
    assert json.loads((out / "config.json").read_text())["quantization_config"] == CT_SCHEME
    written = safetensors_torch.load_file(str(out / "model.safetensors"))
    name = "model.layers.1.mlp.down_proj.weight"
    assert written[name].dtype == torch.float8_e4m3fn
    assert written[name + "_scale"].shape == ct[name + "_scale"].shape
    quantization = transformers.CompressedTensorsConfig(run_compressed=False)  # decompressed: runs on a CPU
    model, info = transformers.AutoModelForCausalLM.from_pretrained(
        str(out), quantization_config=quantization, output_loading_info=True
    )
    assert not info["missing_keys"] and not info["unexpected_keys"], info
    assert torch.isfinite(model(torch.tensor([[1, 2, 3, 4]])).logits).all()
    ours = written[name].to(torch.float32) * written[name + "_scale"]
    loaded = model.state_dict()[name].to(torch.float32)
    assert torch.allclose(loaded, ours, rtol=2**-7, atol=0)
