"""The values the options take: sizes, per-agent lists, method settings and method names."""

from __future__ import annotations

import re
from typing import Any

import click

from ramstream.config import parse_size
from ramstream.errors import RamstreamError, excerpt


class MethodName(click.ParamType):
    """A registered method; the registry is read only when a value or the help needs it (it
    imports the methods, which ``inspect`` and ``status`` never need)."""

    name = "method"

    def get_metavar(self, param: click.Parameter, ctx: click.Context | None = None) -> str:
        from ramstream.methods.registry import method_names

        return "[" + "|".join(method_names()) + "]"

    def convert(self, value: Any, param: click.Parameter | None, ctx: click.Context | None) -> str:
        from ramstream.methods.registry import method_names

        names = method_names()
        if value not in names:
            self.fail(f"{value!r} is not one of {', '.join(map(repr, names))}.", param, ctx)
        return str(value)


class FloatList(click.ParamType):
    """Comma-separated numbers: one per agent, or one for every agent."""

    name = "x[,x...]"

    def convert(self, value: Any, param: click.Parameter | None, ctx: click.Context | None) -> list[float]:
        if isinstance(value, list):
            return value
        try:
            return [float(x) for x in str(value).split(",")]
        except ValueError:
            self.fail(f"{value!r} is not a comma-separated list of numbers", param, ctx)


# A number with an exponent but no dot (``1e8``): YAML 1.1 reads it as text, the user means a number.
_EXPONENT_NUMBER = re.compile(r"[-+]?(\d+\.?\d*|\.\d+)[eE][-+]?\d+")


def _yaml_flow(text: str) -> Any:
    """``text`` read as YAML with the configs' own bounds (aliases, nesting and size checked before
    anything is built, keys given twice refused); numbers such as ``1e8`` read as numbers."""
    from ramstream.errors import ConfigError
    from ramstream.mergekit_config.safe_yaml import load

    try:
        parsed = load(text, "the value")
    except ConfigError as exc:
        raise ValueError(str(exc).removeprefix("the value: ")) from None
    return _numbers(parsed)


def _numbers(value: Any) -> Any:
    """``value`` with every text that is a number in exponent form (``1e8``) made a float."""
    if isinstance(value, str) and _EXPONENT_NUMBER.fullmatch(value.strip()):
        return float(value)
    if isinstance(value, list):
        return [_numbers(v) for v in value]
    if isinstance(value, dict):
        return {k: _numbers(v) for k, v in value.items()}
    return value


class SettingValue(click.ParamType):
    """A number, or a gradient / filters in YAML flow syntax, as in a mergekit config:
    ``0.5``, ``[0, 0.5, 1]``, ``[{filter: self_attn, value: [0, 1]}, {value: 0.5}]``."""

    name = "value"

    def convert(self, value: Any, param: click.Parameter | None, ctx: click.Context | None) -> Any:
        if not isinstance(value, str):
            return value
        try:
            parsed = _yaml_flow(value)
        except ValueError as exc:
            self.fail(
                f"{excerpt(value)} is not a number, a gradient [a, b, ...] or filters in YAML flow ({exc})", param, ctx
            )
        if parsed is None or isinstance(parsed, bool) or not isinstance(parsed, (int, float, str, list, dict)):
            self.fail(f"{excerpt(value)} is not a number, a gradient [a, b, ...] or filters in YAML flow", param, ctx)
        return parsed


class SettingList(FloatList):
    """Comma-separated values, one per agent or one for every agent; each a number, or (where a
    method varies the parameter per tensor) a gradient or filters in YAML flow syntax."""

    def convert(self, value: Any, param: click.Parameter | None, ctx: click.Context | None) -> list[Any]:
        if isinstance(value, list) or not any(c in str(value) for c in "[{"):
            return super().convert(value, param, ctx)
        try:
            parsed = _yaml_flow(f"[{value}]")
        except ValueError as exc:
            self.fail(f"{excerpt(value)} is not a comma-separated list of values ({exc})", param, ctx)
        return list(parsed)


class Size(click.ParamType):
    """A size in bytes, written as ``--memory`` takes it: ``64MiB``, ``8GiB``."""

    name = "size"

    def convert(self, value: Any, param: click.Parameter | None, ctx: click.Context | None) -> int:
        if isinstance(value, int):
            return value
        try:
            return parse_size(value)
        except RamstreamError as exc:
            self.fail(str(exc), param, ctx)
