"""The one registry of merge methods, filled by the explicit list in ``_builtin_methods``."""

from __future__ import annotations

from ramstream.methods.base import MethodSpec
from ramstream.registry import Registry


def _builtin_methods() -> list[MethodSpec]:
    """Every method ramstream ships, in the order ``--help`` lists them."""
    from ramstream.methods import (
        arcee_fusion,
        dare,
        della,
        linear,
        magnitude,
        model_stock,
        nearswap,
        ram,
        sce,
        slerp,
        sphere_mean,
        task_arithmetic,
    )

    return [
        *(ram.ram_spec(name) for name in ram.RAM_METHODS),
        linear.LINEAR,
        task_arithmetic.TASK_ARITHMETIC,
        dare.DARE_LINEAR,
        dare.DARE_TIES,
        model_stock.MODEL_STOCK,
        *(magnitude.magnitude_spec(name) for name in magnitude.MAGNITUDE_METHODS),
        *(della.della_spec(name) for name in della.DELLA_METHODS),
        slerp.SLERP,
        slerp.NUSLERP,
        sphere_mean.MULTISLERP,
        sphere_mean.KARCHER,
        nearswap.NEARSWAP,
        arcee_fusion.ARCEE_FUSION,
        sce.SCE,
    ]


_REGISTRY: Registry[MethodSpec] = Registry("method", _builtin_methods)


def register(spec: MethodSpec) -> None:
    _REGISTRY.register(spec)


def get_method(name: str) -> MethodSpec:
    return _REGISTRY.get(name)


def method_names() -> list[str]:
    return _REGISTRY.names()
