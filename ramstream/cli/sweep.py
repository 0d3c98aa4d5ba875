"""``ramstream sweep``: merge the agents once per candidate of a grid or a config, reading the
inputs once, and score the candidates with an evaluator."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import click

from ramstream.cli.command import friendly, load_api, summary
from ramstream.cli.options import (
    checkpoint_options,
    eps_option,
    output_options,
    quantized_base_option,
    run_options_of,
)
from ramstream.errors import RamstreamError
from ramstream.sweep.evaluate import DEFAULT_TIMEOUT


@click.command()
@click.argument("base", type=str, required=False)
@click.argument("agents", nargs=-1, type=str)
@click.option(
    "--out",
    type=click.Path(path_type=Path),
    required=True,
    help="The sweep's directory: a model directory per candidate (DIR/<name>/) and sweep.json.",
)
@click.option(
    "--grid",
    "grids",
    multiple=True,
    metavar='"METHOD[:PARAM=V1,V2,...]"',
    help="Candidates: the cross product of the values, e.g. 'ram+:r=0.05,0.1' (repeatable; docs/sweep.md).",
)
@click.option(
    "--config",
    type=click.Path(path_type=Path, dir_okay=False),
    default=None,
    help="Candidates as mergekit configs: a list of them, or one with a sweep: key (docs/sweep.md); "
    "it names BASE and the AGENTS.",
)
@eps_option
@quantized_base_option
@output_options
@click.option("--force", is_flag=True, help="Replace what earlier merges left in a candidate's directory.")
@click.option("--allow-nonfinite", is_flag=True, help="Let NaN/Inf weights through (see merge --help).")
@click.option(
    "--eval",
    "evaluate_with",
    metavar='"CMD {model}"',
    default=None,
    help="Score every candidate after the merges: the last line of CMD's stdout is a JSON object of metrics "
    "(or a number); a failure is recorded, not fatal.",
)
@click.option("--eval-inputs", is_flag=True, help="With --eval: score the base and the agents too.")
@click.option(
    "--eval-timeout",
    type=click.FloatRange(min=0, min_open=True),
    default=DEFAULT_TIMEOUT,
    show_default=True,
    metavar="SECONDS",
    help="With --eval: stop an evaluation (and all it started) after this many seconds; it is recorded as failed.",
)
@click.option(
    "--select",
    metavar="METRIC[:max|min]",
    default=None,
    help="With --eval: the metric that ranks the candidates [default: the first one reported, max].",
)
@click.option(
    "--plot",
    type=click.Path(path_type=Path, dir_okay=False),
    default=None,
    help="With --eval: draw the selected metric per candidate (*.png or *.svg; pip install 'ramstream[plot]').",
)
@checkpoint_options
@click.pass_context
@friendly
def sweep(
    ctx: click.Context,
    base: str | None,
    agents: tuple[str, ...],
    out: Path,
    grids: tuple[str, ...],
    config: Path | None,
    eps: float,
    quantized_base_as: Any,
    index: Path | None,
    out_dtype: Any,
    shard_size: int,
    force: bool,
    allow_nonfinite: bool,
    evaluate_with: str | None,
    eval_inputs: bool,
    eval_timeout: float,
    select: str | None,
    plot: Path | None,
    **values: Any,
) -> None:
    """Merge AGENTS into BASE once per candidate of --grid (or --config), reading the inputs once,
    into --out/<name>/ (each what `ramstream merge` writes with those arguments); resumable."""
    base, agents, candidates, shared = _sweep_candidates(ctx, base, agents, grids, config)
    eps, out_dtype = shared.get("eps", eps), shared.get("out_dtype", out_dtype)
    api = load_api(values["backend"])
    result = api.sweep(
        base,
        list(agents),
        out=out,
        candidates=candidates,
        eps=eps,
        index=index,
        out_dtype=out_dtype,
        shard_size=shard_size,
        force=force,
        allow_nonfinite=allow_nonfinite,
        evaluate_with=evaluate_with,
        eval_inputs=eval_inputs,
        eval_timeout=eval_timeout,
        select=select,
        plot=plot,
        quantized_base_as=quantized_base_as,
        options=run_options_of(**values),
    )
    for c in result.candidates:
        said = c.error if c.status == "failed" else summary(c.method, c.per_agent)
        click.echo(f"{c.status}: {c.out} ({said})")
    count = len(result.candidates)
    click.echo(f"sweep: {count} candidate{'' if count == 1 else 's'} in {result.out} (sweep.json)")
    if result.evaluations:
        click.echo(_score_table(result))
    if plot is not None:
        click.echo(f"plot: {plot}")
    failed = [c for c in result.candidates if c.status == "failed"]
    if failed:  # after the others' results: one candidate's failure is its own, but not a success
        raise RamstreamError(
            f"{len(failed)} of {len(result.candidates)} candidates failed (recorded in sweep.json; the others are "
            f"finished): {failed[0].error}"
        )


def _sweep_candidates(
    ctx: click.Context, base: str | None, agents: tuple[str, ...], grids: tuple[str, ...], config: Path | None
) -> tuple[str, tuple[str, ...], list[Any], dict[str, Any]]:
    """The family, the candidates (the config's, then the grids') and the sweep-wide settings the
    config sets (eps, out_dtype), which a flag may repeat but not contradict."""
    from ramstream.sweep import config as sweep_config
    from ramstream.sweep.grid import check_unique, parse_grid, parse_grids

    if config is None:
        if base is None or not agents:
            raise click.UsageError("give BASE and at least one AGENT (or --config FILE)")
        return base, agents, parse_grids(grids, len(agents)), {}
    if base is not None or agents:
        raise click.UsageError("give either --config or BASE AGENT..., not both")
    loaded = sweep_config.load(config)
    candidates = [*loaded.candidates, *(c for g in grids for c in parse_grid(g, len(loaded.agents)))]
    check_unique(candidates)
    for key, value in loaded.shared.items():
        if ctx.get_parameter_source(key) != click.core.ParameterSource.DEFAULT and ctx.params[key] != value:
            flag = "--" + key.replace("_", "-")
            raise click.UsageError(f"{flag} is set by {config} too ({value!r}); set it in one place")
    return str(loaded.base), tuple(map(str, loaded.agents)), candidates, dict(loaded.shared)


def _score_table(result: Any) -> str:
    """The evaluations, the candidates best first by the selected metric, then the rest; a metric
    name (an evaluator's) is shown escaped, so it cannot move the cursor or forge a line."""
    from ramstream.errors import shown

    ranked = result.ranked
    rest = [e for e in result.evaluations if e not in ranked]
    metric = result.selection.metric if result.selection is not None else "-"
    best = f"{shown(metric)} ({result.selection.best})" if result.selection is not None else "no metric"
    width = max(len(e.model) for e in result.evaluations)
    lines = [f"{'model':<{width}}  {best}"]
    for e in [*ranked, *rest]:
        score = f"{e.metrics[metric]:.6g}" if metric in e.metrics else shown(e.error or "no " + metric)
        lines.append(f"{e.model:<{width}}  {score}{'  (recorded earlier)' if e.recorded else ''}")
    if result.selected is not None:
        lines.append(f"selected: {result.selected} ({shown(metric)} {ranked[0].metrics[metric]:.6g})")
    return "\n".join(lines)
