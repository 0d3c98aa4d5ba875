"""Where a tensor sits in the model, from its name alone: its layer, its module (role) and kind.

    model.layers.3.self_attn.q_proj.weight  ->  layer 3,    module "self_attn.q_proj",      kind "attention"
    model.layers.3.self_attn.q_proj.bias    ->  layer 3,    module "self_attn.q_proj.bias", kind "attention"
    model.layers.3.input_layernorm.weight   ->  layer 3,    module "input_layernorm",       kind "norm"
    model.embed_tokens.weight               ->  layer None, module "embed_tokens",          kind "embedding"
    model.norm.weight                       ->  layer None, module "norm",                  kind "norm"
    lm_head.weight                          ->  layer None, module "lm_head",               kind "head"
    model.layers.3.mlp.experts.17.up_proj.weight -> layer 3, module "mlp.experts.*.up_proj", kind "mlp"

The module drops the layer prefix and a trailing ``.weight`` (a ``.bias`` stays: it is another
role), the expert number of a mixture-of-experts' per-expert tensors (the experts of a layer
share a role: one module, not one per expert), and container prefixes (``model.``,
``transformer.``, ...) outside the layers. A tensor outside the layers is its own "layer" group,
keyed by its module; groups are ordered embeddings, layers 0..L-1, then the rest in model order.
"""

from __future__ import annotations

import re
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Literal

from ramstream.format.names import LAYER

Kind = Literal["embedding", "attention", "mlp", "norm", "head", "other"]
KIND_ORDER: tuple[Kind, ...] = ("embedding", "attention", "mlp", "norm", "other", "head")

_CONTAINERS = ("model.", "transformer.", "language_model.", "decoder.", "encoder.")
_EXPERT = re.compile(r"(^|\.)experts\.\d+\.")
_NORM = re.compile(r"(norm|(^|[._])ln(_?\w*)?$)")


@dataclass(frozen=True)
class Role:
    layer: int | None
    module: str
    kind: Kind

    @property
    def layer_key(self) -> str:
        """The tensor's row in the per-layer table: its layer number, or its module outside layers."""
        return str(self.layer) if self.layer is not None else self.module


def role_of(name: str) -> Role:
    match = LAYER.search(name)
    if match is not None:
        layer: int | None = int(match.group(1))
        module = name[match.end() :]
    else:
        layer, module = None, name
        stripped = True
        while stripped:
            stripped = False
            for prefix in _CONTAINERS:
                if module.startswith(prefix) and len(module) > len(prefix):
                    module, stripped = module[len(prefix) :], True
    module = _EXPERT.sub(r"\1experts.*.", module)
    if module.endswith(".weight") and len(module) > len(".weight"):
        module = module[: -len(".weight")]
    return Role(layer, module, _kind(module, layer))


def _kind(module: str, layer: int | None) -> Kind:
    lowered = module.lower()
    if "embed" in lowered or lowered in ("wte", "wpe", "word_embeddings"):
        return "embedding"
    if _NORM.search(lowered):
        return "norm"
    if layer is None and (lowered.startswith("lm_head") or lowered in ("output", "head", "score")):
        return "head"
    if "attn" in lowered or "attention" in lowered:
        return "attention"
    if any(w in lowered for w in ("mlp", "ffn", "feed_forward", "expert", "fc1", "fc2")):
        return "mlp"
    return "other"


def layer_groups(roles: Sequence[Role]) -> tuple[list[str], list[int]]:
    """The per-layer row keys, in display order, and the row of each tensor."""
    first: dict[str, int] = {}
    for i, role in enumerate(roles):
        first.setdefault(role.layer_key, i)
    by_key = {r.layer_key: r for r in roles}

    def order(key: str) -> tuple[int, int, int]:
        role = by_key[key]
        if role.layer is not None:
            return (1, role.layer, 0)
        return (0 if role.kind == "embedding" else 2, 0, first[key])

    keys = sorted(first, key=order)
    row = {k: i for i, k in enumerate(keys)}
    return keys, [row[r.layer_key] for r in roles]


def module_groups(roles: Sequence[Role]) -> tuple[list[str], list[int]]:
    """The per-module row keys (by kind, then name) and the row of each tensor."""
    kinds = {r.module: r.kind for r in roles}
    keys = sorted(kinds, key=lambda m: (KIND_ORDER.index(kinds[m]), m))
    row = {k: i for i, k in enumerate(keys)}
    return keys, [row[r.module] for r in roles]
