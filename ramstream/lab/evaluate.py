"""Greedy exact-match accuracy of a lab checkpoint on every task (torch).

Each task is scored on its fixed prompts (``tasks.eval_digits``: 1000 test, 500 validation):
the model continues ``[task, x1..x7, SEP]`` greedily for 7 tokens, and a prompt counts only
when all 7 tokens are the answer's (the task's own digit tokens, in order).
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import torch

from ramstream.lab.checkpoint import load_checkpoint
from ramstream.lab.model import generate
from ramstream.lab.tasks import PROMPT_LEN, TASKS, Split, eval_digits, exact_match, prompts

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
    """Accuracy per task of the checkpoint directory ``directory``."""
    return evaluate_model(load_checkpoint(directory), split, tasks, limit)


def mean_accuracy(scores: dict[str, TaskScore]) -> float:
    return float(np.mean([s.accuracy for s in scores.values()]))
