"""One frozen run configuration for the Python API and the CLI, and size parsing."""

from __future__ import annotations

import math
import os
import re
from dataclasses import dataclass, field
from pathlib import Path

from ramstream.errors import ConfigError

_UNITS = {
    "": 1,
    "B": 1,
    "K": 1000,
    "KB": 1000,
    "M": 1000**2,
    "MB": 1000**2,
    "G": 1000**3,
    "GB": 1000**3,
    "T": 1000**4,
    "TB": 1000**4,
    "KIB": 1024,
    "MIB": 1024**2,
    "GIB": 1024**3,
    "TIB": 1024**4,
}
_SIZE_RE = re.compile(r"^\s*([0-9]+(?:\.[0-9]+)?)\s*([A-Za-z]*)\s*$")
_DEVICE_RE = re.compile(r"^(cpu|cuda|cuda:[0-9]+)$")

DEFAULT_MEMORY = 1024**3
DEFAULT_SHARD_SIZE = 5 * 1000**3
DEFAULT_EPS = 1e-5
BLOCK_QUANTUM = 64  # a block size is a positive multiple of this many elements
DEFAULT_HUB_TIMEOUT = 10.0  # seconds: huggingface_hub's own default for a request
DEFAULT_SCHEDULER_TIMEOUT = 10.0  # seconds: distributed's own default connect timeout


def parse_size(text: str | int) -> int:
    """Parse ``"8GiB"``, ``"64MiB"``, ``"5GB"`` or a plain byte count into bytes."""
    if isinstance(text, int):
        value = text
    else:
        match = _SIZE_RE.match(text)
        unit = match.group(2).upper() if match else None
        if match is None or unit not in _UNITS:
            raise ConfigError(f"cannot read size {text!r}: use a number with a unit like 64MiB or 8GiB")
        value = int(float(match.group(1)) * _UNITS[unit])
    if value <= 0:
        raise ConfigError(f"size {text!r} must be positive")
    return value


def show_size(nbytes: int) -> str:
    """A size as a message shows one the user gave: in MiB, unrounded (``16.5MiB``), so that a
    budget never reads as the larger one suggested beside it."""
    return f"{nbytes / (1 << 20)!r}".removesuffix(".0") + "MiB"


def default_cache_dir() -> Path:
    """Where indexes live when no ``--index`` is given (the XDG cache convention)."""
    base = os.environ.get("XDG_CACHE_HOME") or str(Path.home() / ".cache")
    return Path(base) / "ramstream"


@dataclass(frozen=True)
class RunOptions:
    """How to run a pass: budget, threads, block size, where to compute and reporting; never
    what to compute. ``backend`` and ``executor`` are registry names (``backends/registry.py``,
    ``execution/registry.py``); every choice gives the same output bytes."""

    memory: int = DEFAULT_MEMORY
    threads: int | None = None
    backend: str = "numba"
    executor: str = "local"
    block_elems: int | None = None
    quiet: bool = False
    cache_dir: Path = field(default_factory=default_cache_dir)
    hf_cache: Path | None = None  # the Hugging Face cache for hub ids (None: huggingface_hub's, HF_HUB_CACHE/HF_HOME)
    hub_timeout: float = DEFAULT_HUB_TIMEOUT  # seconds the hub may take to answer a request
    scheduler: str | None = None  # a running Dask scheduler's address: the blocks run on its workers
    scheduler_timeout: float = DEFAULT_SCHEDULER_TIMEOUT  # seconds for the scheduler to answer, connecting
    dask_workers: int | None = None  # a Dask LocalCluster of this many worker processes, started here
    device: str | None = None  # cpu, cuda or cuda:N (None: the backend's default; torch: cuda if it has one)
    gpu_memory: int | None = None  # bytes of GPU memory the backend may hold (None: its default)

    def __post_init__(self) -> None:
        if self.scheduler is not None and self.dask_workers is not None:
            raise ConfigError("give either --scheduler or --dask-workers, not both")
        if self.dask_workers is not None and self.dask_workers < 1:
            raise ConfigError("--dask-workers must be at least 1")
        if self.scheduler is not None or self.dask_workers is not None:
            if self.executor not in ("local", "dask"):
                raise ConfigError(f"--scheduler and --dask-workers run on the dask executor, not {self.executor!r}")
            object.__setattr__(self, "executor", "dask")  # naming a cluster is choosing to run on it
        elif self.executor == "dask":
            raise ConfigError("the dask executor needs --scheduler ADDRESS or --dask-workers N")
        for name, value in (("--hub-timeout", self.hub_timeout), ("--scheduler-timeout", self.scheduler_timeout)):
            if not 0 < value < math.inf:
                raise ConfigError(f"{name} must be a positive number of seconds, got {value}")
        if self.memory < 16 * 1024**2:
            raise ConfigError("--memory must be at least 16MiB")
        if self.threads is not None and self.threads < 1:
            raise ConfigError("--threads must be at least 1")
        if self.block_elems is not None and (self.block_elems < BLOCK_QUANTUM or self.block_elems % BLOCK_QUANTUM):
            raise ConfigError("block size must be a positive multiple of 64 elements")
        if self.device is not None and not _DEVICE_RE.match(self.device):
            raise ConfigError(f"--device must be cpu, cuda or cuda:N, got {self.device!r}")
        if self.gpu_memory is not None and self.gpu_memory < 16 * 1024**2:
            raise ConfigError("--gpu-memory must be at least 16MiB")
