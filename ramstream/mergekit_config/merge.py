"""A merge config (every method but passthrough) translated into ``api.merge``'s settings."""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field
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

# A model of the config: its path, its parameters, and where the config lists it (``models[2]``).
Input = tuple[Path, dict[str, Any], str]


@dataclass(frozen=True)
class ConfigMerge:
    """A config, translated: the base, the agents (in mergekit's input order) and the settings."""

    source: Path
    base: Path
    agents: tuple[Path, ...]
    settings: Mapping[str, Any]
    # per option, the config's key of each value (one for a shared setting, one per agent): the
    # merge's refusal of a value names the key the config writes it under (``config_refusal``)
    keys: Mapping[str, list[str]] = field(default_factory=dict)


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
    top_where: dict[str, str] = {}  # where a top-level parameter is written, when not under parameters
    entries = doc.get("models")
    listed = "models"
    if "slices" in doc:
        if entries is not None:
            raise fail("slices and models are both given: mergekit reads one or the other")
        entries, slice_params = one_full_slice(doc["slices"], fail)
        top = {**top, **slice_params}
        top_where = dict.fromkeys(slice_params, "slices[0].parameters")
        listed = "slices[0].sources"
    inputs = [(path, params, f"{listed}[{i}]") for i, (path, params) in enumerate(model_inputs(entries, base, fail))]
    scopes = Scopes(top, top_where)
    if name == "linear":
        return _linear(source, base, inputs, scopes, settings, fail)
    if base is None and spec.base == "optional":
        return _without_base(source, name, spec, inputs, scopes, settings, fail)
    if base is None:
        raise fail(f"base_model is required: {name} merges task vectors against a base")
    else:
        for path, params, where in inputs:
            if same_path(path, base) and params:
                raise fail(f"{where} is the base model: its parameters ({', '.join(params)}) have no effect")
        inputs = [entry for entry in inputs if not same_path(entry[0], base)]
        if not inputs:
            raise fail("models lists no model other than base_model: nothing to merge")
    _count(name, spec, len(inputs), fail)
    agents = tuple(path for path, _, _ in inputs)
    method, keys = _method_settings(name, spec, scopes, inputs, fail)
    settings.update(method)
    settings.update(dict(spec.fixed))
    return ConfigMerge(source, base, agents, settings, keys)


@dataclass(frozen=True)
class Scopes:
    """The top-level parameters (with a slice's), and where each is written for messages."""

    top: dict[str, Any]
    where: dict[str, str]

    def of(self, key: str) -> str:
        return self.where.get(key, "parameters")


def config_refusal(config: ConfigMerge, flags: Mapping[str, Any], exc: ConfigError) -> ConfigError:
    """The method's refusal of a merge ``config`` (with ``flags``) set up, as the user should read
    it: a refused value the config wrote (``OptionError``: a density of 1.5) named by its key, not
    by a flag the user never typed; any other refusal prefixed with the file when no flag given with
    the config could be its cause."""
    name, item, problem = getattr(exc, "name", None), getattr(exc, "item", None), getattr(exc, "problem", None)
    if isinstance(name, str) and problem is not None and name in config.keys and name not in flags:
        where = config.keys[name]
        key = where[item] if isinstance(item, int) and 0 <= item < len(where) else where[0]
        return ConfigError(f"{config.source}: {key} {problem}")
    if all(k in RUN_SETTINGS for k in flags):
        return ConfigError(f"{config.source}: {exc}")
    return exc


# Settings that are arguments of the run, not options the method parses.
RUN_SETTINGS = ("method", "eps", "out_dtype")


def _count(name: str, spec: MethodMap, models: int, fail: Fail, extra: str = "") -> None:
    low, high = spec.agents
    if models < low or (high is not None and models > high):
        wanted = f"exactly {low}" if low == high else f"at least {low}" if high is None else f"{low} to {high}"
        raise fail(f"{name} merges {wanted} model(s) besides base_model; the config lists {models}{extra}")


def _without_base(
    source: Path,
    name: str,
    spec: MethodMap,
    inputs: list[Input],
    scopes: Scopes,
    settings: dict[str, Any],
    fail: Fail,
) -> ConfigMerge:
    """A method that merges the models themselves when there is no base_model (nuslerp,
    multislerp, karcher): ramstream's BASE is the first model, and ``no_base`` says it is a
    model like the others."""
    if len(inputs) < 2:
        raise fail(f"{name} without base_model needs at least two models")
    _count(name, spec, len(inputs), fail, " (here without base_model: all of them)")
    method, keys = _method_settings(name, spec, scopes, inputs, fail)
    settings.update(method)
    if name != "karcher":  # karcher treats the base as one more input anyway
        settings["no_base"] = True
    return ConfigMerge(source, inputs[0][0], tuple(path for path, _, _ in inputs[1:]), settings, keys)


def _linear(
    source: Path,
    base: Path | None,
    inputs: list[Input],
    scopes: Scopes,
    settings: dict[str, Any],
    fail: Fail,
) -> ConfigMerge:
    """mergekit's linear is a weighted mean of its inputs, base_model among them (appended when
    it is not listed, weighted by the top-level weight); every input needs a weight. ramstream's
    linear takes one of them as its base (``base_weight``, added first) and the rest as agents:
    base_model when there is one, otherwise the first model."""
    if base is not None and not any(same_path(path, base) for path, _, _ in inputs):
        if "weight" not in scopes.top:
            raise fail(
                "base_model is an input of linear (mergekit adds it to the models): give it a weight "
                "(list it under models, or set a top-level weight), or leave base_model out"
            )
        inputs = [*inputs, (base, {}, "base_model")]
    if len(inputs) < 2:
        raise fail("linear needs at least two models (base_model counts as one)")
    method, keys = _method_settings("linear", METHODS["linear"], scopes, inputs, fail)
    settings.update(method)
    weights = settings.pop("weights", None)
    if weights is None:
        raise fail("linear needs a weight for every model (as in mergekit): set weight in their parameters")
    at = 0 if base is None else next(i for i, (path, _, _) in enumerate(inputs) if same_path(path, base))
    settings["base_weight"] = weights[at]
    settings["weights"] = weights[:at] + weights[at + 1 :]
    where = keys["weights"]
    keys = {**keys, "base_weight": [where[at]], "weights": where[:at] + where[at + 1 :]}
    agents = tuple(path for i, (path, _, _) in enumerate(inputs) if i != at)
    return ConfigMerge(source, inputs[at][0], agents, settings, keys)


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
    name: str, spec: MethodMap, scopes: Scopes, inputs: list[Input], fail: Fail
) -> tuple[dict[str, Any], dict[str, list[str]]]:
    """The method's settings, and where each value is written (per option: one key for a shared
    setting, one per model for a per-model one), for messages about the values."""
    top = scopes.top
    per_model = [params for _, params, _ in inputs]
    known = {p.name: p for p in spec.params}
    default_only = DEFAULT_ONLY.get(name, {})
    given = [*((scopes.of(key), True, {key: value}) for key, value in top.items())]
    given += [(f"{where}.parameters", False, params) for _, params, where in inputs]
    for where, top_level, params in given:
        for key, value in params.items():
            _refuse_varying(known.get(key), key, value, where, fail)
            if key in default_only:
                param, reason = default_only[key]
                if value_of(param, value, where, fail) != param.default:
                    raise fail(f"{where}.{key}: {excerpt(value)} " + reason.format(method=name))
            elif key not in known:
                reads = ", ".join(known) or "none"
                raise fail(f"{where}.{key}: {name} has no parameter {excerpt(key)} (it reads {reads})")
            elif known[key].scope == "shared" and not top_level:
                raise fail(f"{where}.{key}: {key} is one value for the whole merge: set it in the top-level parameters")
    settings: dict[str, Any] = {}
    for param in spec.params:
        if param.varying:
            settings.update(_varying(param, scopes, inputs, name, fail))
        elif param.scope == "shared":
            if param.name in top:
                settings[param.option] = value_of(param, top[param.name], scopes.of(param.name), fail)
        elif param.name in top or any(param.name in p for p in per_model):
            settings[param.option] = [_model_value(param, scopes, entry, name, fail) for entry in inputs]
    keys: dict[str, list[str]] = {}
    for param in spec.params:
        if param.option in settings and param.scope == "shared":
            keys[param.option] = [f"{scopes.of(param.name)}.{param.name}"]
        elif param.option in settings:
            keys[param.option] = [f"{_where(param, scopes, p, where)}.{param.name}" for _, p, where in inputs]
    return settings, keys


def _where(param: Param, scopes: Scopes, params: dict[str, Any], model: str) -> str:
    """Where a model's value of a per-model parameter is written: its own parameters, else the top level."""
    return f"{model}.parameters" if param.name in params or param.name not in scopes.top else scopes.of(param.name)


def _varying(param: Param, scopes: Scopes, inputs: list[Input], name: str, fail: Fail) -> dict[str, Any]:
    """A parameter that may differ per tensor, as ``methods.tensor_settings`` reads it: the
    model's setting first, then the top-level one, then mergekit's default."""
    top = scopes.top
    if param.scope == "shared":
        if param.name not in top:
            return {}  # left to the method, whose default is mergekit's
        value = chain(param, [(scopes.of(param.name), top.get(param.name))], fail)
        return {} if value is None else {param.option: value}
    if param.name not in top and not any(param.name in p for _, p, _ in inputs):
        return {}
    values = []
    for _, p, where in inputs:
        own = (f"{where}.parameters", p.get(param.name))
        value = chain(param, [own, (scopes.of(param.name), top.get(param.name))], fail)
        if value is None:
            raise fail(f"{where}: {param.name} is missing; {name} needs one for every model when any has one")
        values.append(value)
    return {param.option: values}


def _model_value(param: Param, scopes: Scopes, entry: Input, name: str, fail: Fail) -> Any:
    _, params, model = entry
    value = params.get(param.name, scopes.top.get(param.name, param.default))
    if value is None:
        raise fail(f"{model}: {param.name} is missing; {name} needs one for every model when any has one")
    return value_of(param, value, _where(param, scopes, params, model), fail)


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
