"""Tied output heads: an agent whose ``lm_head.weight`` the base does not have, or the reverse.

A model with ``tie_word_embeddings: true`` in its ``config.json`` uses its input embedding as its
output head, and many checkpoints then leave ``lm_head.weight`` out; some write it anyway. Only
an explicit ``tie_word_embeddings`` counts (its default differs between model classes).

A tied base's own head is dropped when it holds its embedding's values, so the output has none,
as ``save_pretrained`` writes a tied model: merged separately, the head and the embedding came
out different wherever a method treats two tensors apart even when their inputs are equal
(DARE's and DELLA's drops are drawn per tensor; a cut ranked over the whole model falls between
equal magnitudes of the two), while the output's ``config.json`` says they are tied.

Against a tied base, an agent's head is dropped when it holds its embedding's values, and
refused by name when it differs: merging it would silently lose the agent's head. Values are
compared in chunks, never loaded whole, and by value: a float32 head equal to a bfloat16
embedding is the same head. Against a base with its own head, an agent that lacks one and says
it is tied has its embedding read as its head.
"""

from __future__ import annotations

import json
import os
from dataclasses import replace

import numpy as np

from ramstream.errors import CorruptFileError, InputError, MismatchError
from ramstream.format import codecs
from ramstream.format.checkpoint import Checkpoint, TensorRef
from ramstream.format.dtypes import FLOAT_CODES, ITEMSIZE, RAW_CARRIER, FloatCode
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


def untie_base(base: Checkpoint) -> Checkpoint:
    """``base`` without its head when its config ties it to the embedding and it holds the same values."""
    if HEAD not in base.tensors or tie_word_embeddings(base) is not True:
        return base
    head = base.tensors[HEAD]
    embedding = _embedding(base, head)
    if embedding is None:
        return base  # no one embedding to compare with: merged as any other tensor
    difference = _first_difference(head, embedding)
    if difference is not None:
        raise MismatchError(
            f"{head.file}: tensor {HEAD!r} of the base differs from its embedding {embedding.name!r} "
            f"({difference}), but its {CONFIG_FILE} ties them (tie_word_embeddings: true), so transformers "
            f"would load the embedding as its head; set tie_word_embeddings to false in the base's {CONFIG_FILE} "
            "if the head is its own"
        )
    return _without_head(base)


def reconcile_head(base: Checkpoint, agent: Checkpoint) -> Checkpoint:
    """``agent`` with its head made to match the base's tensor set where the configs say they are tied."""
    if HEAD in agent.tensors and HEAD not in base.tensors and tie_word_embeddings(base) is True:
        head = agent.tensors[HEAD]
        embedding = _embedding(agent, head)
        if embedding is None:
            return agent  # nothing to compare with: refused as a tensor the base lacks
        difference = _first_difference(head, embedding)
        if difference is not None:
            raise MismatchError(
                f"{head.file}: tensor {HEAD!r} of agent {agent.name} differs from its embedding "
                f"{embedding.name!r} ({difference}), but the base ties them (tie_word_embeddings: true in its "
                f"{CONFIG_FILE}); merge it against an untied base, or drop the agent's head if it is not meant "
                "to differ"
            )
        return _without_head(agent)
    if HEAD in base.tensors and HEAD not in agent.tensors and tie_word_embeddings(agent) is True:
        embedding = _embedding(agent, base.tensors[HEAD])
        if embedding is not None:
            return replace(
                agent, tensors={**agent.tensors, HEAD: TensorRef(embedding.file, replace(embedding.entry, name=HEAD))}
            )
    return agent


def tie_word_embeddings(checkpoint: Checkpoint) -> bool | None:
    """The explicit ``tie_word_embeddings`` of the checkpoint's ``config.json``, else None (a broken
    base config is refused later, before the merge pass)."""
    if checkpoint.directory is None:
        return None
    try:  # opened non-blocking: a FIFO named config.json must not hang the run (it is refused later)
        fd = open_regular(checkpoint.directory / CONFIG_FILE)
    except (OSError, CorruptFileError):
        return None
    try:
        with os.fdopen(fd, "rb") as f:
            config = json.loads(f.read())
    except (OSError, ValueError):
        return None
    value = config.get("tie_word_embeddings") if isinstance(config, dict) else None
    return value if isinstance(value, bool) else None


def _without_head(checkpoint: Checkpoint) -> Checkpoint:
    return replace(checkpoint, tensors={k: v for k, v in checkpoint.tensors.items() if k != HEAD})


def _embedding(checkpoint: Checkpoint, head: TensorRef) -> TensorRef | None:
    """The checkpoint's one input embedding shaped like ``head``, if there is exactly one."""
    found = [
        ref
        for name, ref in checkpoint.tensors.items()
        if name.endswith(EMBEDDING_SUFFIXES) and ref.entry.shape == head.entry.shape
    ]
    return found[0] if len(found) == 1 else None


def _first_difference(a: TensorRef, b: TensorRef) -> str | None:
    """None when two tensors of one shape hold the same values (the same bytes, or equal values
    in two float dtypes), else where they first differ, read side by side in chunks."""
    codes = FLOAT_CODES.get(a.entry.dtype), FLOAT_CODES.get(b.entry.dtype)
    if (codes[0] is None or codes[1] is None) and a.entry.dtype != b.entry.dtype:
        return f"{a.entry.dtype} against {b.entry.dtype}"
    stored = "" if a.entry.dtype == b.entry.dtype else f", stored as {a.entry.dtype} against {b.entry.dtype}"
    size_a, size_b = ITEMSIZE[a.entry.dtype], ITEMSIZE[b.entry.dtype]
    step = CHUNK_BYTES // max(size_a, size_b)
    try:
        fa, fb = open_regular(a.file), open_regular(b.file)
    except OSError as exc:
        raise InputError(f"{exc.filename or a.file}: cannot read ({exc.strerror})") from exc
    try:
        for start in range(0, a.entry.numel, step):
            count = min(step, a.entry.numel - start)
            left = _read(fa, a, start, count)
            right = _read(fb, b, start, count)
            if left == right and not stored:
                continue
            if codes[0] is None or codes[1] is None:
                return "other bytes"
            x, y = _values(left, codes[0]), _values(right, codes[1])
            unequal = np.flatnonzero((x != y) & ~(np.isnan(x) & np.isnan(y)))
            if unequal.size:
                k = int(unequal[0])
                return f"first at element {start + k}: {x[k]:.8g} against {y[k]:.8g}{stored}"
        return None
    finally:
        os.close(fa)
        os.close(fb)


def _read(fd: int, ref: TensorRef, start: int, count: int) -> bytes:
    size = ITEMSIZE[ref.entry.dtype]
    try:
        data = os.pread(fd, count * size, ref.entry.offset + start * size)
    except OSError as exc:
        raise InputError(f"{ref.file}: cannot read ({exc.strerror})") from exc
    if len(data) != count * size:
        raise InputError(f"{ref.file}: is shorter than its header says; re-download or re-save it")
    return data


def _values(data: bytes, code: FloatCode) -> np.ndarray:
    """float64 values of raw ``data`` (exact for every float dtype; f64 is not narrowed)."""
    raw = np.frombuffer(data, RAW_CARRIER[code])
    return raw.astype(np.float64) if code == FloatCode.F64 else codecs.decode(raw, code).astype(np.float64)
