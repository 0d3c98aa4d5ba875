"""Scoring a sweep's candidates with the user's own evaluator: ``--eval "CMD {model}"``.

The command is split like a shell line (``shlex``) and ``{model}`` is replaced, in every word,
by the model directory, so a path with spaces or quotes stays one argument and nothing is
interpreted by a shell. The last non-empty line of its stdout is the result: a JSON object of
metrics (its numeric values are kept) or a bare number (metric ``score``). A command that fails,
times out or prints anything else is recorded as such, never fatal: the other candidates are
still scored. Evaluations run after the merges, one at a time, in the candidates' order: an
evaluator usually wants the machine (and the memory the merge was promised) to itself.
"""

from __future__ import annotations

import json
import math
import shlex
import subprocess
import time
from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from ramstream.errors import ConfigError

DEFAULT_METRIC = "score"


@dataclass(frozen=True)
class Evaluation:
    """One model's evaluation: its metrics, or why there are none."""

    model: str  # a candidate's name, or the base's / an agent's
    metrics: dict[str, float] = field(default_factory=dict)
    error: str | None = None
    seconds: float = 0.0
    recorded: bool = False  # read back from an earlier run's sweep.json, not run now

    def to_dict(self) -> dict[str, Any]:
        return {"metrics": self.metrics, "error": self.error, "seconds": round(self.seconds, 3)}


@dataclass(frozen=True)
class Selection:
    """``--select METRIC[:max|min]``: which metric ranks the candidates, and which way."""

    metric: str
    best: str = "max"

    @classmethod
    def parse(cls, text: str) -> Selection:
        metric, _, way = text.partition(":")
        if not metric or way not in ("", "max", "min"):
            raise ConfigError(f"--select {text!r}: write METRIC, METRIC:max or METRIC:min")
        return cls(metric, way or "max")

    def ranked(self, evaluations: Sequence[Evaluation]) -> list[Evaluation]:
        """The evaluations holding the metric, best first (ties keep the candidates' order)."""
        scored = [e for e in evaluations if self.metric in e.metrics]
        return sorted(scored, key=lambda e: -e.metrics[self.metric] if self.best == "max" else e.metrics[self.metric])


def check_command(command: str) -> list[str]:
    """The command's words; one that does not split, is empty or never names ``{model}`` is refused."""
    try:
        words = shlex.split(command)
    except ValueError as exc:
        raise ConfigError(f"--eval {command!r}: cannot be split into words ({exc})") from None
    if not words:
        raise ConfigError("--eval is empty; give a command such as 'python eval.py {model}'")
    if not any("{model}" in w for w in words):
        raise ConfigError(f"--eval {command!r}: never names {{model}}, the model directory to evaluate")
    return words


def evaluate(command: str, model: str, directory: Path, timeout: float | None = None) -> Evaluation:
    """Run ``command`` on ``directory``; its metrics, or the reason it gave none."""
    argv = [w.replace("{model}", str(directory)) for w in check_command(command)]
    started = time.monotonic()
    try:
        done = subprocess.run(argv, capture_output=True, text=True, timeout=timeout, errors="replace")
    except FileNotFoundError:
        return Evaluation(model, error=f"no such command: {argv[0]}")
    except subprocess.TimeoutExpired:
        return Evaluation(model, error=f"did not finish within {timeout:g} s", seconds=time.monotonic() - started)
    except OSError as exc:
        return Evaluation(model, error=f"cannot run {argv[0]} ({exc.strerror})")
    seconds = time.monotonic() - started
    if done.returncode != 0:
        last = _last_line(done.stderr) or _last_line(done.stdout)
        return Evaluation(model, error=f"exit status {done.returncode}: {last[:200]}", seconds=seconds)
    line = _last_line(done.stdout)
    metrics = _metrics(line)
    if metrics is None:
        return Evaluation(
            model, error=f"its last line of output is not a JSON object or a number: {line[:200]!r}", seconds=seconds
        )
    return Evaluation(model, metrics, seconds=seconds)


def _last_line(text: str) -> str:
    lines = [line.strip() for line in text.splitlines() if line.strip()]
    return lines[-1] if lines else ""


def _metrics(line: str) -> dict[str, float] | None:
    try:
        value = json.loads(line)
    except ValueError:
        return None
    if _is_number(value):
        return {DEFAULT_METRIC: float(value)}
    if isinstance(value, dict):
        return {str(k): float(v) for k, v in value.items() if _is_number(v)}
    return None


def _is_number(value: object) -> bool:
    return isinstance(value, int | float) and not isinstance(value, bool) and math.isfinite(value)
