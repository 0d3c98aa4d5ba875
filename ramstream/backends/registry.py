"""The one registry of compute backends, filled by the explicit list in ``_builtin_backends``.

A backend is made by name with the run's thread count; a backend whose library is an optional
extra is imported only when asked for.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

from ramstream.backends.base import Backend
from ramstream.errors import ConfigError


@dataclass(frozen=True)
class BackendSpec:
    name: str
    summary: str
    make: Callable[[int | None], Backend]  # make(threads) -> a backend


def _numba(threads: int | None) -> Backend:
    from ramstream.backends.numba.backend import NumbaBackend

    return NumbaBackend(threads)


def _builtin_backends() -> list[BackendSpec]:
    return [BackendSpec("numba", "Numba-parallel kernels on the CPU", _numba)]


_REGISTRY: dict[str, BackendSpec] = {}


def register(spec: BackendSpec) -> None:
    if spec.name in _REGISTRY:
        raise ValueError(f"backend {spec.name!r} registered twice")
    _REGISTRY[spec.name] = spec


def _ensure_builtins() -> None:
    if not _REGISTRY:
        for spec in _builtin_backends():
            register(spec)


def backend_names() -> list[str]:
    _ensure_builtins()
    return list(_REGISTRY)


def make_backend(name: str = "numba", threads: int | None = None) -> Backend:
    _ensure_builtins()
    spec = _REGISTRY.get(name)
    if spec is None:
        raise ConfigError(f"unknown backend {name!r}; choose one of {', '.join(backend_names())}")
    return spec.make(threads)
