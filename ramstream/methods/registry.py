"""The one registry of merge methods, filled by explicit calls listed here."""

from __future__ import annotations

from ramstream.errors import ConfigError
from ramstream.methods.base import MethodSpec
from ramstream.methods.ram import RAM_METHODS, ram_spec

_REGISTRY: dict[str, MethodSpec] = {}


def register(spec: MethodSpec) -> None:
    if spec.name in _REGISTRY:
        raise ValueError(f"method {spec.name!r} registered twice")
    _REGISTRY[spec.name] = spec


def get_method(name: str) -> MethodSpec:
    try:
        return _REGISTRY[name]
    except KeyError:
        raise ConfigError(f"unknown method {name!r}; choose one of {', '.join(method_names())}") from None


def method_names() -> list[str]:
    return list(_REGISTRY)


for _name in RAM_METHODS:
    register(ram_spec(_name))
