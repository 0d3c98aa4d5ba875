"""``ramstream demo --sweep``: why a sweep matters, shown on the shipped lab agents.

The agents are merged with RAM+ for several r, task arithmetic for several λ, TIES and DARE-TIES
in one sweep (``api.sweep``: one read of the inputs). The lab's evaluator scores each candidate
on the validation prompts, run as a user's own evaluator would be (``--eval "CMD {model}"``),
and the best mean validation accuracy is selected. Only then are the test prompts used: for the
selected candidate, the methods' defaults (RAM+ r = 0.1, task arithmetic λ = 1, candidates of the
sweep) and the inputs, so the table shows what choosing on held-out prompts buys over a default.
Scoring is the point, so without torch the demo refuses before any work.
"""

from __future__ import annotations

import shlex
import sys
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

from ramstream import api
from ramstream.config import RunOptions
from ramstream.demo.run import INDEX, SWEEP_DIR, probe_family
from ramstream.errors import EvaluationError, MissingDependencyError
from ramstream.lab import torch_available
from ramstream.lab.shipped import shipped_family
from ramstream.lab.tasks import SPLIT_SIZES
from ramstream.sweep.grid import Candidate, parse_grids

GRIDS = (
    "ram+:r=0.05,0.1,0.2,0.5",
    "task_arithmetic:lambda=0.5,0.75,1.0",
    "ties:density=0.2,0.5",
    "dare_ties:density=0.5:seed=0",
)
# What `ramstream merge --method ram+` and `--method task_arithmetic` use when given no setting
# (tests/test_demo_sweep.py checks both against the methods and the grids above).
DEFAULTS = (Candidate("ram+", {"r": 0.1}), Candidate("task_arithmetic", {"lambda": 1.0}))
METRIC = "mean"
NO_TORCH = (
    "demo --sweep scores its candidates with the agents lab's evaluator, which needs torch "
    "(pip install 'ramstream[torch]'); `ramstream demo` merges without it"
)


def eval_command() -> str:
    """The sweep's ``--eval``: this Python running the lab's evaluator on the validation prompts."""
    return f"{shlex.quote(sys.executable)} -m ramstream.lab.evaluate {{model}} --split validation --json"


@dataclass(frozen=True)
class Row:
    label: str
    path: Path
    validation: float | None  # None: scored here (the inputs), not by the sweep


def run_sweep_demo(directory: Path | None, options: RunOptions, echo: Callable[[str], None]) -> Path:
    """Sweep the shipped agents into ``directory/sweep``, select on validation, show the test table."""
    if not torch_available():
        raise MissingDependencyError(NO_TORCH)
    directory = directory or options.cache_dir / "demo"
    base, agents = shipped_family()
    echo(f"agents lab: a base and {len(agents)} RL agents ({', '.join(a.name for a in agents)}) from {base.parent}")
    probe_family(directory, base, agents, options, echo)
    candidates = parse_grids(GRIDS)
    echo(f"sweep: {len(candidates)} candidates into {directory / SWEEP_DIR}, as `ramstream sweep` with")
    echo("  " + " ".join(f"--grid {shlex.quote(g)}" for g in GRIDS))
    echo(f"  --eval {shlex.quote(eval_command())} --select {METRIC}")
    result = api.sweep(
        base,
        [str(a) for a in agents],
        out=directory / SWEEP_DIR,
        candidates=candidates,
        index=directory / INDEX,
        evaluate_with=eval_command(),
        select=METRIC,
        options=options,
    )
    if result.selected is None:
        failed = next((e.error for e in result.evaluations if e.error), f"no metric {METRIC!r} reported")
        raise EvaluationError(f"the lab's evaluator scored no candidate of {result.out}: {failed}")
    echo(_ranking(result))
    echo(_table(_rows(result, base, agents)))
    return result.out


def _rows(result: api.SweepResult, base: Path, agents: list[Path]) -> list[Row]:
    """The inputs, the defaults (marked if selected), then the selected candidate if not a default."""
    validation = {e.model: e.metrics[METRIC] for e in result.ranked}
    defaults = [c.name for c in DEFAULTS]
    rows = [Row(m.name if m == base else f"agent {m.name}", m, None) for m in (base, *agents)]
    for name in defaults:
        mark = ", selected" if name == result.selected else ""
        rows.append(Row(f"{name} (default{mark})", result.out / name, validation.get(name)))
    if result.selected is not None and result.selected not in defaults:
        rows.append(Row(f"{result.selected} (selected)", result.out / result.selected, validation[result.selected]))
    return rows


def _ranking(result: api.SweepResult) -> str:
    """Each candidate's mean validation accuracy, best first, then any whose evaluation failed."""
    n = SPLIT_SIZES["validation"]
    width = max(len(c.name) for c in result.candidates)
    lines = [f"mean validation accuracy ({n} prompts per task), best first; in {result.out}/sweep.json:"]
    for e in result.ranked:
        mark = "  <- selected" if e.model == result.selected else ""
        lines.append(f"  {e.model:<{width}}  {e.metrics[METRIC]:.3f}{mark}")
    ranked = {e.model for e in result.ranked}
    lines += [f"  {e.model:<{width}}  failed: {e.error}" for e in result.evaluations if e.model not in ranked]
    return "\n".join(lines)


def _table(rows: list[Row]) -> str:
    """Validation and test mean accuracy of each row; the test prompts are used only here."""
    from ramstream.lab.evaluate import evaluate_dir, mean_accuracy

    width = max(len(r.label) for r in rows)
    lines = [
        f"mean accuracy over the tasks (greedy exact match; {SPLIT_SIZES['validation']} validation and "
        f"{SPLIT_SIZES['test']} test prompts per task):",
        f"  {'model':<{width}}  validation    test",
    ]
    for r in rows:
        val = r.validation if r.validation is not None else mean_accuracy(evaluate_dir(r.path, "validation"))
        test = mean_accuracy(evaluate_dir(r.path, "test"))
        lines.append(f"  {r.label:<{width}}  {val:>10.3f}  {test:>6.3f}")
    return "\n".join(lines)
