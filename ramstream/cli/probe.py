"""``ramstream probe``: gather the agents' statistics against the base into the index."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import click

from ramstream.cli.command import friendly, load_api
from ramstream.cli.options import checkpoint_options, eps_option, quantized_base_option, run_options_of


# Checkpoints are taken as written: a path (``./org/name`` stays a path) or a hub id (org/name[@rev]).
@click.command()
@click.argument("base", type=str)
@click.argument("agents", nargs=-1, required=True, type=str)
@click.option("--index", "index", type=click.Path(path_type=Path), default=None, help="Index path [default: cache].")
@eps_option
@quantized_base_option
@click.option(
    "--allow-nonfinite",
    is_flag=True,
    help="Let NaN/Inf weights through (a non-finite task-vector element counts as inactive) instead of refusing.",
)
@click.option(
    "--agreement",
    is_flag=True,
    help="Also gather how each pair of agents agrees (shared elements, signs, cosine; inspect --pairs): "
    "one more read of the checkpoints, added to an existing index too.",
)
@checkpoint_options
@friendly
def probe(
    base: str,
    agents: tuple[str, ...],
    index: Path | None,
    eps: float,
    quantized_base_as: Any,
    allow_nonfinite: bool,
    agreement: bool,
    **run: Any,
) -> None:
    """Gather the statistics of AGENTS against BASE into the index (resumable)."""
    api = load_api(run["backend"])
    store = api.probe(
        base,
        [str(a) for a in agents],
        index=index,
        eps=eps,
        allow_nonfinite=allow_nonfinite,
        agreement=agreement,
        quantized_base_as=quantized_base_as,
        options=run_options_of(**run),
    )
    click.echo(f"index: {store.path}")
