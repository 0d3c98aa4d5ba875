"""``python -m tools.agents_lab``: pretrain, train, evaluate, rebuild (and ship), table, regimes."""

from __future__ import annotations

import json
import shutil
import sys
from pathlib import Path

import click
import torch

from ramstream.config import DEFAULT_EPS
from ramstream.lab.evaluate import parse_tasks
from ramstream.lab.shipped import DATA, MEMBERS, RECORD
from ramstream.lab.tasks import ALL_TASKS, SPLITS, TASKS
from tools.agents_lab import regimes as lab2
from tools.agents_lab import table as quality
from tools.agents_lab.build import RECIPE, SMOKE_RECIPE, Recipe, ensure_agents, ensure_base
from tools.agents_lab.common import Timer, set_threads
from tools.agents_lab.pretrain import PretrainConfig, pretrain
from tools.agents_lab.rl import RLConfig, train_agent

ROOT = Path(__file__).resolve().parents[2]


def log(line: str) -> None:
    click.echo(line)
    sys.stdout.flush()


def _recipe(smoke: bool) -> Recipe:
    return SMOKE_RECIPE if smoke else RECIPE


threads_option = click.option(
    "--threads",
    type=click.IntRange(min=1),
    default=1,
    show_default=True,
    help="torch threads per process (1: reproducible bits, and robust on a busy machine).",
)
work_option = click.option(
    "--work",
    type=click.Path(path_type=Path, file_okay=False),
    default=ROOT / "lab-data",
    show_default=True,
    help="Where checkpoints, indexes and merges go.",
)
jobs_option = click.option(
    "--jobs", type=click.IntRange(min=1), default=1, show_default=True, help="Agents trained at once."
)
smoke_option = click.option("--smoke", is_flag=True, help="A few steps of everything (the CI smoke run).")


@click.group()
def main() -> None:
    """The agents lab: tiny RL agents for ramstream's demo and quality table (docs/agents_lab.md)."""


@main.command("pretrain")
@click.option("--out", type=click.Path(path_type=Path), required=True)
@click.option("--seed", type=int, default=0, show_default=True)
@click.option("--max-steps", type=int, default=PretrainConfig.max_steps, show_default=True)
@threads_option
def pretrain_cmd(out: Path, seed: int, max_steps: int, threads: int) -> None:
    """Pretrain the base until every task reaches the controller's target."""
    set_threads(threads)
    pretrain(PretrainConfig(seed=seed, max_steps=max_steps), out, log)


@main.command("train")
@click.option("--base", type=click.Path(path_type=Path, exists=True), required=True)
@click.option("--task", type=click.Choice(ALL_TASKS), required=True)
@click.option("--out", type=click.Path(path_type=Path), required=True)
@click.option("--seed", type=int, default=0, show_default=True)
@click.option("--lr", type=float, default=None, help="[default: the recipe's lr for the task]")
@click.option("--steps", type=int, default=150, show_default=True)
@threads_option
def train_cmd(base: Path, task: str, out: Path, seed: int, lr: float | None, steps: int, threads: int) -> None:
    """Train one agent from BASE with on-policy RL on TASK (bf16 weights, plain SGD); dec needs a
    base that knows it (lab II's, `regimes`)."""
    set_threads(threads)
    config = lab2.LAB2_RECIPE.agent(task, seed)
    config = RLConfig(task, lr=lr if lr is not None else config.lr, seed=seed, steps=steps)
    train_agent(config, base, out, log)


@main.command("evaluate")
@click.argument("checkpoints", nargs=-1, required=True, type=click.Path(path_type=Path, exists=True))
@click.option("--split", type=click.Choice(SPLITS), default="test", show_default=True)
@click.option("--tasks", "task_list", default=",".join(TASKS), show_default=True, help="Comma-separated.")
@click.option("--json", "as_json", is_flag=True)
@threads_option
def evaluate_cmd(checkpoints: tuple[Path, ...], split: str, task_list: str, as_json: bool, threads: int) -> None:
    """Greedy exact-match accuracy of each checkpoint directory on every task."""
    set_threads(threads)
    tasks = parse_tasks(task_list)
    results = {str(c): quality.score(c, split, tasks=tasks) for c in checkpoints}  # type: ignore[arg-type]
    if as_json:
        click.echo(json.dumps(results, indent=1))
        return
    width = max(len(str(c)) for c in checkpoints)
    click.echo(f"{'checkpoint':<{width}}" + "".join(f"{t:>8}" for t in tasks) + f"{'mean':>8}")
    for name, acc in results.items():
        mean = sum(acc.values()) / len(acc)
        click.echo(f"{name:<{width}}" + "".join(f"{acc[t]:>8.3f}" for t in tasks) + f"{mean:>8.3f}")


@main.command("rebuild")
@work_option
@click.option("--ship", is_flag=True, help=f"Copy the base and the seed-0 agents into {DATA.relative_to(ROOT)}.")
@click.option("--ship-to", type=click.Path(path_type=Path, file_okay=False), default=DATA, hidden=True)
@threads_option
@jobs_option
@smoke_option
def rebuild_cmd(work: Path, ship: bool, ship_to: Path, threads: int, jobs: int, smoke: bool) -> None:
    """Pretrain the base and train the three agents of seed 0 (reusing what is already there)."""
    recipe = _recipe(smoke)
    timer = Timer()
    base = ensure_base(work, recipe, log, threads)
    agents = ensure_agents(work, recipe, 0, log, threads, jobs)
    log(f"rebuild: {timer():.1f}s (base and 3 agents)")
    if ship:
        ship_checkpoints(work, recipe, [base, *agents], ship_to, threads)


def ship_checkpoints(work: Path, recipe: Recipe, members: list[Path], dest: Path, threads: int) -> None:
    """Copy the checkpoints into the package and record how they were made and what they score."""
    set_threads(threads)
    seconds = {}
    for name, src in zip(MEMBERS, members, strict=True):
        target = dest / name
        target.mkdir(parents=True, exist_ok=True)
        for f in ("model.safetensors", "config.json"):
            shutil.copyfile(src / f, target / f)
        seconds[name] = json.loads((src / "config.json").read_text())["agents_lab"]["seconds"]
    index = work / "ship-index.zarr"
    if index.exists():
        shutil.rmtree(index)
    family = [dest / m for m in MEMBERS]
    record = {
        "about": "The agents lab's base and RL agents (seed 0); see docs/agents_lab.md.",
        "recipe": recipe.to_dict(),
        "seed": 0,
        "eps": DEFAULT_EPS,
        "build": {"training_seconds": seconds, "threads": threads, "torch": torch.__version__},
        "accuracy": {m: quality.score(p, limit=recipe.eval_prompts) for m, p in zip(MEMBERS, family, strict=True)},
        "agents": quality.overlap_report(family[0], family[1:], index, work / "cache"),
    }
    (dest / RECORD).write_text(json.dumps(record, indent=1) + "\n")
    shutil.rmtree(index)
    for rep in record["agents"]:
        log(f"shipped {rep['name']}: density {rep['density']:.4f}, unique {rep['unique']}, shared {rep['shared']}")
    log(f"shipped to {dest}")


@main.command("table")
@work_option
@click.option("--seeds", default="0,1,2", show_default=True, help="RL seeds, comma-separated.")
@click.option(
    "--doc",
    type=click.Path(path_type=Path, dir_okay=False),
    default=ROOT / "docs" / "agents_lab.md",
    show_default=True,
    help="Markdown file whose quality-table block is replaced.",
)
@threads_option
@jobs_option
@smoke_option
def table_cmd(work: Path, seeds: str, doc: Path, threads: int, jobs: int, smoke: bool) -> None:
    """Base, agents and every merge method per task over RL seeds; writes the doc's table."""
    seed_list = [int(s) for s in seeds.split(",") if s.strip()]
    result = quality.run_table(work, _recipe(smoke), seed_list, log, threads, jobs)
    text = quality.render(result)
    quality.write_doc(doc, text)
    click.echo(text)
    log(f"table: {result['seconds']}s; written to {doc} and {work / 'results.json'}")


@main.command("render")
@work_option
@click.option("--doc", type=click.Path(path_type=Path, dir_okay=False), default=ROOT / "docs" / "agents_lab.md")
def render_cmd(work: Path, doc: Path) -> None:
    """Rewrite the doc's quality-table block from WORK/results.json (no training, no merging)."""
    text = quality.render(json.loads((work / "results.json").read_text()))
    quality.write_doc(doc, text)
    click.echo(text)


@main.command("regimes")
@work_option
@click.option("--seeds", default="0,1,2", show_default=True, help="RL seeds, comma-separated.")
@click.option(
    "--only",
    default=",".join(lab2.DEFAULT_REGIMES),
    show_default=True,
    help=f"Regimes, comma-separated, of {', '.join(r.name for r in lab2.REGIMES)}.",
)
@click.option(
    "--doc",
    type=click.Path(path_type=Path, dir_okay=False),
    default=ROOT / "docs" / "agents_lab.md",
    show_default=True,
    help="Markdown file whose lab II block is replaced.",
)
@click.option("--render", "render_only", is_flag=True, help="Only rewrite the doc from WORK/regimes/results.json.")
@threads_option
@jobs_option
@smoke_option
def regimes_cmd(
    work: Path, seeds: str, only: str, doc: Path, render_only: bool, threads: int, jobs: int, smoke: bool
) -> None:
    """Lab II: redundant, conflicting and disjoint agents, every merge of each (docs/agents_lab.md)."""
    from tools.agents_lab import regimes_doc

    results = lab2.lab2_dir(work) / "results.json"
    if render_only:
        result = json.loads(results.read_text())
    else:
        by_name = {r.name: r for r in lab2.REGIMES}
        names = [n.strip() for n in only.split(",") if n.strip()]
        unknown = [n for n in names if n not in by_name]
        if unknown or not names:
            raise click.BadParameter(f"{only!r}: choose regimes of {', '.join(by_name)}", param_hint="--only")
        seed_list = [int(s) for s in seeds.split(",") if s.strip()]
        recipe = lab2.LAB2_SMOKE_RECIPE if smoke else lab2.LAB2_RECIPE
        regimes = tuple(by_name[n] for n in names)
        try:
            lab2.regime_agents(regimes, seed_list)
        except ValueError as exc:
            raise click.BadParameter(str(exc), param_hint="--seeds") from None
        result = lab2.run_regimes(work, recipe, regimes, seed_list, log, threads, jobs)
    text = regimes_doc.render_regimes(result)
    quality.write_doc(doc, text, regimes_doc.BEGIN, regimes_doc.END)
    click.echo(text)
    log(f"regimes: {result['seconds']}; written to {doc} and {results}")


if __name__ == "__main__":
    main()
