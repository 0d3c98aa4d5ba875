"""The file names of a Hugging Face model directory that ramstream reads, fetches or copies, and
the shard list of its ``*.index.json``."""

from __future__ import annotations

import json
import os
import re
from pathlib import Path

from ramstream.errors import CorruptFileError

SINGLE_FILE = "model.safetensors"
SHARD_INDEX = "model.safetensors.index.json"
BIN_FILE = "pytorch_model.bin"
BIN_INDEX = "pytorch_model.bin.index.json"
CONFIG_FILE = "config.json"
# A PEFT adapter directory (``format.lora``): its config and its weights, in PEFT's preference order.
ADAPTER_CONFIG = "adapter_config.json"
ADAPTER_WEIGHTS = ("adapter_model.safetensors", "adapter_model.bin")

# Copied from the base into the output as they are (and fetched with a hub model).
COPIED_FILES = (
    "tokenizer.json",
    "tokenizer_config.json",
    "special_tokens_map.json",
    "tokenizer.model",
    "vocab.json",
    "merges.txt",
    "added_tokens.json",
    "chat_template.jinja",
    "chat_template.json",
    "generation_config.json",
)


# A decoder layer's tensors: ``model.layers.3.``, GPT-2's ``h.3.``, ``blocks.3.``...
LAYER = re.compile(r"(?:^|\.)(?:layers|layer|h|blocks|block)\.(\d+)\.")


def layer_of(name: str) -> int | None:
    """The layer a tensor belongs to, from its name; None outside the layers (embeddings, head)."""
    match = LAYER.search(name)
    return None if match is None else int(match.group(1))


def shard_names(index: Path) -> list[str]:
    """The shard files a ``*.index.json`` lists, each once, in order: names relative to its own
    directory (``sub/../a`` is ``a``); an absolute path or one that climbs out of the directory is
    refused, as transformers' hub download would refuse it (the index travels with the model, and
    the merge records a shard by its name in the directory)."""
    try:
        weight_map = json.loads(index.read_text())["weight_map"]
        shards = list(dict.fromkeys(weight_map.values()))
    except (OSError, ValueError, KeyError, TypeError, AttributeError) as exc:
        raise CorruptFileError(f"{index}: not a valid shard index ({exc})") from exc
    if not all(isinstance(s, str) and s for s in shards):
        raise CorruptFileError(f"{index}: not a valid shard index (a shard name that is not a file name)")
    for shard in shards:
        if os.path.isabs(shard) or os.path.normpath(shard).split(os.sep)[0] == os.pardir:
            raise CorruptFileError(
                f"{index}: lists the shard {shard!r}, outside its directory {index.parent}; a shard index names "
                "files beside it: move the shard there and list it by its name"
            )
    return shards
