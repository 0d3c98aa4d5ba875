"""A config's values as mergekit validates them: names, parameter mappings, numbers (YAML may
read ``1e-5`` as text), dtypes, and settings that may vary per tensor (``chain``)."""

from __future__ import annotations

import math
from collections.abc import Mapping
from typing import Any

from ramstream.errors import excerpt
from ramstream.mergekit_config.tables import OUT_DTYPES, REFUSED_KEYS, TOP_KEYS, Fail, Param


def name_of(doc: Mapping[str, Any], key: str, fail: Fail) -> str | None:
    """A value that names something (a method, a dtype): a string, or absent."""
    value = doc.get(key)
    if value is not None and not isinstance(value, str):
        raise fail(f"{key}: expected a name, got a {type(value).__name__} ({excerpt(value)})")
    return value


def check_keys(doc: Any, fail: Fail) -> None:
    """A mapping of the top-level keys ramstream reads; the others are refused by name."""
    if not isinstance(doc, Mapping):
        raise fail("a mergekit config is a mapping with merge_method, base_model and models")
    for key in doc:
        if key in REFUSED_KEYS:
            raise fail(REFUSED_KEYS[key])
        if key not in TOP_KEYS:
            raise fail(f"unknown key {excerpt(key)} (ramstream reads {', '.join(TOP_KEYS)})")


def dtype_name(value: Any, key: str, fail: Fail) -> str | None:
    if value is None:
        return None
    name = value[len("torch.") :] if isinstance(value, str) and value.startswith("torch.") else value
    if name not in OUT_DTYPES:
        raise fail(f"{key}: {excerpt(value)} is not supported (bfloat16, float16 or float32)")
    return str(name)


def check_tokenizer(doc: Mapping[str, Any], fail: Fail) -> None:
    source = name_of(doc, "tokenizer_source", fail)
    if source not in (None, "base"):
        raise fail(
            f"tokenizer_source: {excerpt(source)} is not supported: ramstream copies the tokenizer files "
            "from base_model (tokenizer_source: base)"
        )


def parameters_of(value: Any, where: str, fail: Fail) -> dict[str, Any]:
    if value is None:
        return {}
    if not isinstance(value, Mapping):
        raise fail(f"{where}.parameters must be a mapping of parameter names to values")
    return {str(key): setting for key, setting in value.items()}


def chain(param: Param, scopes: list[tuple[str, Any]], fail: Fail) -> Any:
    """The scopes' settings (where each is written, its value or None), as one list of conditions
    tried in order (the method's parser, ``methods.tensor_settings``, reads it); a plain value
    when that is all there is."""
    conditions: list[Any] = []
    for where, value in scopes:
        if value is None:
            continue
        if isinstance(value, Mapping):
            conditions.append(value)
        elif isinstance(value, list) and value and all(isinstance(v, Mapping) for v in value):
            conditions += value
        elif isinstance(value, list) and any(isinstance(v, (list, Mapping)) for v in value):
            raise fail(f"{where}.{param.name}: a gradient is a list of numbers, got {excerpt(value)}")
        elif isinstance(value, list):
            conditions.append({"value": value})
        else:  # a number, which YAML may have read as text ("1e-5")
            conditions.append({"value": value_of(param, value, where, fail)})
    default = _default(param)
    if default is not None:
        conditions.append({"value": default})
    if not conditions:
        return None
    first = conditions[0]
    if "filter" not in first and len(first) == 1 and "value" in first:
        return first["value"]  # it applies everywhere: the rest are never asked
    return conditions


def _default(param: Param) -> float | None:
    return None if param.default is None else float(param.default)


def value_of(param: Param, value: Any, where: str, fail: Fail) -> float | bool:
    """A scalar as mergekit's validation reads it (YAML strings like ``1e-5`` are numbers)."""
    if param.kind == "bool":
        if isinstance(value, bool):
            return value
        if isinstance(value, str) and value.lower() in ("true", "false"):
            return value.lower() == "true"
        raise fail(f"{where}.{param.name} must be true or false, got {excerpt(value)}")
    try:
        if isinstance(value, bool):
            raise ValueError
        number = float(value)
    except (TypeError, ValueError):
        raise fail(f"{where}.{param.name} must be a number, got {excerpt(value)}") from None
    if not math.isfinite(number):
        raise fail(f"{where}.{param.name} must be a finite number, got {excerpt(value)}")
    return number
