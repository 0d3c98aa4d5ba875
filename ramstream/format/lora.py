"""PEFT LoRA adapters as agents: an adapter directory read against the base it updates.

Users' RL agents are often LoRA adapters (``adapter_config.json`` beside
``adapter_model.safetensors`` or ``adapter_model.bin``). Such an agent's task vector is known
from its factors, without its weights: for a targeted tensor W (out x in), with B = lora_B
(out x r) and A = lora_A (r x in),

    delta = scale * (B @ A),   scale = lora_alpha / r   (lora_alpha / sqrt(r) with use_rslora),

r and lora_alpha per module from ``rank_pattern`` / ``alpha_pattern`` (matched as PEFT matches
them: the first pattern ``p`` with ``re.match(rf"(.*\\.)?({p})$", module)``). For a ``Conv1D``
target (GPT-2 and its kin store W as in x out: ``CONV1D_MODULES``) and for embeddings
(``lora_embedding_A`` (r x vocab) / ``lora_embedding_B`` (dim x r)), delta = scale * (B @ A)^T,
as PEFT's ``get_delta_weight``. ``fan_in_fan_out`` is what PEFT makes of it: PEFT sets it from
the target's type whatever the config says (False on an ``nn.Linear``, True on a ``Conv1D``,
with a warning), so ramstream follows the base's ``model_type``; only a base without one is read
as the config says.

Which modules an adapter updates is its config's, as PEFT's ``check_target_module_exists``
decides: ``target_modules`` (names matched at the end of a module's name, or one regular
expression matched whole), ``exclude_modules``, ``layers_to_transform`` with ``layers_pattern``,
and ``modules_to_save`` (saved whole, never adapted). Factors of a module the config does not
target, and a config that targets no module of the base (PEFT refuses to load it), are refused
by name. An adapter saved with ``init_lora_weights`` pissa, olora, corda or loftq and not
converted is refused by name: its factors are relative to a residual base PEFT rebuilds on load.

Tensors the adapter saves whole (``modules_to_save``, trained biases) are ordinary agent tensors
(task vector: saved minus base); every other tensor of the base is left alone: its task vector is 0.

The arithmetic's order is part of the definition, so that every backend, block size and resume
point gives the same bytes: delta[i, j] = float32(sum_k B[i, k] * A[k, j]) * float32(scale), each
product rounded to float32, summed over k in index order in float32 from +0.0, then multiplied
by the scale (computed in float64 from alpha and r, rounded to float32 once). ``blocks.lora``
computes it block by block from the factors; no whole delta is ever made.

Why the agent is its task vector, not base + delta: the kernels would then compute
f32(base + delta) - f32(base), which is not delta once rounded. Its tensors reach the kernels as
float32 task vectors (input code ``format.dtypes.TAU32``); operations on weights (``linear``) see
f32(base) + delta, rounded in float32.

Adapter keys are PEFT's: ``base_model.model.<module>.lora_A.weight`` (and ``lora_B``,
``lora_embedding_A``/``_B``), ``base_model.model.<name>`` for a tensor saved whole; ``<module>``
maps to the base's ``<module>.weight``, with or without a leading ``model.`` (checkpoints of the
bare model and of its task head name it differently). ``<module>.base_layer.weight`` is the
frozen layer PEFT saves beside embedding factors: it must have the base's shape and is not used.

Refused, one line each (``AdapterError`` unless said): a directory holding adapter weights but
no ``adapter_config.json``, a ``peft_type`` other than LORA, DoRA and
the other options whose update is not B @ A, a key that matches no base tensor, factors whose
shapes do not fit their target or disagree with the configured rank, a factor without its
partner, factor dtypes that cannot be decoded (``UnsupportedDtypeError``), and an adapter whose
``base_model_name_or_path`` names another hub model than the base given.
"""

from __future__ import annotations

import json
import math
import os
import re
from collections.abc import Iterable
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Any

import numpy as np

from ramstream.errors import AdapterError, CorruptFileError, UnsupportedDtypeError, excerpt
from ramstream.format.checkpoint import Checkpoint, DeltaRef, TensorRef, read_weights_file
from ramstream.format.dtypes import FLOAT_CODES, is_float
from ramstream.format.hub import is_repo_id
from ramstream.format.names import ADAPTER_CONFIG, ADAPTER_WEIGHTS, CONFIG_FILE
from ramstream.format.regular import open_regular

PEFT_PREFIX = "base_model.model."

# Options whose update is not scale * B @ A on the base's own tensors: refused by name.
NOT_LOW_RANK = {
    "use_dora": "DoRA (use_dora) rescales each column by a learned magnitude",
    "lora_bias": "lora_bias trains a bias beside B @ A",
    "use_qalora": "QA-LoRA (use_qalora) applies A to pooled inputs",
    "use_bdlora": "BD-LoRA (use_bdlora) uses block-diagonal factors",
    "alora_invocation_tokens": "aLoRA applies its update only after its invocation tokens",
    "arrow_config": "Arrow routes between several LoRA experts",
    "layer_replication": "layer_replication adds layers the base does not have",
    "target_parameters": "target_parameters puts LoRA on raw parameters",
    "trainable_token_indices": "trainable_token_indices trains token embeddings apart",
}

# (suffix of a key, factor, transposed: None = as fan_in_fan_out says)
_FACTOR_KEYS = (
    (".lora_A.weight", "A", None),
    (".lora_B.weight", "B", None),
    (".lora_embedding_A", "A", True),
    (".lora_embedding_B", "B", True),
)
_FROZEN_LAYER = ".base_layer.weight"
_REFUSED_KEYS = (".lora_B.bias", ".lora_magnitude_vector")

# The modules that are transformers' ``Conv1D`` (W stored in x out), by the base's model_type;
# every other LoRA target of these models, and of every other model, is an ``nn.Linear``.
_GPT2_CONV1D = frozenset({"c_attn", "q_attn", "c_proj", "c_fc"})
CONV1D_MODULES: dict[str, frozenset[str]] = {
    "gpt2": _GPT2_CONV1D,
    "imagegpt": _GPT2_CONV1D,
    "decision_transformer": _GPT2_CONV1D,
    "openai-gpt": frozenset({"c_attn", "c_proj", "c_fc"}),
    "clvp": frozenset({"c_fc", "c_proj"}),
}

# init_lora_weights that change the base at initialisation: the saved factors are relative to a
# residual base PEFT rebuilds when it loads them (a PEFT conversion turns them into plain LoRA).
_RESIDUAL_INITS = {
    "pissa": "PiSSA",
    "olora": "OLoRA",
    "corda": "CorDA",
    "loftq": "LoftQ",
}


def is_adapter(path: str | Path) -> bool:
    """True when ``path`` is a local directory holding a PEFT ``adapter_config.json``."""
    directory = Path(path)
    return directory.is_dir() and (directory / ADAPTER_CONFIG).is_file()


@dataclass(frozen=True)
class AdapterConfig:
    """What ramstream reads from ``adapter_config.json``."""

    path: Path
    r: int
    alpha: float
    rslora: bool
    fan_in_fan_out: bool
    rank_pattern: dict[str, int]
    alpha_pattern: dict[str, float]
    base_model: str | None
    target_modules: str | tuple[str, ...] | None = None
    exclude_modules: str | tuple[str, ...] | None = None
    layers_to_transform: tuple[int, ...] | None = None
    layers_pattern: tuple[str, ...] = ()
    modules_to_save: tuple[str, ...] = ()

    def targets(self, key: str) -> bool:
        """Whether PEFT adapts the module ``key`` (its name in the model, as adapter keys write
        it): PEFT's ``check_target_module_exists``."""
        if isinstance(self.exclude_modules, str):
            if re.fullmatch(self.exclude_modules, key):
                return False
        elif self.exclude_modules and (
            key in self.exclude_modules or any(key.endswith(f".{e}") for e in self.exclude_modules)
        ):
            return False
        if any(re.match(rf"(^|.*\.){m}($|\..*)", key) for m in self.modules_to_save):
            return False
        if self.target_modules is None or self.target_modules == ALL_LINEAR:
            return True  # not recorded; all-linear: every linear layer but the output's (PEFT expands it)
        if isinstance(self.target_modules, str):
            return re.fullmatch(self.target_modules, key) is not None
        if key in self.target_modules:
            return True
        if not any(key.endswith(f".{t}") for t in self.target_modules):
            return False
        return self.layers_to_transform is None or self._layer_of(key) in self.layers_to_transform

    def _layer_of(self, key: str) -> int | None:
        """The first numbered segment of ``key`` after ``layers_pattern`` (any segment without one)."""
        patterns = self.layers_pattern or (None,)
        for pattern in patterns:
            found = (
                re.match(r".*?\.[^.]*\.(?P<idx>\d+)\.", key)
                if pattern is None
                else re.match(rf"(?:^|.*?\.){pattern}\.(?P<idx>\d+)\.", key)
            )
            if found is not None:
                return int(found["idx"])
        return None

    def described(self) -> str:
        """The fields that choose the targets, as the config gives them (for messages)."""
        fields = {
            "target_modules": self.target_modules,
            "exclude_modules": self.exclude_modules,
            "layers_to_transform": self.layers_to_transform,
            "layers_pattern": self.layers_pattern or None,
        }
        return ", ".join(f"{k} {excerpt(list(v) if isinstance(v, tuple) else v, 60)}" for k, v in fields.items() if v)

    def rank_and_scale(self, module: str) -> tuple[int, float]:
        """Module ``module``'s rank and its scale (a float32 value), as PEFT picks them."""
        r = int(self.rank_pattern.get(_pattern_key(self.rank_pattern, module), self.r))
        alpha = float(self.alpha_pattern.get(_pattern_key(self.alpha_pattern, module), self.alpha))
        scale = alpha / math.sqrt(r) if self.rslora else alpha / r
        return r, float(np.float32(scale))


def _pattern_key(patterns: dict[str, Any], module: str) -> str:
    """PEFT's ``get_pattern_key``: the first pattern that matches the end of ``module``'s name."""
    for key in patterns:
        if re.match(rf"(.*\.)?({key})$", module):
            return key
    return module


def read_config(path: Path) -> AdapterConfig:
    """Parse ``adapter_config.json``; refuse what is not a plain LoRA adapter."""
    try:
        fd = open_regular(path)
        with os.fdopen(fd, "rb") as f:
            raw = json.loads(f.read())
    except (OSError, ValueError) as exc:
        raise AdapterError(f"{path}: not a readable adapter config ({exc})") from exc
    if not isinstance(raw, dict):
        raise AdapterError(f"{path}: not a readable adapter config (not a JSON object)")
    peft_type = raw.get("peft_type")
    if peft_type != "LORA":
        raise AdapterError(
            f"{path}: peft_type is {peft_type!r}; ramstream merges LoRA adapters only: merge this adapter into its "
            "base first (peft's merge_and_unload) and give that model as the agent"
        )
    for option, why in NOT_LOW_RANK.items():
        if raw.get(option):
            raise AdapterError(
                f"{path}: {why}, so its update is not scale * B @ A; ramstream cannot merge it as a LoRA agent: "
                "merge it into its base first (peft's merge_and_unload) and give that model as the agent"
            )
    try:
        r, alpha = int(raw["r"]), float(raw["lora_alpha"])
        rank_pattern = {str(k): int(v) for k, v in (raw.get("rank_pattern") or {}).items()}
        alpha_pattern = {str(k): float(v) for k, v in (raw.get("alpha_pattern") or {}).items()}
        for pattern in (*rank_pattern, *alpha_pattern):
            re.compile(pattern)
    except (KeyError, TypeError, ValueError, AttributeError, re.error) as exc:
        raise AdapterError(
            f"{path}: r, lora_alpha, rank_pattern or alpha_pattern is missing or invalid ({exc})"
        ) from exc
    if r <= 0 or any(v <= 0 for v in rank_pattern.values()):
        raise AdapterError(f"{path}: a rank (r or rank_pattern) that is not positive")
    _refuse_residual_init(path, raw.get("init_lora_weights"))
    base_model = raw.get("base_model_name_or_path")
    try:
        targets = _names_or_pattern(raw.get("target_modules"))
        excluded = _names_or_pattern(raw.get("exclude_modules"))
        layers = _layers(raw.get("layers_to_transform"))
        layer_names = _as_names(_names_or_pattern(raw.get("layers_pattern")))
        saved = _as_names(_names_or_pattern(raw.get("modules_to_save")))
        for regex in (targets, excluded, *layer_names, *saved):  # used as regular expressions
            if isinstance(regex, str):
                re.compile(regex)
    except (TypeError, ValueError, re.error) as exc:
        raise AdapterError(
            f"{path}: target_modules, exclude_modules, layers_to_transform, layers_pattern or modules_to_save is "
            f"invalid ({excerpt(str(exc), 80)})"
        ) from None
    return AdapterConfig(
        path,
        r,
        alpha,
        bool(raw.get("use_rslora")),
        bool(raw.get("fan_in_fan_out")),
        rank_pattern,
        alpha_pattern,
        base_model if isinstance(base_model, str) and base_model else None,
        targets,
        excluded,
        layers,
        layer_names,
        saved,
    )


ALL_LINEAR = "all-linear"


def _names_or_pattern(value: object) -> str | tuple[str, ...] | None:
    """A config field PEFT reads as a list of names or one regular expression (None: not given)."""
    if value is None:
        return None
    if isinstance(value, str):
        return value
    if isinstance(value, list) and all(isinstance(v, str) for v in value):
        return tuple(value)
    raise TypeError(f"{excerpt(value, 40)} is neither a name list nor a pattern")


def _as_names(value: str | tuple[str, ...] | None) -> tuple[str, ...]:
    return (value,) if isinstance(value, str) else (value or ())


def _layers(value: object) -> tuple[int, ...] | None:
    """``layers_to_transform``: an index or a list of them (None, or an empty list: every layer)."""
    if value is None or value == []:
        return None
    if isinstance(value, int) and not isinstance(value, bool):
        return (value,)
    if isinstance(value, list) and all(isinstance(v, int) and not isinstance(v, bool) for v in value):
        return tuple(value)
    raise TypeError(f"layers_to_transform {excerpt(value, 40)} is not a layer index or a list of them")


def _refuse_residual_init(path: Path, init: object) -> None:
    """PiSSA, OLoRA, CorDA and LoftQ adapters that were not converted to plain LoRA."""
    name = init.lower() if isinstance(init, str) else ""
    kind = next((label for key, label in _RESIDUAL_INITS.items() if name.startswith(key)), None)
    if kind is not None:
        raise AdapterError(
            f"{path}: init_lora_weights is {excerpt(init)}: a {kind} adapter's factors are relative to a residual "
            "base that PEFT rebuilds when it loads them, not to this base; convert it to a plain LoRA adapter with "
            "PEFT (save_pretrained(..., path_initial_model_for_weight_conversion=THE_ADAPTER_AS_INITIALISED)), or "
            "merge it with PEFT's merge_and_unload and give that model as the agent"
        )


def open_adapter(path: str | Path, base: Checkpoint, base_given: str) -> Checkpoint:
    """The adapter at ``path`` as an agent of ``base`` (given on the command line as
    ``base_given``): its saved tensors under the base's names, every other tensor of the base as
    a ``DeltaRef`` (its factors, or zero). The data stays on disk."""
    directory = Path(path)
    config = read_config(directory / ADAPTER_CONFIG)
    _check_base_model(config, base, base_given)
    weights = next((directory / n for n in ADAPTER_WEIGHTS if (directory / n).is_file()), None)
    if weights is None:
        raise AdapterError(f"{directory}: holds {ADAPTER_CONFIG} but no {' or '.join(ADAPTER_WEIGHTS)}")
    _refuse_targeting_nothing(config, base)
    header = read_weights_file(weights)
    conv1d = _conv1d_modules(base)
    factors: dict[str, dict[str, TensorRef]] = {}  # base tensor -> {"A": ..., "B": ...}
    layout: dict[str, tuple[str, bool]] = {}  # base tensor -> (module, transposed)
    saved: dict[str, TensorRef] = {}
    for entry in header.tensors:
        key = entry.name
        rest = key.removeprefix(PEFT_PREFIX)
        if rest.endswith(_REFUSED_KEYS):
            raise AdapterError(
                f"{weights}: tensor {key!r} is not part of a plain LoRA update; merge the adapter into its base "
                "first (peft's merge_and_unload) and give that model as the agent"
            )
        factor = next(((s, f, t) for s, f, t in _FACTOR_KEYS if rest.endswith(s)), None)
        if factor is not None:
            suffix, which, transposed = factor
            module = rest[: -len(suffix)]
            name = _base_name(module + ".weight", base, weights, key)
            if not config.targets(module):
                raise AdapterError(
                    f"{weights}: module {module!r} has LoRA factors but {ADAPTER_CONFIG} does not target it "
                    f"({config.described()}); PEFT would not apply them: correct the config or the adapter file"
                )
            factors.setdefault(name, {})[which] = TensorRef(weights, entry)
            if transposed is None:  # a linear layer: Conv1D or not, as PEFT decides (see the docstring)
                transposed = config.fan_in_fan_out if conv1d is None else module.rpartition(".")[2] in conv1d
            layout[name] = (module, transposed)
        elif rest.endswith(_FROZEN_LAYER):
            name = _base_name(rest[: -len(_FROZEN_LAYER)] + ".weight", base, weights, key)
            if base.tensors[name].entry.shape != entry.shape:
                raise AdapterError(
                    f"{weights}: tensor {key!r} has shape {list(entry.shape)} but the base's {name!r} has "
                    f"{list(base.tensors[name].entry.shape)} (a resized vocabulary?); give the base it was trained on"
                )
        else:
            name = _base_name(rest, base, weights, key)
            saved[name] = TensorRef(weights, replace(entry, name=name))
    deltas = {name: _delta(name, parts, layout[name], config, base, weights) for name, parts in factors.items()}
    both = sorted(set(deltas) & set(saved))
    if both:
        raise AdapterError(
            f"{weights}: tensor {both[0]!r} is saved whole and also has LoRA factors; which one is meant is unclear"
        )
    tensors, as_task_vectors = {}, {}
    for name, ref in base.tensors.items():
        if name in saved:
            tensors[name] = saved[name]
        elif name in deltas:
            as_task_vectors[name] = deltas[name]
        elif is_float(ref.entry.dtype):
            as_task_vectors[name] = DeltaRef(name, ref.entry.shape)  # left alone: task vector 0
        else:
            tensors[name] = ref  # copied from the base in any case
    return Checkpoint(
        directory.resolve().name,
        directory.resolve(),
        directory,
        (header,),
        tensors,
        deltas=as_task_vectors,
        described_by=(config.path,),
    )


def _conv1d_modules(base: Checkpoint) -> frozenset[str] | None:
    """The names of the base's ``Conv1D`` modules (empty: all linear layers are ``nn.Linear``);
    None when the base records no ``model_type`` (then ``fan_in_fan_out`` is taken as given)."""
    model_type = _config_value(base, "model_type")
    if not isinstance(model_type, str):
        return None
    return CONV1D_MODULES.get(model_type, frozenset())


def _refuse_targeting_nothing(config: AdapterConfig, base: Checkpoint) -> None:
    """PEFT refuses to load an adapter whose config targets no module of the base."""
    modules = [name.removesuffix(".weight") for name in base.tensors if name.endswith(".weight")]
    if config.target_modules is None or not modules:
        return
    if not any(config.targets(m) or config.targets(m.removeprefix("model.")) for m in modules):
        raise AdapterError(
            f"{config.path}: targets no module of the base ({config.described()}); PEFT refuses to load it: "
            "correct the config, or give the base model this adapter was trained on"
        )


def _base_name(name: str, base: Checkpoint, weights: Path, key: str) -> str:
    """The base's tensor that an adapter key's ``name`` means: itself, or with a leading ``model.``
    added or removed; refused by name when there is none."""
    candidates = list(dict.fromkeys([name, "model." + name, name.removeprefix("model.")]))
    for candidate in candidates:
        if candidate in base.tensors:
            return candidate
    raise AdapterError(
        f"{weights}: tensor {key!r} matches no tensor of the base (looked for "
        f"{', '.join(repr(c) for c in candidates)}); give the base model this adapter was trained on"
    )


def _delta(
    name: str,
    parts: dict[str, TensorRef],
    layout: tuple[str, bool],
    config: AdapterConfig,
    base: Checkpoint,
    weights: Path,
) -> DeltaRef:
    """The checked ``DeltaRef`` of base tensor ``name`` from its factors."""
    module, transposed = layout
    missing = [f"lora_{w}" for w in ("A", "B") if w not in parts]
    if missing:
        raise AdapterError(f"{weights}: module {module!r} has no {missing[0]} factor; the adapter file is incomplete")
    a, b = parts["A"], parts["B"]
    for ref in (a, b):
        if ref.entry.dtype not in FLOAT_CODES:
            raise UnsupportedDtypeError(
                f"{weights}: tensor {ref.name!r} is {ref.entry.dtype}, which ramstream cannot decode (a quantized "
                "adapter?); save the adapter in bf16, f16 or f32"
            )
    target = base.tensors[name].entry
    if not is_float(target.dtype):
        raise AdapterError(
            f"{weights}: module {module!r} targets {name!r}, which is {target.dtype}, not a float tensor"
        )
    r, scale = config.rank_and_scale(module)
    if len(target.shape) != 2:
        raise AdapterError(f"{weights}: module {module!r} targets {name!r} of shape {list(target.shape)}, not a matrix")
    rows, cols = (target.shape[1], target.shape[0]) if transposed else target.shape  # B @ A's layout
    if tuple(a.entry.shape) != (r, cols) or tuple(b.entry.shape) != (rows, r):
        orientation = " (transposed: fan_in_fan_out or an embedding)" if transposed else ""
        raise AdapterError(
            f"{weights}: module {module!r}: lora_A {list(a.entry.shape)} and lora_B {list(b.entry.shape)} do not fit "
            f"the base's tensor {name!r} {list(target.shape)}{orientation} with rank {r}; give the base model this "
            "adapter was trained on"
        )
    return DeltaRef(name, target.shape, a, b, scale, transposed)


def _check_base_model(config: AdapterConfig, base: Checkpoint, given: str) -> None:
    """Refuse an adapter whose ``base_model_name_or_path`` is a hub id that clearly names another
    model than the base: the base's hub id, or the hub id its ``config.json`` records
    (``_name_or_path``). Models are compared by name, ignoring the organisation (a mirror of a model
    is the same model). A local path, or a base that records no hub id, is not compared."""
    named = config.base_model
    if named is None or os.path.lexists(named) or not is_repo_id(named):
        return
    known = list(_base_ids(base))
    wanted = _model_name(named)
    if not known or any(_model_name(k) == wanted for k in known):
        return
    raise AdapterError(
        f"{config.path}: base_model_name_or_path is {named!r} but the BASE given ({given}) is "
        f"{' / '.join(repr(k) for k in known)}; give the base this adapter was trained on, or set "
        f"base_model_name_or_path to null in {ADAPTER_CONFIG} if this base really is that model"
    )


def _base_ids(base: Checkpoint) -> Iterable[str]:
    if base.hub is not None:
        yield base.hub.repo_id
    recorded = _config_value(base, "_name_or_path")
    if isinstance(recorded, str) and not os.path.isabs(recorded) and is_repo_id(recorded):
        yield recorded


def _model_name(repo_id: str) -> str:
    return repo_id.partition("@")[0].rpartition("/")[2].lower()


def _config_value(checkpoint: Checkpoint, key: str) -> object:
    if checkpoint.directory is None:
        return None
    try:
        fd = open_regular(checkpoint.directory / CONFIG_FILE)
        with os.fdopen(fd, "rb") as f:
            config = json.loads(f.read())
    except (OSError, ValueError, CorruptFileError):
        return None
    return config.get(key) if isinstance(config, dict) else None
