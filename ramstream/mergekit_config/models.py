"""The models a config names: paths and hub ids, mergekit's ``base_model+adapter`` LoRA references,
and the one full-range slice that says what ``models`` says (layer counts from config.json)."""

from __future__ import annotations

import json
from collections.abc import Mapping
from pathlib import Path
from typing import Any

from ramstream.errors import excerpt
from ramstream.mergekit_config.tables import Fail
from ramstream.mergekit_config.values import parameters_of


def same_path(a: Path, b: Path) -> bool:
    return a == b or a.resolve() == b.resolve()


def model_path(value: Any, where: str, fail: Fail) -> Path:
    if not isinstance(value, str) or not value:
        raise fail(f"{where}: model must be a path (override_architecture is not supported)")
    if is_lora_reference(value):
        raise fail(f"{where}: {excerpt(value)} names a LoRA (model+lora): the base cannot be one (merge it in first)")
    return Path(value).expanduser()  # a hub id (org/name@rev) stays as written: it is resolved on opening


# The keys of a model entry, of a slice's source, and what messages call them.
MODEL_ENTRY = (("model", "parameters"), "a model entry holds model and parameters")
SLICE_SOURCE = (("model", "layer_range", "parameters"), "a source holds model, layer_range and parameters")


def check_entry(
    entry: Any, where: str, keys: tuple[tuple[str, ...], str], fail: Fail, shape: str = "model: PATH"
) -> None:
    """A model entry or a slice's source: a mapping with ``model`` and no key it does not hold."""
    allowed, holds = keys
    if not isinstance(entry, Mapping) or "model" not in entry:
        raise fail(f"{where} must be a mapping with {shape}")
    extra = sorted(set(entry) - set(allowed))
    if extra:
        raise fail(f"{where}: {excerpt(extra[0])} is not supported ({holds})")


def model_inputs(entries: Any, base: Path | None, fail: Fail) -> list[tuple[Path, dict[str, Any]]]:
    if not isinstance(entries, list) or not entries:
        raise fail("models must be a list of {model: PATH, parameters: {...}} entries")
    out = []
    for i, entry in enumerate(entries):
        where = f"models[{i}]"
        check_entry(entry, where, MODEL_ENTRY, fail)
        model = entry["model"]
        path = _adapter_path(model, base, where, fail) if is_lora_reference(model) else model_path(model, where, fail)
        out.append((path, parameters_of(entry.get("parameters"), where, fail)))
    return out


def is_lora_reference(value: Any) -> bool:
    """mergekit's ``model+lora``: a string with a '+' that is not itself an existing path."""
    return isinstance(value, str) and "+" in value and not Path(value).expanduser().exists()


def _adapter_path(value: str, base: Path | None, where: str, fail: Fail) -> Path:
    """``base+adapter``: the adapter directory, merged as an agent of base_model (its task vector is
    the adapter's update). A LoRA on another model would make that model's own update part of the
    agent, which ramstream does not read: refused, as is an adapter that is not a local directory."""
    model, adapter = (part.strip() for part in value.split("+", 1))
    if base is None:
        raise fail(
            f"{where}: {excerpt(value)} applies a LoRA to {excerpt(model)}: set base_model: {model} "
            "(an adapter merges as an agent of base_model)"
        )
    if not same_path(Path(model).expanduser(), base):
        raise fail(
            f"{where}: {excerpt(value)} applies a LoRA to {excerpt(model)}, which is not base_model ({base}): "
            "ramstream merges an adapter as an agent of base_model only (merge it into its model first)"
        )
    path = Path(adapter).expanduser()
    if not (path / "adapter_config.json").is_file():
        raise fail(f"{where}: {excerpt(adapter)} is not a local PEFT adapter directory (no adapter_config.json in it)")
    return path


def one_full_slice(slices: Any, fail: Fail) -> tuple[list[Any], dict[str, Any]]:
    """mergekit's ``slices`` when they say what ``models`` says (mergekit turns ``models`` into
    exactly this): one slice whose every source spans all the layers of its model. Returns the
    sources as ``models`` entries and the slice's own parameters (which override the top-level
    ones). Anything else (several slices, part of the layers: a frankenmerge) is refused by name:
    stacking layer ranges is passthrough's (``parse_stack``)."""
    if not isinstance(slices, list) or len(slices) != 1 or not isinstance(slices[0], Mapping):
        count = len(slices) if isinstance(slices, list) else "no list of"
        raise fail(
            f"slices: ramstream reads one slice spanning every layer of its models (the models: form); "
            f"this config has {count} slices (frankenmerges: merge_method: passthrough stacks layer ranges)"
        )
    extra = sorted(set(slices[0]) - {"sources", "parameters"})
    if extra:
        raise fail(f"slices[0]: {excerpt(extra[0])} is not supported (a slice holds sources and parameters)")
    sources = slices[0].get("sources")
    if not isinstance(sources, list) or not sources:
        raise fail("slices[0].sources must be a list of {model: PATH, layer_range: [0, LAYERS]} entries")
    entries = []
    for i, source in enumerate(sources):
        where = f"slices[0].sources[{i}]"
        check_entry(source, where, SLICE_SOURCE, fail)
        _check_full_range(source.get("layer_range"), source["model"], where, fail)
        entries.append({key: value for key, value in source.items() if key != "layer_range"})
    return entries, parameters_of(slices[0].get("parameters"), "slices[0]", fail)


def _check_full_range(layer_range: Any, model: Any, where: str, fail: Fail) -> None:
    """``layer_range`` must be [0, the model's num_hidden_layers], read from its config.json."""
    two_integers(layer_range, where, fail)
    directory = Path(str(model).split("+", 1)[0] if is_lora_reference(model) else str(model)).expanduser()
    layers = num_layers(directory, where, "a slice must span every layer; list the models under models: instead", fail)
    if layer_range != [0, layers]:
        raise fail(
            f"{where}: layer_range {layer_range} is not all of {model}'s {layers} layers: slices of part of "
            f"the layers (frankenmerges) are read for merge_method: passthrough only; use [0, {layers}]"
        )


def two_integers(layer_range: Any, where: str, fail: Fail) -> tuple[int, int]:
    if (
        not isinstance(layer_range, list)
        or len(layer_range) != 2
        or not all(isinstance(x, int) and not isinstance(x, bool) for x in layer_range)
    ):
        raise fail(f"{where}: layer_range must be [first, end], two integers")
    return layer_range[0], layer_range[1]


def num_layers(directory: Path, where: str, hint: str, fail: Fail) -> int:
    """``num_hidden_layers`` from the model's config.json (``hint``: what to do without it)."""
    try:
        config = json.loads((directory / "config.json").read_text())
        layers = config.get("num_hidden_layers", config.get("n_layer"))  # GPT-2's name
    except (OSError, ValueError, AttributeError):
        layers = None
    if not isinstance(layers, int) or isinstance(layers, bool) or layers < 0:
        raise fail(
            f"{where}: cannot read num_hidden_layers from {directory / 'config.json'} to check layer_range ({hint})"
        )
    return layers
