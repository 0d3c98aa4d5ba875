"""Lab II: regimes of agents whose shared updates should agree, conflict or add up.

- ``redundant``: the same task (``inc``) trained twice, from two RL seeds (s and the next seed
  of the run, wrapping around): where both agents change a weight they learned the same change,
  and averaging it is right.
- ``conflicting``: ``inc`` and ``dec``, which write with the same ten digit tokens and pull them
  towards opposite answers (+1 and -1).
- ``disjoint``: ``inc`` and ``rev``, each with its own digit tokens, two agents like the other
  regimes; ``disjoint-3`` adds ``srt``: the lab's three tasks.

At seed s every regime holds the ``inc`` agent of seed s, merged with a twin, with ``dec`` or
with ``rev``: the comparison across regimes is paired.

Every regime's agents come from one base that knows all four tasks (a 35-token vocabulary): the
lab's shipped base, pretrained further with the lab's recipe until ``dec`` meets the target too
(the three tasks are fed again only if they fall below it). The agents follow the lab's RL
recipe; ``dec`` takes ``inc``'s budget.
Layout of a work directory: ``WORK/regimes/base``, ``WORK/regimes/seed{S}/{task}`` (agents),
``WORK/regimes/{regime}/seed{S}/`` (index and merges), ``WORK/regimes/results.json``.
"""

from __future__ import annotations

import json
import multiprocessing
import shutil
from collections.abc import Iterator, Sequence
from concurrent.futures import ProcessPoolExecutor
from dataclasses import asdict, dataclass, replace
from pathlib import Path
from typing import Any

from ramstream.config import DEFAULT_EPS
from ramstream.lab.shipped import DATA
from ramstream.lab.tasks import ALL_TASKS
from tools.agents_lab import merges
from tools.agents_lab.agreement import family_agreement
from tools.agents_lab.build import RECIPE, SMOKE_RECIPE, Recipe, agent_dir, base_dir, ensure_base, ensure_trained
from tools.agents_lab.common import Log, Timer, set_threads
from tools.agents_lab.rl import RLConfig
from tools.agents_lab.table import MergeContext, environment, overlap_report, run_method, score


@dataclass(frozen=True)
class Regime:
    name: str
    expect: str  # what its shared updates should do: agree, conflict or add
    members: tuple[tuple[str, int], ...]  # (task, k): the agent of the k-th seed after s in the seed list
    about: str

    def agents(self, seed: int, seeds: Sequence[int]) -> list[tuple[str, int]]:
        """The (task, RL seed) of each agent of the regime at seed ``seed``: a member (task, k)
        is the agent of the k-th seed after ``seed`` in ``seeds``, wrapping around."""
        at = list(seeds).index(seed)
        return [(task, seeds[(at + k) % len(seeds)]) for task, k in self.members]

    @property
    def tasks(self) -> tuple[str, ...]:
        """The tasks its merges are scored on: its agents' tasks, each once."""
        return tuple(dict.fromkeys(task for task, _ in self.members))


REGIMES: tuple[Regime, ...] = (
    Regime("redundant", "agree", (("inc", 0), ("inc", 1)), "inc twice: the agents of seeds s and the next seed"),
    Regime("conflicting", "conflict", (("inc", 0), ("dec", 0)), "inc and dec, on the same ten digit tokens"),
    Regime("disjoint", "add", (("inc", 0), ("rev", 0)), "inc and rev, each with its own digit tokens"),
    Regime("disjoint-3", "add", (("inc", 0), ("rev", 0), ("srt", 0)), "inc, rev and srt: the lab's three tasks"),
)
DEFAULT_REGIMES = ("redundant", "conflicting", "disjoint")


def _with_dec(recipe: Recipe) -> Recipe:
    inc = next(a for a in recipe.agents if a.task == "inc")
    agents: tuple[RLConfig, ...] = (*recipe.agents, replace(inc, task="dec"))
    assert tuple(a.task for a in agents) == ALL_TASKS
    return replace(recipe, agents=agents, base_init=DATA / "base")


# The lab's recipe with a fourth task: the shipped base learns dec, dec's agents take inc's lr.
LAB2_RECIPE = _with_dec(RECIPE)
LAB2_SMOKE_RECIPE = _with_dec(SMOKE_RECIPE)


def lab2_dir(work: Path) -> Path:
    return work / "regimes"


def regime_agents(regimes: tuple[Regime, ...], seeds: list[int]) -> list[tuple[str, int]]:
    """Every (task, RL seed) the regimes need, each once, in a stable order; a regime whose
    agents would repeat one (the redundant regime with one seed) is a ``ValueError``."""
    for regime in regimes:
        for seed in seeds:
            agents = regime.agents(seed, seeds)
            if len(set(agents)) < len(agents):
                raise ValueError(f"regime {regime.name} needs agents of distinct seeds: give it at least two seeds")
    return list(dict.fromkeys(a for seed in seeds for r in regimes for a in r.agents(seed, seeds)))


# -- merging and scoring ---------------------------------------------------------------------------

# Task arithmetic's grid includes 1/2, which is averaging for two agents.
REGIME_TA_GRID = (0.2, 0.4, 0.5, 0.6, 0.8, 1.0, 1.2)
R_GRID = (0.05, 0.2, 0.5, 1.0)  # and 0.1, RAM+'s default, a row of its own
TIES_GRID = (0.1, 0.2, 0.5, 1.0)
DARE_GRID = (0.3, 0.5, 0.9)

# Every method of the quality table, and RAM+, TIES and DARE-TIES with r or density chosen on
# the validation prompts too.
REGIME_METHODS: tuple[merges.MethodRun, ...] = (
    *(replace(m, grid=("lambda", REGIME_TA_GRID)) if m.key == "ta_val" else m for m in merges.METHODS),
    merges.MethodRun("ram+_val", "RAM+, r on validation", "ram+", {}, grid=("r", R_GRID)),
    merges.MethodRun("ties_val", "TIES, density on validation", "ties", {}, grid=("density", TIES_GRID)),
    merges.MethodRun(
        "dare_ties_val", "DARE-TIES, density on validation", "dare_ties", {"seed": 0}, grid=("density", DARE_GRID)
    ),
)


def run_regime_seed(
    work2: Path,
    recipe: Recipe,
    regime: Regime,
    seed: int,
    seeds: list[int],
    scores: dict[Path, dict[str, float]],
    log: Log,
) -> dict[str, Any]:
    """One regime at one RL seed: its agents' scores, overlap and agreement, and every merge."""
    timer = Timer()
    base = base_dir(work2)
    members = regime.agents(seed, seeds)
    agents = [agent_dir(work2, task, s) for task, s in members]
    out = work2 / regime.name / f"seed{seed}"
    for stale in (out / "index.zarr", out / "merges"):
        if stale.exists():
            shutil.rmtree(stale)
    ctx = MergeContext(base, agents, out / "index.zarr", work2 / "cache", out / "merges", recipe.eval_prompts)
    ctx = replace(ctx, tasks=regime.tasks)
    result: dict[str, Any] = {
        "agents": [
            {"task": task, "seed": s, "test": {t: scores[a][t] for t in regime.tasks}}
            for (task, s), a in zip(members, agents, strict=True)
        ],
        "overlap": overlap_report(base, agents, ctx.index, ctx.cache),
        "agreement": family_agreement(base, agents).to_dict(),
        "merges": {},
    }
    for run in REGIME_METHODS:
        row = result["merges"][run.key] = run_method(ctx, run, log)
        cells = " ".join(f"{t} {v:.3f}" for t, v in row.get("test", {}).items())
        log(f"  {regime.name} seed {seed} {run.key:14s} [{row['source']}] {cells}")
    result["seconds"] = round(timer(), 1)
    return result


def _keep_others(path: Path, doc: dict[str, Any], regimes: tuple[Regime, ...]) -> None:
    """Carry over the results of other regimes from an earlier run of the same recipe, seeds and
    base (``--only disjoint-3`` after the default run adds a regime to the document)."""
    try:
        old = json.loads(path.read_text())
    except (OSError, ValueError):
        return
    if any(old.get(k) != doc[k] for k in ("recipe", "seeds", "base")):
        return
    doc["agents"] = {**old.get("agents", {}), **doc["agents"]}
    names = {r.name for r in regimes}
    doc["regimes"] = {k: v for k, v in old.get("regimes", {}).items() if k not in names}


def run_regimes(
    work: Path,
    recipe: Recipe,
    regimes: tuple[Regime, ...],
    seeds: list[int],
    log: Log,
    threads: int = 1,
    jobs: int = 1,
) -> dict[str, Any]:
    """Train what is missing (one base of all four tasks, the regimes' agents), then merge and
    score every regime at every seed; the document is also written to WORK/regimes/results.json."""
    timer = Timer()
    work2 = lab2_dir(work)
    set_threads(threads)
    base = ensure_base(work2, recipe, log, threads)
    wanted = regime_agents(regimes, seeds)
    paths = ensure_trained(work2, recipe, wanted, log, threads, jobs)
    trained = round(timer(), 1)
    set_threads(threads)
    limit = recipe.eval_prompts
    scores = {p: score(p, limit=limit, tasks=recipe.tasks) for p in [base, *paths]}
    doc: dict[str, Any] = {
        "recipe": recipe.to_dict(),
        "seeds": seeds,
        "eps": DEFAULT_EPS,
        "methods": {
            run.key: {"label": run.label, "method": run.method, "params": run.params, "grid": run.grid}
            for run in REGIME_METHODS
        },
        "base": scores[base],
        "agents": {f"{task} seed {s}": scores[p] for (task, s), p in zip(wanted, paths, strict=True)},
        "regimes": {},
        "environment": environment(threads, jobs),
    }
    _keep_others(work2 / "results.json", doc, regimes)
    jobs_list = [(work2, recipe, regime, seed, seeds, scores, threads) for regime in regimes for seed in seeds]
    done: Iterator[tuple[list[str], dict[str, Any]]]
    if jobs <= 1:
        done = map(_regime_seed_job, jobs_list)
    else:  # regimes and seeds are independent: ``jobs`` processes merge and score them
        pool = ProcessPoolExecutor(jobs, mp_context=multiprocessing.get_context("spawn"))
        done = pool.map(_regime_seed_job, jobs_list)
    results = iter(done)
    for regime in regimes:
        per_seed = {}
        for seed in seeds:
            lines, per_seed[str(seed)] = next(results)
            log("\n".join(lines))
        doc["regimes"][regime.name] = {**asdict(regime), "tasks": list(regime.tasks), "per_seed": per_seed}
        doc["seconds"] = {"training": trained, "total": round(timer(), 1)}
        (work2 / "results.json").write_text(json.dumps(doc, indent=1) + "\n")  # after each regime
    if jobs > 1:
        pool.shutdown()
    return doc


def _regime_seed_job(
    args: tuple[Path, Recipe, Regime, int, list[int], dict[Path, dict[str, float]], int],
) -> tuple[list[str], dict[str, Any]]:
    """``run_regime_seed`` in a worker: its log lines and its result."""
    work2, recipe, regime, seed, seeds, scores, threads = args
    set_threads(threads)
    lines = [f"{regime.name} seed {seed}: {regime.about}"]
    return lines, run_regime_seed(work2, recipe, regime, seed, seeds, scores, lines.append)
