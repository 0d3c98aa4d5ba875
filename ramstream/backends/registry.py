"""The one registry of compute backends, filled by the explicit list in ``_builtin_backends``.

A backend is made by name with the run's thread count; a backend whose library is an optional
extra is imported only when asked for.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

from ramstream.backends.base import Backend
from ramstream.registry import Registry


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


_REGISTRY: Registry[BackendSpec] = Registry("backend", _builtin_backends)


def backend_names() -> list[str]:
    return _REGISTRY.names()


def make_backend(name: str = "numba", threads: int | None = None) -> Backend:
    return _REGISTRY.get(name).make(threads)
