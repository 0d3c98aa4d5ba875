"""``ramstream demo``: the main job end to end on built-in data.

By default the data are the agents lab's checkpoints shipped with ramstream (a tiny transformer
and three agents trained from it with on-policy RL, see docs/agents_lab.md), read in place; with
``synthetic=True`` a synthetic family with the paper's densities is written instead. Either way
the family is probed, the overlap table printed and the agents merged. For the lab's agents,
when torch is installed, the per-task accuracy of the base, the agents and the merge follows.
"""

from __future__ import annotations

import shutil
from collections.abc import Callable
from pathlib import Path

from ramstream import api
from ramstream.config import RunOptions
from ramstream.demo.samples import PAPER_DENSITIES, write_family
from ramstream.errors import IndexMismatchError
from ramstream.index.store import IndexStore
from ramstream.lab import torch_available
from ramstream.lab.shipped import shipped_family
from ramstream.lab.tasks import SPLIT_SIZES, TASKS
from ramstream.methods.ram import RamParams
from ramstream.methods.registry import get_method
from ramstream.methods.report import agent_reports, format_table

DONE_MARK = ".family-complete"
INDEX = "index.zarr"
SWEEP_DIR = "sweep"  # ``demo --sweep``'s candidates (ramstream.demo.sweep)
NO_TORCH = "per-task accuracy: needs torch (pip install 'ramstream[torch]')"


def run_demo(
    directory: Path | None,
    options: RunOptions,
    echo: Callable[[str], None],
    synthetic: bool = False,
    method: str = "ram+",
) -> Path:
    directory = directory or options.cache_dir / "demo"
    get_method(method)  # an unknown method is refused before any work
    if synthetic:
        base, agents = _synthetic_family(directory / "family", echo)
    else:
        base, agents = shipped_family()
        echo(f"agents lab: a base and {len(agents)} RL agents ({', '.join(a.name for a in agents)}) from {base.parent}")
    index = directory / INDEX
    out = directory / f"merged-{method}"
    store = probe_family(directory, base, agents, options, echo)
    echo(f"index: {index}")
    echo(format_table(agent_reports(store, params=RamParams())))
    result = api.merge(base, [str(a) for a in agents], out=out, method=method, index=index, options=options)
    lambdas = f", lambda {', '.join(f'{x:.4f}' for x in result.lambdas)}" if result.lambdas else ""
    echo(f"merged model ({_display(method)}{lambdas}): {out}")
    if not synthetic:
        echo(_accuracy_table([base, *agents], out, method) if torch_available() else NO_TORCH)
    return out


def probe_family(
    directory: Path, base: Path, agents: list[Path], options: RunOptions, echo: Callable[[str], None]
) -> IndexStore:
    """The probe into ``directory``'s index, which the demo's merges and sweep share."""
    index = directory / INDEX
    try:
        return api.probe(base, [str(a) for a in agents], index=index, options=options)
    except IndexMismatchError:
        # The demo owns its directory: inputs that changed (e.g. ramstream reinstalled) start it over.
        echo(f"the inputs changed since the last demo in {directory}: starting over")
        for stale in [index, directory / SWEEP_DIR, *directory.glob("merged-*")]:
            if stale.exists():
                shutil.rmtree(stale)
        return api.probe(base, [str(a) for a in agents], index=index, options=options)


def _display(method: str) -> str:
    return method.upper() if method.startswith("ram") else method


def _synthetic_family(family_dir: Path, echo: Callable[[str], None]) -> tuple[Path, list[Path]]:
    if not (family_dir / DONE_MARK).is_file():
        echo(f"writing a sample family (bf16 base + 3 agents, densities {PAPER_DENSITIES}) to {family_dir}")
        base, agents = write_family(family_dir)
        (family_dir / DONE_MARK).write_text("ok\n")
        return base, agents
    return family_dir / "base", [family_dir / f"agent{k + 1}" for k in range(len(PAPER_DENSITIES))]


def _accuracy_table(inputs: list[Path], merged: Path, method: str) -> str:
    from ramstream.lab.evaluate import evaluate_dir, mean_accuracy

    rows = [(p.name, p) for p in inputs] + [(_display(method), merged)]
    width = max(8, *(len(name) + 2 for name, _ in rows))
    head = f"{'model':<{width}}" + "".join(f"{t:>8}" for t in TASKS) + f"{'mean':>8}"
    lines = [f"per-task accuracy (greedy exact match, {SPLIT_SIZES['test']} test prompts per task):", head]
    for name, path in rows:
        scores = evaluate_dir(path)
        cells = "".join(f"{scores[t].accuracy:>8.3f}" for t in TASKS)
        lines.append(f"{name:<{width}}{cells}{mean_accuracy(scores):>8.3f}")
    return "\n".join(lines)
