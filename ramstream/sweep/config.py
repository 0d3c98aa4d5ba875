"""A sweep's candidates as mergekit configs: ``ramstream sweep --config sweep.yml``.

Two forms, both made of configs ``ramstream merge --config`` reads:

- **a list of configs**, one per candidate: a YAML sequence of mappings, or several YAML
  documents separated by ``---``. Every config names the same ``base_model`` and ``models`` (one
  family); each may add ``name:``, the candidate's directory (otherwise derived from its method
  and settings, like a grid's).
- **one config with a ``sweep:`` key**: a mapping of ``merge_method`` or top-level parameter
  names to lists of values. The candidates are the cross product, in the order written (the last
  key varies fastest); a value replaces that entry of the top-level ``parameters:`` (a model's
  own ``parameters`` still override it, as in mergekit). Each is named after its method and its
  swept values: ``ties-density=0.2-lambda=0.5``.

Every candidate is translated exactly as ``merge --config`` translates a config
(``mergekit_config.parse``), so its directory holds the bytes that merge writes. Settings that
cannot differ between candidates of one sweep (``out_dtype``/``dtype``, and RAM's ``epsilon``:
the index is per epsilon) must agree; they are returned in ``shared``.
"""

from __future__ import annotations

import itertools
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from ramstream import mergekit_config
from ramstream.errors import ConfigError
from ramstream.mergekit_config import safe_yaml
from ramstream.runs.config_values import check_config_values
from ramstream.sweep.grid import Candidate, check_label, check_unique

SWEEP_KEY = "sweep"
NAME_KEY = "name"
# One value for the whole sweep (arguments of ``api.sweep``), and what a config calls them.
SHARED = {"eps": "parameters.epsilon", "out_dtype": "out_dtype (or dtype)"}


@dataclass(frozen=True)
class SweepConfig:
    """The family and the candidates a sweep config describes, and its sweep-wide settings."""

    source: Path
    base: Path
    agents: tuple[Path, ...]
    candidates: tuple[Candidate, ...]
    shared: Mapping[str, Any]  # keyword arguments of ``api.sweep`` (eps, out_dtype) the configs set


def load(path: str | Path) -> SweepConfig:
    """Read a sweep config in either form; ``ConfigError`` names the file, the candidate and what
    cannot be run."""
    path = Path(path)
    docs = [d for d in safe_yaml.load_all(mergekit_config.read_text(path), path) if d is not None]
    if len(docs) == 1 and isinstance(docs[0], list):
        docs = docs[0]
    if not docs:
        raise ConfigError(f"{path}: no candidates; write a list of mergekit configs, or one with a sweep: key")
    if len(docs) == 1 and isinstance(docs[0], Mapping) and SWEEP_KEY in docs[0]:
        entries = _cross_product(docs[0], path)
    else:
        entries = [_listed(doc, i, path) for i, doc in enumerate(docs)]
    return _gather(path, entries)


def _listed(doc: Any, i: int, source: Path) -> tuple[str, Any, str | None]:
    """One config of a list: where it is (for messages), the config, its ``name`` if given."""
    where = f"candidate {i + 1}"
    if not isinstance(doc, Mapping):
        raise ConfigError(f"{source}: {where} is not a mergekit config (a mapping with merge_method, models...)")
    if SWEEP_KEY in doc:
        raise ConfigError(f"{source}: {where}: a sweep: key belongs in a config of its own, not in a list")
    label = check_label(doc[NAME_KEY], f"{source}: {where}") if NAME_KEY in doc else None
    return where, {k: v for k, v in doc.items() if k != NAME_KEY}, label


def _cross_product(doc: Mapping[str, Any], source: Path) -> list[tuple[str, Any, str | None]]:
    """The configs of a ``sweep:`` key's cross product, each named after its swept values."""
    axes = doc[SWEEP_KEY]
    if not isinstance(axes, Mapping) or not axes:
        raise ConfigError(f"{source}: sweep: must map parameters (or merge_method) to lists of values")
    for key, values in axes.items():
        if not isinstance(values, list) or not values:
            raise ConfigError(f"{source}: sweep.{key}: give a list of values, e.g. [0.2, 0.5]")
        if any(isinstance(v, list | Mapping) or v is None for v in values):
            raise ConfigError(f"{source}: sweep.{key}: each value is one number, word or true/false")
    if NAME_KEY in doc:
        raise ConfigError(f"{source}: name: names one candidate; a sweep: key makes several, named after their values")
    base = {k: v for k, v in doc.items() if k != SWEEP_KEY}
    top = base.get("parameters") or {}
    if not isinstance(top, Mapping):
        raise ConfigError(f"{source}: parameters must be a mapping of parameter names to values")
    entries: list[tuple[str, Any, str | None]] = []
    for combo in itertools.product(*axes.values()):
        chosen = dict(zip(axes, combo, strict=True))
        config = dict(base)
        if "merge_method" in chosen:
            config["merge_method"] = chosen["merge_method"]
        swept = {k: v for k, v in chosen.items() if k != "merge_method"}
        config["parameters"] = {**top, **swept}
        where = "candidate " + ", ".join(f"{k}={v}" for k, v in chosen.items())
        entries.append((where, config, _swept_name(config, swept, where, source)))
    return entries


def _swept_name(config: Mapping[str, Any], swept: Mapping[str, Any], where: str, source: Path) -> str:
    method = config.get("merge_method")
    spec = mergekit_config.METHODS.get(method) if isinstance(method, str) else None
    return Candidate(spec.method if spec else str(method), dict(swept)).name  # an unknown method fails in parse


def _gather(source: Path, entries: list[tuple[str, Any, str | None]]) -> SweepConfig:
    """Translate every config, check they merge one family and agree on the shared settings."""
    family: tuple[Path, tuple[Path, ...]] | None = None
    shared: dict[str, Any] = {}
    candidates = []
    for i, (where, config, label) in enumerate(entries):
        merge = mergekit_config.parse(config, Path(f"{source}: {where}"))
        if family is None:
            family = (merge.base, merge.agents)
        elif (merge.base, merge.agents) != family:
            raise ConfigError(
                f"{source}: {where} merges other models than candidate 1 (base {merge.base}, models "
                f"{', '.join(map(str, merge.agents))}); a sweep merges one family: give every config the same "
                "base_model and models"
            )
        settings = dict(merge.settings)
        fixed = {k: settings.pop(k, None) for k in SHARED}
        if i == 0:
            shared = fixed
        elif fixed != shared:
            key = next(k for k in SHARED if fixed[k] != shared[k])
            raise ConfigError(
                f"{source}: {where} sets {SHARED[key]} to {_shown(fixed[key])}, candidate 1 to "
                f"{_shown(shared[key])}; it is one value for the whole sweep"
            )
        check_config_values(merge, {}, merge.settings)
        method = settings.pop("method")
        candidates.append(Candidate(method, settings, label))
    assert family is not None
    check_unique(candidates)
    given = {k: v for k, v in shared.items() if v is not None}
    return SweepConfig(source, family[0], family[1], tuple(candidates), given)


def _shown(value: Any) -> str:
    return "nothing (the default)" if value is None else repr(value)
