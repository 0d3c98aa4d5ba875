"""What a stack of layers (mergekit's ``passthrough``) writes: every output tensor with its new
name, the tensor it copies and the factor it is scaled by, all checked before a byte is written.

Output layer j is layer ``start + offset`` of its slice's model: its tensors are renamed by the
layer number in their names (``format.names.LAYER``: ``model.layers.7.`` becomes
``model.layers.j.``). The tensors outside the layers come from the first slice's model when they
lie before the layers (embeddings and anything not named below) and from the last slice's model
when they lie after them: the final norm, the head, a classifier or pooler (``POST_MODULES``),
as mergekit plans ``pre_weights`` from ``slices[0]`` and ``post_weights`` from ``slices[-1]``.

``scale`` is evaluated as mergekit does for the slice a tensor belongs to (the first slice for
the tensors before the layers, the last for those after): against the tensor's name in its own
model, at t = offset / (layers in the slice - 1) in a slice (1 for a slice of one layer) and at
t = 0 outside the layers; no condition matching leaves the tensor unscaled. Tensors that are not
floats (integer buffers) are copied as they are, as mergekit copies them.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from ramstream.errors import ConfigError, MismatchError, UnsupportedDtypeError
from ramstream.format.checkpoint import Checkpoint, TensorRef
from ramstream.format.dtypes import OUT_DTYPES, UNDECODABLE_FLOATS, is_float
from ramstream.format.names import LAYER
from ramstream.mergekit_config import StackSlice
from ramstream.methods import tensor_settings
from ramstream.output.hf_config import LayerSource, layer_count

# A module outside the layers named so lies after them (mergekit's post_weights, across its architectures).
POST_MODULES = frozenset(
    {
        "lm_head",
        "embed_out",
        "output",
        "output_layer",
        "score",
        "classifier",
        "pre_classifier",
        "cls",
        "pooler",
        "norm",
        "norm_f",
        "ln_f",
        "final_layer_norm",
        "final_layernorm",
        "vocab_transform",
        "vocab_projector",
        "vocab_layer_norm",
    }
)


@dataclass(frozen=True)
class StackTensor:
    """One output tensor: its name, the tensor it copies, the factor it is scaled by (None: not
    scaled), the dtype mergekit holds it in before scaling (``dtype:``; None: its own) and the
    dtype written."""

    name: str
    source: TensorRef
    scale: float | None
    work: str | None
    dtype: str

    @property
    def copied(self) -> bool:
        """Its bytes are the source's bytes (nothing to decode)."""
        src = self.source.entry.dtype
        return self.scale is None and self.dtype == src and self.work in (None, src, "F32")


@dataclass(frozen=True)
class StackPlan:
    tensors: tuple[StackTensor, ...]  # in output order: before the layers, the layers, after them
    layers: tuple[LayerSource, ...]  # per output layer, where it comes from
    ranges: tuple[tuple[int, int], ...]  # per slice, the layers [start, end) it takes
    scales: tuple[Any, ...]  # per slice, its scale as JSON (None: unscaled)


@dataclass(frozen=True)
class _Model:
    """A checkpoint's tensors sorted out: before the layers, per layer (by the name's layer
    number), after the layers; and its layer count (config.json's, else the names')."""

    checkpoint: Checkpoint
    config: Mapping[str, Any] | None
    before: dict[str, TensorRef]
    layers: dict[int, list[tuple[str, str, TensorRef]]]  # layer -> (name before the number, after it, tensor)
    after: dict[str, TensorRef]
    count: int


def plan_stack(
    slices: Sequence[StackSlice],
    models: Sequence[Checkpoint],
    configs: Sequence[Mapping[str, Any] | None],
    dtype: str | None,
    out_dtype: str,
) -> StackPlan:
    """The output of ``slices`` (``models[k]`` and ``configs[k]``: slice k's checkpoint and its
    config.json, None without one; ``dtype`` and ``out_dtype`` as ``api.stack`` takes them)."""
    sorted_out = {id(m): _sort(m, c) for m, c in zip(models, configs, strict=True)}
    parts = [sorted_out[id(m)] for m in models]
    ranges = [_range(k, s, part) for k, (s, part) in enumerate(zip(slices, parts, strict=True))]
    settings = [_setting(k, s) for k, s in enumerate(slices)]
    _check_layers(parts, ranges)
    _check_outside(parts[0], parts[-1])
    work = None if dtype is None else OUT_DTYPES[dtype]
    written = None if out_dtype == "auto" else OUT_DTYPES[out_dtype]
    scales = _Scales(settings)

    def tensor(name: str, ref: TensorRef, k: int, t: float) -> StackTensor:
        return _tensor(name, ref, scales.at(k, ref.name, t), work, written)

    first, last = parts[0], parts[-1]
    tensors = [tensor(name, ref, 0, 0.0) for name, ref in first.before.items()]
    sources: list[LayerSource] = []
    for k, (start, end) in enumerate(ranges):
        part = parts[k]
        for offset, layer in enumerate(range(start, end)):
            t = offset / (end - start - 1) if end - start > 1 else 1.0
            j = len(sources)
            tensors += [tensor(f"{head}{j}{tail}", ref, k, t) for head, tail, ref in part.layers[layer]]
            sources.append(LayerSource(part.checkpoint.name, part.config, layer))
    tensors += [tensor(name, ref, len(slices) - 1, 0.0) for name, ref in last.after.items()]
    scales.check_filters()
    return StackPlan(tuple(tensors), tuple(sources), tuple(ranges), tuple(map(_json, settings)))


def _sort(checkpoint: Checkpoint, config: Mapping[str, Any] | None) -> _Model:
    before: dict[str, TensorRef] = {}
    after: dict[str, TensorRef] = {}
    layers: dict[int, list[tuple[str, str, TensorRef]]] = {}
    heads: set[str] = set()
    for name, ref in checkpoint.tensors.items():
        match = LAYER.search(name)
        if match is None:
            (after if _after_layers(name) else before)[name] = ref
            continue
        head, tail = name[: match.start(1)], name[match.end(1) :]
        heads.add(head)
        layers.setdefault(int(match.group(1)), []).append((head, tail, ref))
    if len(heads) > 1:
        shown = ", ".join(sorted(heads)[:3])
        raise MismatchError(
            f"{checkpoint.path}: holds several stacks of layers ({shown}): passthrough stacks the layers of "
            "single-stack models (a language model's decoder), not of encoder-decoder or multimodal ones"
        )
    count = _count(config, layers)
    beyond = [n for n in layers if n >= count]
    if beyond:
        raise MismatchError(
            f"{checkpoint.path}: tensor {layers[min(beyond)][0][2].name!r} lies in layer {min(beyond)}, beyond its "
            f"{count} layers (num_hidden_layers in its config.json); ramstream stacks the decoder's layers only"
        )
    return _Model(checkpoint, config, before, layers, after, count)


def _after_layers(name: str) -> bool:
    return any(part in POST_MODULES for part in name.split(".")[:-1])


def _count(config: Mapping[str, Any] | None, layers: Mapping[int, Any]) -> int:
    """config.json's layer count when it gives one, else one more than the highest layer number."""
    count = layer_count(config)
    return max(layers, default=-1) + 1 if count is None else count


def _label(k: int, s: StackSlice) -> str:
    end = "" if s.end is None else f", layers [{s.start}, {s.end})"
    return f"slice {k} ({s.model}{end})"


def _range(k: int, s: StackSlice, part: _Model) -> tuple[int, int]:
    end = part.count if s.end is None else s.end
    if not 0 <= s.start < end:
        raise ConfigError(f"{_label(k, s)}: holds no layer; give start < end")
    if end > part.count:
        raise ConfigError(
            f"{_label(k, s)}: goes beyond the {part.count} layers of {part.checkpoint.path}; "
            f"end is at most {part.count}"
        )
    for layer in range(s.start, end):
        if layer not in part.layers:
            raise MismatchError(f"{part.checkpoint.path}: has no tensor of layer {layer}, which {_label(k, s)} takes")
    return s.start, end


def _setting(k: int, s: StackSlice) -> tensor_settings.Setting | None:
    if s.scale is None:
        return None
    try:
        return tensor_settings.parse("scale", s.scale)
    except ConfigError as exc:
        raise ConfigError(f"{_label(k, s)}: {exc}") from None


def _json(setting: tensor_settings.Setting | None) -> Any:
    """A scale as a config would write it (a gradient as its list of values)."""
    if isinstance(setting, tensor_settings.Varying) and len(setting.rules) == 1 and setting.rules[0].filter is None:
        return list(setting.rules[0].values)
    return tensor_settings.to_json(setting)


def _check_layers(parts: Sequence[_Model], ranges: Sequence[tuple[int, int]]) -> None:
    """Every layer taken holds the tensors of the first one taken (names after the layer number,
    shapes, float or not): a stack of unlike layers would load as nothing."""
    reference_part, reference_layer = parts[0], ranges[0][0]
    reference = _signature(reference_part.layers[reference_layer])
    for part, (start, end) in zip(parts, ranges, strict=True):
        for layer in range(start, end):
            got = _signature(part.layers[layer])
            if got == reference:
                continue
            where = f"layer {layer} of {part.checkpoint.path}"
            first = f"layer {reference_layer} of {reference_part.checkpoint.path}"
            missing = sorted(set(reference) - set(got))
            extra = sorted(set(got) - set(reference))
            if missing or extra:
                what = (
                    f"has no {missing[0]!r}, which {first} has"
                    if missing
                    else f"has {extra[0]!r}, which {first} has not"
                )
                raise MismatchError(f"{where} {what}: stacked layers must hold the same tensors")
            tail = next(t for t in reference if reference[t] != got[t])
            raise MismatchError(
                f"{where}: tensor {tail!r} has shape {list(got[tail][0])} but {list(reference[tail][0])} in {first} "
                "(and must be float in both or in neither): stacked layers must be alike"
            )


def _signature(layer: list[tuple[str, str, TensorRef]]) -> dict[str, tuple[tuple[int, ...], bool]]:
    return {tail: (ref.entry.shape, is_float(ref.entry.dtype)) for _head, tail, ref in layer}


def _check_outside(first: _Model, last: _Model) -> None:
    """The tensors before the layers come from the first slice's model, those after from the last's:
    the two models must hold the same ones, alike, or the output would lack some (a tied head in
    one model and not in the other) or not fit (another vocabulary)."""
    if first is last:
        return
    for mine, theirs in ((first.before, last.before), (first.after, last.after)):
        for name in sorted(set(mine) ^ set(theirs)):
            holder, other = (first, last) if name in mine else (last, first)
            raise MismatchError(
                f"{holder.checkpoint.path}: tensor {name!r} is not in {other.checkpoint.path}; the first slice's model "
                "gives the tensors before the layers and the last slice's those after: they must hold the same ones"
            )
        for name, ref in mine.items():
            if ref.entry.shape != theirs[name].entry.shape:
                raise MismatchError(
                    f"{theirs[name].file}: tensor {name!r} has shape {list(theirs[name].entry.shape)} but "
                    f"{list(ref.entry.shape)} in {first.checkpoint.path}: the first and last slices' models "
                    "must be alike"
                )


def _tensor(name: str, ref: TensorRef, scale: float | None, work: str | None, written: str | None) -> StackTensor:
    src = ref.entry.dtype
    if is_float(src):
        return StackTensor(name, ref, scale, work, written or work or src)
    if src in UNDECODABLE_FLOATS and scale is not None:
        raise UnsupportedDtypeError(
            f"{ref.file}: tensor {ref.name!r} is {src}, which ramstream cannot decode to scale it; "
            "convert the checkpoint to bf16, f16 or f32, or give it no scale"
        )
    return StackTensor(name, ref, None, None, src)  # copied as it is (an integer buffer, an F8 tensor)


class _Scales:
    """Each slice's scale, evaluated per tensor; remembers which filters matched some tensor."""

    def __init__(self, settings: Sequence[tensor_settings.Setting | None]) -> None:
        self.settings = settings
        self.matched: set[str] = set()

    def at(self, k: int, name: str, t: float) -> float | None:
        setting = self.settings[k]
        if not isinstance(setting, tensor_settings.Varying):
            return setting
        rules = [rule for rule in setting.rules if rule.matches(name)]
        self.matched.update(rule.filter for rule in rules if rule.filter is not None)
        return rules[0].at(t) if rules else None

    def check_filters(self) -> None:
        """A filter that matches no tensor of the stack can only be a mistake (a typo)."""
        for setting in self.settings:
            rules = setting.rules if isinstance(setting, tensor_settings.Varying) else ()
            for rule in rules:
                if rule.filter not in (None, "*") and rule.filter not in self.matched:
                    raise ConfigError(
                        f"scale: the filter {rule.filter!r} matches no tensor of the stack (a filter is part of "
                        "a tensor name, e.g. self_attn or o_proj)"
                    )
