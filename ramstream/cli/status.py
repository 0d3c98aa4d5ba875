"""``ramstream status``: which passes over an index or a merge's output directory are done, how
far, and an ETA."""

from __future__ import annotations

import json
from pathlib import Path

import click

from ramstream.cli.command import friendly
from ramstream.config import default_cache_dir


@click.command()
@click.argument("path", type=click.Path(path_type=Path))
@click.option("--json", "as_json", is_flag=True, help="Print one JSON object (schema: docs/inspect.md).")
@click.option(
    "--index",
    "index",
    type=click.Path(path_type=Path),
    default=None,
    help="For an output directory: the index its merge used, if status cannot find it.",
)
@click.option(
    "--cache-dir",
    type=click.Path(path_type=Path),
    default=None,
    help="Where cached indexes are looked up [default: ~/.cache/ramstream].",
)
@friendly
def status(path: Path, as_json: bool, index: Path | None, cache_dir: Path | None) -> None:
    """Which passes over an index or a merge's output directory are done, how far, and an ETA."""
    from ramstream.inspect.status import render
    from ramstream.inspect.status import status as get_status

    result = get_status(path, index=index, cache_dir=cache_dir or default_cache_dir())
    click.echo(json.dumps(result.to_dict(), indent=1) if as_json else render(result))
