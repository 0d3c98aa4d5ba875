"""mergekit YAML configurations: the subset ramstream runs, as the arguments of ``api.merge``.

A config names a method, a base, the models and their parameters, as mergekit 0.1.5 reads it:

    merge_method: ties
    base_model: ./base
    models:
      - model: ./agent1
        parameters: {weight: 1.0, density: 0.5}
      - model: ./agent2
        parameters: {weight: 0.5, density: 0.2}
    parameters: {lambda: 1.0}
    dtype: float32
    out_dtype: bfloat16

``load`` returns a ``ConfigMerge``: the base, the agents, and ``settings``, the flat mapping of
option names that the CLI also collects from its flags (``method``, ``weights``, ``density``,
``eps``, ``out_dtype`` ...), so that a config and flags meet in one place (``combine``) and
reach ``api.merge`` through one function (``api_arguments``).

mergekit's semantics are kept: a model's own ``parameters`` override the top-level ones, and a
model that gives no value for a per-model parameter that others give takes mergekit's default;
parameters nobody gives are left to the method, whose defaults are mergekit's (the parity tests
check that), except where the mergekit method implies other values (``ramplus_tl``: rho per
tensor, alpha 0.2). The base model may be listed in ``models``: for ``linear`` it is an input
like any other (mergekit adds ``base_model`` to linear's inputs when it is not listed; ramstream
passes its weight as ``base_weight``), for the other methods it is the base. Relative paths are
relative to the working directory, as in mergekit; a model that is no existing path and reads as
``org/name[@revision]`` is a Hugging Face hub id, resolved when the checkpoints are opened.
Gradients (lists of values over the layers) and filters (``{filter: self_attn, value: ...}``)
are read for the parameters ramstream varies per tensor (slerp's and nearswap's ``t``, the
spherical and GTA methods' ``weight``, the GTA methods' ``lambda``; see
``methods.tensor_settings``). nuslerp, multislerp and karcher run without a base_model as
mergekit does: the first model becomes ramstream's BASE, a model like the others (``no_base``).
A LoRA agent is its adapter directory, or mergekit's ``base_model+adapter`` (a LoRA on any other
model is refused). ``slices`` are read when they are what ``models`` says (one slice whose
sources span every layer: the form many slerp configs use). Everything else is refused by name,
in one line: other slices (outside passthrough), modules, gradients and filters of other parameters,
tokenizer merging, parameters the method does not read, and any ``dtype`` other than float32
(ramstream's arithmetic is float32, always; see docs/methods.md).

``merge_method: passthrough`` merges nothing: it stacks layer ranges of models (frankenmerges)
or copies one model, optionally scaled. ``load`` returns a ``ConfigStack`` for it (``parse_stack``),
which ``api.stack`` runs; its slices may be any number, one source each.
"""

from __future__ import annotations

import json
import math
import os
import stat
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Literal

from ramstream.errors import ConfigError

Kind = Literal["float", "bool"]
Scope = Literal["shared", "model"]
Fail = Callable[[str], ConfigError]


@dataclass(frozen=True)
class Param:
    """One mergekit parameter: its name in the YAML, the ramstream option it becomes, whether it
    is one value for the merge or one per model, and mergekit's default (None: required)."""

    name: str
    option: str
    scope: Scope
    kind: Kind
    default: float | bool | None = None
    varying: bool = False  # takes gradients and filters (a value per tensor)


@dataclass(frozen=True)
class MethodMap:
    """A mergekit method as ramstream runs it: ramstream's method, the parameters, the settings
    the mergekit method implies (``fixed``: always; ``implied``: unless the config gives them)."""

    method: str
    params: tuple[Param, ...]
    fixed: tuple[tuple[str, Any], ...] = ()
    implied: tuple[tuple[str, Any], ...] = ()
    base: Literal["required", "optional"] = "required"  # optional: without base_model, BASE is a model
    agents: tuple[int, int | None] = (1, None)  # how many models besides the base (min, max)


WEIGHT = Param("weight", "weights", "model", "float")  # linear: one value per model
LAMBDA = Param("lambda", "lambda", "shared", "float", 1.0, varying=True)
DENSITY = Param("density", "density", "model", "float", 1.0)
GAMMA = Param("gamma", "gamma", "model", "float", 0.01)
DELLA_EPSILON = Param("epsilon", "epsilon", "model", "float", 0.15)
NORMALIZE = Param("normalize", "normalize", "shared", "bool")
RESCALE = Param("rescale", "rescale", "shared", "bool")
RAM_EPSILON = Param("epsilon", "eps", "shared", "float", 1e-5)
INT8_MASK = Param("int8_mask", "int8_mask", "shared", "bool", False)
T = Param("t", "t", "shared", "float", varying=True)
VARYING_WEIGHT = Param("weight", "weights", "model", "float", varying=True)  # GTA and spherical methods

_GTA = (VARYING_WEIGHT, LAMBDA, NORMALIZE)
_SPARSE = (*_GTA, DENSITY, RESCALE)

# mergekit's methods that ramstream runs, with the parameters that change mergekit's result.
METHODS: dict[str, MethodMap] = {
    "linear": MethodMap("linear", (WEIGHT, NORMALIZE)),
    "task_arithmetic": MethodMap("task_arithmetic", _GTA),
    "ties": MethodMap("ties", _SPARSE),
    "dare_linear": MethodMap("dare_linear", _SPARSE),
    "dare_ties": MethodMap("dare_ties", _SPARSE),
    "breadcrumbs": MethodMap("breadcrumbs", (*_SPARSE, GAMMA)),
    "breadcrumbs_ties": MethodMap("breadcrumbs_ties", (*_SPARSE, GAMMA)),
    "della": MethodMap("della", (*_SPARSE, DELLA_EPSILON)),
    "della_linear": MethodMap("della_linear", (*_SPARSE, DELLA_EPSILON)),
    "model_stock": MethodMap("model_stock", ()),
    "ram": MethodMap("ram", (RAM_EPSILON,)),
    "ramplus_tl": MethodMap(
        "ram+",
        (Param("r", "r", "shared", "float"), Param("alpha", "alpha", "shared", "float"), RAM_EPSILON),
        fixed=(("rho_scope", "tensor"),),
        implied=(("alpha", 0.2),),
    ),
    "slerp": MethodMap("slerp", (T,), agents=(1, 1)),
    "nearswap": MethodMap("nearswap", (T,), agents=(1, 1)),
    "nuslerp": MethodMap(
        "nuslerp",
        (
            VARYING_WEIGHT,
            Param("nuslerp_row_wise", "nuslerp_row_wise", "shared", "bool", False),
            Param("nuslerp_flatten", "nuslerp_flatten", "shared", "bool", True),
        ),
        base="optional",
        agents=(2, 2),
    ),
    "multislerp": MethodMap(
        "multislerp",
        (VARYING_WEIGHT, Param("normalize_weights", "normalize_weights", "shared", "bool", True)),
        base="optional",
    ),
    "karcher": MethodMap(
        "karcher",
        (Param("max_iter", "max_iter", "shared", "float", 10), Param("tol", "tol", "shared", "float", 1e-5)),
        base="optional",
    ),
}

# Parameters mergekit declares that ramstream takes at mergekit's default only: ones that change
# nothing for that method (density and rescale without sparsification; int8_mask, a storage
# choice) and model_stock's filter_wise. Configs written for mergekit load; other values are refused.
_INERT = "has no effect with {method} (mergekit ignores it too)"
_DEFAULT_ONLY: dict[str, dict[str, tuple[Param, str]]] = {
    "task_arithmetic": {
        "density": (DENSITY, _INERT),
        "rescale": (Param("rescale", "rescale", "shared", "bool", False), _INERT),
        "int8_mask": (INT8_MASK, _INERT),
    },
    **{
        m: {"int8_mask": (INT8_MASK, _INERT)}
        for m in ("ties", "dare_linear", "dare_ties", "breadcrumbs", "breadcrumbs_ties", "della", "della_linear")
    },
    "multislerp": {"eps": (Param("eps", "eps", "shared", "float", 1e-8), "is not supported: only eps: 1e-8")},
    "model_stock": {
        "filter_wise": (
            Param("filter_wise", "filter_wise", "shared", "bool", False),
            "is not supported: only filter_wise: false (one interpolation ratio per tensor)",
        )
    },
}

_REFUSED_KEYS = {
    "modules": "modules are not supported: ramstream merges whole models listed under models:",
    "tokenizer": "tokenizer merging is not supported: the tokenizer files are copied from base_model",
    "chat_template": "chat_template is not supported: the tokenizer files are copied from base_model as they are",
}
_TOP_KEYS = (
    "merge_method",
    "base_model",
    "models",
    "slices",
    "parameters",
    "dtype",
    "out_dtype",
    "tokenizer_source",
)
_OUT_DTYPES = {"bfloat16": "bf16", "float16": "f16", "float32": "f32"}

# What the CLI calls each setting, for messages about clashes between a config and flags.
FLAGS = {
    "method": "--method",
    "r": "--r",
    "alpha": "--alpha",
    "rho_scope": "--rho-scope",
    "lambda_rule": "--lambda-rule",
    "eps": "--eps",
    "out_dtype": "--out-dtype",
    "weights": "--weights",
    "lambda": "--lambda",
    "density": "--density",
    "gamma": "--gamma",
    "epsilon": "--epsilon",
    "base_weight": "--base-weight",
    "seed": "--seed",
    "normalize": "--normalize/--no-normalize",
    "trim_scope": "--trim-scope",
    "rescale": "--rescale",
    "t": "--t",
    "no_base": "--no-base",
    "normalize_weights": "--normalize-weights",
    "nuslerp_row_wise": "--nuslerp-row-wise",
    "nuslerp_flatten": "--nuslerp-flatten",
    "max_iter": "--max-iter",
    "tol": "--tol",
    "index": "--index",
    "allow_nonfinite": "--allow-nonfinite",
}
_API_KEYS = ("method", "r", "alpha", "rho_scope", "lambda_rule", "eps", "out_dtype")


@dataclass(frozen=True)
class ConfigMerge:
    """A config, translated: the base, the agents (in mergekit's input order) and the settings."""

    source: Path
    base: Path
    agents: tuple[Path, ...]
    settings: Mapping[str, Any]


def load(path: str | Path) -> ConfigMerge | ConfigStack:
    """Read and translate a mergekit YAML file: a merge, or a passthrough's stack of layers
    (``parse_stack``); ``ConfigError`` names what cannot be run."""
    import yaml

    path = Path(path)
    text = read_text(path)
    try:
        doc = yaml.safe_load(text)
    except yaml.YAMLError as exc:
        raise ConfigError(f"{path}: not valid YAML ({' '.join(str(exc).split())})") from None
    if isinstance(doc, Mapping) and doc.get("merge_method") == PASSTHROUGH:
        return parse_stack(doc, path)
    return parse(doc, path)


def read_text(path: Path) -> str:
    """A config file's text; unreadable, not UTF-8 or not a regular file is one line."""
    try:
        return _read_regular(path).decode("utf-8")
    except OSError as exc:
        raise ConfigError(f"{path}: cannot read the config ({exc.strerror or exc})") from None
    except UnicodeDecodeError as exc:
        raise ConfigError(f"{path}: not UTF-8 text (byte {exc.start}); save the config as UTF-8") from None


def _read_regular(path: Path) -> bytes:
    """The file's bytes; a FIFO or device is refused at once (a FIFO would block ``open``)."""
    fd = os.open(path, os.O_RDONLY | os.O_NONBLOCK | os.O_CLOEXEC)
    with os.fdopen(fd, "rb") as f:
        if not stat.S_ISREG(os.fstat(fd).st_mode):
            raise ConfigError(f"{path}: not a regular file; give the path of a YAML config")
        return f.read()


def _name(doc: Mapping[str, Any], key: str, fail: Fail) -> str | None:
    """A value that names something (a method, a dtype): a string, or absent."""
    value = doc.get(key)
    if value is not None and not isinstance(value, str):
        raise fail(f"{key}: expected a name, got a {type(value).__name__} ({value!r})")
    return value


def parse(doc: Any, source: Path) -> ConfigMerge:
    """Translate a config already read from YAML (``source`` names it in messages)."""

    def fail(message: str) -> ConfigError:
        return ConfigError(f"{source}: {message}")

    _check_keys(doc, fail)
    name = _name(doc, "merge_method", fail)
    if name == PASSTHROUGH:
        raise fail("passthrough stacks layers and merges nothing: `ramstream merge --config` runs it, a sweep cannot")
    if name not in METHODS:
        raise fail(f"merge_method {name!r} is not supported; ramstream runs {', '.join(METHODS)}, {PASSTHROUGH}")
    spec = METHODS[name]
    settings: dict[str, Any] = {"method": spec.method, **dict(spec.implied), **_dtypes(doc, fail)}
    _tokenizer(doc, fail)
    base = None if doc.get("base_model") is None else _model_path(doc["base_model"], "base_model", fail)
    top = _parameters(doc.get("parameters"), "parameters", fail)
    entries = doc.get("models")
    if "slices" in doc:
        if entries is not None:
            raise fail("slices and models are both given: mergekit reads one or the other")
        entries, slice_params = _one_full_slice(doc["slices"], fail)
        top = {**top, **slice_params}
    inputs = _inputs(entries, base, fail)
    if name == "linear":
        return _linear(source, base, inputs, top, settings, fail)
    if base is None and spec.base == "optional":
        return _without_base(source, name, spec, inputs, top, settings, fail)
    if base is None:
        raise fail(f"base_model is required: {name} merges task vectors against a base")
    else:
        for i, (path, params) in enumerate(inputs):
            if _same(path, base) and params:
                raise fail(f"models[{i}] is the base model: its parameters ({', '.join(params)}) have no effect")
        inputs = [(path, params) for path, params in inputs if not _same(path, base)]
        if not inputs:
            raise fail("models lists no model other than base_model: nothing to merge")
    _count(name, spec, len(inputs), fail)
    agents = tuple(path for path, _ in inputs)
    settings.update(_method_settings(name, spec, top, [params for _, params in inputs], fail))
    settings.update(dict(spec.fixed))
    return ConfigMerge(source, base, agents, settings)


def _check_keys(doc: Any, fail: Fail) -> None:
    """A mapping of the top-level keys ramstream reads; the others are refused by name."""
    if not isinstance(doc, Mapping):
        raise fail("a mergekit config is a mapping with merge_method, base_model and models")
    for key in doc:
        if key in _REFUSED_KEYS:
            raise fail(_REFUSED_KEYS[key])
        if key not in _TOP_KEYS:
            raise fail(f"unknown key {key!r} (ramstream reads {', '.join(_TOP_KEYS)})")


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
    if base is not None and not any(_same(path, base) for path, _ in inputs):
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
    at = 0 if base is None else next(i for i, (path, _) in enumerate(inputs) if _same(path, base))
    settings["base_weight"] = weights[at]
    settings["weights"] = weights[:at] + weights[at + 1 :]
    agents = tuple(path for i, (path, _) in enumerate(inputs) if i != at)
    return ConfigMerge(source, inputs[at][0], agents, settings)


def _same(a: Path, b: Path) -> bool:
    return a == b or a.resolve() == b.resolve()


def _inputs(entries: Any, base: Path | None, fail: Fail) -> list[tuple[Path, dict[str, Any]]]:
    if not isinstance(entries, list) or not entries:
        raise fail("models must be a list of {model: PATH, parameters: {...}} entries")
    out = []
    for i, entry in enumerate(entries):
        where = f"models[{i}]"
        if not isinstance(entry, Mapping) or "model" not in entry:
            raise fail(f"{where} must be a mapping with model: PATH")
        extra = sorted(set(entry) - {"model", "parameters"})
        if extra:
            raise fail(f"{where}: {extra[0]!r} is not supported (a model entry holds model and parameters)")
        model = entry["model"]
        path = _adapter_path(model, base, where, fail) if _is_lora_reference(model) else _model_path(model, where, fail)
        out.append((path, _parameters(entry.get("parameters"), where, fail)))
    return out


def _one_full_slice(slices: Any, fail: Fail) -> tuple[list[Any], dict[str, Any]]:
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
        raise fail(f"slices[0]: {extra[0]!r} is not supported (a slice holds sources and parameters)")
    sources = slices[0].get("sources")
    if not isinstance(sources, list) or not sources:
        raise fail("slices[0].sources must be a list of {model: PATH, layer_range: [0, LAYERS]} entries")
    entries = []
    for i, source in enumerate(sources):
        where = f"slices[0].sources[{i}]"
        if not isinstance(source, Mapping) or "model" not in source:
            raise fail(f"{where} must be a mapping with model: PATH")
        extra = sorted(set(source) - {"model", "layer_range", "parameters"})
        if extra:
            raise fail(f"{where}: {extra[0]!r} is not supported (a source holds model, layer_range and parameters)")
        _check_full_range(source.get("layer_range"), source["model"], where, fail)
        entries.append({key: value for key, value in source.items() if key != "layer_range"})
    return entries, _parameters(slices[0].get("parameters"), "slices[0]", fail)


def _check_full_range(layer_range: Any, model: Any, where: str, fail: Fail) -> None:
    """``layer_range`` must be [0, the model's num_hidden_layers], read from its config.json."""
    _two_integers(layer_range, where, fail)
    directory = Path(str(model).split("+", 1)[0] if _is_lora_reference(model) else str(model)).expanduser()
    layers = _num_layers(directory, where, "a slice must span every layer; list the models under models: instead", fail)
    if layer_range != [0, layers]:
        raise fail(
            f"{where}: layer_range {layer_range} is not all of {model}'s {layers} layers: slices of part of "
            f"the layers (frankenmerges) are read for merge_method: passthrough only; use [0, {layers}]"
        )


def _two_integers(layer_range: Any, where: str, fail: Fail) -> tuple[int, int]:
    if (
        not isinstance(layer_range, list)
        or len(layer_range) != 2
        or not all(isinstance(x, int) and not isinstance(x, bool) for x in layer_range)
    ):
        raise fail(f"{where}: layer_range must be [first, end], two integers")
    return layer_range[0], layer_range[1]


def _num_layers(directory: Path, where: str, hint: str, fail: Fail) -> int:
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


def _is_lora_reference(value: Any) -> bool:
    """mergekit's ``model+lora``: a string with a '+' that is not itself an existing path."""
    return isinstance(value, str) and "+" in value and not Path(value).expanduser().exists()


def _adapter_path(value: str, base: Path | None, where: str, fail: Fail) -> Path:
    """``base+adapter``: the adapter directory, merged as an agent of base_model (its task vector is
    the adapter's update). A LoRA on another model would make that model's own update part of the
    agent, which ramstream does not read: refused, as is an adapter that is not a local directory."""
    model, adapter = (part.strip() for part in value.split("+", 1))
    if base is None:
        raise fail(
            f"{where}: {value!r} applies a LoRA to {model!r}: set base_model: {model} "
            "(an adapter merges as an agent of base_model)"
        )
    if not _same(Path(model).expanduser(), base):
        raise fail(
            f"{where}: {value!r} applies a LoRA to {model!r}, which is not base_model ({base}): ramstream merges an "
            "adapter as an agent of base_model only (merge it into its model first)"
        )
    path = Path(adapter).expanduser()
    if not (path / "adapter_config.json").is_file():
        raise fail(f"{where}: {adapter!r} is not a local PEFT adapter directory (no adapter_config.json in it)")
    return path


def _dtypes(doc: Mapping[str, Any], fail: Fail) -> dict[str, Any]:
    dtype = _dtype_name(_name(doc, "dtype", fail), "dtype", fail)
    if dtype not in (None, "float32"):
        raise fail(
            f"dtype: {dtype} is not supported: ramstream's arithmetic is float32 whatever the inputs "
            "(write dtype: float32, and out_dtype: for the output's dtype)"
        )
    out = _dtype_name(_name(doc, "out_dtype", fail), "out_dtype", fail)
    if out is not None:
        return {"out_dtype": _OUT_DTYPES[out]}
    if dtype is not None:
        return {"out_dtype": "f32"}  # mergekit writes the arithmetic dtype when out_dtype is absent
    return {}


def _dtype_name(value: Any, key: str, fail: Fail) -> str | None:
    if value is None:
        return None
    name = value[len("torch.") :] if isinstance(value, str) and value.startswith("torch.") else value
    if name not in _OUT_DTYPES:
        raise fail(f"{key}: {value!r} is not supported (bfloat16, float16 or float32)")
    return str(name)


def _tokenizer(doc: Mapping[str, Any], fail: Fail) -> None:
    source = _name(doc, "tokenizer_source", fail)
    if source not in (None, "base"):
        raise fail(
            f"tokenizer_source: {source!r} is not supported: ramstream copies the tokenizer files "
            "from base_model (tokenizer_source: base)"
        )


def _model_path(value: Any, where: str, fail: Fail) -> Path:
    if not isinstance(value, str) or not value:
        raise fail(f"{where}: model must be a path (override_architecture is not supported)")
    if _is_lora_reference(value):
        raise fail(f"{where}: {value!r} names a LoRA (model+lora): the base cannot be one (merge it in first)")
    return Path(value).expanduser()  # a hub id (org/name@rev) stays as written: it is resolved on opening


def _parameters(value: Any, where: str, fail: Fail) -> dict[str, Any]:
    if value is None:
        return {}
    if not isinstance(value, Mapping):
        raise fail(f"{where}.parameters must be a mapping of parameter names to values")
    return {str(key): setting for key, setting in value.items()}


def _refuse_varying(param: Param | None, key: str, value: Any, where: str, fail: Fail) -> None:
    """Gradients and filters where ramstream cannot vary the parameter per tensor yet."""
    if (param is not None and param.varying) or not isinstance(value, (list, Mapping)):
        return
    kind = "gradients" if isinstance(value, list) and not any(isinstance(s, Mapping) for s in value) else "filters"
    raise fail(
        f"{where}.{key}: per-tensor {kind} are not supported for {key} yet (they are for slerp's and nearswap's t "
        "and the spherical methods' weight); give one value"
    )


def _method_settings(
    name: str, spec: MethodMap, top: dict[str, Any], per_model: list[dict[str, Any]], fail: Fail
) -> dict[str, Any]:
    known = {p.name: p for p in spec.params}
    default_only = _DEFAULT_ONLY.get(name, {})
    scopes = [("parameters", top), *((f"models[{i}]", p) for i, p in enumerate(per_model))]
    for where, params in scopes:
        for key, value in params.items():
            _refuse_varying(known.get(key), key, value, where, fail)
            if key in default_only:
                param, reason = default_only[key]
                if _value(param, value, where, fail) != param.default:
                    raise fail(f"{where}.{key}: {value!r} " + reason.format(method=name))
            elif key not in known:
                reads = ", ".join(known) or "none"
                raise fail(f"{where}.{key}: {name} has no parameter {key!r} (it reads {reads})")
            elif known[key].scope == "shared" and where != "parameters":
                raise fail(f"{where}.{key}: {key} is one value for the whole merge: set it in the top-level parameters")
    settings: dict[str, Any] = {}
    for param in spec.params:
        if param.varying:
            settings.update(_varying(param, top, per_model, name, fail))
        elif param.scope == "shared":
            if param.name in top:
                settings[param.option] = _value(param, top[param.name], "parameters", fail)
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
        value = _chain(param, [top.get(param.name)], "parameters", fail)
        return {} if value is None else {param.option: value}
    if param.name not in top and not any(param.name in p for p in per_model):
        return {}
    values = []
    for i, p in enumerate(per_model):
        value = _chain(param, [p.get(param.name), top.get(param.name)], f"models[{i}]", fail)
        if value is None:
            raise fail(f"models[{i}]: {param.name} is missing; {name} needs one for every model when any has one")
        values.append(value)
    return {param.option: values}


def _chain(param: Param, scopes: list[Any], where: str, fail: Fail) -> Any:
    """The scopes' settings as one list of conditions, tried in order (the method's parser,
    ``methods.tensor_settings``, reads it); a plain value when that is all there is."""
    conditions: list[Any] = []
    for value in scopes:
        if value is None:
            continue
        if isinstance(value, Mapping):
            conditions.append(value)
        elif isinstance(value, list) and value and all(isinstance(v, Mapping) for v in value):
            conditions += value
        elif isinstance(value, list) and any(isinstance(v, (list, Mapping)) for v in value):
            raise fail(f"{where}.{param.name}: a gradient is a list of numbers, got {value!r}")
        elif isinstance(value, list):
            conditions.append({"value": value})
        else:  # a number, which YAML may have read as text ("1e-5")
            conditions.append({"value": _value(param, value, f"{where}.{param.name}", fail)})
    default = _default(param)
    if default is not None:
        conditions.append({"value": default})
    if not conditions:
        return None
    first = conditions[0]
    if "filter" not in first and len(first) == 1 and "value" in first:
        return first["value"]  # it applies everywhere: the rest are never asked
    return conditions


def _default(param: Param) -> float | None:
    return None if param.default is None else float(param.default)


def _model_value(param: Param, top: dict[str, Any], params: dict[str, Any], i: int, name: str, fail: Fail) -> Any:
    where = f"models[{i}]" if param.name in params else "parameters"
    value = params.get(param.name, top.get(param.name, param.default))
    if value is None:
        raise fail(f"models[{i}]: {param.name} is missing; {name} needs one for every model when any has one")
    return _value(param, value, where, fail)


def _value(param: Param, value: Any, where: str, fail: Fail) -> float | bool:
    """A scalar as mergekit's validation reads it (YAML strings like ``1e-5`` are numbers)."""
    if param.kind == "bool":
        if isinstance(value, bool):
            return value
        if isinstance(value, str) and value.lower() in ("true", "false"):
            return value.lower() == "true"
        raise fail(f"{where}.{param.name} must be true or false, got {value!r}")
    try:
        if isinstance(value, bool):
            raise ValueError
        number = float(value)
    except (TypeError, ValueError):
        raise fail(f"{where}.{param.name} must be a number, got {value!r}") from None
    if not math.isfinite(number):
        raise fail(f"{where}.{param.name} must be a finite number, got {value!r}")
    return number


# -- passthrough: layers stacked, not merged (frankenmerges) -----------------------------------

PASSTHROUGH = "passthrough"
SCALE = Param("scale", "scale", "model", "float", varying=True)  # no default: unscaled


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

    _check_keys(doc, fail)
    _tokenizer(doc, fail)
    base = None if doc.get("base_model") is None else _model_path(doc["base_model"], "base_model", fail)
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
            raise fail(f"{where}: {extra[0]!r} is not supported (a slice holds sources and parameters)")
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
    if not isinstance(source, Mapping) or "model" not in source:
        raise fail(f"{where} must be a mapping with model: PATH and layer_range: [start, end]")
    extra = sorted(set(source) - {"model", "layer_range", "parameters"})
    if extra:
        raise fail(f"{where}: {extra[0]!r} is not supported (a source holds model, layer_range and parameters)")
    model = _stack_model(source["model"], where, fail)
    start, end = _two_integers(source.get("layer_range"), where, fail)
    if not 0 <= start < end:
        raise fail(f"{where}: layer_range [{start}, {end}] holds no layer; give [start, end] with 0 <= start < end")
    if model.is_dir():  # a hub id is checked once resolved (a weights file, against its layers)
        layers = _num_layers(model, where, "passthrough takes layers that the model has", fail)
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
    if not isinstance(entry, Mapping) or "model" not in entry:
        raise fail("models[0] must be a mapping with model: PATH")
    extra = sorted(set(entry) - {"model", "parameters"})
    if extra:
        raise fail(f"models[0]: {extra[0]!r} is not supported (a model entry holds model and parameters)")
    model = _stack_model(entry["model"], "models[0]", fail)
    if base is not None and not _same(model, base):
        raise fail(
            f"base_model {base} is not models[0] ({model}): mergekit adds base_model to the models, which gives "
            "passthrough two inputs; leave base_model out or make it that model"
        )
    own = _scale_parameters(entry.get("parameters"), "models[0]", fail)
    return StackSlice(model, 0, None, _scale_chain([own, top], "models[0]", fail))


def _stack_model(value: Any, where: str, fail: Fail) -> Path:
    if _is_lora_reference(value):
        raise fail(f"{where}: {value!r} names a LoRA (model+lora): passthrough copies weights; merge it in first")
    return _model_path(value, where, fail)


def _scale_parameters(value: Any, where: str, fail: Fail) -> dict[str, Any]:
    params = _parameters(value, where, fail)
    for key in params:
        if key != SCALE.name:
            raise fail(f"{where}.{key}: passthrough has no parameter {key!r} (it reads scale)")
    return {key: _scale_setting(setting, f"{where}.scale", fail) for key, setting in params.items()}


def _scale_setting(value: Any, where: str, fail: Fail) -> Any:
    """A number, a gradient (numbers), a condition ``{filter, value}`` or a list of conditions,
    its numbers as floats (YAML reads ``1e-5`` as text; mergekit validates it as a number)."""
    if isinstance(value, Mapping):
        extra = sorted(map(str, set(value) - {"filter", "value"}))
        if extra or "value" not in value or not isinstance(value.get("filter"), (str, type(None))):
            raise fail(f"{where}: a condition is {{filter: TEXT, value: V}}, got {dict(value)!r}")
        inner = value["value"]
        if isinstance(inner, Mapping) or (isinstance(inner, list) and any(isinstance(v, Mapping) for v in inner)):
            raise fail(f"{where}: a condition's value is a number or a gradient, got {inner!r}")
        return {**value, "value": _scale_setting(inner, where, fail)}
    if isinstance(value, list):
        if not value:
            raise fail(f"{where}: an empty list gives no value")
        conditions = [isinstance(v, Mapping) for v in value]
        if any(isinstance(v, list) for v in value) or (any(conditions) and not all(conditions)):
            raise fail(f"{where}: a gradient is a list of numbers, got {value!r}")
        return [_scale_setting(v, where, fail) for v in value]
    return _value(SCALE, value, where.removesuffix(".scale"), fail)


def _scale_chain(scopes: list[dict[str, Any]], where: str, fail: Fail) -> Any:
    return _chain(SCALE, [params.get(SCALE.name) for params in scopes], where, fail)


def _stack_dtypes(doc: Mapping[str, Any], fail: Fail) -> dict[str, Any]:
    """mergekit's ``dtype`` (the dtype it reads the tensors in, and scales them in) and
    ``out_dtype``, any of bfloat16, float16, float32: a copy has no arithmetic to keep in float32."""
    settings = {}
    for key in ("dtype", "out_dtype"):
        name = _dtype_name(_name(doc, key, fail), key, fail)
        if name is not None:
            settings[key] = _OUT_DTYPES[name]
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
            f"--out-dtype is set by {config.source} too ({config.settings['out_dtype']!r}); set it in one place"
        )
    return {"slices": config.slices, "base": config.base, **config.settings, **flags}


def combine(config: ConfigMerge, flags: Mapping[str, Any]) -> dict[str, Any]:
    """The config's settings plus the flags given with it; a flag the config also sets is refused."""
    both = [k for k in flags if k in config.settings]
    if both:
        flag = FLAGS.get(both[0], both[0])
        raise ConfigError(f"{flag} is set by {config.source} too ({config.settings[both[0]]!r}); set it in one place")
    return {**config.settings, **flags}


def api_arguments(settings: Mapping[str, Any]) -> dict[str, Any]:
    """Keyword arguments of ``api.merge`` from flat settings (method options go in method_options)."""
    out: dict[str, Any] = {k: settings[k] for k in _API_KEYS if k in settings}
    options = {k: v for k, v in settings.items() if k not in _API_KEYS}
    if options:
        out["method_options"] = options
    return out
