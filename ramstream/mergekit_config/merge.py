"""A merge config (every method but passthrough) translated into ``api.merge``'s settings."""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from ramstream.errors import ConfigError, excerpt
from ramstream.mergekit_config.models import model_inputs, model_path, one_full_slice, same_path
from ramstream.mergekit_config.tables import (
    API_KEYS,
    DEFAULT_ONLY,
    FLAGS,
    METHODS,
    OUT_DTYPES,
    PASSTHROUGH,
    Fail,
    MethodMap,
    Param,
)
from ramstream.mergekit_config.values import (
    chain,
    check_keys,
    check_tokenizer,
    dtype_name,
    name_of,
    parameters_of,
    value_of,
)


@dataclass(frozen=True)
class ConfigMerge:
    """A config, translated: the base, the agents (in mergekit's input order) and the settings."""

    source: Path
    base: Path
    agents: tuple[Path, ...]
    settings: Mapping[str, Any]


def parse(doc: Any, source: Path) -> ConfigMerge:
    """Translate a config already read from YAML (``source`` names it in messages)."""

    def fail(message: str) -> ConfigError:
        return ConfigError(f"{source}: {message}")

    check_keys(doc, fail)
    name = name_of(doc, "merge_method", fail)
    if name == PASSTHROUGH:
        raise fail("passthrough stacks layers and merges nothing: `ramstream merge --config` runs it, a sweep cannot")
    if name not in METHODS:
        raise fail(f"merge_method {excerpt(name)} is not supported; ramstream runs {', '.join(METHODS)}, {PASSTHROUGH}")
    spec = METHODS[name]
    settings: dict[str, Any] = {"method": spec.method, **dict(spec.implied), **_dtypes(doc, fail)}
    check_tokenizer(doc, fail)
    base = None if doc.get("base_model") is None else model_path(doc["base_model"], "base_model", fail)
    top = parameters_of(doc.get("parameters"), "parameters", fail)
    entries = doc.get("models")
    if "slices" in doc:
        if entries is not None:
            raise fail("slices and models are both given: mergekit reads one or the other")
        entries, slice_params = one_full_slice(doc["slices"], fail)
        top = {**top, **slice_params}
    inputs = model_inputs(entries, base, fail)
    if name == "linear":
        return _linear(source, base, inputs, top, settings, fail)
    if base is None and spec.base == "optional":
        return _without_base(source, name, spec, inputs, top, settings, fail)
    if base is None:
        raise fail(f"base_model is required: {name} merges task vectors against a base")
    else:
        for i, (path, params) in enumerate(inputs):
            if same_path(path, base) and params:
                raise fail(f"models[{i}] is the base model: its parameters ({', '.join(params)}) have no effect")
        inputs = [(path, params) for path, params in inputs if not same_path(path, base)]
        if not inputs:
            raise fail("models lists no model other than base_model: nothing to merge")
    _count(name, spec, len(inputs), fail)
    agents = tuple(path for path, _ in inputs)
    settings.update(_method_settings(name, spec, top, [params for _, params in inputs], fail))
    settings.update(dict(spec.fixed))
    return ConfigMerge(source, base, agents, settings)


def _count(name: str, spec: MethodMap, models: int, fail: Fail, extra: str = "") -> None:
    low, high = spec.agents
    if models < low or (high is not None and models > high):
        wanted = f"exactly {low}" if low == high else f"at least {low}" if high is None else f"{low} to {high}"
        raise fail(f"{name} merges {wanted} model(s) besides base_model; the config lists {models}{extra}")


def _without_base(
    source: Path,
    name: str,
    spec: MethodMap,
    inputs: list[tuple[Path, dict[str, Any]]],
    top: dict[str, Any],
    settings: dict[str, Any],
    fail: Fail,
) -> ConfigMerge:
    """A method that merges the models themselves when there is no base_model (nuslerp,
    multislerp, karcher): ramstream's BASE is the first model, and ``no_base`` says it is a
    model like the others."""
    if len(inputs) < 2:
        raise fail(f"{name} without base_model needs at least two models")
    _count(name, spec, len(inputs), fail, " (here without base_model: all of them)")
    settings.update(_method_settings(name, spec, top, [params for _, params in inputs], fail))
    if name != "karcher":  # karcher treats the base as one more input anyway
        settings["no_base"] = True
    return ConfigMerge(source, inputs[0][0], tuple(path for path, _ in inputs[1:]), settings)


def _linear(
    source: Path,
    base: Path | None,
    inputs: list[tuple[Path, dict[str, Any]]],
    top: dict[str, Any],
    settings: dict[str, Any],
    fail: Fail,
) -> ConfigMerge:
    """mergekit's linear is a weighted mean of its inputs, base_model among them (appended when
    it is not listed, weighted by the top-level weight); every input needs a weight. ramstream's
    linear takes one of them as its base (``base_weight``, added first) and the rest as agents:
    base_model when there is one, otherwise the first model."""
    if base is not None and not any(same_path(path, base) for path, _ in inputs):
        if "weight" not in top:
            raise fail(
                "base_model is an input of linear (mergekit adds it to the models): give it a weight "
                "(list it under models, or set a top-level weight), or leave base_model out"
            )
        inputs = [*inputs, (base, {})]
    if len(inputs) < 2:
        raise fail("linear needs at least two models (base_model counts as one)")
    settings.update(_method_settings("linear", METHODS["linear"], top, [params for _, params in inputs], fail))
    weights = settings.pop("weights", None)
    if weights is None:
        raise fail("linear needs a weight for every model (as in mergekit): set weight in their parameters")
    at = 0 if base is None else next(i for i, (path, _) in enumerate(inputs) if same_path(path, base))
    settings["base_weight"] = weights[at]
    settings["weights"] = weights[:at] + weights[at + 1 :]
    agents = tuple(path for i, (path, _) in enumerate(inputs) if i != at)
    return ConfigMerge(source, inputs[at][0], agents, settings)


def _dtypes(doc: Mapping[str, Any], fail: Fail) -> dict[str, Any]:
    dtype = dtype_name(name_of(doc, "dtype", fail), "dtype", fail)
    if dtype not in (None, "float32"):
        raise fail(
            f"dtype: {dtype} is not supported: ramstream's arithmetic is float32 whatever the inputs "
            "(write dtype: float32, and out_dtype: for the output's dtype)"
        )
    out = dtype_name(name_of(doc, "out_dtype", fail), "out_dtype", fail)
    if out is not None:
        return {"out_dtype": OUT_DTYPES[out]}
    if dtype is not None:
        return {"out_dtype": "f32"}  # mergekit writes the arithmetic dtype when out_dtype is absent
    return {}


def _refuse_varying(param: Param | None, key: str, value: Any, where: str, fail: Fail) -> None:
    """Gradients and filters where ramstream cannot vary the parameter per tensor yet."""
    if (param is not None and param.varying) or not isinstance(value, (list, Mapping)):
        return
    kind = "gradients" if isinstance(value, list) and not any(isinstance(s, Mapping) for s in value) else "filters"
    raise fail(
        f"{where}.{key}: per-tensor {kind} are not supported for {key} (they are for slerp's and nearswap's t, "
        "the spherical and GTA methods' weight, the GTA methods' lambda, density, gamma and epsilon); give one value"
    )


def _method_settings(
    name: str, spec: MethodMap, top: dict[str, Any], per_model: list[dict[str, Any]], fail: Fail
) -> dict[str, Any]:
    known = {p.name: p for p in spec.params}
    default_only = DEFAULT_ONLY.get(name, {})
    scopes = [("parameters", top), *((f"models[{i}]", p) for i, p in enumerate(per_model))]
    for where, params in scopes:
        for key, value in params.items():
            _refuse_varying(known.get(key), key, value, where, fail)
            if key in default_only:
                param, reason = default_only[key]
                if value_of(param, value, where, fail) != param.default:
                    raise fail(f"{where}.{key}: {excerpt(value)} " + reason.format(method=name))
            elif key not in known:
                reads = ", ".join(known) or "none"
                raise fail(f"{where}.{key}: {name} has no parameter {excerpt(key)} (it reads {reads})")
            elif known[key].scope == "shared" and where != "parameters":
                raise fail(f"{where}.{key}: {key} is one value for the whole merge: set it in the top-level parameters")
    settings: dict[str, Any] = {}
    for param in spec.params:
        if param.varying:
            settings.update(_varying(param, top, per_model, name, fail))
        elif param.scope == "shared":
            if param.name in top:
                settings[param.option] = value_of(param, top[param.name], "parameters", fail)
        elif param.name in top or any(param.name in p for p in per_model):
            settings[param.option] = [_model_value(param, top, p, i, name, fail) for i, p in enumerate(per_model)]
    return settings


def _varying(
    param: Param, top: dict[str, Any], per_model: list[dict[str, Any]], name: str, fail: Fail
) -> dict[str, Any]:
    """A parameter that may differ per tensor, as ``methods.tensor_settings`` reads it: the
    model's setting first, then the top-level one, then mergekit's default."""
    if param.scope == "shared":
        if param.name not in top:
            return {}  # left to the method, whose default is mergekit's
        value = chain(param, [("parameters", top.get(param.name))], fail)
        return {} if value is None else {param.option: value}
    if param.name not in top and not any(param.name in p for p in per_model):
        return {}
    values = []
    for i, p in enumerate(per_model):
        value = chain(param, [(f"models[{i}]", p.get(param.name)), ("parameters", top.get(param.name))], fail)
        if value is None:
            raise fail(f"models[{i}]: {param.name} is missing; {name} needs one for every model when any has one")
        values.append(value)
    return {param.option: values}


def _model_value(param: Param, top: dict[str, Any], params: dict[str, Any], i: int, name: str, fail: Fail) -> Any:
    where = f"models[{i}]" if param.name in params else "parameters"
    value = params.get(param.name, top.get(param.name, param.default))
    if value is None:
        raise fail(f"models[{i}]: {param.name} is missing; {name} needs one for every model when any has one")
    return value_of(param, value, where, fail)


def combine(config: ConfigMerge, flags: Mapping[str, Any]) -> dict[str, Any]:
    """The config's settings plus the flags given with it; a flag the config also sets is refused."""
    both = [k for k in flags if k in config.settings]
    if both:
        flag = FLAGS.get(both[0], both[0])
        given = excerpt(config.settings[both[0]])
        raise ConfigError(f"{flag} is set by {config.source} too ({given}); set it in one place")
    return {**config.settings, **flags}


def api_arguments(settings: Mapping[str, Any]) -> dict[str, Any]:
    """Keyword arguments of ``api.merge`` from flat settings (method options go in method_options)."""
    out: dict[str, Any] = {k: settings[k] for k in API_KEYS if k in settings}
    options = {k: v for k, v in settings.items() if k not in API_KEYS}
    if options:
        out["method_options"] = options
    return out
