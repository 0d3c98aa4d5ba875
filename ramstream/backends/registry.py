"""The one registry of compute backends, filled by the explicit list in ``_builtin_backends``.

A backend is made by name with the run's ``BackendSettings`` (threads, device, GPU memory); a
backend whose library is an optional extra is imported only when asked for, and a missing extra
is one line saying how to install it.
"""

from __future__ import annotations

import importlib
from collections.abc import Callable
from dataclasses import dataclass
from types import ModuleType

from ramstream.backends.base import Backend
from ramstream.backends.settings import BackendSettings
from ramstream.config import RunOptions
from ramstream.errors import MissingDependencyError
from ramstream.io.heap import map_large_buffers
from ramstream.registry import Registry


@dataclass(frozen=True)
class BackendSpec:
    name: str
    summary: str
    module: str  # imported on first use: its library may be an optional extra
    factory: str  # the name in ``module`` that makes the backend: factory(settings)
    extra: str | None = None  # the optional library (and the ramstream extra installing it)
    # the name in ``module`` that prepares a run of a method (prepare(method) -> stop), if any
    prepare: str | None = None
    # the name in ``module`` that starts, on a thread, what making a backend with these settings
    # would otherwise spend its first seconds on (warm(settings); the torch backend: CUDA's
    # initialisation), if any; the factory waits for it
    warm: str | None = None

    def load(self) -> Callable[[BackendSettings], Backend]:
        return getattr(self._module(), self.factory)  # type: ignore[no-any-return]

    def prepared(self, method: str) -> Callable[[], None]:
        """Start what the backend does ahead of a run of ``method``; returns what stops it."""
        if self.prepare is None:
            return _nothing
        return getattr(self._module(), self.prepare)(method)  # type: ignore[no-any-return]

    def warmed(self, settings: BackendSettings) -> None:
        """Start what making this backend with ``settings`` would otherwise wait for."""
        if self.warm is not None:
            getattr(self._module(), self.warm)(settings)

    def _module(self) -> ModuleType:
        try:
            return importlib.import_module(self.module)
        except ModuleNotFoundError as exc:
            if self.extra is None or (exc.name or "").split(".")[0] != self.extra:
                raise
            raise MissingDependencyError(
                f"--backend {self.name} needs {self.extra}, which is not installed: "
                f"pip install 'ramstream[{self.extra}]'"
            ) from None


def _nothing() -> None:
    pass


def _builtin_backends() -> list[BackendSpec]:
    return [
        BackendSpec(
            "numba", "Numba-parallel kernels on the CPU", "ramstream.backends.numba.backend", "make", prepare="prepare"
        ),
        BackendSpec(
            "torch",
            "torch on a CUDA GPU (pinned, streamed tiles) or on the CPU",
            "ramstream.backends.torch.backend",
            "make",
            extra="torch",
            warm="warm",
        ),
    ]


_REGISTRY: Registry[BackendSpec] = Registry("backend", _builtin_backends)


def backend_names() -> list[str]:
    return _REGISTRY.names()


def load_backend(name: str) -> None:
    """Import a backend's code (and its library) without making one."""
    _REGISTRY.get(name).load()


def prepare_backend(name: str, method: str) -> Callable[[], None]:
    """Start what backend ``name`` does ahead of a merge with ``method`` (the Numba backend:
    compile the kernels the merge calls later in child processes); returns what stops it."""
    return _REGISTRY.get(name).prepared(method)


def make_backend(
    name: str = "numba",
    threads: int | None = None,
    device: str | None = None,
    gpu_memory: int | None = None,
    memory: int | None = None,
) -> Backend:
    if memory is not None:
        map_large_buffers(memory)
    return _REGISTRY.get(name).load()(BackendSettings(threads, device, gpu_memory, memory))


def warm_backend(options: RunOptions) -> None:
    """Start what making the run's backend would otherwise wait for at its first use (the torch
    backend on CUDA: the device's initialisation), while the run opens its inputs and plans."""
    _REGISTRY.get(options.backend).warmed(_settings(options))


def backend_for(options: RunOptions) -> Backend:
    """The run's compute backend, with its thread count (scoped to its own calls) and device."""
    map_large_buffers(options.memory)  # a run's peak is what it holds, not what it held (io/heap.py)
    return _REGISTRY.get(options.backend).load()(_settings(options))


def _settings(options: RunOptions) -> BackendSettings:
    return BackendSettings(options.threads, options.device, options.gpu_memory, options.memory)
