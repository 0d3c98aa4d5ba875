"""Validation of the options baseline methods share: per-agent lists, lambda, flags and seeds.

Options arrive from the Python API or the CLI as plain values: a per-agent option is a list with
one value per agent, or one value for every agent. Every check raises ``ConfigError`` naming the
option as the CLI spells it; a refused value is an ``OptionError`` and an option the method does
not read an ``UnknownOptions``, which keep what they refuse apart from the flag, so that a
mergekit config or a sweep grid can name the key its user wrote instead.
"""

from __future__ import annotations

import math
from collections.abc import Callable
from typing import Any, TypeVar

import numpy as np

from ramstream.errors import ConfigError, excerpt

T = TypeVar("T")


def flag_name(name: str) -> str:
    return "--" + name.replace("_", "-")


class OptionError(ConfigError):
    """A value of option ``name`` refused: ``problem`` says why (``must lie in [0, 1], got 1.5``),
    ``item`` which value of a per-agent list (None: the one value). It reads as the flag's message;
    a config or a grid puts its own key in front of ``problem`` instead."""

    def __init__(self, name: str, problem: str, item: int | None = None) -> None:
        super().__init__(f"{flag_name(name)} {problem}")
        self.name, self.problem, self.item = name, problem, item

    def __reduce__(self) -> tuple[Any, ...]:  # pickles with its fields, not its message
        return type(self), (self.name, self.problem, self.item)

    def at(self, item: int) -> OptionError:
        """The same refusal, of value ``item`` of a list."""
        return OptionError(self.name, self.problem, item)


class UnknownOptions(ConfigError):
    """Options ``method`` does not read (``names``), and those it reads (``reads``), so that a grid
    can say which of its parameters is wrong and what would be right."""

    def __init__(self, method: str, names: tuple[str, ...], reads: tuple[str, ...]) -> None:
        super().__init__(f"{', '.join(map(flag_name, names))} has no effect with --method {method}")
        self.method, self.names, self.reads = method, names, reads

    def __reduce__(self) -> tuple[Any, ...]:
        return type(self), (self.method, self.names, self.reads)


FLOAT32_MAX = float(np.finfo(np.float32).max)


def number(name: str, value: Any) -> float:
    """A finite real number within float32's range, where the kernels compute (bools and strings
    are refused: ``True`` is not a weight; 1e300 would be Inf in every merged value)."""
    try:
        if isinstance(value, (bool, str, bytes)):
            raise TypeError
        result = float(value)
    except (TypeError, ValueError):
        raise OptionError(name, f"must be a number, got {excerpt(value)}") from None
    if not math.isfinite(result):
        raise OptionError(name, f"must be a finite number, got {excerpt(value)}")
    if abs(result) > FLOAT32_MAX:
        raise OptionError(name, f"overflows float32 (|x| <= 3.4e38, where merges compute), got {excerpt(value)}")
    return result


def per_agent(name: str, value: Any, n_agents: int) -> tuple[float, ...]:
    """One finite number per agent, from a list of ``n_agents`` values or one value for all."""
    if isinstance(value, (list, tuple, np.ndarray)):
        values: list[Any] = list(np.ravel(value)) if isinstance(value, np.ndarray) else list(value)
        if len(values) == 1:
            values = values * n_agents
        if len(values) != n_agents:
            raise OptionError(name, f"needs one value per agent ({n_agents}) or one for all, got {len(values)}")
        return tuple(item(i, number, name, v) for i, v in enumerate(values))
    return (number(name, value),) * n_agents


def item(i: int, check: Callable[..., T], *args: Any) -> T:
    """``check(*args)``, its refusal naming value ``i`` of a list (a config names that model's key)."""
    try:
        return check(*args)
    except OptionError as exc:
        raise exc.at(i) from None


def boolean(name: str, value: Any) -> bool:
    if not isinstance(value, bool):
        raise OptionError(name, f"must be true or false, got {excerpt(value)}")
    return value


def seed(name: str, value: Any) -> int:
    if isinstance(value, bool) or not isinstance(value, int) or not 0 <= value < 2**63:
        raise OptionError(name, f"must be an integer in [0, 2**63), got {excerpt(value)}")
    return int(value)


def in_range(name: str, values: tuple[float, ...], low: float, high: float, low_open: bool = False) -> None:
    """Every value in [low, high] (or (low, high] with ``low_open``)."""
    for i, v in enumerate(values):
        if v > high or v < low or (low_open and v == low):
            bracket = "(" if low_open else "["
            raise OptionError(name, f"must lie in {bracket}{low:g}, {high:g}], got {v:g}", i)


def float32_sum(values: tuple[float, ...]) -> np.float32:
    """The float32 sum of ``values`` in order, from +0.0 (as the kernels add weights)."""
    total = np.float32(0.0)
    with np.errstate(over="ignore"):  # an overflow is the caller's to refuse (Inf), not a warning
        for v in values:
            total = np.float32(total + np.float32(v))
    return total
