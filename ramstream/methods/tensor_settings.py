"""Parameters that differ between tensors, as mergekit writes them: gradients and filters.

A mergekit parameter is a number, a *gradient* (a list of numbers interpolated over the layers)
or a list of *conditions* ``{filter: TEXT, value: V}``: the first condition whose filter occurs in
the tensor's name (or has no filter, or ``*``) gives the value, itself a number or a gradient. A
model's own setting is asked first, then the top-level one, then the method's default: as the
conditions are tried in that order, a parameter is one ``Varying`` whose rules are the model's,
then the top level's.

A gradient's value for a tensor of layer i among L layers is mergekit's: with x = i / (L - 1)
(1 when L = 1), s = x (n - 1) for n values, the values at floor(s) and the next, interpolated by
the fraction of s (in float64). Tensors outside the layers (embeddings, final norm, head) take
x = 0: mergekit plans them outside its layer slices. L is one more than the highest layer number
in the tensor names (``format.names.layer_of``).

A gradient may hold more values than the model has layers: mergekit interpolates it all the same
(layer i takes the value at x = i / (L - 1) of the whole list), and so does ramstream, so that
a config written for a deeper model runs unchanged.

``check`` refuses, before any work, what can only be a mistake: a filter that matches no tensor.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np

from ramstream.errors import ConfigError, excerpt
from ramstream.format.names import layer_of
from ramstream.methods import options


@dataclass(frozen=True)
class Rule:
    """One condition: the tensors whose name contains ``filter`` (all when None), and the value
    there: one number, or a gradient over the layers."""

    filter: str | None
    values: tuple[float, ...]

    def matches(self, name: str) -> bool:
        return self.filter is None or self.filter == "*" or self.filter in name

    def at(self, x: float) -> float:
        """The value at layer position x in [0, 1] (mergekit's interpolation)."""
        if len(self.values) == 1:
            return self.values[0]
        scaled = x * (len(self.values) - 1)
        i0 = int(scaled)
        i1 = min(len(self.values) - 1, i0 + 1)
        frac = scaled - i0
        return (1 - frac) * self.values[i0] + frac * self.values[i1]

    def to_json(self) -> Any:
        value: Any = self.values[0] if len(self.values) == 1 else list(self.values)
        return value if self.filter is None else {"filter": self.filter, "value": value}


@dataclass(frozen=True)
class Varying:
    """A parameter that may differ per tensor: rules tried in order, the first match wins."""

    name: str  # the option, for messages
    rules: tuple[Rule, ...]

    def to_json(self) -> Any:
        return [rule.to_json() for rule in self.rules]


Setting = float | Varying


def parse(name: str, value: Any) -> Setting:
    """A number, or a gradient / conditions as mergekit's YAML writes them."""
    return _setting(name, _rules(name, value))


def per_model(name: str, value: Any, count: int, per: str = "model") -> tuple[Setting, ...]:
    """One setting per model (``per``, for messages): a list of ``count`` settings, or one setting
    for all (a list of conditions is one setting, not one value per model)."""
    one = isinstance(value, (list, tuple)) and all(isinstance(v, Mapping) for v in value)
    if isinstance(value, (list, tuple)) and len(value) == count and count > 1 and not one:
        return tuple(options.item(i, parse, name, v) for i, v in enumerate(value))
    if isinstance(value, (list, tuple)) and len(value) == 1:
        return (options.item(0, parse, name, value[0]),) * count
    if isinstance(value, (list, tuple)) and not one:
        raise options.OptionError(name, f"needs one value per {per} ({count}) or one for all, got {len(value)}")
    return (parse(name, value),) * count


def per_agent(name: str, value: Any, count: int) -> tuple[Setting, ...]:
    """``per_model`` for the agents' values (``--weights 1,0.5``, an array from a sweep grid):
    one setting per agent, or one for all."""
    if isinstance(value, np.ndarray):
        value = [float(v) for v in np.ravel(value)]
    return per_model(name, value, count, per="agent")


def per_tensor(settings: Sequence[Setting], names: Sequence[str]) -> np.ndarray:
    """float32 (tensors, len(settings)): each setting's value per tensor, rounded once."""
    if not settings:
        return np.zeros((len(names), 0), np.float32)
    return np.stack([resolve(s, names) for s in settings], axis=1).astype(np.float32)


def per_tensor64(settings: Sequence[Setting], names: Sequence[str]) -> np.ndarray:
    """float64 (tensors, len(settings)): each setting's value per tensor, not rounded (what a
    method compares or multiplies in float64 before rounding, as mergekit's Python floats)."""
    if not settings:
        return np.zeros((len(names), 0), np.float64)
    return np.stack([resolve(s, names) for s in settings], axis=1)


def values(setting: Setting) -> tuple[float, ...]:
    """Every value a setting can give a tensor's interpolation endpoints: a gradient's values lie
    between them, so a range that holds them holds every tensor's value."""
    if not isinstance(setting, Varying):
        return (setting,)
    return tuple(v for rule in setting.rules for v in rule.values)


def in_range(name: str, settings: Sequence[Setting], low: float, high: float, low_open: bool = False) -> None:
    """``options.in_range`` over every value the settings can give any tensor; a refusal names
    the setting's position (the agent's, for per-agent settings)."""
    for i, setting in enumerate(settings):
        options.item(i, options.in_range, name, values(setting), low, high, low_open)


def uniform(settings: Sequence[Setting]) -> tuple[float, ...] | None:
    """The values when none varies per tensor (what reports can show per agent), else None."""
    values = tuple(s for s in settings if not isinstance(s, Varying))
    return values if len(values) == len(settings) else None


def _setting(name: str, rules: list[Rule]) -> Setting:
    """One number where a single rule without a filter gives one value everywhere."""
    if len(rules) == 1 and rules[0].filter is None and len(rules[0].values) == 1:
        return rules[0].values[0]
    return Varying(name, tuple(rules))


def chain(name: str, scopes: Sequence[Any], default: float | None) -> Setting | None:
    """The setting of a parameter given in several scopes (most specific first, None where a scope
    does not give it), then ``default``: None when nothing gives it and there is no default."""
    rules: list[Rule] = []
    for value in scopes:
        if value is not None:
            rules += _rules(name, value)
    if default is not None:
        rules.append(Rule(None, (default,)))
    rules = _reachable(rules)
    return _setting(name, rules) if rules else None


def _reachable(rules: list[Rule]) -> list[Rule]:
    """The rules up to the first that matches every tensor (those after it are never asked)."""
    for i, rule in enumerate(rules):
        if rule.filter is None or rule.filter == "*":
            return rules[: i + 1]
    return rules


def _rules(name: str, value: Any) -> list[Rule]:
    if isinstance(value, Varying):
        return list(value.rules)
    if isinstance(value, Mapping):
        return [_condition(name, value)]
    if isinstance(value, (list, tuple)):
        if not value:
            raise ConfigError(f"{name}: an empty list gives no value")
        if all(isinstance(v, Mapping) for v in value):
            return [_condition(name, v) for v in value]
        return [Rule(None, _gradient(name, value))]
    return [Rule(None, (_number(name, value),))]


def _condition(name: str, entry: Mapping[str, Any]) -> Rule:
    extra = sorted(set(map(str, entry)) - {"filter", "value"})
    if extra or "value" not in entry:
        raise ConfigError(f"{name}: a condition is {{filter: TEXT, value: V}}, got {excerpt(dict(entry))}")
    where = entry.get("filter")
    if where is not None and not isinstance(where, str):
        raise ConfigError(f"{name}: filter must be text (part of tensor names), got {excerpt(where)}")
    value = entry["value"]
    if isinstance(value, Mapping) or (isinstance(value, (list, tuple)) and any(isinstance(v, Mapping) for v in value)):
        raise ConfigError(f"{name}: a condition's value is a number or a gradient, got {excerpt(value)}")
    values = _gradient(name, value) if isinstance(value, (list, tuple)) else (_number(name, value),)
    return Rule(where, values)


def _gradient(name: str, values: Sequence[Any]) -> tuple[float, ...]:
    if not values:
        raise ConfigError(f"{name}: an empty gradient gives no value")
    if any(isinstance(v, (list, tuple, Mapping)) for v in values):
        raise ConfigError(f"{name}: a gradient is a list of numbers, got {excerpt(list(values))}")
    return tuple(_number(name, _yaml_number(v)) for v in values)


def _number(name: str, value: Any) -> float:
    return options.number(name, value)  # an OptionError: --lambda must be a number, or a config's key


def _yaml_number(value: Any) -> Any:
    """YAML reads ``1e-5`` as text; mergekit validates it as the number it spells."""
    if isinstance(value, str):
        try:
            return float(value)
        except ValueError:
            return value
    return value


def layer_positions(names: Sequence[str]) -> np.ndarray:
    """Each tensor's x in [0, 1] for gradients: i / (L - 1) in layer i (1 when L = 1), 0 outside."""
    count = n_layers(names)
    layers = [layer_of(n) for n in names]
    return np.array([0.0 if i is None else (i / (count - 1) if count > 1 else 1.0) for i in layers], np.float64)


def n_layers(names: Sequence[str]) -> int:
    """One more than the highest layer number in the names (0 without layers)."""
    return max((i for i in (layer_of(n) for n in names) if i is not None), default=-1) + 1


def resolve(setting: Setting, names: Sequence[str]) -> np.ndarray:
    """float64 per tensor. Every tensor must get a value (``chain`` adds the default)."""
    if not isinstance(setting, Varying):
        return np.full(len(names), setting, np.float64)
    xs = layer_positions(names)
    out = np.empty(len(names), np.float64)
    for i, (name, x) in enumerate(zip(names, xs, strict=True)):
        rule = next((r for r in setting.rules if r.matches(name)), None)
        if rule is None:
            raise ConfigError(
                f"{setting.name}: no value for tensor {excerpt(name)} (no filter matches it); "
                "add a condition without a filter as the default"
            )
        out[i] = rule.at(float(x))
    return out


def check(settings: Sequence[Setting | None], names: Sequence[str]) -> None:
    """Refuse a filter that matches no tensor."""
    for setting in settings:
        if not isinstance(setting, Varying):
            continue
        for rule in setting.rules:
            if rule.filter not in (None, "*") and not any(rule.matches(n) for n in names):
                raise ConfigError(
                    f"{setting.name}: the filter {excerpt(rule.filter)} matches no tensor of the model "
                    "(a filter is part of a tensor name, e.g. self_attn or mlp)"
                )
        resolve(setting, names)  # every tensor must get a value


def to_json(setting: Setting | None) -> Any:
    return setting.to_json() if isinstance(setting, Varying) else setting
