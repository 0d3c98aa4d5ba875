"""The lab's tiny decoder-only transformer (torch), with Llama-style tensor names.

Learned token and position embeddings, pre-norm blocks (RMS norm, causal multi-head attention
without biases, a GELU MLP), a final norm and an untied output head. State-dict keys read like a
Hugging Face decoder (``model.layers.0.self_attn.q_proj.weight``, ``lm_head.weight``), so
``ramstream inspect --by module`` groups the lab's checkpoints like any other model.
"""

from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import nn

from ramstream.lab.tasks import DIGITS, ModelShape


class RMSNorm(nn.Module):
    def __init__(self, dim: int, eps: float = 1e-6) -> None:
        super().__init__()
        self.weight = nn.Parameter(torch.ones(dim))
        self.eps = eps

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return x * torch.rsqrt(x.pow(2).mean(-1, keepdim=True) + self.eps) * self.weight


class KVCache:
    """One layer's keys and values so far, for decoding one token at a time."""

    def __init__(self) -> None:
        self.k: torch.Tensor | None = None
        self.v: torch.Tensor | None = None


class Attention(nn.Module):
    def __init__(self, shape: ModelShape) -> None:
        super().__init__()
        h = shape.hidden
        self.heads = shape.heads
        self.q_proj = nn.Linear(h, h, bias=False)
        self.k_proj = nn.Linear(h, h, bias=False)
        self.v_proj = nn.Linear(h, h, bias=False)
        self.o_proj = nn.Linear(h, h, bias=False)

    def forward(self, x: torch.Tensor, cache: KVCache | None = None) -> torch.Tensor:
        b, t, h = x.shape

        def split(y: torch.Tensor) -> torch.Tensor:
            return y.view(b, t, self.heads, h // self.heads).transpose(1, 2)

        q, k, v = split(self.q_proj(x)), split(self.k_proj(x)), split(self.v_proj(x))
        causal = True
        if cache is not None:
            if cache.k is not None and cache.v is not None:
                if t != 1:
                    raise ValueError("a cached step takes one new token")
                k, v, causal = torch.cat([cache.k, k], dim=2), torch.cat([cache.v, v], dim=2), False
            cache.k, cache.v = k, v
        out = F.scaled_dot_product_attention(q, k, v, is_causal=causal)
        return self.o_proj(out.transpose(1, 2).reshape(b, t, h))


class MLP(nn.Module):
    def __init__(self, shape: ModelShape) -> None:
        super().__init__()
        self.up_proj = nn.Linear(shape.hidden, shape.intermediate, bias=False)
        self.down_proj = nn.Linear(shape.intermediate, shape.hidden, bias=False)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.down_proj(F.gelu(self.up_proj(x)))


class Block(nn.Module):
    def __init__(self, shape: ModelShape) -> None:
        super().__init__()
        self.input_layernorm = RMSNorm(shape.hidden)
        self.self_attn = Attention(shape)
        self.post_attention_layernorm = RMSNorm(shape.hidden)
        self.mlp = MLP(shape)

    def forward(self, x: torch.Tensor, cache: KVCache | None = None) -> torch.Tensor:
        x = x + self.self_attn(self.input_layernorm(x), cache)
        return x + self.mlp(self.post_attention_layernorm(x))


class Backbone(nn.Module):
    def __init__(self, shape: ModelShape) -> None:
        super().__init__()
        self.embed_tokens = nn.Embedding(shape.vocab, shape.hidden)
        self.embed_positions = nn.Embedding(shape.positions, shape.hidden)
        self.layers = nn.ModuleList(Block(shape) for _ in range(shape.layers))
        self.norm = RMSNorm(shape.hidden)

    def forward(self, tokens: torch.Tensor, caches: list[KVCache] | None = None, start: int = 0) -> torch.Tensor:
        positions = torch.arange(start, start + tokens.shape[1], device=tokens.device)
        x = self.embed_tokens(tokens) + self.embed_positions(positions)
        for i, layer in enumerate(self.layers):
            x = layer(x, caches[i] if caches is not None else None)
        return self.norm(x)  # type: ignore[no-any-return]


class AgentsLabLM(nn.Module):
    """``forward(tokens (B, T)) -> logits (B, T, vocab)``, float32."""

    def __init__(self, shape: ModelShape) -> None:
        super().__init__()
        self.shape = shape
        self.model = Backbone(shape)
        self.lm_head = nn.Linear(shape.hidden, shape.vocab, bias=False)
        for name, param in self.named_parameters():
            if not name.endswith("norm.weight"):
                nn.init.normal_(param, std=shape.init_std)

    def forward(self, tokens: torch.Tensor, caches: list[KVCache] | None = None, start: int = 0) -> torch.Tensor:
        """Logits for ``tokens`` at positions ``start``...; with ``caches``, keys and values
        of earlier positions come from (and new ones go to) the caches."""
        return self.lm_head(self.model(tokens, caches, start))  # type: ignore[no-any-return]


@torch.no_grad()
def generate(
    model: AgentsLabLM, prompts: torch.Tensor, temperature: float = 0.0, generator: torch.Generator | None = None
) -> torch.Tensor:
    """Append 7 tokens to each prompt: greedy when ``temperature`` is 0, else sampled.
    Returns the whole sequences, shape (B, prompt length + 7)."""
    caches = [KVCache() for _ in range(model.shape.layers)]
    seq = prompts
    logits = model(prompts, caches)[:, -1, :]
    for i in range(DIGITS):
        if i:
            logits = model(seq[:, -1:], caches, seq.shape[1] - 1)[:, -1, :]
        if temperature == 0:
            nxt = logits.argmax(dim=-1, keepdim=True)
        else:
            probs = torch.softmax(logits / temperature, dim=-1)
            nxt = torch.multinomial(probs, 1, generator=generator)
        seq = torch.cat([seq, nxt], dim=1)
    return seq
