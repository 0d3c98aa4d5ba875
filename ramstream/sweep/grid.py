"""Candidates of a sweep, from ``--grid "METHOD[:PARAM=V1,V2,...[:PARAM=...]]"``.

A grid is a method and, per parameter, a comma-separated list of values; its candidates are
the cross product of those lists, in the order given (the last parameter varies fastest).
Values are YAML scalars (``0.5``, ``true``, ``7``, ``paper``), as in a mergekit config; a
per-agent list belongs in ``--config``. Each candidate gets a name derived from its method and
parameters, stable across runs and safe as a directory name: the folder it is written to.
"""

from __future__ import annotations

import hashlib
import itertools
import re
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field
from typing import Any

from ramstream.errors import ConfigError, excerpt
from ramstream.mergekit_config import safe_yaml

_NAME_PART = re.compile(r"[^A-Za-z0-9.,+=_-]")
MAX_NAME = 120  # well within every file system's 255 bytes, and readable in a table
# What a sweep's directory holds besides its candidates (``sweep.run``; its work area and lock
# start with a dot, which no name may): a candidate named like one would replace it, or be
# taken for it by every rerun and by ``status``. Compared case-folded (case-insensitive disks).
SWEEP_FILE = "sweep.json"
RESERVED_NAMES = frozenset({SWEEP_FILE})
_PARAM = re.compile(r"^[a-z][a-z0-9_]*$")


@dataclass(frozen=True)
class Candidate:
    """One merge of a sweep: the method and the settings it is given (flat, as ``merge`` takes),
    and the directory name the user chose (``label``; a config's ``name:``), if any."""

    method: str
    settings: Mapping[str, Any] = field(default_factory=dict)
    label: str | None = None

    @property
    def name(self) -> str:
        """``label``, or ``method`` then ``-param=value`` per setting, in the order given:
        ``ram+-r=0.05``; a per-agent list is written ``weights=1.0,0.5``. A name longer than
        ``MAX_NAME`` keeps its start and ends in a digest of the whole (still stable)."""
        if self.label is not None:
            return self.label
        parts = [self.method, *(f"{k}={_text(v)}" for k, v in self.settings.items())]
        name = _NAME_PART.sub("_", "-".join(parts))
        if len(name) <= MAX_NAME:
            return name
        return f"{name[: MAX_NAME - 13]}-{hashlib.sha256(name.encode()).hexdigest()[:12]}"

    def to_dict(self) -> dict[str, Any]:
        return {"name": self.name, "method": self.method, "settings": dict(self.settings)}


def parse_grid(text: str, n_agents: int | None = None) -> list[Candidate]:
    """The candidates of one ``--grid``; a malformed grid raises ``ConfigError`` quoting it. Given
    the number of agents, each candidate is also parsed as its method will parse it, so that a
    parameter the method does not read or a value it refuses is named as the grid writes it."""
    method, *fields = [f.strip() for f in text.split(":")]
    if not method:
        raise ConfigError(f"--grid {excerpt(text)}: no method; write METHOD[:PARAM=V1,V2,...]")
    axes: dict[str, list[Any]] = {}
    spelled: dict[str, str] = {}  # each parameter as the grid writes it (rho-scope), for messages
    for item in fields:
        written, sep, values = item.partition("=")
        param = written.strip().replace("-", "_")
        if not sep or not _PARAM.match(param):
            raise ConfigError(f"--grid {excerpt(text)}: {excerpt(item)} is not PARAM=V1,V2,...")
        if param in axes:
            raise ConfigError(f"--grid {excerpt(text)}: {param} is given twice")
        if param == "method":
            raise ConfigError(f"--grid {excerpt(text)}: the method is the grid's first field, not a parameter")
        axes[param] = [_scalar(text, param, v) for v in values.split(",")]
        spelled[param] = written.strip()
    candidates = [Candidate(method, dict(zip(axes, combo, strict=True))) for combo in itertools.product(*axes.values())]
    if n_agents is not None:
        for candidate in candidates:
            refuse_reserved(candidate.name, "")  # its name first: a method named sweep.json is no method either
            _check_candidate(text, candidate, spelled, n_agents)
    return candidates


def _check_candidate(text: str, candidate: Candidate, spelled: Mapping[str, str], n_agents: int) -> None:
    """The candidate's settings as its method parses them (the sweep parses them again, alone, as
    ``merge`` would): any refusal, in one line that names the grid and the parameter as written
    rather than a flag the user never typed."""
    from ramstream.methods.options import OptionError, UnknownOptions
    from ramstream.methods.registry import get_method

    where = f"--grid {excerpt(text)}"
    try:
        get_method(candidate.method).parse(candidate.settings, n_agents)
    except UnknownOptions as exc:
        names = ", ".join(excerpt(spelled.get(name, name)) for name in exc.names)
        reads = ", ".join(exc.reads) or "none"
        many = "parameters" if len(exc.names) > 1 else "parameter"
        raise ConfigError(f"{where}: {exc.method} has no {many} {names} (it reads {reads})") from None
    except OptionError as exc:
        raise ConfigError(f"{where}: {spelled.get(exc.name, exc.name)} {exc.problem}") from None
    except ConfigError as exc:
        raise ConfigError(f"{where}: {exc}") from None


def parse_grids(grids: Iterable[str], n_agents: int | None = None) -> list[Candidate]:
    """Every grid's candidates in order; none at all, or two with one name, is refused."""
    candidates = [c for text in grids for c in parse_grid(text, n_agents)]
    if not candidates:
        raise ConfigError("a sweep needs at least one candidate: give --grid METHOD[:PARAM=V1,V2,...] (or --config)")
    check_unique(candidates)
    return candidates


def check_unique(candidates: list[Candidate]) -> None:
    """Every candidate's directory name is its own: not another's, not one of the sweep's files."""
    seen: dict[str, Candidate] = {}
    for c in candidates:
        refuse_reserved(c.name, "")
        if c.name in seen:
            raise ConfigError(
                f"two candidates are both named {excerpt(c.name)} (the same method and parameters); drop one"
            )
        seen[c.name] = c


def _scalar(text: str, param: str, value: str) -> Any:
    value = value.strip()
    if not value:
        raise ConfigError(f"--grid {excerpt(text)}: {param} has an empty value")
    try:
        parsed = safe_yaml.load(value, f"--grid {excerpt(text)}")
    except ConfigError:
        parsed = None
    if not isinstance(parsed, str | int | float | bool):
        raise ConfigError(f"--grid {excerpt(text)}: {param}={excerpt(value)} is not a number, a word or true/false")
    if isinstance(parsed, str):
        try:
            return float(parsed)  # YAML 1.1 reads 1e-1 (no dot) as a word; a user means the number
        except ValueError:
            return parsed
    return parsed


def refuse_reserved(name: str, where: str) -> None:
    """A candidate may not take the name of one of the sweep's own files."""
    if name.casefold() in RESERVED_NAMES or name.startswith("."):
        raise ConfigError(
            f"{where}a candidate named {excerpt(name)} would take the place of the sweep's own file of that name; "
            "give it another name"
        )


def check_label(label: Any, where: str) -> str:
    """A user-chosen candidate name: a word of letters, digits and ``.,+=_-`` (a directory name
    on every file system), not starting with a dot (the sweep's own files do)."""
    if isinstance(label, str) and label.startswith("."):
        raise ConfigError(
            f"{where}: name {excerpt(label)} starts with a dot, as the sweep's own entries (its work area and lock) "
            "do; give it another name"
        )
    if not isinstance(label, str) or not label or _NAME_PART.search(label):
        raise ConfigError(
            f"{where}: name {excerpt(label)} is not a directory name; use letters, digits and . , + = _ -"
        )
    if len(label) > MAX_NAME:
        raise ConfigError(f"{where}: name {excerpt(label)} is longer than {MAX_NAME} characters")
    refuse_reserved(label, f"{where}: ")
    return label


def _text(value: Any) -> str:
    if isinstance(value, list | tuple):
        return ",".join(_text(v) for v in value)
    if isinstance(value, bool):
        return "true" if value else "false"
    return repr(value) if isinstance(value, float) else str(value)
