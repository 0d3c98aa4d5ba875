"""Greedy exact-match accuracy of a lab checkpoint on every task (torch).

Each task is scored on its fixed prompts (``tasks.eval_digits``: 1000 test, 500 validation):
the model continues ``[task, x1..x7, SEP]`` greedily for 7 tokens, and a prompt counts only
when all 7 tokens are the answer's (the task's own digit tokens, in order).

``python -m ramstream.lab.evaluate MODEL_DIR [--split validation|test] [--json] [--limit N]
[--tasks inc,dec]`` scores one directory; with ``--json`` its last line is ``{"mean": ..., "inc": ...,
...}``, what ``ramstream sweep --eval "... {model} --json"`` reads (docs/sweep.md,
docs/agents_lab.md). ``--tasks`` scores other tasks than the three (lab II's ``dec``), the mean
being over those.
"""

from __future__ import annotations

import json
import sys
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from pathlib import Path

import click
import numpy as np

try:
    import torch
except ImportError:  # as a library the importer checks torch_available(); as a command, say it in one line
    if __name__ != "__main__":
        raise
    sys.exit("error: the agents lab's evaluator needs torch (pip install 'ramstream[torch]')")

from ramstream.errors import InputError, RamstreamError
from ramstream.lab.checkpoint import load_checkpoint
from ramstream.lab.model import generate
from ramstream.lab.tasks import (
    ALL_TASKS,
    PROMPT_LEN,
    SPLITS,
    TASKS,
    Split,
    eval_digits,
    exact_match,
    prompts,
    vocab_for,
)

# (B, 9) prompt tokens -> (B, 16) sequences; the model's greedy decoding by default.
Decoder = Callable[[torch.Tensor], torch.Tensor]


@dataclass(frozen=True)
class TaskScore:
    task: str
    correct: int
    total: int

    @property
    def accuracy(self) -> float:
        return self.correct / self.total if self.total else 0.0


def score_task(decode: Decoder, task: str, digits: np.ndarray) -> TaskScore:
    """Exact-match score of ``decode`` on ``task``'s prompts ``digits`` (n, 7)."""
    out = decode(torch.from_numpy(prompts(task, digits)))
    generated = out[:, PROMPT_LEN:].numpy()
    return TaskScore(task, int(exact_match(task, digits, generated).sum()), len(digits))


def evaluate_decoder(
    decode: Decoder, split: Split = "test", tasks: Sequence[str] = TASKS, limit: int | None = None
) -> dict[str, TaskScore]:
    """Scores on each task's prompts of ``split`` (the first ``limit`` of them if given)."""
    return {task: score_task(decode, task, eval_digits(task, split)[:limit]) for task in tasks}


def evaluate_model(
    model: torch.nn.Module, split: Split = "test", tasks: Sequence[str] = TASKS, limit: int | None = None
) -> dict[str, TaskScore]:
    model.eval()
    return evaluate_decoder(lambda p: generate(model, p), split, tasks, limit)  # type: ignore[arg-type]


def evaluate_dir(
    directory: Path, split: Split = "test", tasks: Sequence[str] = TASKS, limit: int | None = None
) -> dict[str, TaskScore]:
    """Accuracy per task of the checkpoint directory ``directory``; a task whose tokens the model
    lacks (``dec`` for a model of the three tasks) is an ``InputError``."""
    model = load_checkpoint(directory)
    lacking = [t for t in tasks if vocab_for((t,)) > model.shape.vocab]
    if lacking:
        raise InputError(f"{directory}: its {model.shape.vocab} tokens do not include task {lacking[0]}'s")
    return evaluate_model(model, split, tasks, limit)


def mean_accuracy(scores: dict[str, TaskScore]) -> float:
    return float(np.mean([s.accuracy for s in scores.values()]))


def metrics(scores: dict[str, TaskScore]) -> dict[str, float]:
    """``mean`` (what a sweep selects on) first, then each task's accuracy."""
    return {"mean": mean_accuracy(scores), **{task: score.accuracy for task, score in scores.items()}}


def parse_tasks(text: str) -> tuple[str, ...]:
    """``inc,dec`` -> ("inc", "dec"); an unknown or repeated task is an ``InputError``."""
    names = tuple(t.strip() for t in text.split(",") if t.strip())
    unknown = [t for t in names if t not in ALL_TASKS]
    if unknown or not names or len(set(names)) != len(names):
        raise InputError(f"--tasks {text!r}: give distinct tasks of {', '.join(ALL_TASKS)}, comma-separated")
    return names


def _table(directory: Path, split: str, scores: dict[str, TaskScore]) -> str:
    lines = [f"{directory} ({split} prompts, greedy exact match)", f"{'task':<6}{'accuracy':>10}  correct"]
    lines += [f"{t:<6}{s.accuracy:>10.3f}  {s.correct}/{s.total}" for t, s in scores.items()]
    return "\n".join([*lines, f"{'mean':<6}{mean_accuracy(scores):>10.3f}"])


@click.command()
@click.argument("model", type=click.Path(path_type=Path))
@click.option("--split", type=click.Choice(SPLITS), default="test", show_default=True, help="Which fixed prompts.")
@click.option("--json", "as_json", is_flag=True, help="Print one JSON object of metrics (the sweep's --eval protocol).")
@click.option("--limit", type=click.IntRange(min=1), default=None, help="Only the first N prompts of each task.")
@click.option(
    "--tasks",
    "task_list",
    default=",".join(TASKS),
    show_default=True,
    help=f"Comma-separated, of {', '.join(ALL_TASKS)}.",
)
def main(model: Path, split: Split, as_json: bool, limit: int | None, task_list: str) -> None:
    """Greedy exact-match accuracy of the lab checkpoint directory MODEL on every task."""
    try:
        scores = evaluate_dir(model, split, parse_tasks(task_list), limit=limit)
    except RamstreamError as exc:
        click.echo(f"error: {exc}", err=True)
        sys.exit(1)
    click.echo(json.dumps(metrics(scores)) if as_json else _table(model, split, scores))


if __name__ == "__main__":
    main()
