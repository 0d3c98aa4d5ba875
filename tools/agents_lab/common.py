"""Small helpers shared by the lab commands: seeding, threads and a timer."""

from __future__ import annotations

import hashlib
import time
from collections.abc import Callable
from pathlib import Path

import numpy as np
import torch

Log = Callable[[str], None]


def seed_everything(seed: int) -> tuple[np.random.Generator, torch.Generator]:
    """A numpy generator for prompts and a torch generator for sampling, both from ``seed``;
    the global torch seed (parameter init) too."""
    torch.manual_seed(seed)
    return np.random.default_rng(seed), torch.Generator().manual_seed(seed)


def set_threads(threads: int | None) -> None:
    if threads is not None:
        torch.set_num_threads(threads)


class Timer:
    def __init__(self) -> None:
        self.start = time.perf_counter()

    def __call__(self) -> float:
        return time.perf_counter() - self.start


def weights_digest(checkpoint: Path) -> str:
    """sha256 of a checkpoint's model.safetensors: which base an agent was trained from."""
    return hashlib.sha256((checkpoint / "model.safetensors").read_bytes()).hexdigest()
