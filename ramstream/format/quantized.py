"""Checkpoints quantized at rest: which of their tensors are read dequantized, and with which scales.

A checkpoint whose ``config.json`` holds ``quantization_config`` with ``quant_method: "fp8"``
(DeepSeek-V3/R1, Kimi-K2, Qwen3's FP8 releases) stores its large weights as FP8 (``F8_E4M3`` by
``fmt: "e4m3"``, ``F8_E5M2`` by ``"e5m2"``) beside a float tensor ``<weight>_scale_inv`` of one
scale per ``weight_block_size`` block (rows x columns, usually 128 x 128): weight element (i, j)
is worth ``f32(weight[i, j]) * f32(scale_inv[i // 128, j // 128])``. Such a weight becomes a
``QuantRef`` (``Checkpoint.quantized``); its scale tensor leaves the checkpoint's tensors, since
it belongs to its weight and is never merged.

Everything is checked here, before any data is read, and refused in one line naming the file and
tensor: a scheme ramstream does not read, a scale whose shape does not cover its weight's blocks,
a scale without its weight or a weight without its scale, a weight of the other FP8 format, and
FP8 tensors in a checkpoint whose ``config.json`` names no scheme.
"""

from __future__ import annotations

import json
import math
from dataclasses import replace
from pathlib import Path
from typing import Any, Literal, cast

from ramstream.errors import ConfigError, InputError, UnsupportedDtypeError
from ramstream.format.checkpoint import Checkpoint, QuantRef, QuantScheme, TensorRef
from ramstream.format.dtypes import FLOAT_CODES, FP8_FLOATS
from ramstream.format.names import CONFIG_FILE
from ramstream.format.safetensors_header import TensorEntry

FP8_FORMATS = {"e4m3": "F8_E4M3", "e5m2": "F8_E5M2"}
SCALE_SUFFIX = "_scale_inv"  # fp8 (DeepSeek): weight_scale_inv
CT_SCALE_SUFFIX = "_scale"  # compressed-tensors: weight_scale
ACTIVATION_SCALE_SUFFIX = ".input_scale"  # static activation scales, both schemes
ZERO_POINT_SUFFIX = "_zero_point"
CT_FORMATS = ("float-quantized", "naive-quantized")
CT_STRATEGIES = {"tensor": "per-tensor", "channel": "per-channel", "block": "per-block"}
READ_METHODS = ("fp8", "compressed-tensors", "mxfp4")
MX_BLOCKS, MX_SCALES = "_blocks", "_scales"  # mxfp4 (gpt-oss): <name>_blocks, <name>_scales
# Which scales a scheme allows: (strategy, block); the block is the one a "block" strategy names.
Strategies = tuple[tuple[str, tuple[int, int] | None], ...]
CONVERT = "convert the checkpoint to bf16, f16 or f32 first"

# Which values a quantized base stands for (``resolved_base_as``): its dequantized float32 values
# (f32), or those rounded to bf16 / f16, as its conversion to that dtype holds them; auto: the
# agents' dtype where they all share bf16 or f16.
QuantizedBaseAs = Literal["auto", "f32", "bf16", "f16"]
QUANTIZED_BASE_AS: tuple[str, ...] = ("auto", "f32", "bf16", "f16")
ROUNDED_TO = {"BF16": "bf16", "F16": "f16"}  # a stored dtype -> the setting that rounds to it


def checked_base_as(value: object) -> QuantizedBaseAs:
    """``value`` as a ``--quantized-base-as`` setting; anything else is refused in one line."""
    if value not in QUANTIZED_BASE_AS:
        raise ConfigError(f"--quantized-base-as must be one of {', '.join(QUANTIZED_BASE_AS)}, got {value!r}")
    return cast(QuantizedBaseAs, value)


def resolved_base_as(base: Checkpoint, agents: tuple[Checkpoint, ...], asked: QuantizedBaseAs) -> str:
    """What the base's quantized tensors are read as: f32 for a base with none (the setting is
    moot), ``asked`` when it is not auto, else ``agents_dtype`` (f32 when the agents differ)."""
    if not base.quantized:
        return "f32"
    if asked != "auto":
        return asked
    return agents_dtype(base, agents) or "f32"


def agents_dtype(base: Checkpoint, agents: tuple[Checkpoint, ...]) -> str | None:
    """bf16 or f16 when every agent stores every tensor the base stores quantized in that dtype
    (the dtype they were trained in, from the base converted to it), else None."""
    stored = {
        "quantized" if name in agent.quantized else agent.dtype_of(name) for agent in agents for name in base.quantized
    }
    return ROUNDED_TO.get(stored.pop()) if len(stored) == 1 else None


def with_quantization(checkpoint: Checkpoint) -> Checkpoint:
    """``checkpoint`` with its quantized weights described (``quantized``, ``scheme``) and their
    scales out of ``tensors``; unchanged when it stores only floats the kernels decode."""
    odd = [ref for ref in checkpoint.tensors.values() if ref.entry.dtype not in FLOAT_CODES]
    scales = [ref for name, ref in checkpoint.tensors.items() if name.endswith(SCALE_SUFFIX)]  # fp8 of another dtype
    if not odd and not scales:
        return checkpoint  # a config naming a scheme (an agent saved in bf16 with its base's config) is moot
    config_path, config = _quantization_config(checkpoint)
    fp8 = [ref for ref in odd if ref.entry.dtype in FP8_FLOATS]
    if config is None or config_path is None:
        if fp8:
            where = (
                f"{config_path} names" if config_path is not None and config_path.is_file() else "no config.json gives"
            )
            raise UnsupportedDtypeError(
                f"{fp8[0].file}: tensor {fp8[0].name!r} is {fp8[0].entry.dtype}, and {where} no quantization_config "
                f"(how its scales apply), so ramstream cannot decode it; give the checkpoint's directory with the "
                f"config.json it was saved with, or {CONVERT}"
            )
        return checkpoint
    method = config.get("quant_method")
    if method == "fp8":
        return _fp8_blocks(checkpoint, config_path, config)
    if method == "compressed-tensors" and fp8:
        return _compressed_tensors(checkpoint, config_path, config)
    if method == "mxfp4":
        return _mxfp4(checkpoint)
    if not fp8 and not scales and all(ref.entry.dtype not in ("U8", "I8", "I32") for ref in odd):
        return checkpoint  # integer buffers beside float weights: the scheme quantizes nothing stored here
    raise UnsupportedDtypeError(
        f"{config_path}: quantization_config names quant_method {method!r}, which ramstream does not read "
        f"(it reads {', '.join(repr(m) for m in READ_METHODS)}); {CONVERT}"
    )


def _quantization_config(checkpoint: Checkpoint) -> tuple[Path | None, dict[str, Any] | None]:
    """The checkpoint's ``config.json`` path (None without a directory) and its
    ``quantization_config`` (None when it has none); a config.json that cannot be read is refused."""
    if checkpoint.directory is None:
        return None, None
    path = checkpoint.directory / CONFIG_FILE
    if not path.is_file():
        return path, None
    try:
        config = json.loads(path.read_bytes())
    except (OSError, ValueError) as exc:
        raise InputError(f"{path}: cannot be read as JSON ({exc}); fix the checkpoint's config.json") from exc
    quantization = config.get("quantization_config") if isinstance(config, dict) else None
    if quantization is None:
        return path, None
    if not isinstance(quantization, dict):
        raise UnsupportedDtypeError(f"{path}: quantization_config is not an object; fix the config.json or {CONVERT}")
    return path, quantization


def _fp8_blocks(checkpoint: Checkpoint, config_path: Path, config: dict[str, Any]) -> Checkpoint:
    """The ``fp8`` scheme: FP8 weights, one ``_scale_inv`` scale per ``weight_block_size`` block."""
    fmt = config.get("fmt", "e4m3")
    if fmt not in FP8_FORMATS:
        raise UnsupportedDtypeError(
            f"{config_path}: quantization_config.fmt is {fmt!r}; ramstream reads {' or '.join(FP8_FORMATS)}; {CONVERT}"
        )
    block = _as_block(config.get("weight_block_size"))
    if block is None:
        raise UnsupportedDtypeError(
            f"{config_path}: quantization_config.weight_block_size is {config.get('weight_block_size')!r}, not two "
            f"positive integers (rows, columns of a scale's block); ramstream reads fp8 checkpoints with block "
            f"scales only; {CONVERT}"
        )
    summary = f"fp8 ({fmt}, one scale per {block[0]} x {block[1]} block)"
    strategies: Strategies = (("block", block),)
    return _paired(checkpoint, SCALE_SUFFIX, FP8_FORMATS[fmt], strategies, QuantScheme("fp8", summary))


def _compressed_tensors(checkpoint: Checkpoint, config_path: Path, config: dict[str, Any]) -> Checkpoint:
    """compressed-tensors' FP8 (``format: float-quantized``): E4M3 weights and a ``weight_scale``
    per tensor, per output channel (row) or per block, as its config groups' ``strategy`` says."""
    fmt = config.get("format")
    if fmt not in CT_FORMATS:
        raise UnsupportedDtypeError(
            f"{config_path}: quantization_config is compressed-tensors with format {fmt!r}; ramstream reads "
            f"{' and '.join(repr(f) for f in CT_FORMATS)} (FP8 weights) only; {CONVERT}"
        )
    groups = config.get("config_groups")
    if not isinstance(groups, dict) or not groups:
        raise UnsupportedDtypeError(f"{config_path}: quantization_config has no config_groups; {CONVERT}")
    strategies: list[tuple[str, tuple[int, int] | None]] = []
    for key, group in groups.items():
        weights = group.get("weights") if isinstance(group, dict) else None
        if weights is None:
            continue  # a group that quantizes activations only
        strategy = weights.get("strategy") if isinstance(weights, dict) else None
        block = _as_block(weights.get("block_structure")) if isinstance(weights, dict) else None
        if (
            not isinstance(weights, dict)
            or weights.get("type") != "float"
            or weights.get("num_bits") != 8
            or strategy not in CT_STRATEGIES
            or (strategy == "block" and block is None)
        ):
            raise UnsupportedDtypeError(
                f"{config_path}: quantization_config.config_groups.{key}.weights is {weights!r}; ramstream reads "
                f"8-bit float weights with strategy {', '.join(CT_STRATEGIES)} (block: with block_structure); {CONVERT}"
            )
        strategies.append((strategy, block if strategy == "block" else None))
    names = sorted({CT_STRATEGIES[s] for s, _ in strategies})
    summary = f"compressed-tensors fp8 (e4m3, {' or '.join(names)} scales)"
    return _paired(
        checkpoint, CT_SCALE_SUFFIX, "F8_E4M3", tuple(strategies), QuantScheme("compressed-tensors", summary)
    )


def _paired(checkpoint: Checkpoint, suffix: str, dtype: str, strategies: Strategies, scheme: QuantScheme) -> Checkpoint:
    """Each ``<weight><suffix>`` scale paired with its weight as a ``QuantRef`` and taken out of
    the tensors, activation scales set apart (``activation_scales``); anything that does not fit
    is refused."""
    tensors = dict(checkpoint.tensors)
    quantized: dict[str, QuantRef] = {}
    activation: dict[str, TensorRef] = {}
    for name in list(checkpoint.tensors):
        if name.endswith(ZERO_POINT_SUFFIX):
            raise UnsupportedDtypeError(
                f"{checkpoint.tensors[name].file}: tensor {name!r} is a zero point (asymmetric quantization), which "
                f"ramstream does not read; {CONVERT}"
            )
        if name.endswith(ACTIVATION_SCALE_SUFFIX):
            activation[name] = tensors.pop(name)  # how activations were quantized: no value of the model
        elif name.endswith(suffix):
            scale = tensors.pop(name)
            weight = _checked_weight(scale, tensors.get(name[: -len(suffix)]), dtype, suffix)
            quantized[weight.name] = QuantRef(weight.name, weight, scale, _block_of(scale, weight, strategies))
    for ref in tensors.values():
        if ref.entry.dtype in FP8_FLOATS and ref.name not in quantized:
            raise UnsupportedDtypeError(
                f"{ref.file}: tensor {ref.name!r} is {ref.entry.dtype} but the checkpoint holds no "
                f"{ref.name + suffix!r} (its scales), so its values are unknown; {CONVERT}"
            )
    if not quantized:
        return checkpoint
    return replace(checkpoint, tensors=tensors, quantized=quantized, scheme=scheme, activation_scales=activation)


def _block_of(scale: TensorRef, weight: TensorRef, strategies: Strategies) -> tuple[int, int]:
    """The block of elements one scale covers: the first strategy whose scale shape ``scale``
    has (per tensor: one scale; per channel: one per row; per block: one per block)."""
    rows, cols = weight.entry.shape
    shape = list(scale.entry.shape)
    expected = []
    for strategy, block in strategies:
        if strategy == "tensor":
            shapes, covers = [[], [1], [1, 1]], (max(rows, 1), max(cols, 1))
        elif strategy == "channel":
            shapes, covers = [[rows, 1], [rows]], (1, max(cols, 1))
        else:
            assert block is not None  # a block strategy names its block (checked with the config)
            shapes, covers = [[math.ceil(rows / block[0]), math.ceil(cols / block[1])]], block
        if shape in shapes:
            return covers
        expected.append(shapes[0])
    raise UnsupportedDtypeError(
        f"{scale.file}: tensor {scale.name!r} has shape {shape}, but {weight.name!r} {[rows, cols]} needs "
        f"{' or '.join(map(str, expected))} scales ({', '.join(s for s, _ in strategies)}); the checkpoint and its "
        f"quantization_config disagree, fix one of them or {CONVERT}"
    )


def _mxfp4(checkpoint: Checkpoint) -> Checkpoint:
    """gpt-oss's MXFP4 experts: each ``<name>_blocks`` (U8 [E, R, G, 16]) with its ``<name>_scales``
    (U8 [E, R, G]) is tensor ``<name>`` [E, G * 32, R] (``QuantRef``, layout "mxfp4"), in the
    blocks' place among the tensors; it is read as float32 (its entry says F32, the dtype it
    reaches the kernels in; its bytes are the blocks')."""
    tensors: dict[str, TensorRef] = {}
    quantized: dict[str, QuantRef] = {}
    names = set(checkpoint.tensors)
    for name, ref in checkpoint.tensors.items():
        if name.endswith(MX_SCALES) and name[: -len(MX_SCALES)] + MX_BLOCKS in names:
            continue  # read with its blocks
        if not name.endswith(MX_BLOCKS):
            if name.endswith(MX_SCALES) and ref.entry.dtype == "U8":
                raise UnsupportedDtypeError(
                    f"{ref.file}: tensor {name!r} holds MXFP4 scales, but the checkpoint holds no "
                    f"{name[: -len(MX_SCALES)] + MX_BLOCKS!r}; the checkpoint is incomplete, re-download or re-save it"
                )
            tensors[name] = ref
            continue
        stem = name[: -len(MX_BLOCKS)]
        scales = _checked_scales(ref, checkpoint.tensors.get(stem + MX_SCALES), stem in names)
        quant = QuantRef(stem, ref, scales, (1, 32), "mxfp4")
        numel = math.prod(quant.shape)
        tensors[stem] = TensorRef(ref.file, TensorEntry(stem, "F32", quant.shape, ref.entry.offset, 4 * numel))
        quantized[stem] = quant
    if not quantized:
        return checkpoint
    scheme = QuantScheme("mxfp4", "mxfp4 (FP4 E2M1 values in groups of 32, one E8M0 scale a group)")
    return replace(checkpoint, tensors=tensors, quantized=quantized, scheme=scheme)


def _checked_scales(blocks: TensorRef, scales: TensorRef | None, stem_too: bool) -> TensorRef:
    """The scales of MXFP4 ``blocks``; blocks without them, or whose shapes or dtypes do not fit,
    are refused (by name)."""
    stem = blocks.name[: -len(MX_BLOCKS)]
    if scales is None:
        raise UnsupportedDtypeError(
            f"{blocks.file}: tensor {blocks.name!r} holds MXFP4 blocks, but the checkpoint holds no "
            f"{stem + MX_SCALES!r}; the checkpoint is incomplete, re-download or re-save it"
        )
    if stem_too:
        raise UnsupportedDtypeError(
            f"{blocks.file}: the checkpoint holds both {stem!r} and its MXFP4 blocks {blocks.name!r}; keep one"
        )
    shape, scale_shape = list(blocks.entry.shape), list(scales.entry.shape)
    if blocks.entry.dtype != "U8" or scales.entry.dtype != "U8" or len(shape) != 4 or shape[3] != 16:
        raise UnsupportedDtypeError(
            f"{blocks.file}: tensor {blocks.name!r} is {blocks.entry.dtype}{shape} with scales "
            f"{scales.entry.dtype}{scale_shape}; MXFP4 blocks are U8 [experts, rows, groups, 16] with U8 scales "
            f"[experts, rows, groups]; {CONVERT}"
        )
    if scale_shape != shape[:3]:
        raise UnsupportedDtypeError(
            f"{scales.file}: tensor {scales.name!r} has shape {scale_shape}, but {blocks.name!r} {shape} needs "
            f"{shape[:3]} scales; the checkpoint is inconsistent, re-download or re-save it"
        )
    return scales


def _as_block(value: object) -> tuple[int, int] | None:
    """``value`` as a block (rows, columns) when it is a list of two positive integers, else None."""
    if (
        isinstance(value, list)
        and len(value) == 2
        and all(isinstance(b, int) and not isinstance(b, bool) and b > 0 for b in value)
    ):
        return value[0], value[1]
    return None


def _checked_weight(scale: TensorRef, weight: TensorRef | None, dtype: str, suffix: str) -> TensorRef:
    """The weight of ``scale``; a scale that does not fit its weight is refused (by name, in one line)."""
    if weight is None:
        raise UnsupportedDtypeError(
            f"{scale.file}: tensor {scale.name!r} is a scale, but the checkpoint holds no weight "
            f"{scale.name[: -len(suffix)]!r} for it; the checkpoint is incomplete, re-download or re-save it"
        )
    if weight.entry.dtype != dtype:
        raise UnsupportedDtypeError(
            f"{weight.file}: tensor {weight.name!r} is {weight.entry.dtype}, but quantization_config says the "
            f"weights are {dtype}; fix the config.json or {CONVERT}"
        )
    if scale.entry.dtype not in FLOAT_CODES:
        raise UnsupportedDtypeError(
            f"{scale.file}: tensor {scale.name!r} (the scales of {weight.name!r}) is {scale.entry.dtype}, not a "
            f"float; {CONVERT}"
        )
    if len(weight.entry.shape) != 2:
        raise UnsupportedDtypeError(
            f"{weight.file}: tensor {weight.name!r} has shape {list(weight.entry.shape)}; ramstream reads scales "
            f"of 2-D weights only; {CONVERT}"
        )
    return weight
