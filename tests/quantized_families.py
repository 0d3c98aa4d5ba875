"""Test-side FP8 checkpoints: a base quantized as DeepSeek-V3 ships it (FP8 weights, a float32
``weight_scale_inv`` per 128 x 128 block, ``quantization_config`` in config.json), agents saved in
bf16 from it, and the same base converted to float32 first (what the merge must equal).

Quantizing and dequantizing go through torch's own ``float8_e4m3fn`` / ``float8_e5m2``, not
through ramstream: the dequantized value of element (i, j) is ``f32(q[i, j]) *
scale_inv[i // 128, j // 128]``, one float32 rounding.
"""

from __future__ import annotations

import json
import math
from pathlib import Path
from typing import Any

import numpy as np
import torch

from tests.families import Family, decode, encode, write_safetensors

BLOCK = 128
TORCH_FP8 = {"e4m3": (torch.float8_e4m3fn, "F8_E4M3", 448.0), "e5m2": (torch.float8_e5m2, "F8_E5M2", 57344.0)}

# Quantized (2-D, partial blocks at the edges) and plain bf16 tensors, as DeepSeek-V3 mixes them.
FP8_SHAPES: dict[str, tuple[tuple[int, ...], bool]] = {
    "model.embed_tokens.weight": ((64, 40), False),
    "model.layers.0.input_layernorm.weight": ((200,), False),
    "model.layers.0.self_attn.q_proj.weight": ((300, 200), True),
    "model.layers.0.mlp.down_proj.weight": ((130, 260), True),
    "model.layers.0.mlp.experts.0.up_proj.weight": ((24, 40), True),
    "model.norm.weight": ((40,), False),
    "lm_head.weight": ((64, 40), False),
}


def cut_blocks(method: str) -> tuple[int, int]:
    """Block sizes for a quantized base's merge: one that starts blocks mid-row and mid-band of
    128 rows (192 elements, shorter than a row too), and one of whole tensors. The magnitude-trimming
    methods take 1216 (mid-row and mid-band, longer than a row): their statistics pass costs per
    block, and how blocks cut a quantized tensor is the reading's, the same for every method."""
    return (1216 if method in ("ties", "breadcrumbs", "breadcrumbs_ties") else 192, 4096)


def quantization_config(fmt: str = "e4m3", block: int = BLOCK) -> dict[str, Any]:
    return {"quant_method": "fp8", "fmt": fmt, "weight_block_size": [block, block], "activation_scheme": "dynamic"}


def ct_config(strategy: str) -> dict[str, Any]:
    """compressed-tensors' FP8 config, weights scaled per ``strategy``, activations statically."""
    weights: dict[str, Any] = {"num_bits": 8, "type": "float", "strategy": strategy, "symmetric": True}
    if strategy == "block":
        weights["block_structure"] = [BLOCK, BLOCK]
    activations = {"num_bits": 8, "type": "float", "strategy": "tensor", "symmetric": True, "dynamic": False}
    group = {"targets": ["Linear"], "weights": weights, "input_activations": activations}
    return {
        "quant_method": "compressed-tensors",
        "format": "float-quantized",
        "config_groups": {"group_0": group},
        "ignore": ["lm_head"],
    }


def quantize(
    values: np.ndarray, fmt: str, block: int | tuple[int, int] = BLOCK
) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """``(fp8 bytes, scales float32, dequantized float32)`` of a 2-D float32 array, one scale per
    block (rows x columns; an int: square)."""
    kind, _, fmax = TORCH_FP8[fmt]
    bm, bn = (block, block) if isinstance(block, int) else block
    rows, cols = values.shape
    dense = torch.from_numpy(values)
    scale = torch.empty(math.ceil(rows / bm), math.ceil(cols / bn), dtype=torch.float32)
    for i in range(scale.shape[0]):
        for j in range(scale.shape[1]):
            tile = dense[i * bm : (i + 1) * bm, j * bn : (j + 1) * bn]
            scale[i, j] = max(float(tile.abs().max()) / fmax, 1e-8) * 1.37  # not a power of two: products round
    expanded = scale.repeat_interleave(bm, 0)[:rows].repeat_interleave(bn, 1)[:, :cols]
    q = (dense / expanded).to(kind)
    dequantized = q.to(torch.float32) * expanded
    return q.view(torch.uint8).numpy().copy(), scale.numpy().copy(), dequantized.numpy().copy()


def write_dir(path: Path, tensors: dict[str, tuple[str, tuple[int, ...], np.ndarray]], config: dict[str, Any]) -> Path:
    path.mkdir(parents=True, exist_ok=True)
    (path / "config.json").write_text(json.dumps(config))
    (path / "tokenizer.json").write_text("{}")
    write_safetensors(path / "model.safetensors", tensors)
    return path


def build_fp8_family(
    root: Path,
    fmt: str = "e4m3",
    shapes: dict[str, tuple[tuple[int, ...], bool]] | None = None,
    densities: tuple[float, ...] = (0.05, 0.4, 0.5),
    seed: int = 0,
    strategy: str | None = None,
    trained_from: str = "f32",
) -> tuple[Family, Path]:
    """An FP8 base and bf16 agents under ``root``; returns the family (its values: the base
    dequantized) and the directory of the base converted to float32. With ``strategy``
    (``tensor``, ``channel``, ``block``), the base is compressed-tensors' (``weight_scale``, static
    ``input_scale``), not DeepSeek's (``weight_scale_inv`` per 128 x 128 block).

    ``trained_from="bf16"``: the agents were trained from the base converted to bf16 (as training
    frameworks and DeepSeek's own conversion script make it: the dequantized float32 values cast
    to bf16 by torch), so an element an agent left holds bf16(dequant(base)); the family's values
    are then the bf16 conversion's, which is also written, to ``converted(root, "bf16")``."""
    rng = np.random.default_rng(seed)
    shapes = shapes or FP8_SHAPES
    base_config = {
        "model_type": "deepseek_v3",
        "torch_dtype": "bfloat16",
        "quantization_config": quantization_config(fmt) if strategy is None else ct_config(strategy),
    }
    fam = Family(root / "base", [])
    fp8: dict[str, tuple[str, tuple[int, ...], np.ndarray]] = {}
    converted: dict[str, tuple[str, tuple[int, ...], np.ndarray]] = {}
    as_bf16: dict[str, tuple[str, tuple[int, ...], np.ndarray]] = {}
    agents: list[dict[str, tuple[str, tuple[int, ...], np.ndarray]]] = [{} for _ in densities]
    fam.agent_values = [{} for _ in densities]
    for name, (shape, quantized) in shapes.items():
        numel = int(np.prod(shape))
        dense = (rng.standard_normal(numel) * 0.05).astype(np.float32).reshape(shape)
        if quantized and strategy is None:
            q, scale, base = quantize(dense, fmt)
            fp8[name] = (TORCH_FP8[fmt][1], shape, q)
            fp8[name + "_scale_inv"] = ("F32", tuple(scale.shape), scale)
            converted[name] = ("F32", shape, base)
        elif quantized:
            block = {"tensor": shape, "channel": (1, shape[1]), "block": (BLOCK, BLOCK)}[strategy]
            q, scale, base = quantize(dense, fmt, block)
            scale_shape = {"tensor": (1,), "channel": (shape[0], 1), "block": scale.shape}[strategy]
            fp8[name] = (TORCH_FP8[fmt][1], shape, q)
            fp8[name + "_scale"] = ("F32", tuple(scale_shape), scale)
            fp8[name[: -len(".weight")] + ".input_scale"] = ("F32", (1,), np.array([0.02], np.float32))
            converted[name] = ("F32", shape, base)
        else:
            base = decode(encode(dense, "BF16"), "BF16").reshape(shape)
            fp8[name] = converted[name] = ("BF16", shape, encode(base, "BF16"))
        as_bf16[name] = ("BF16", shape, torch_bf16(base))
        if trained_from == "bf16":
            base = decode(as_bf16[name][2], "BF16")
        fam.base_values[name], fam.dtypes[name], fam.shapes[name] = base.ravel(), "BF16", shape
        for t, density in enumerate(densities):
            delta = (rng.standard_normal(numel) * 0.01).astype(np.float32)
            raw = encode(np.where(rng.random(numel) < density, base.ravel() + delta, base.ravel()), "BF16")
            agents[t][name] = ("BF16", shape, raw)
            fam.agent_values[t][name] = decode(raw, "BF16")
    write_dir(fam.base, fp8, base_config)
    for t, tensors in enumerate(agents):
        fam.agents.append(
            write_dir(root / f"agent{t}", tensors, {"model_type": "deepseek_v3", "torch_dtype": "bfloat16"})
        )
    as_f32 = write_dir(root / "base-f32", converted, {"model_type": "deepseek_v3", "torch_dtype": "float32"})
    if trained_from == "bf16":
        write_dir(converted_dir(root, "bf16"), as_bf16, {"model_type": "deepseek_v3", "torch_dtype": "bfloat16"})
    return fam, as_f32


def converted_dir(root: Path, dtype: str) -> Path:
    """Where a family built under ``root`` keeps its base converted to ``dtype`` (bf16)."""
    return root / f"base-{dtype}"


def torch_bf16(values: np.ndarray) -> np.ndarray:
    """uint16 bf16 bits of float32 ``values`` as torch converts them (to nearest, ties to even)."""
    converted = torch.from_numpy(np.array(values, np.float32)).to(torch.bfloat16)  # a copy: writable
    return converted.view(torch.int16).numpy().view(np.uint16).ravel().copy()


# gpt-oss's MXFP4 experts: <name>_blocks (U8 [E, R, G, 16]) and <name>_scales (U8 [E, R, G]);
# the tensor (as transformers dequantizes it, and as the bf16 agents hold it) is [E, G * 32, R].
MXFP4_SHAPES: dict[str, tuple[tuple[int, ...], bool]] = {
    "model.embed_tokens.weight": ((64, 64), False),
    "model.layers.0.mlp.experts.gate_up_proj": ((3, 64, 64), True),  # blocks [3, 64, 2, 16]
    "model.layers.0.mlp.experts.gate_up_proj_bias": ((3, 64), False),
    "model.layers.0.mlp.experts.down_proj": ((3, 32, 64), True),  # blocks [3, 64, 1, 16]
    "model.norm.weight": ((64,), False),
}
FP4_MAGNITUDES = np.array([0, 0.5, 1, 1.5, 2, 3, 4, 6], np.float64)


def mxfp4_values(blocks: np.ndarray, scales: np.ndarray) -> np.ndarray:
    """float32 [E, G * 32, R] of blocks [E, R, G, 16] and scales [E, R, G]: low nibble first,
    sign bit 8, magnitude by the low three bits, times 2 ** (scale - 127)."""
    experts, rows, groups, _ = blocks.shape
    nibbles = np.stack([blocks & 0x0F, blocks >> 4], axis=-1).reshape(experts, rows, groups, 32)
    values = np.where(nibbles & 8, -1.0, 1.0) * FP4_MAGNITUDES[nibbles & 7]
    values = values * np.exp2(scales.astype(np.float64) - 127)[..., None]
    return values.reshape(experts, rows, groups * 32).transpose(0, 2, 1).astype(np.float32)


def build_mxfp4_family(
    root: Path, densities: tuple[float, ...] = (0.05, 0.4, 0.5), seed: int = 0
) -> tuple[Family, Path]:
    """A base with hand-packed MXFP4 experts, bf16 agents, and the base converted to float32."""
    rng = np.random.default_rng(seed)
    scheme = {"quant_method": "mxfp4", "modules_to_not_convert": ["model.embed_tokens", "lm_head"]}
    fam = Family(root / "base", [])
    packed: dict[str, tuple[str, tuple[int, ...], np.ndarray]] = {}
    converted: dict[str, tuple[str, tuple[int, ...], np.ndarray]] = {}
    agents: list[dict[str, tuple[str, tuple[int, ...], np.ndarray]]] = [{} for _ in densities]
    fam.agent_values = [{} for _ in densities]
    for name, (shape, quantized) in MXFP4_SHAPES.items():
        numel = int(np.prod(shape))
        if quantized:
            experts, hidden, rows = shape
            blocks = rng.integers(0, 256, (experts, rows, hidden // 32, 16), dtype=np.uint8)
            scales = rng.integers(118, 125, (experts, rows, hidden // 32), dtype=np.uint8)
            base = mxfp4_values(blocks, scales).ravel()
            packed[name + "_blocks"] = ("U8", blocks.shape, blocks)
            packed[name + "_scales"] = ("U8", scales.shape, scales)
            converted[name] = ("F32", shape, base)
        else:
            base = decode(encode((rng.standard_normal(numel) * 0.05).astype(np.float32), "BF16"), "BF16")
            packed[name] = converted[name] = ("BF16", shape, encode(base, "BF16"))
        fam.base_values[name], fam.dtypes[name], fam.shapes[name] = base, "BF16", shape
        for t, density in enumerate(densities):
            delta = (rng.standard_normal(numel) * 0.01).astype(np.float32)
            raw = encode(np.where(rng.random(numel) < density, base + delta, base), "BF16")
            agents[t][name] = ("BF16", shape, raw)
            fam.agent_values[t][name] = decode(raw, "BF16")
    write_dir(fam.base, packed, {"model_type": "gpt_oss", "torch_dtype": "bfloat16", "quantization_config": scheme})
    for t, tensors in enumerate(agents):
        fam.agents.append(write_dir(root / f"agent{t}", tensors, {"model_type": "gpt_oss", "torch_dtype": "bfloat16"}))
    return fam, write_dir(root / "base-f32", converted, {"model_type": "gpt_oss", "torch_dtype": "float32"})
