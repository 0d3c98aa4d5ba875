"""``ramstream demo``: the main job end to end on a built-in sample family."""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path

from ramstream import api
from ramstream.config import RunOptions
from ramstream.methods.ram import RamParams
from ramstream.report import agent_reports, format_table
from ramstream.samples import PAPER_DENSITIES, write_family

DONE_MARK = ".family-complete"


def run_demo(directory: Path | None, options: RunOptions, echo: Callable[[str], None]) -> Path:
    directory = directory or options.cache_dir / "demo"
    family_dir = directory / "family"
    if not (family_dir / DONE_MARK).is_file():
        echo(f"writing a sample family (bf16 base + 3 agents, densities {PAPER_DENSITIES}) to {family_dir}")
        base, agents = write_family(family_dir)
        (family_dir / DONE_MARK).write_text("ok\n")
    else:
        base, agents = family_dir / "base", [family_dir / f"agent{k + 1}" for k in range(len(PAPER_DENSITIES))]
    index = directory / "index.zarr"
    out = directory / "merged-ram+"
    store = api.probe(base, [str(a) for a in agents], index=index, options=options)
    echo(f"index: {index}")
    echo(format_table(agent_reports(store, params=RamParams())))
    result = api.merge(base, [str(a) for a in agents], out=out, method="ram+", index=index, options=options)
    echo(f"merged model (RAM+, lambda {', '.join(f'{x:.4f}' for x in result.lambdas)}): {out}")
    return out
