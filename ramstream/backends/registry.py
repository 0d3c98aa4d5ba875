"""The one registry of compute backends, filled by the explicit list in ``_builtin_backends``.

A backend is made by name with the run's thread count; a backend whose library is an optional
extra is imported only when asked for.
"""

from __future__ import annotations

import importlib
from collections.abc import Callable
from dataclasses import dataclass

from ramstream.backends.base import Backend
from ramstream.registry import Registry


@dataclass(frozen=True)
class BackendSpec:
    name: str
    summary: str
    module: str  # imported on first use: its library may be an optional extra
    factory: str  # the name in ``module`` that makes the backend: factory(threads)

    def load(self) -> Callable[[int | None], Backend]:
        return getattr(importlib.import_module(self.module), self.factory)  # type: ignore[no-any-return]


def _builtin_backends() -> list[BackendSpec]:
    return [
        BackendSpec("numba", "Numba-parallel kernels on the CPU", "ramstream.backends.numba.backend", "NumbaBackend")
    ]


_REGISTRY: Registry[BackendSpec] = Registry("backend", _builtin_backends)


def backend_names() -> list[str]:
    return _REGISTRY.names()


def load_backend(name: str) -> None:
    """Import a backend's code (and its library) without making one."""
    _REGISTRY.get(name).load()


def make_backend(name: str = "numba", threads: int | None = None) -> Backend:
    return _REGISTRY.get(name).load()(threads)
