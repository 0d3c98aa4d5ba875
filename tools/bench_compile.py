"""What a first run spends compiling: every Numba kernel's compile seconds from an empty cache.

A user's first ``ramstream merge`` after ``pip install`` compiles the kernels it calls (Numba's
on-disk cache is empty); later runs load them. This benchmark writes a tiny bf16 family (base and
three agents, about 1 M parameters each) and measures, each from an empty Numba cache:

- **first runs, as a user meets them**: the CLI's ``merge --method ram+`` (probe and merge), then a
  first ``--method ties`` over the same cache, then the same ram+ merge again (kernels cached);
  each round twice, back to back: without and with the kernels a merge calls later compiled in
  child processes (``RAMSTREAM_PREWARM=0`` / ``1``, ``backends/numba/prewarm.py``);
- **per method**: a fresh process merging with that method alone, with the seconds of every kernel
  it compiled (Numba's ``numba:compile`` events of the top-level kernels, their helpers included)
  and the process's wall time;
- **all methods in one process**: the sum every kernel costs once, whatever the method.

    python tools/bench_compile.py                    # everything (a few minutes on 2 cores)
    python tools/bench_compile.py --methods ram+,ties --skip-all
    python tools/bench_compile.py --skip-per-method --skip-all --rounds 3   # the first runs alone

Goals (issue 35): a cold first ram+ merge <= 10 s, a first TIES merge after it <= 10 s more, every
method's kernels compiled in <= 60 s in all.
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

REPO = Path(__file__).resolve().parent.parent
CODE = [REPO]  # the checkout whose ramstream the children run (``--code``)

# Method settings as the tests use them: each reaches its own kernels.
METHODS: dict[str, dict[str, object]] = {
    "ram+": {},
    "task_arithmetic": {"lambda": 0.7},
    "linear": {"weights": [1.0, 2.0, 1.5]},
    "ties": {"density": 0.3},
    "ties-model": {"density": 0.3, "trim_scope": "model", "rescale": "l1"},
    "breadcrumbs": {"density": 0.5, "gamma": 0.05},
    "dare_ties": {"density": 0.5, "seed": 3},
    "della": {"density": 0.5, "epsilon": 0.1, "seed": 1},
    "model_stock": {},
    "sce": {},
    "multislerp": {"weights": [1.0]},
    "nuslerp": {"weights": [0.5, 0.5], "agents": 2},
    "slerp": {"t": 0.5, "agents": 1},
    "karcher": {},
    "nearswap": {"t": 0.5, "agents": 1},
    "arcee_fusion": {"agents": 1},
}

# Runs in a child process: the merges of argv[2:], with every top-level compile timed.
_CHILD = """
import json, sys, time
from pathlib import Path
t0 = time.perf_counter()
from numba.core import event
compiles = {}
depth = [0]
starts = []

class Timer(event.Listener):
    def on_start(self, ev):
        depth[0] += 1
        starts.append(time.perf_counter())

    def on_end(self, ev):
        depth[0] -= 1
        spent = time.perf_counter() - starts.pop()
        if depth[0] == 0:
            func = ev.data["dispatcher"].py_func
            name = func.__module__.rsplit(".", 1)[-1] + "." + func.__name__
            compiles[name] = compiles.get(name, 0.0) + spent

event.register("numba:compile", Timer())
from ramstream import api
from ramstream.config import RunOptions
family, work = json.loads(sys.argv[1]), sys.argv[2]
per_method = {}
for label, given in json.loads(sys.argv[3]):
    given = dict(given)
    method = given.pop("method")
    agents = family["agents"][: given.pop("agents", len(family["agents"]))]
    before, t = dict(compiles), time.perf_counter()
    api.merge(family["base"], agents, out=f"{work}/{label}", method=method, method_options=given,
              options=RunOptions(cache_dir=Path(work) / "cache", quiet=True))
    spent = {k: v - before.get(k, 0.0) for k, v in compiles.items() if v != before.get(k, 0.0)}
    per_method[label] = {"wall": time.perf_counter() - t, "compiles": spent}
print(json.dumps({"process": time.perf_counter() - t0, "methods": per_method}))
"""


def write_family(directory: Path) -> dict[str, object]:
    from ramstream.demo.samples import FamilyShape
    from ramstream.demo.samples import write_family as write

    shape = FamilyShape(hidden=128, layers=2, vocab=2560, intermediate=704, kv_hidden=32)
    base, agents = write(directory, shape=shape, densities=(0.032, 0.462, 0.543))
    return {"base": str(base), "agents": [str(a) for a in agents]}


def child_env(cache: Path) -> dict[str, str]:
    env = dict(os.environ, NUMBA_CACHE_DIR=str(cache))
    env["PYTHONPATH"] = str(CODE[0]) + os.pathsep + env.get("PYTHONPATH", "")
    return env


def run_child(
    family: dict[str, object], work: Path, runs: list[tuple[str, dict[str, object]]], cache: Path
) -> dict[str, Any]:
    t = time.perf_counter()
    done = subprocess.run(
        [sys.executable, "-c", _CHILD, json.dumps(family), str(work), json.dumps(runs)],
        env=child_env(cache),
        cwd=work.parent,  # not this checkout: ``-c`` puts the working directory first on sys.path
        capture_output=True,
        text=True,
        check=False,
    )
    if done.returncode != 0:
        raise SystemExit(f"the merge failed:\n{done.stderr[-3000:]}")
    result = json.loads(done.stdout.strip().splitlines()[-1])
    result["wall"] = time.perf_counter() - t
    return result


def cli_seconds(args: list[str], cache: Path, prewarm: bool = True) -> float:
    t = time.perf_counter()
    command = [sys.executable, "-m", "ramstream", *args, "--quiet"]
    env = dict(child_env(cache), RAMSTREAM_PREWARM="1" if prewarm else "0")
    subprocess.run(command, env=env, cwd=cache.parent, check=True)
    return time.perf_counter() - t


def first_runs(family: dict[str, object], work: Path, rounds: int) -> None:
    """The first CLI merges, each round with the later kernels compiled in child processes
    (``backends/numba/prewarm.py``) and without, back to back, every run from an empty cache."""
    members = [str(family["base"]), *map(str, family["agents"])]  # type: ignore[call-overload]
    seconds: dict[bool, list[tuple[float, float, float]]] = {True: [], False: []}
    for r in range(rounds):
        for prewarm in (False, True):
            run = work / f"first-{r}-{int(prewarm)}"
            run.mkdir()
            cache, index = run / "numba", ["--cache-dir", str(run / "index")]
            ram = ["merge", *members, "--method", "ram+", "--out", str(run / "ram"), *index]
            ties = ["merge", *members, "--method", "ties", "--density", "0.3", "--out", str(run / "ties"), *index]
            again = ["merge", *members, "--method", "ram+", "--out", str(run / "again"), *index]
            ram_s, ties_s = cli_seconds(ram, cache, prewarm), cli_seconds(ties, cache, prewarm)
            seconds[prewarm].append((ram_s, ties_s, cli_seconds(again, cache, prewarm)))

    def shown(prewarm: bool, k: int) -> str:
        values = sorted(run[k] for run in seconds[prewarm])
        rounds_text = ", ".join(f"{run[k]:.1f}" for run in seconds[prewarm])
        return f"{values[len(values) // 2]:5.1f} s ({rounds_text})"

    print(f"first runs, each a `ramstream merge` process from an empty Numba cache; medians of {rounds} rounds:")
    print(f"  {'':48s} {'without children':>26s}   {'later kernels in children':>26s}")
    for k, what in enumerate(("cold first merge --method ram+ (probe + merge)", "then a first merge --method ties",
                              "ram+ again, kernels cached (a new output)")):  # fmt: skip
        print(f"  {what:48s} {shown(False, k):>26s}   {shown(True, k):>26s}")


def per_method(family: dict[str, object], work: Path, labels: list[str]) -> None:
    print("\nper method, each in a fresh process from an empty Numba cache (seconds):")
    for label in labels:
        given = {"method": label.split("-")[0], **METHODS[label]}
        result = run_child(family, work / label, [(label, given)], work / f"numba-{label}")
        compiles = result["methods"][label]["compiles"]
        kernels = ", ".join(f"{k} {v:.1f}" for k, v in sorted(compiles.items(), key=lambda kv: -kv[1]))
        print(f"  {label:16s} process {result['wall']:5.1f}  compiling {sum(compiles.values()):5.1f}  ({kernels})")


def all_methods(family: dict[str, object], work: Path, labels: list[str]) -> None:
    runs = [(label, {"method": label.split("-")[0], **METHODS[label]}) for label in labels]
    result = run_child(family, work / "all", runs, work / "numba-all")
    total: dict[str, float] = {}
    for method in result["methods"].values():
        for k, v in method["compiles"].items():
            total[k] = total.get(k, 0.0) + v
    print(f"\nall {len(labels)} method settings in one process from an empty cache: process {result['wall']:.1f} s, ")
    print(f"compiling {sum(total.values()):.1f} s; per kernel (seconds, helpers included):")
    for k, v in sorted(total.items(), key=lambda kv: -kv[1]):
        print(f"  {k:40s} {v:5.1f}")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--methods", default=",".join(METHODS), help="comma-separated labels of METHODS")
    parser.add_argument("--skip-first", action="store_true", help="skip the CLI first-run timings")
    parser.add_argument("--skip-per-method", action="store_true")
    parser.add_argument("--rounds", type=int, default=1, help="rounds of the first runs (medians shown)")
    parser.add_argument("--skip-all", action="store_true", help="skip the all-methods-in-one-process run")
    parser.add_argument("--code", type=Path, default=REPO, help="a checkout whose ramstream to time (e.g. a worktree)")
    args = parser.parse_args()
    CODE[0] = args.code.resolve()
    labels = [m for m in args.methods.split(",") if m]
    unknown = sorted(set(labels) - set(METHODS))
    if unknown:
        raise SystemExit(f"unknown method labels {unknown}; choose from {sorted(METHODS)}")
    print(f"python {sys.version.split()[0]}, {os.cpu_count()} cores, ramstream from {CODE[0]}")
    with tempfile.TemporaryDirectory(prefix="bench-compile-") as tmp:
        work = Path(tmp)
        family = write_family(work / "family")
        if not args.skip_first:
            first_runs(family, work, args.rounds)
        if not args.skip_per_method:
            per_method(family, work, labels)
        if not args.skip_all:
            all_methods(family, work, labels)


if __name__ == "__main__":
    main()
