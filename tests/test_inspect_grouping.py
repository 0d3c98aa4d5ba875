"""Layer, module and kind parsed from tensor names of common architectures."""

from __future__ import annotations

import pytest

from ramstream.inspect.grouping import Role, layer_groups, module_groups, role_of


@pytest.mark.parametrize(
    ("name", "role"),
    [
        ("model.embed_tokens.weight", Role(None, "embed_tokens", "embedding")),
        ("model.layers.0.self_attn.q_proj.weight", Role(0, "self_attn.q_proj", "attention")),
        ("model.layers.27.self_attn.q_proj.bias", Role(27, "self_attn.q_proj.bias", "attention")),
        ("model.layers.3.mlp.down_proj.weight", Role(3, "mlp.down_proj", "mlp")),
        ("model.layers.3.input_layernorm.weight", Role(3, "input_layernorm", "norm")),
        ("model.layers.3.post_attention_layernorm.weight", Role(3, "post_attention_layernorm", "norm")),
        ("model.layers.3.self_attn.q_norm.weight", Role(3, "self_attn.q_norm", "norm")),
        ("model.layers.1.block_sparse_moe.experts.7.w1.weight", Role(1, "block_sparse_moe.experts.*.w1", "mlp")),
        ("model.norm.weight", Role(None, "norm", "norm")),
        ("lm_head.weight", Role(None, "lm_head", "head")),
        ("transformer.wte.weight", Role(None, "wte", "embedding")),
        ("transformer.h.11.attn.c_attn.weight", Role(11, "attn.c_attn", "attention")),
        ("transformer.h.11.ln_1.weight", Role(11, "ln_1", "norm")),
        ("transformer.ln_f.weight", Role(None, "ln_f", "norm")),
        ("language_model.model.layers.2.mlp.gate_proj.weight", Role(2, "mlp.gate_proj", "mlp")),
        ("model.layers.1.scale", Role(1, "scale", "other")),
        ("weight", Role(None, "weight", "other")),
    ],
)
def test_role_of(name: str, role: Role) -> None:
    assert role_of(name) == role


def test_group_order() -> None:
    names = [
        "lm_head.weight",
        "model.embed_tokens.weight",
        "model.layers.10.mlp.up_proj.weight",
        "model.layers.2.self_attn.q_proj.weight",
        "model.layers.2.input_layernorm.weight",
        "model.norm.weight",
        "model.layers.10.self_attn.q_proj.weight",
    ]
    roles = [role_of(n) for n in names]
    keys, rows = layer_groups(roles)
    assert keys == ["embed_tokens", "2", "10", "lm_head", "norm"]
    assert [keys[r] for r in rows] == ["lm_head", "embed_tokens", "10", "2", "2", "norm", "10"]
    keys, rows = module_groups(roles)
    assert keys == ["embed_tokens", "self_attn.q_proj", "mlp.up_proj", "input_layernorm", "norm", "lm_head"]
    assert [keys[r] for r in rows][:3] == ["lm_head", "embed_tokens", "mlp.up_proj"]
