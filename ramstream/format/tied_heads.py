"""Tied output heads: an agent whose ``lm_head.weight`` the base does not have, or the reverse.

A model with ``tie_word_embeddings: true`` in its ``config.json`` uses its input embedding as its
output head, and many checkpoints then leave ``lm_head.weight`` out; some write it anyway. Only
an explicit ``tie_word_embeddings`` counts (its default differs between model classes). Against
a tied base, an agent's extra head is dropped when it holds the very bytes of that agent's
embedding (compared in chunks, never loaded whole) and refused by name when it differs: merging
it would silently lose the agent's head. Against a base with its own head, an agent that lacks
one and says it is tied has its embedding read as its head.
"""

from __future__ import annotations

import json
import os
from dataclasses import replace

from ramstream.errors import InputError, MismatchError
from ramstream.format.checkpoint import Checkpoint, TensorRef
from ramstream.format.names import CONFIG_FILE
from ramstream.format.regular import open_regular

HEAD = "lm_head.weight"
# The input embedding's name in the common architectures (Llama/Qwen/Mistral, GPT-2, BLOOM, GPT-NeoX, InternLM).
EMBEDDING_SUFFIXES = (
    "embed_tokens.weight",
    "wte.weight",
    "word_embeddings.weight",
    "embed_in.weight",
    "tok_embeddings.weight",
)
CHUNK_BYTES = 8 << 20


def reconcile_head(base: Checkpoint, agent: Checkpoint) -> Checkpoint:
    """``agent`` with its head made to match the base's tensor set where the configs say they are tied."""
    if HEAD in agent.tensors and HEAD not in base.tensors and tie_word_embeddings(base) is True:
        head = agent.tensors[HEAD]
        embedding = _embedding(agent, head)
        if embedding is None:
            return agent  # nothing to compare with: refused as a tensor the base lacks
        if not _same_bytes(head, embedding):
            raise MismatchError(
                f"{head.file}: tensor {HEAD!r} of agent {agent.name} differs from its embedding "
                f"{embedding.name!r}, but the base ties them (tie_word_embeddings: true in its {CONFIG_FILE}); "
                "merge it against an untied base, or drop the agent's head if it is not meant to differ"
            )
        return replace(agent, tensors={k: v for k, v in agent.tensors.items() if k != HEAD})
    if HEAD in base.tensors and HEAD not in agent.tensors and tie_word_embeddings(agent) is True:
        embedding = _embedding(agent, base.tensors[HEAD])
        if embedding is not None:
            return replace(
                agent, tensors={**agent.tensors, HEAD: TensorRef(embedding.file, replace(embedding.entry, name=HEAD))}
            )
    return agent


def tie_word_embeddings(checkpoint: Checkpoint) -> bool | None:
    """The explicit ``tie_word_embeddings`` of the checkpoint's ``config.json``, else None (a broken
    base config is refused later, by the output's config writer)."""
    if checkpoint.directory is None:
        return None
    try:
        config = json.loads((checkpoint.directory / CONFIG_FILE).read_text())
    except (OSError, ValueError):
        return None
    value = config.get("tie_word_embeddings") if isinstance(config, dict) else None
    return value if isinstance(value, bool) else None


def _embedding(checkpoint: Checkpoint, head: TensorRef) -> TensorRef | None:
    """The checkpoint's one input embedding shaped like ``head``, if there is exactly one."""
    found = [
        ref
        for name, ref in checkpoint.tensors.items()
        if name.endswith(EMBEDDING_SUFFIXES) and ref.entry.shape == head.entry.shape
    ]
    return found[0] if len(found) == 1 else None


def _same_bytes(a: TensorRef, b: TensorRef) -> bool:
    """Whether two tensors hold the same dtype and bytes, read side by side in chunks."""
    if a.entry.dtype != b.entry.dtype or a.entry.nbytes != b.entry.nbytes:
        return False
    try:
        fa, fb = open_regular(a.file), open_regular(b.file)
    except OSError as exc:
        raise InputError(f"{exc.filename or a.file}: cannot read ({exc.strerror})") from exc
    try:
        for start in range(0, a.entry.nbytes, CHUNK_BYTES):
            count = min(CHUNK_BYTES, a.entry.nbytes - start)
            left = os.pread(fa, count, a.entry.offset + start)
            if len(left) != count or left != os.pread(fb, count, b.entry.offset + start):
                return False
        return True
    except OSError as exc:
        raise InputError(f"{a.file}: cannot read ({exc.strerror})") from exc
    finally:
        os.close(fa)
        os.close(fb)
