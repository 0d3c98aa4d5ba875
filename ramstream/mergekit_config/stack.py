"""``merge_method: passthrough``: layer ranges of models stacked, not merged (frankenmerges), or
one model copied, optionally scaled; ``api.stack`` runs the ``ConfigStack``."""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from ramstream.errors import ConfigError, excerpt
from ramstream.mergekit_config.models import (
    MODEL_ENTRY,
    SLICE_SOURCE,
    check_entry,
    is_lora_reference,
    model_path,
    num_layers,
    same_path,
    two_integers,
)
from ramstream.mergekit_config.tables import FLAGS, OUT_DTYPES, SCALE, Fail
from ramstream.mergekit_config.values import (
    chain,
    check_keys,
    check_tokenizer,
    dtype_name,
    name_of,
    parameters_of,
    value_of,
)

FLOAT32_MAX = 3.4028234663852886e38  # a scale past it would be Inf in every stacked value


@dataclass(frozen=True)
class StackSlice:
    """Layers ``[start, end)`` of ``model`` (``end`` None: to its last layer), stacked in the
    output after the slices before it. ``scale`` multiplies its tensors: None (copied as they
    are), a number, a gradient over the slice's layers, or conditions ``{filter, value}`` tried in
    order against the tensor's name in ``model`` (none matching: unscaled), as mergekit writes them."""

    model: Path
    start: int = 0
    end: int | None = None
    scale: Any = None


@dataclass(frozen=True)
class ConfigStack:
    """A passthrough config: the slices in output order, the model whose config.json and tokenizer
    files the output takes (None: the first slice's), and ``dtype``/``out_dtype`` (bf16, f16, f32)."""

    source: Path
    slices: tuple[StackSlice, ...]
    base: Path | None
    settings: Mapping[str, Any]


def parse_stack(doc: Any, source: Path) -> ConfigStack:
    """A ``merge_method: passthrough`` config: ``slices`` with one source each (a layer range
    within the model's layers, checked against its config.json when it is a local path), or
    ``models`` with one model (all its layers). ``scale`` is its one parameter; a source's own
    setting comes first, then its slice's, then the top-level one (mergekit's precedence)."""

    def fail(message: str) -> ConfigError:
        return ConfigError(f"{source}: {message}")

    check_keys(doc, fail)
    check_tokenizer(doc, fail)
    base = None if doc.get("base_model") is None else model_path(doc["base_model"], "base_model", fail)
    top = _scale_parameters(doc.get("parameters"), "parameters", fail)
    if "slices" in doc and doc.get("models") is not None:
        raise fail("slices and models are both given: mergekit reads one or the other")
    if "slices" in doc:
        slices = _stack_slices(doc["slices"], top, fail)
    else:
        slices = (_whole_model(doc.get("models"), base, top, fail),)
    return ConfigStack(source, slices, base, _stack_dtypes(doc, fail))


def _stack_slices(slices: Any, top: dict[str, Any], fail: Fail) -> tuple[StackSlice, ...]:
    if not isinstance(slices, list) or not slices:
        raise fail("slices must be a list of {sources: [{model: PATH, layer_range: [start, end]}]} entries")
    out = []
    for k, entry in enumerate(slices):
        where = f"slices[{k}]"
        if not isinstance(entry, Mapping):
            raise fail(f"{where} must be a mapping with sources: [{{model: PATH, layer_range: [start, end]}}]")
        extra = sorted(set(entry) - {"sources", "parameters"})
        if extra:
            raise fail(f"{where}: {excerpt(extra[0])} is not supported (a slice holds sources and parameters)")
        sources = entry.get("sources")
        if not isinstance(sources, list) or not sources:
            raise fail(f"{where}.sources must be a list of {{model: PATH, layer_range: [start, end]}} entries")
        if len(sources) != 1:
            raise fail(
                f"{where}: passthrough takes one source per slice (it copies layers, it merges nothing); "
                f"this slice has {len(sources)}"
            )
        params = _scale_parameters(entry.get("parameters"), where, fail)
        out.append(_stack_source(sources[0], f"{where}.sources[0]", [params, top], fail))
    return tuple(out)


def _stack_source(source: Any, where: str, scopes: list[dict[str, Any]], fail: Fail) -> StackSlice:
    check_entry(source, where, SLICE_SOURCE, fail, "model: PATH and layer_range: [start, end]")
    model = _stack_model(source["model"], where, fail)
    start, end = two_integers(source.get("layer_range"), where, fail)
    if not 0 <= start < end:
        raise fail(f"{where}: layer_range [{start}, {end}] holds no layer; give [start, end] with 0 <= start < end")
    if model.is_dir():  # a hub id is checked once resolved (a weights file, against its layers)
        layers = num_layers(model, where, "passthrough takes layers that the model has", fail)
        if end > layers:
            raise fail(
                f"{where}: layer_range [{start}, {end}] goes beyond the {layers} layers of {model} "
                f"(num_hidden_layers in its config.json); end is at most {layers}"
            )
    own = _scale_parameters(source.get("parameters"), where, fail)
    return StackSlice(model, start, end, _scale_chain([own, *scopes], where, fail))


def _whole_model(entries: Any, base: Path | None, top: dict[str, Any], fail: Fail) -> StackSlice:
    """passthrough over ``models``: one model, all its layers (mergekit makes it one slice, with
    base_model added to its sources: another model there would be a second input)."""
    if not isinstance(entries, list) or not entries:
        raise fail("passthrough needs slices: [...] or models: [{model: PATH}] (one model)")
    if len(entries) != 1:
        raise fail(
            f"passthrough takes one model under models: (it copies, it merges nothing); the config lists "
            f"{len(entries)}: stack layer ranges of several models with slices: instead"
        )
    entry = entries[0]
    check_entry(entry, "models[0]", MODEL_ENTRY, fail)
    model = _stack_model(entry["model"], "models[0]", fail)
    if base is not None and not same_path(model, base):
        raise fail(
            f"base_model {base} is not models[0] ({model}): mergekit adds base_model to the models, which gives "
            "passthrough two inputs; leave base_model out or make it that model"
        )
    own = _scale_parameters(entry.get("parameters"), "models[0]", fail)
    return StackSlice(model, 0, None, _scale_chain([own, top], "models[0]", fail))


def _stack_model(value: Any, where: str, fail: Fail) -> Path:
    if is_lora_reference(value):
        raise fail(
            f"{where}: {excerpt(value)} names a LoRA (model+lora): passthrough copies weights; merge it in first"
        )
    return model_path(value, where, fail)


def _scale_parameters(value: Any, where: str, fail: Fail) -> dict[str, Any]:
    params = parameters_of(value, where, fail)
    for key in params:
        if key != SCALE.name:
            raise fail(f"{where}.{key}: passthrough has no parameter {excerpt(key)} (it reads scale)")
    return {key: _scale_setting(setting, f"{where}.scale", fail) for key, setting in params.items()}


def _scale_setting(value: Any, where: str, fail: Fail) -> Any:
    """A number, a gradient (numbers), a condition ``{filter, value}`` or a list of conditions,
    its numbers as floats (YAML reads ``1e-5`` as text; mergekit validates it as a number)."""
    if isinstance(value, Mapping):
        extra = sorted(map(str, set(value) - {"filter", "value"}))
        if extra or "value" not in value or not isinstance(value.get("filter"), (str, type(None))):
            raise fail(f"{where}: a condition is {{filter: TEXT, value: V}}, got {excerpt(dict(value))}")
        inner = value["value"]
        if isinstance(inner, Mapping) or (isinstance(inner, list) and any(isinstance(v, Mapping) for v in inner)):
            raise fail(f"{where}: a condition's value is a number or a gradient, got {excerpt(inner)}")
        return {**value, "value": _scale_setting(inner, where, fail)}
    if isinstance(value, list):
        if not value:
            raise fail(f"{where}: an empty list gives no value")
        conditions = [isinstance(v, Mapping) for v in value]
        if any(isinstance(v, list) for v in value) or (any(conditions) and not all(conditions)):
            raise fail(f"{where}: a gradient is a list of numbers, got {excerpt(value)}")
        return [_scale_setting(v, where, fail) for v in value]
    number = value_of(SCALE, value, where.removesuffix(".scale"), fail)
    if isinstance(number, (int, float)) and not isinstance(number, bool) and abs(number) > FLOAT32_MAX:
        raise fail(f"{where} overflows float32 (|x| <= 3.4e38, where merges compute), got {excerpt(number)}")
    return number


def _scale_chain(scopes: list[dict[str, Any]], where: str, fail: Fail) -> Any:
    return chain(SCALE, [(where, params.get(SCALE.name)) for params in scopes], fail)


def _stack_dtypes(doc: Mapping[str, Any], fail: Fail) -> dict[str, Any]:
    """mergekit's ``dtype`` (the dtype it reads the tensors in, and scales them in) and
    ``out_dtype``, any of bfloat16, float16, float32: a copy has no arithmetic to keep in float32."""
    settings = {}
    for key in ("dtype", "out_dtype"):
        name = dtype_name(name_of(doc, key, fail), key, fail)
        if name is not None:
            settings[key] = OUT_DTYPES[name]
    return settings


def stack_arguments(config: ConfigStack, flags: Mapping[str, Any]) -> dict[str, Any]:
    """Keyword arguments of ``api.stack`` from a passthrough config and the flags given with it:
    ``--out-dtype`` when the config sets none; a merge's options are refused (nothing reads them)."""
    other = [key for key in flags if key != "out_dtype"]
    if other:
        flag = FLAGS.get(other[0], "--" + other[0].replace("_", "-"))
        raise ConfigError(f"{flag} does not apply to {config.source}: passthrough copies layers, it merges nothing")
    if "out_dtype" in flags and "out_dtype" in config.settings:
        raise ConfigError(
            f"--out-dtype is set by {config.source} too ({excerpt(config.settings['out_dtype'])}); set it in one place"
        )
    return {"slices": config.slices, "base": config.base, **config.settings, **flags}
