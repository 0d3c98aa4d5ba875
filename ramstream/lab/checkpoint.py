"""Lab checkpoints as Hugging Face style directories: bf16 ``model.safetensors`` + ``config.json``.

Loading also reads what ``ramstream merge`` writes (sharded files with
``model.safetensors.index.json``), so merged models are evaluated like any other checkpoint.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import torch
from safetensors.torch import load_file, save_file

from ramstream.lab.model import AgentsLabLM
from ramstream.lab.tasks import ModelShape


def round_bf16_(model: torch.nn.Module) -> None:
    """Round every parameter, in place, to the nearest bfloat16 (ties to even)."""
    with torch.no_grad():
        for p in model.parameters():
            p.copy_(p.to(torch.bfloat16).to(p.dtype))


def save_checkpoint(model: AgentsLabLM, directory: Path, lab: dict[str, Any] | None = None) -> Path:
    """Write ``model`` as bf16 safetensors; ``lab`` (how it was made) goes into config.json."""
    directory.mkdir(parents=True, exist_ok=True)
    tensors = {name: p.detach().to(torch.bfloat16).contiguous() for name, p in model.state_dict().items()}
    save_file(tensors, str(directory / "model.safetensors"), metadata={"format": "pt"})
    config = model.shape.config()
    if lab is not None:
        config["agents_lab"] = lab
    (directory / "config.json").write_text(json.dumps(config, indent=2) + "\n")
    return directory


def read_tensors(directory: Path) -> dict[str, torch.Tensor]:
    """All tensors of a checkpoint directory (single file or shards), as stored."""
    index = directory / "model.safetensors.index.json"
    if index.is_file():
        files = sorted(set(json.loads(index.read_text())["weight_map"].values()))
    else:
        files = ["model.safetensors"]
    tensors: dict[str, torch.Tensor] = {}
    for name in files:
        tensors.update(load_file(str(directory / name)))
    return tensors


def load_checkpoint(directory: Path) -> AgentsLabLM:
    """A float32 model holding exactly the checkpoint's (bf16) values, in eval mode."""
    config = json.loads((directory / "config.json").read_text())
    model = AgentsLabLM(ModelShape.from_config(config))
    state = {k: v.to(torch.float32) for k, v in read_tensors(directory).items()}
    model.load_state_dict(state, strict=True)
    return model.eval()
