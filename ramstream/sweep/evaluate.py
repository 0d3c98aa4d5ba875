"""Scoring a sweep's candidates with the user's own evaluator: ``--eval "CMD {model}"``.

The command is split like a shell line (``shlex``) and ``{model}`` is replaced, in every word,
by the model directory, so a path with spaces or quotes stays one argument and nothing is
interpreted by a shell. The last non-empty line of its stdout is the result: a JSON object of
metrics (its numeric values are kept) or a bare number (metric ``score``). A command that fails,
runs past ``--eval-timeout`` (``DEFAULT_TIMEOUT``), prints anything else, or reports a metric
that is not a finite float64 (NaN, infinite, a 400-digit integer) is recorded as a failure with
its reason, never fatal: the other candidates are still scored. Evaluations run after the
merges, one at a time, in the candidates' order: an evaluator usually wants the machine (and the
memory the merge was promised) to itself. The evaluator is a child the sweep owns (``child``):
stdin closed, all it started killed when it exits, overruns or the sweep is interrupted (on
Linux through a supervisor that is a child subreaper, so a daemon it started too), its output
read in bounded memory. Text taken from its output is quoted escaped (``errors.shown``).
"""

from __future__ import annotations

import json
import math
import shlex
from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from ramstream.errors import ConfigError, EvaluationError, excerpt, shown
from ramstream.sweep import child

DEFAULT_METRIC = "score"
DEFAULT_TIMEOUT = 4 * 3600.0  # seconds an evaluation may take (--eval-timeout): a benchmark, not forever


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

    def check_reported(self, evaluations: Sequence[Evaluation]) -> None:
        """Refuse a metric that no evaluation reported while some reported others: say which."""
        reported = list(dict.fromkeys(k for e in evaluations for k in e.metrics))
        if reported and self.metric not in reported:
            names = ", ".join(excerpt(k, 40) for k in reported[:10]) + (", ..." if len(reported) > 10 else "")
            raise EvaluationError(
                f"--select {excerpt(self.metric, 40)}: no evaluation reported that metric; they reported {names} "
                "(the scores are kept in sweep.json: rerun with one of those)"
            )

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


def check_timeout(seconds: float) -> float:
    if not (_is_number(seconds) and math.isfinite(seconds) and seconds > 0):
        raise ConfigError(f"--eval-timeout {excerpt(seconds)}: give a number of seconds above 0")
    return float(seconds)


def recorded_metrics(metrics: dict[str, object]) -> dict[str, float]:
    """Metrics read back from ``sweep.json``, checked as an evaluator's are (``BadMetrics``)."""
    checked = {}
    for name, value in metrics.items():
        if not _is_number(value):
            raise BadMetrics(f"metric {excerpt(name)} is not a number")
        checked[str(name)] = _finite(str(name), value)
    return checked


def evaluate(command: str, model: str, directory: Path, timeout: float = DEFAULT_TIMEOUT) -> Evaluation:
    """Run ``command`` on ``directory``; its metrics, or the reason it gave none."""
    argv = [w.replace("{model}", str(directory)) for w in check_command(command)]
    try:
        done = child.run(argv, timeout)
    except FileNotFoundError:
        return Evaluation(model, error=f"no such command: {excerpt(argv[0])}")
    except OSError as exc:
        return Evaluation(model, error=f"cannot run {excerpt(argv[0])} ({exc.strerror})")
    code = done.returncode
    if code is None:
        return Evaluation(
            model,
            error=f"did not finish within {timeout:g} s (--eval-timeout); it was stopped with what it started",
            seconds=done.seconds,
        )
    if code != 0:
        status = f"killed by signal {-code}" if code < 0 else f"exit status {code}"
        last = done.stderr or done.stdout
        if last is not None and not last.strip():
            return Evaluation(model, error=f"{status}, printing nothing", seconds=done.seconds)
        said = shown(last if len(last) <= 200 else last[:200] + "...") if last is not None else _quoted(None)
        return Evaluation(model, error=f"{status}: {said}", seconds=done.seconds)
    try:
        metrics = parse_metrics(done.stdout)
    except BadMetrics as exc:
        return Evaluation(model, error=str(exc), seconds=done.seconds)
    return Evaluation(model, metrics, seconds=done.seconds)


class BadMetrics(Exception):
    """An evaluator's last line that gives no usable metric; the message says why."""


def parse_metrics(line: str | None) -> dict[str, float]:
    """The metrics of an evaluator's last line (None: too long): a JSON number (metric ``score``)
    or an object whose numeric values are kept; any of them NaN, infinite or beyond float64 is a
    failure."""
    if line is None:
        raise BadMetrics(f"its last line of output is longer than {child.LINE_BYTES} bytes")
    try:
        value = json.loads(line)
    except (ValueError, RecursionError):  # not JSON, an integer of too many digits, nesting too deep
        value = None
    if _is_number(value):
        return {DEFAULT_METRIC: _finite(DEFAULT_METRIC, value)}
    if isinstance(value, dict):
        metrics = {str(k): _finite(str(k), v) for k, v in value.items() if _is_number(v)}
        if not metrics:
            raise BadMetrics(f"its last line reports no numeric metric: {_quoted(line)}")
        return metrics
    raise BadMetrics(f"its last line of output is not a JSON object or a number: {_quoted(line)}")


def _is_number(value: object) -> bool:
    return isinstance(value, int | float) and not isinstance(value, bool)


def _finite(name: str, value: Any) -> float:
    try:
        number = float(value)
    except OverflowError:
        raise BadMetrics(f"metric {excerpt(name)} is {excerpt(value)}, beyond float64's range") from None
    if not math.isfinite(number):
        raise BadMetrics(f"metric {excerpt(name)} is {number}, not a finite number") from None
    return number


def _quoted(text: str | None) -> str:
    """A line of the evaluator's output as a message quotes it: escaped, at most 200 characters."""
    if text is None:
        return f"(a line longer than {child.LINE_BYTES} bytes)"
    return excerpt(text, 200)
