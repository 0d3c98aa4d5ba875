"""Synthetic families for the demo and the benchmarks: a bf16 base and agents whose task
vectors are sparse and heterogeneous, like RL-trained agents (see the paper's Figure 2).

Each agent changes a random subset of elements (its density) by a small amount; the subsets
are drawn independently, so dense agents overlap a lot and sparse agents keep unique updates.
"""

from __future__ import annotations

import json
import os
from dataclasses import dataclass
from pathlib import Path

import numpy as np

from ramstream.format import codecs
from ramstream.format.dtypes import FloatCode
from ramstream.output.shards import plan_shards


@dataclass(frozen=True)
class FamilyShape:
    """A Qwen2-like decoder: names and shapes as Hugging Face writes them."""

    hidden: int = 64
    layers: int = 2
    vocab: int = 512
    intermediate: int = 176
    kv_hidden: int = 16
    experts: int = 0  # > 0: a Qwen3-MoE-like MLP, one tensor per expert projection
    expert_intermediate: int = 0

    def tensors(self) -> list[tuple[str, tuple[int, ...]]]:
        h, kv = self.hidden, self.kv_hidden
        out: list[tuple[str, tuple[int, ...]]] = [("model.embed_tokens.weight", (self.vocab, h))]
        for i in range(self.layers):
            p = f"model.layers.{i}."
            out += [
                (p + "input_layernorm.weight", (h,)),
                (p + "self_attn.q_proj.weight", (h, h)),
                (p + "self_attn.q_proj.bias", (h,)),
                (p + "self_attn.k_proj.weight", (kv, h)),
                (p + "self_attn.k_proj.bias", (kv,)),
                (p + "self_attn.v_proj.weight", (kv, h)),
                (p + "self_attn.v_proj.bias", (kv,)),
                (p + "self_attn.o_proj.weight", (h, h)),
                (p + "post_attention_layernorm.weight", (h,)),
            ]
            out += self._mlp(p + "mlp.")
        out += [("model.norm.weight", (h,)), ("lm_head.weight", (self.vocab, h))]
        return out

    def _mlp(self, p: str) -> list[tuple[str, tuple[int, ...]]]:
        h, inter, moe = self.hidden, self.intermediate, self.expert_intermediate
        if not self.experts:
            return [
                (p + "gate_proj.weight", (inter, h)),
                (p + "up_proj.weight", (inter, h)),
                (p + "down_proj.weight", (h, inter)),
            ]
        out: list[tuple[str, tuple[int, ...]]] = [(p + "gate.weight", (self.experts, h))]
        for e in range(self.experts):
            q = f"{p}experts.{e}."
            out += [
                (q + "gate_proj.weight", (moe, h)),
                (q + "up_proj.weight", (moe, h)),
                (q + "down_proj.weight", (h, moe)),
            ]
        return out

    def config(self) -> dict[str, object]:
        moe: dict[str, object] = (
            {"num_experts": self.experts, "moe_intermediate_size": self.expert_intermediate, "num_experts_per_tok": 2}
            if self.experts
            else {}
        )
        return {
            "architectures": ["Qwen2ForCausalLM"],
            "model_type": "qwen2",
            "hidden_size": self.hidden,
            "intermediate_size": self.intermediate,
            "num_hidden_layers": self.layers,
            "num_attention_heads": max(1, self.hidden // 16),
            "num_key_value_heads": max(1, self.kv_hidden // 16),
            "vocab_size": self.vocab,
            "max_position_embeddings": 2048,
            "rms_norm_eps": 1e-6,
            "tie_word_embeddings": False,
            "torch_dtype": "bfloat16",
            **moe,
        }


DEMO_SHAPE = FamilyShape()
BENCH_SHAPE = FamilyShape(hidden=2048, layers=8, vocab=64000, intermediate=8448, kv_hidden=256)
# The MoE benchmark's families (tools/bench_moe.py): 8 layers x 64 experts (about 1.6 k tensors,
# 14 M parameters) and 48 layers x 128 experts (Qwen3-30B-A3B's 18.9 k tensors, small dimensions).
MOE_SHAPE = FamilyShape(
    hidden=128, layers=8, vocab=4096, intermediate=0, kv_hidden=32, experts=64, expert_intermediate=64
)
MOE_WIDE_SHAPE = FamilyShape(
    hidden=64, layers=48, vocab=2048, intermediate=0, kv_hidden=16, experts=128, expert_intermediate=16
)
PAPER_DENSITIES = (0.032, 0.462, 0.543)


def write_family(
    directory: Path,
    shape: FamilyShape = DEMO_SHAPE,
    densities: tuple[float, ...] = PAPER_DENSITIES,
    seed: int = 0,
    shard_size: int = 2 * 1024**3,
) -> tuple[Path, list[Path]]:
    """Write ``base/`` and ``agent{k}/`` under ``directory``; return their paths."""
    rng = np.random.default_rng(seed)
    names = ["base"] + [f"agent{k + 1}" for k in range(len(densities))]
    paths = [directory / n for n in names]
    for p in paths:
        p.mkdir(parents=True, exist_ok=True)
    tensors = shape.tensors()
    layout = plan_shards([(n, "BF16", s, int(np.prod(s)) * 2) for n, s in tensors], shard_size)
    fds = [
        [_open_shard(p / name, header) for name, header in zip(layout.names, layout.headers, strict=True)]
        for p in paths
    ]
    try:
        for name, tshape in tensors:
            numel = int(np.prod(tshape))
            base = _bf16(rng.standard_normal(numel, dtype=np.float32) * np.float32(0.02))
            place = layout.placements[name]
            os.pwrite(fds[0][place.shard], base.tobytes(), place.offset)
            base_f32 = codecs.decode(base, FloatCode.BF16)
            for k, density in enumerate(densities):
                changed = rng.random(numel, dtype=np.float32) < density
                delta = rng.standard_normal(numel, dtype=np.float32) * np.float32(2e-3)
                agent = _bf16(base_f32 + np.where(changed, delta, np.float32(0)))
                os.pwrite(fds[k + 1][place.shard], agent.tobytes(), place.offset)
    finally:
        for row in fds:
            for fd in row:
                os.close(fd)
    for p in paths:
        if len(layout.names) > 1:
            (p / "model.safetensors.index.json").write_text(
                json.dumps({"metadata": {}, "weight_map": layout.weight_map()}, indent=1)
            )
        (p / "config.json").write_text(json.dumps(shape.config(), indent=2))
        (p / "generation_config.json").write_text(json.dumps({"do_sample": False}))
    return paths[0], paths[1:]


def _open_shard(path: Path, header: bytes) -> int:
    fd = os.open(path, os.O_RDWR | os.O_CREAT | os.O_TRUNC, 0o644)
    os.pwrite(fd, header, 0)
    return fd


def _bf16(values: np.ndarray) -> np.ndarray:
    return codecs.encode(values, FloatCode.BF16)
