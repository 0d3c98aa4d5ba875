"""The device a torch backend computes on, chosen once; an unusable choice is one line."""

from __future__ import annotations

import torch

from ramstream.errors import ConfigError


def resolve(name: str | None) -> torch.device:
    """``cpu``, ``cuda`` or ``cuda:N``; None: the current CUDA device if torch sees one, else cpu."""
    if name is None:
        return _cuda(None) if torch.cuda.is_available() else torch.device("cpu")
    if name == "cpu":
        return torch.device("cpu")
    if name == "cuda":
        return _cuda(None)
    if name.startswith("cuda:") and name[5:].isdigit():
        return _cuda(int(name[5:]))
    raise ConfigError(f"--device must be cpu, cuda or cuda:N (N a device number, say cuda:0), got {name!r}")


def _cuda(index: int | None) -> torch.device:
    if not torch.cuda.is_available():
        built = f"built for CUDA {torch.version.cuda}" if torch.version.cuda else "a CPU-only build"
        raise ConfigError(f"--device cuda: torch {torch.__version__} ({built}) sees no CUDA GPU; use --device cpu")
    count = torch.cuda.device_count()
    if index is None:
        index = torch.cuda.current_device()
    if index >= count:
        raise ConfigError(f"--device cuda:{index}: torch sees {count} CUDA device(s), cuda:0 to cuda:{count - 1}")
    return torch.device("cuda", index)
