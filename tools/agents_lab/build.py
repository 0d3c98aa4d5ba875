"""The lab's recipe and its checkpoints on disk: a base, then three agents per RL seed.

Layout of a work directory::

    WORK/base/                       pretrained base (bf16 safetensors + config.json)
    WORK/seed{S}/{inc,rev,srt}/      the agents of RL seed S
    WORK/seed{S}/index.zarr          ramstream's index of that family
    WORK/seed{S}/merges/{method}/    merged models

A checkpoint whose config.json records the same recipe (and, for an agent, the same base
weights) is reused, so commands can be rerun and extended (more seeds) without training twice.
"""

from __future__ import annotations

import json
import multiprocessing
from concurrent.futures import ProcessPoolExecutor
from dataclasses import asdict, dataclass, replace
from pathlib import Path
from typing import Any

from ramstream.lab.tasks import TASKS
from tools.agents_lab.common import Log, set_threads, weights_digest
from tools.agents_lab.pretrain import PretrainConfig, pretrain
from tools.agents_lab.rl import RLConfig, train_agent


@dataclass(frozen=True)
class Recipe:
    pretrain: PretrainConfig
    agents: tuple[RLConfig, ...]  # one per task; the seed is set per RL seed
    eval_prompts: int | None = None  # score on the first N prompts of each split (None: all)
    base_init: Path | None = None  # pretraining starts from this checkpoint (None: from scratch)

    def agent(self, task: str, seed: int) -> RLConfig:
        config = next(a for a in self.agents if a.task == task)
        return replace(config, seed=seed)

    @property
    def tasks(self) -> tuple[str, ...]:
        """The agents' tasks, which the base is pretrained on."""
        return tuple(a.task for a in self.agents)

    def to_dict(self) -> dict[str, object]:
        out: dict[str, object] = {
            "pretrain": asdict(self.pretrain),
            "agents": [asdict(a) for a in self.agents],
            "eval_prompts": self.eval_prompts,
        }
        if self.base_init is not None:
            out["base_init"] = {"path": str(self.base_init), "sha256": weights_digest(self.base_init)}
        return out


# Different budgets per agent give different densities (see docs/agents_lab.md).
RECIPE = Recipe(
    PretrainConfig(),
    (RLConfig("inc", lr=0.005), RLConfig("rev", lr=0.01), RLConfig("srt", lr=0.03)),
)

# A few steps of everything: the CI smoke run.
SMOKE_RECIPE = Recipe(
    PretrainConfig(max_steps=4, batch_per_task=8, monitor_prompts=16),
    tuple(replace(a, steps=2, prompts=4, samples=4) for a in RECIPE.agents),
    eval_prompts=24,
)


def base_dir(work: Path) -> Path:
    return work / "base"


def seed_dir(work: Path, seed: int) -> Path:
    return work / f"seed{seed}"


def agent_dirs(work: Path, recipe: Recipe, seed: int) -> list[Path]:
    return [seed_dir(work, seed) / task for task in recipe.tasks]


def _recorded(directory: Path) -> dict[str, Any]:
    """What a checkpoint's config.json records about how it was made ({} if nothing)."""
    try:
        config = json.loads((directory / "config.json").read_text())
    except (OSError, ValueError):
        return {}
    lab = config.get("agents_lab")
    return lab if isinstance(lab, dict) and (directory / "model.safetensors").is_file() else {}


def ensure_base(work: Path, recipe: Recipe, log: Log, threads: int = 1) -> Path:
    out = base_dir(work)
    record = _recorded(out)
    init = weights_digest(recipe.base_init) if recipe.base_init is not None else None
    if (
        record.get("recipe") == asdict(recipe.pretrain)
        and record.get("tasks", list(TASKS)) == list(recipe.tasks)
        and record.get("init_sha256") == init
    ):
        log(f"base: reusing {out}")
        return out
    set_threads(threads)
    pretrain(recipe.pretrain, out, log, tasks=recipe.tasks, init=recipe.base_init)
    return out


def _train_one(config: RLConfig, base: Path, out: Path, threads: int) -> str:
    set_threads(threads)
    lines: list[str] = []
    record = train_agent(config, base, out, lines.append)
    lines.append(f"{config.task} seed {config.seed}: done in {record['seconds']}s")
    return "\n".join(lines)


def ensure_agents(work: Path, recipe: Recipe, seed: int, log: Log, threads: int = 1, jobs: int = 1) -> list[Path]:
    """Train the agents of ``seed`` that are missing (``jobs`` processes at a time)."""
    return ensure_trained(work, recipe, [(task, seed) for task in recipe.tasks], log, threads, jobs)


def agent_dir(work: Path, task: str, seed: int) -> Path:
    return seed_dir(work, seed) / task


def ensure_trained(
    work: Path, recipe: Recipe, wanted: list[tuple[str, int]], log: Log, threads: int = 1, jobs: int = 1
) -> list[Path]:
    """Train the agents (task, RL seed) of ``wanted`` that are missing; their directories, in order."""
    base = base_dir(work)
    digest = weights_digest(base)
    todo = []
    for task, seed in wanted:
        out = agent_dir(work, task, seed)
        config = recipe.agent(task, seed)
        record = _recorded(out)
        if record.get("recipe") == asdict(config) and record.get("base_sha256") == digest:
            log(f"{task} seed {seed}: reusing {out}")
        else:
            todo.append((config, out))
    if jobs <= 1 or len(todo) <= 1:
        for config, out in todo:
            log(_train_one(config, base, out, threads))
    else:
        with ProcessPoolExecutor(jobs, mp_context=multiprocessing.get_context("spawn")) as pool:
            futures = [pool.submit(_train_one, config, base, out, threads) for config, out in todo]
            for future in futures:
                log(future.result())
    return [agent_dir(work, task, seed) for task, seed in wanted]
