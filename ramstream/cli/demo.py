"""``ramstream demo``: merge the shipped lab agents (or a synthetic family) and show the overlap
table; ``--sweep`` selects a merge on validation prompts."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import click

from ramstream.cli.command import friendly
from ramstream.cli.options import run_options, run_options_of


@click.command()
@click.option(
    "--dir",
    "directory",
    type=click.Path(path_type=Path),
    default=None,
    help="Where to write the index and the merge [default: a cache directory].",
)
@click.option(
    "--synthetic",
    is_flag=True,
    help="Use a synthetic family with the paper's densities instead of the shipped lab agents.",
)
@click.option("--method", default="ram+", show_default=True, help="The merge method.")
@click.option(
    "--sweep",
    is_flag=True,
    help="Sweep RAM+, task arithmetic, TIES and DARE-TIES settings on the lab agents, select on the validation "
    "prompts and compare with the defaults on the test prompts (needs torch; docs/agents_lab.md).",
)
@run_options
@click.pass_context
@friendly
def demo(ctx: click.Context, directory: Path | None, synthetic: bool, method: str, sweep: bool, **run: Any) -> None:
    """Merge the built-in agents (RAM+ by default) and show the overlap table.

    The built-in agents are a tiny transformer's base and three RL agents trained from it
    (docs/agents_lab.md), shipped with ramstream; with torch installed the demo also scores the
    base, the agents and the merge on each task. --synthetic writes a synthetic family instead;
    --sweep merges a grid of candidates and shows what selecting one on validation prompts gives."""
    if sweep:
        if synthetic or ctx.get_parameter_source("method") != click.core.ParameterSource.DEFAULT:
            raise click.UsageError("--sweep merges its own candidates of the lab agents: drop --synthetic and --method")
        from ramstream.demo.sweep import run_sweep_demo

        run_sweep_demo(directory, run_options_of(**run), click.echo)
        return
    from ramstream import api
    from ramstream.demo.run import run_demo

    stop = api.prepare(method, run["backend"])
    try:
        run_demo(directory, run_options_of(**run), click.echo, synthetic=synthetic, method=method)
    finally:
        stop()
