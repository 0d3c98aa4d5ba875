"""``ramstream sweep``: K candidate merges of one family, from one read of its inputs, resumably.

Every candidate is an ordinary merge output in ``DIR/<name>/`` (``runs.output``: the same run
record, bytes, card and ``ramstream_merge.json`` as ``ramstream merge --out DIR/<name>`` with
the same arguments). What is shared is the reading: the probe and the statistics the
candidates need are kept in one index (each pass runs once, later candidates read its result),
and the merge pass reads every batch of the inputs once and merges it K times (``merge_outputs``),
within ``--memory``: the block size accounts for the K outputs' buffers. The sweep's journal is
``DIR/.ramstream/journal`` (it names the candidates it marks for); a candidate already finished
is left as it is, so a rerun, or a rerun with a candidate added, merges only what is missing.
``DIR/sweep.json`` lists the candidates, their parameters, per-agent values and status.
"""

from __future__ import annotations

import json
import shutil
from collections.abc import Sequence
from contextlib import ExitStack
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from ramstream.backends.registry import backend_for, warm_backend
from ramstream.config import DEFAULT_EPS, DEFAULT_SHARD_SIZE, RunOptions
from ramstream.errors import ConfigError, OutputError, RamstreamError
from ramstream.execution.executor import Executor
from ramstream.execution.registry import make_executor
from ramstream.format.family import Family, open_family
from ramstream.format.quantized import QuantizedBaseAs
from ramstream.index import resolve
from ramstream.inspect import plots
from ramstream.io.atomic import atomic_write_text
from ramstream.methods.base import Prepared
from ramstream.output import directory as output_dir
from ramstream.runs.output import (
    OutDtype,
    OutputPlan,
    already_merged,
    checked_eps,
    merge_outputs,
    parse_method,
    plan_output,
)
from ramstream.sweep.evaluate import (
    DEFAULT_METRIC,
    DEFAULT_TIMEOUT,
    BadMetrics,
    Evaluation,
    Selection,
    check_command,
    check_timeout,
    evaluate,
    recorded_metrics,
)
from ramstream.sweep.grid import SWEEP_FILE, Candidate, check_unique
from ramstream.sweep.plot import write_plot
from ramstream.version import __version__

SWEEP_SCHEMA = 1


@dataclass(frozen=True)
class CandidateResult:
    name: str
    out: Path
    method: str
    params: dict[str, Any]
    per_agent: dict[str, tuple[float, ...]]
    status: str  # "merged" (by this run), "already merged", or "failed" (``error`` says why)
    error: str | None = None

    def to_dict(self) -> dict[str, Any]:
        return {
            "name": self.name,
            "method": self.method,
            "params": self.params,
            "per_agent": {k: list(v) for k, v in self.per_agent.items()},
            "status": self.status,
            **({"error": self.error} if self.error is not None else {}),
        }


@dataclass(frozen=True)
class SweepResult:
    out: Path
    candidates: tuple[CandidateResult, ...]
    evaluations: tuple[Evaluation, ...] = ()  # the inputs' (with eval_inputs), then the candidates'
    selection: Selection | None = None

    @property
    def ranked(self) -> list[Evaluation]:
        """The candidates' evaluations holding the selected metric, best first."""
        names = {c.name for c in self.candidates}
        chosen = [e for e in self.evaluations if e.model in names]
        return self.selection.ranked(chosen) if self.selection is not None else []

    @property
    def selected(self) -> str | None:
        ranked = self.ranked
        return ranked[0].model if ranked else None


def sweep(
    base: str | Path,
    agents: list[str] | tuple[str, ...],
    *,
    out: str | Path,
    candidates: Sequence[Candidate],
    eps: float = DEFAULT_EPS,
    index: str | Path | None = None,
    out_dtype: OutDtype = "auto",
    shard_size: int = DEFAULT_SHARD_SIZE,
    force: bool = False,
    allow_nonfinite: bool = False,
    evaluate_with: str | None = None,
    eval_inputs: bool = False,
    eval_timeout: float = DEFAULT_TIMEOUT,
    select: str | None = None,
    plot: str | Path | None = None,
    quantized_base_as: QuantizedBaseAs = "auto",
    options: RunOptions | None = None,
) -> SweepResult:
    """Merge every candidate into ``out/<name>/``; rerunning the same call resumes the sweep.

    ``evaluate_with`` (``--eval "CMD {model}"``) scores every candidate afterwards (and the base
    and agents with ``eval_inputs``); ``select`` (``METRIC[:max|min]``) ranks them; ``plot``
    draws the selected metric per candidate (PNG or SVG). An evaluation taking more than
    ``eval_timeout`` seconds is stopped and recorded as failed. A rerun reuses the scores
    ``sweep.json`` holds for candidates it did not merge again (same command, no error); a
    ``select`` metric that evaluations reported under other names only is an ``EvaluationError``
    (after the scores are recorded) naming those they reported."""
    options = options or RunOptions()
    check_unique(list(candidates))
    if evaluate_with is not None:
        check_command(evaluate_with)
        check_timeout(eval_timeout)
    elif eval_inputs or select is not None or plot is not None:
        raise ConfigError('--eval-inputs, --select and --plot need --eval "CMD {model}"')
    selection = Selection.parse(select) if select is not None else None
    if plot is not None:
        plots.check_target(Path(plot))  # a plot that cannot be written fails now, not after the merges
    if not candidates:
        raise OutputError(f"{out}: a sweep needs at least one candidate")
    eps = checked_eps(eps)
    parsed = [parse_method(c.method, c.settings, len(agents), allow_nonfinite) for c in candidates]
    min_agents = max(spec.min_agents for spec, _ in parsed)
    warm_backend(options)  # the device initialises while the family is opened and the outputs planned
    family = open_family(
        base,
        list(agents),
        min_agents=min_agents,
        hf_cache=options.hf_cache,
        hub_timeout=options.hub_timeout,
        quantized_base_as=quantized_base_as,
    )
    root = Path(out)
    outputs = [
        plan_output(
            root / c.name,
            family,
            spec,
            params,
            eps=eps,
            out_dtype=out_dtype,
            shard_size=shard_size,
            allow_nonfinite=allow_nonfinite,
        )
        for c, (spec, params) in zip(candidates, parsed, strict=True)
    ]
    output_dir.check_output_path(root, [m.path for m in family.members])
    output_dir.check_work_paths(root, Path(index) if index else None, options.cache_dir)
    _check_sweep_dir(root, {c.name for c in candidates})
    key = resolve.family_key(family, eps)  # the inputs recorded scores must have been taken on
    backend = backend_for(options)
    executor = make_executor(backend, options)
    try:
        root.mkdir(parents=True, exist_ok=True)
        with ExitStack() as locks:
            locks.enter_context(output_dir.lock(root))
            for output in outputs:
                if force or not _finished(output):  # a finished candidate is not touched, not even by a lock
                    output.out.mkdir(exist_ok=True)
                    locks.enter_context(output_dir.lock(output.out))
            recorded = _recorded_scores(root, evaluate_with, key)
            _write_sweep_file(root, family, [{**c.to_dict(), "status": "pending"} for c in candidates])
            results = _sweep_into(root, outputs, family, index, force, allow_nonfinite, options, executor)
            entries = [{**r.to_dict(), "settings": dict(c.settings)} for c, r in zip(candidates, results, strict=True)]
            _write_sweep_file(root, family, entries)
    finally:
        executor.close()
        backend.close()
    if evaluate_with is None:
        return SweepResult(root, tuple(results))
    inputs = [(m.name, m.path) for m in family.members] if eval_inputs else []
    evaluations = _evaluations(evaluate_with, inputs, results, recorded, eval_timeout)
    if selection is None:
        first = next((e for e in evaluations if e.metrics), None)
        selection = Selection(next(iter(first.metrics))) if first is not None else None
    result = SweepResult(root, tuple(results), evaluations, selection)
    _write_sweep_file(root, family, entries, _scores(result, evaluate_with, key))
    if select is not None and selection is not None:
        selection.check_reported(evaluations)
    if plot is not None:
        names = {r.name for r in results}
        write_plot(Path(plot), list(evaluations), names, selection or Selection(DEFAULT_METRIC), result.selected)
    return result


def _evaluations(
    command: str,
    inputs: list[tuple[str, Path]],
    results: list[CandidateResult],
    recorded: dict[str, dict[str, Evaluation]],
    timeout: float,
) -> tuple[Evaluation, ...]:
    """The inputs' then the candidates' evaluations, in order: an input, or a candidate this run
    did not merge, keeps the score recorded for it, when there is one; the rest are evaluated now."""
    earlier_inputs, earlier = recorded.get("inputs", {}), recorded.get("candidates", {})
    out = [earlier_inputs.get(name) or evaluate(command, name, path, timeout) for name, path in inputs]
    for r in results:
        if r.status == "failed":
            continue  # nothing to evaluate
        reuse = r.status != "merged" and r.name in earlier
        out.append(earlier[r.name] if reuse else evaluate(command, r.name, r.out, timeout))
    return tuple(out)


def _scores(result: SweepResult, command: str, inputs_key: str) -> dict[str, Any]:
    by_model = {e.model: e.to_dict() for e in result.evaluations}
    names = {c.name for c in result.candidates}
    return {
        "eval": {
            "command": command,
            "inputs_key": inputs_key,
            "inputs": {m: v for m, v in by_model.items() if m not in names},
            "candidates": {m: v for m, v in by_model.items() if m in names},
            "select": None if result.selection is None else vars(result.selection),
            "selected": result.selected,
        }
    }


def _recorded_scores(root: Path, command: str | None, inputs_key: str) -> dict[str, dict[str, Evaluation]]:
    """The evaluations (``inputs``, ``candidates``) an earlier run of this sweep recorded with the
    same command and the same inputs, those that gave metrics (a failure is tried again: the
    evaluator may have been fixed). A candidate merged again is scored again whatever this holds."""
    try:
        doc = json.loads((root / SWEEP_FILE).read_text())
        scores = doc["eval"]
        if command is None or scores["command"] != command or scores.get("inputs_key") != inputs_key:
            return {}
        return {
            part: {
                name: Evaluation(name, recorded_metrics(e["metrics"]), None, e["seconds"], True)
                for name, e in scores[part].items()
                if e["metrics"] and e["error"] is None
            }
            for part in ("inputs", "candidates")
        }
    except (OSError, ValueError, KeyError, TypeError, AttributeError, OverflowError, BadMetrics):
        return {}  # no earlier scores, or a record this version cannot read: score again


def _sweep_into(
    root: Path,
    outputs: list[OutputPlan],
    family: Family,
    index: str | Path | None,
    force: bool,
    allow_nonfinite: bool,
    options: RunOptions,
    executor: Executor,
) -> list[CandidateResult]:
    """The passes, with the sweep and its candidates locked; finished candidates are left alone."""
    finished = {o.out.name for o in outputs if output_dir.prepare(o.out, o.run, force)}
    pending = [o for o in outputs if o.out.name not in finished]
    merged: dict[str, Prepared] = {}
    failed: dict[str, RamstreamError] = {}
    if pending:
        work = output_dir.work_dir(root)
        work.mkdir(exist_ok=True)
        done = merge_outputs(
            pending,
            work,
            family,
            Path(index) if index else None,
            allow_nonfinite,
            options,
            executor,
            [o.out.name for o in pending],
        )
        for o, result in zip(pending, done, strict=True):
            if isinstance(result, RamstreamError):
                failed[o.out.name] = result  # its directory stays unfinished; a rerun tries it again
            else:
                merged[o.out.name] = result[0]
    work = output_dir.work_dir(root)
    if work.exists():
        shutil.rmtree(work)
    results = []
    for o in outputs:
        if o.out.name in failed:
            reason = f"candidate {o.out.name}: {failed[o.out.name]}"
            results.append(CandidateResult(o.out.name, o.out, o.spec.name, o.params.to_dict(), {}, "failed", reason))
            continue
        if o.out.name in merged:
            per_agent = merged[o.out.name].per_agent
            status = "merged"
        else:
            per_agent = already_merged(o.out)
            status = "already merged"
        results.append(CandidateResult(o.out.name, o.out, o.spec.name, o.params.to_dict(), per_agent, status))
    return results


def _finished(output: OutputPlan) -> bool:
    """The candidate's directory holds its finished merge (the same run record, its files unchanged)."""
    return output_dir.holds_finished(output.out, output.run)


def _check_sweep_dir(root: Path, names: set[str]) -> None:
    """``root`` is new, empty, or a sweep's: only candidates (this run's or earlier ones'), the
    sweep's record and its work area; anything else is the user's, and is refused, untouched."""
    if not root.is_dir():
        return
    ours = {SWEEP_FILE, output_dir.WORK_DIR, output_dir.LOCK_FILE}
    for entry in sorted(root.iterdir()):
        if entry.name in ours or entry.name in names or _is_candidate(entry):
            continue
        raise OutputError(
            f"{root}: holds {entry.name!r}, which is not part of a sweep; choose another (or an empty) --out"
        )


def _is_candidate(entry: Path) -> bool:
    return entry.is_dir() and (
        (entry / output_dir.RECORD_FILE).is_file() or output_dir.work_dir(entry).is_dir() or not any(entry.iterdir())
    )


def _write_sweep_file(
    root: Path, family: Family, entries: list[dict[str, Any]], scores: dict[str, Any] | None = None
) -> None:
    """``sweep.json``: the candidates in order, written when the sweep starts (all "pending", so
    that ``ramstream status`` finds it), when the merges end, and with the scores."""
    doc = {
        "schema": SWEEP_SCHEMA,
        "base": family.base.name,
        "agents": list(family.agent_names),
        "candidates": entries,
        **(scores or {}),
        "ramstream_version": __version__,
    }
    atomic_write_text(root / SWEEP_FILE, json.dumps(doc, indent=1) + "\n")
