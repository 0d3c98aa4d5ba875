"""``sweep --plot FILE``: the selected metric per candidate, so the choice can be seen at a glance.

One horizontal bar per candidate, best first, the selected one highlighted; a candidate whose
evaluation failed or lacks the metric is listed with that said instead of a bar (so no candidate
silently drops out of the picture); the base and the agents, when they were scored
(``--eval-inputs``), are dashed reference lines: a merge is worth it when it beats them.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

from ramstream.inspect.plots import new_figure, save
from ramstream.sweep.evaluate import Evaluation, Selection

SELECTED, OTHER = "tab:orange", "tab:blue"


def sweep_figure(
    candidates: list[Evaluation], inputs: list[Evaluation], selection: Selection, selected: str | None
) -> Any:
    metric = selection.metric
    ranked = selection.ranked(candidates)
    unscored = [e for e in candidates if e not in ranked]
    rows = [*ranked, *unscored]
    figure = new_figure(9.0, 1.6 + 0.32 * max(len(rows), 1))
    ax = figure.add_subplot(1, 1, 1)
    positions = list(range(len(rows)))[::-1]  # best at the top
    for y, e in zip(positions, rows, strict=True):
        if metric in e.metrics:
            ax.barh(y, e.metrics[metric], color=SELECTED if e.model == selected else OTHER)
        else:
            reason = e.error or f"no {metric}"
            ax.text(0, y, _plain(f"  not scored: {reason[:60]}"), va="center", fontsize=8, color="tab:red")
    for e in inputs:
        if metric in e.metrics:
            ax.axvline(e.metrics[metric], linestyle="--", linewidth=1, color="gray")
            label = _plain(f" {e.model}")
            ax.text(e.metrics[metric], len(rows) - 0.4, label, rotation=90, va="top", fontsize=7, color="gray")
    ax.set_yticks(positions, [_plain(e.model) for e in rows], fontsize=8)
    ax.set_ylim(-0.6, len(rows) - 0.4)
    ax.set_xlabel(_plain(metric))
    ax.set_title(_plain(f"{metric} per candidate ({selection.best} is best; selected: {selected or 'none'})"))
    return figure


def _plain(text: str) -> str:
    """``text`` drawn as it is: an evaluator's metric name or a model's with ``$`` in it is not
    taken for math (a malformed one would fail the drawing)."""
    return text.replace("$", r"\$")


def write_plot(
    path: Path, evaluations: list[Evaluation], names: set[str], selection: Selection, selected: str | None
) -> None:
    """Draw the candidates (``names``) and the scored inputs (the rest) into ``path``."""
    candidates = [e for e in evaluations if e.model in names]
    inputs = [e for e in evaluations if e.model not in names]
    save(sweep_figure(candidates, inputs, selection, selected), path)
