"""``ramstream inspect``: sparsity and overlap per agent, layer, module and tensor, read from the
index alone (no weights read); tables, JSON or a figure."""

from __future__ import annotations

import json
from pathlib import Path

import click

from ramstream.cli.command import friendly
from ramstream.errors import ConfigError


@click.command()
@click.argument("path", type=click.Path(path_type=Path))
@click.option("--json", "as_json", is_flag=True, help="Print one JSON object (schema: docs/inspect.md).")
@click.option(
    "--by",
    "by",
    type=click.Choice(["agent", "layer", "module", "tensor", "all"]),
    multiple=True,
    help="Tables to show besides the per-agent summary (repeatable; all = layer, module and tensor).",
)
@click.option("--top", type=click.IntRange(min=1), default=None, help="Each agent's K tensors ranked by --rank-by.")
@click.option(
    "--rank-by",
    type=click.Choice(["unique_share", "unique", "shared", "active", "density", "rho"]),
    default="unique_share",
    show_default=True,
    help="What --top ranks by (unique_share = unique / active).",
)
@click.option("--agent", default=None, help="With --top: only this agent.")
@click.option("--tensor", "tensor", default=None, help="One tensor's numbers (and, with --plot, its mask image).")
@click.option(
    "--pairs",
    is_flag=True,
    help="How each pair of agents agrees (shared elements, same sign, cosine, magnitude ratio), grouped by --by "
    "instead of the overlap tables; needs probe --agreement.",
)
@click.option("--r", "r", type=float, default=0.1, show_default=True, help="r used to show lambda.")
@click.option("--alpha", type=float, default=2.0, show_default=True, help="alpha used to show lambda.")
@click.option(
    "--lambda-rule",
    type=click.Choice(["paper", "script", "share"]),
    default="paper",
    show_default=True,
    help="paper: ram+; script: the authors' script; share: ram+s.",
)
@click.option(
    "--plot",
    type=click.Path(path_type=Path, dir_okay=False),
    default=None,
    help="Write a figure (*.png or *.svg; needs matplotlib: pip install 'ramstream[plot]').",
)
@friendly
def inspect(
    path: Path,
    as_json: bool,
    by: tuple[str, ...],
    top: int | None,
    rank_by: str,
    agent: str | None,
    tensor: str | None,
    r: float,
    alpha: float,
    lambda_rule: str,
    plot: Path | None,
    pairs: bool,
) -> None:
    """Sparsity and overlap per agent, layer, module and tensor, from the index alone (no weights read)."""
    from ramstream.inspect import document, text
    from ramstream.inspect.view import open_index
    from ramstream.methods.ram import RamParams
    from ramstream.methods.report import format_table

    tables = ("layer", "module", "tensor") if "all" in by else tuple(b for b in by if b != "agent")
    request = document.InspectRequest(
        by=tables,  # type: ignore[arg-type]
        top=top,
        rank_by=rank_by,  # type: ignore[arg-type]
        agent=agent,
        tensor=tensor,
        params=RamParams(r=r, alpha=alpha, lambda_rule=lambda_rule),  # type: ignore[arg-type]
        pairs=pairs,
    )
    if plot is not None:
        from ramstream.inspect import plots

        if pairs and tensor is not None:
            raise ConfigError("--plot draws the pairs (--pairs) or one tensor (--tensor), not both; give one")
        plots.check_target(plot)
    view = open_index(path)
    doc, reports = document.build(view, request)
    if plot is not None:
        if pairs:
            figure = plots.pairs_figure(view.pairs.modules if tables[:1] == ("module",) else view.pairs.layers)
        elif tensor is not None:
            figure = plots.tensor_figure(view.mask_image(tensor))
        else:
            figure = plots.summary_figure(view.model, view.modules if tables[:1] == ("module",) else view.layers)
        plots.save(figure, plot)
    click.echo(json.dumps(doc, indent=1) if as_json else text.render(doc, format_table(reports)))
    if plot is not None and not as_json:
        click.echo(f"plot: {plot}")
