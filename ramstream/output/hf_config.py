"""The output's ``config.json``: the base's, with its dtype set to what the merge wrote (and,
for a quantized base written dequantized, without its ``quantization_config``: the output holds
no scales; with ``--out-dtype fp8`` it is kept, the output being in that scheme); for a
stack of layers (passthrough), also its layer count and its per-layer lists."""

from __future__ import annotations

import json
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from ramstream.errors import InputError
from ramstream.format.dtypes import FP8_FLOATS, TORCH_NAMES
from ramstream.format.family import Family

# Where a config.json gives its layer count: transformers' name, and GPT-2's, GPT-J's, BLOOM's.
LAYER_COUNT_KEYS = ("num_hidden_layers", "n_layer")


def merged_config(path: Path | None, family: Family, dtypes: tuple[str, ...]) -> dict[str, Any] | None:
    """The output's config from the base's (``path``; None: the base has none); a broken one is
    an ``InputError`` (the merge calls this before its first block too, so it never fails after
    the long pass)."""
    if path is None:
        return None
    config = read_config(path)
    if family.base.quantized and not any(d in FP8_FLOATS for d in dtypes):  # written dequantized: no scales
        config.pop("quantization_config", None)
    elements: dict[str, int] = {}
    for dtype, ref in zip(dtypes, family.base.tensors.values(), strict=True):
        elements[dtype] = elements.get(dtype, 0) + ref.entry.numel
    set_dtype(config, elements)
    return config


def read_config(path: Path) -> dict[str, Any]:
    """A ``config.json`` as a JSON object; ``InputError`` naming it when it is not one."""
    try:
        text = path.read_bytes()
    except OSError as exc:
        raise InputError(f"{path}: cannot be read ({exc.strerror}); fix or remove the base's config.json") from exc
    try:
        config = json.loads(text)
    except ValueError as exc:
        raise InputError(f"{path}: not valid JSON ({exc}); fix or remove the base's config.json") from exc
    if not isinstance(config, dict):
        raise InputError(
            f"{path}: holds a JSON {type(config).__name__}, not an object; fix or remove the base's config.json"
        )
    return config


def set_dtype(config: dict[str, Any], elements: Mapping[str, int]) -> None:
    """Set ``torch_dtype`` (and ``dtype``, when the config has it) to the float dtype holding most
    of the written elements (``elements``: per safetensors dtype)."""
    counts = {d: n for d, n in elements.items() if d in TORCH_NAMES}
    if counts:
        # The dtype holding most elements; ties go to the first in TORCH_NAMES order (no set order).
        dominant = max(TORCH_NAMES, key=lambda d: (counts.get(d, -1), -list(TORCH_NAMES).index(d)))
        config["torch_dtype"] = TORCH_NAMES[dominant]
        if "dtype" in config:
            config["dtype"] = TORCH_NAMES[dominant]


@dataclass(frozen=True)
class LayerSource:
    """Where one layer of a stack comes from: layer ``layer`` of a model whose config.json is
    ``config`` (None when it has none), ``name`` saying which model in messages."""

    name: str
    config: Mapping[str, Any] | None
    layer: int


def stacked_config(
    path: Path | None, layers: Sequence[LayerSource], elements: Mapping[str, int]
) -> dict[str, Any] | None:
    """The config of a stack of ``layers`` (in output order) from ``path``'s: ``num_hidden_layers``
    (or GPT-2's ``n_layer``) is their count, and each per-layer list (a top-level list with one entry per layer, such as
    ``layer_types``) is rebuilt, output layer j taking the entry of the layer it came from, in its
    own model's config (or, when that model's config has no such list, in ``path``'s)."""
    if path is None:
        return None
    config = read_config(path)
    count = layer_count(config)
    if count is not None and count > 0:
        for key, value in list(config.items()):
            if isinstance(value, list) and len(value) == count:
                config[key] = [_entry(key, source, value, path) for source in layers]
    config[next((k for k in LAYER_COUNT_KEYS if k in config), LAYER_COUNT_KEYS[0])] = len(layers)
    set_dtype(config, elements)
    return config


def layer_count(config: Mapping[str, Any] | None) -> int | None:
    """The layer count a config.json gives (``LAYER_COUNT_KEYS``), None when it gives none."""
    for key in LAYER_COUNT_KEYS:
        value = None if config is None else config.get(key)
        if isinstance(value, int) and not isinstance(value, bool) and value >= 0:
            return value
    return None


def _entry(key: str, source: LayerSource, fallback: list[Any], path: Path) -> Any:
    own = None if source.config is None else source.config.get(key)
    values = own if isinstance(own, list) and len(own) == layer_count(source.config) else fallback
    if source.layer >= len(values):
        raise InputError(
            f"{path}: {key} lists {len(values)} layers, but the stack takes layer {source.layer} of {source.name}, "
            f"whose own config.json has no {key}; give that model a config.json with it"
        )
    return values[source.layer]
