"""Lab checkpoints as Hugging Face style directories: bf16 ``model.safetensors`` + ``config.json``.

Loading also reads what ``ramstream merge`` writes (sharded files with
``model.safetensors.index.json``), so merged models are evaluated like any other checkpoint.
A directory that is not a lab checkpoint is refused with one line (``InputError``): the
evaluator's command line is pointed at user paths.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import torch
from safetensors import SafetensorError
from safetensors.torch import load_file, save_file

from ramstream.errors import InputError
from ramstream.lab.model import AgentsLabLM
from ramstream.lab.tasks import MODEL_TYPE, ModelShape


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
    """A float32 model holding exactly the checkpoint's (bf16) values, in eval mode; anything but a
    lab checkpoint (other model, missing or unreadable files, other tensors) is an ``InputError``."""
    model = AgentsLabLM(_shape(directory))
    try:
        tensors = read_tensors(directory)
    except FileNotFoundError as exc:
        missing = Path(exc.filename or "model.safetensors").name
        raise InputError(f"{directory}: no {missing}; the checkpoint's weights are missing") from None
    except (OSError, ValueError, KeyError, SafetensorError) as exc:
        raise InputError(f"{directory}: its weights cannot be read ({_one_line(exc)})") from None
    _check_tensors(directory, model, tensors)
    model.load_state_dict({k: v.to(torch.float32) for k, v in tensors.items()}, strict=True)
    return model.eval()


def _shape(directory: Path) -> ModelShape:
    """The model shape its ``config.json`` names; anything but a lab checkpoint is refused."""
    if not directory.is_dir():
        raise InputError(f"{directory}: {'not a directory' if directory.exists() else 'no such directory'}")
    config_path = directory / "config.json"
    try:
        config = json.loads(config_path.read_text())
    except FileNotFoundError:
        raise InputError(f"{directory}: no config.json; give an agents lab checkpoint directory") from None
    except (OSError, ValueError) as exc:
        raise InputError(f"{config_path}: cannot be read as JSON ({_one_line(exc)})") from None
    model_type = config.get("model_type") if isinstance(config, dict) else None
    if model_type != MODEL_TYPE:
        raise InputError(f"{directory}: model_type {model_type!r}, not an agents lab checkpoint ({MODEL_TYPE!r})")
    try:
        return ModelShape.from_config(config)
    except KeyError as exc:
        raise InputError(f"{config_path}: lacks {exc.args[0]}, which a lab checkpoint records") from None


def _check_tensors(directory: Path, model: AgentsLabLM, tensors: dict[str, torch.Tensor]) -> None:
    """The checkpoint holds exactly the model's tensors, each of its shape."""
    want = model.state_dict()
    missing, extra = sorted(want.keys() - tensors.keys()), sorted(tensors.keys() - want.keys())
    if missing:
        raise InputError(f"{directory}: lacks {missing[0]} ({len(missing)} of the lab model's tensors missing)")
    if extra:
        raise InputError(f"{directory}: holds {extra[0]}, which the lab's model does not have ({len(extra)} such)")
    for name, tensor in tensors.items():
        if tensor.shape != want[name].shape:
            raise InputError(
                f"{directory}: {name} has shape {tuple(tensor.shape)}, its config.json says {tuple(want[name].shape)}"
            )


def _one_line(exc: BaseException) -> str:
    return str(exc).strip().splitlines()[0] if str(exc).strip() else type(exc).__name__
