"""The one registry of merge methods, filled by the explicit list in ``_builtin_methods``."""

from __future__ import annotations

from ramstream.errors import ConfigError
from ramstream.methods.base import MethodSpec

_REGISTRY: dict[str, MethodSpec] = {}


def _builtin_methods() -> list[MethodSpec]:
    """Every method ramstream ships, in the order ``--help`` lists them."""
    from ramstream.methods import dare, della, linear, magnitude, model_stock, ram, task_arithmetic

    return [
        *(ram.ram_spec(name) for name in ram.RAM_METHODS),
        linear.LINEAR,
        task_arithmetic.TASK_ARITHMETIC,
        dare.DARE_LINEAR,
        dare.DARE_TIES,
        model_stock.MODEL_STOCK,
        *(magnitude.magnitude_spec(name) for name in magnitude.MAGNITUDE_METHODS),
        *(della.della_spec(name) for name in della.DELLA_METHODS),
    ]


def register(spec: MethodSpec) -> None:
    if spec.name in _REGISTRY:
        raise ValueError(f"method {spec.name!r} registered twice")
    _REGISTRY[spec.name] = spec


def _ensure_builtins() -> None:
    if not _REGISTRY:
        for spec in _builtin_methods():
            register(spec)


def get_method(name: str) -> MethodSpec:
    _ensure_builtins()
    try:
        return _REGISTRY[name]
    except KeyError:
        raise ConfigError(f"unknown method {name!r}; choose one of {', '.join(method_names())}") from None


def method_names() -> list[str]:
    _ensure_builtins()
    return list(_REGISTRY)
