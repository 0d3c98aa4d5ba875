"""The merge pass of each method against RAM+'s, statistics cached: what one read per block buys.

On the spine benchmark's 0.75B bf16 family (base + 3 agents, about 6 GB, written once under
``--data`` by ``tools/bench_spine.py`` or here), every method's statistics are computed once,
untimed, into one ``--cache-dir`` (which also warms Numba's cache); then each measured merge runs
in a fresh CLI process with the inputs in the page cache, and the benchmark times its merge pass
alone (``run_merges``, from the first block to the synced shards), its whole run and its peak RSS.
The merges are interleaved round by round (``--repeat``), so a machine whose speed drifts moves
every method alike; the medians and their ratios to RAM+ are reported. ``--before REV`` measures
another revision too (checked out in a git worktree), interleaved with this one in the same run.

    python tools/bench_methods.py --data bench-data --repeat 3     # the full benchmark
    python tools/bench_methods.py --data bench-data --before HEAD~1  # and a revision to compare
    python tools/bench_methods.py --data bench-data --quick        # a smoke run in seconds

Goals (issue 23, part A): TIES and DARE-TIES merge passes <= 1.5 x RAM+'s, DELLA's <= 3 x.
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import statistics
import subprocess
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))

from bench_spine import (  # a sibling tool, found through sys.path
    FULL,
    QUICK,
    REPO,
    add_run_options,
    ensure_family,
    git_commit,
    input_files,
    log,
    machine,
    measure,
    parse_run_args,
    ramstream_cmd,
    read_inputs,
    step,
)

METHODS = {
    "ram+": [],
    "ties": ["--density", "0.2"],
    "breadcrumbs": ["--density", "0.2"],
    "dare_ties": ["--density", "0.2"],
    "della": ["--density", "0.2", "--epsilon", "0.1"],
}
GOALS = {"ties": 1.5, "dare_ties": 1.5, "della": 3.0}

# The CLI in this process, with the merge pass timed: ``run_merges`` as ``runs.output`` calls it.
_TIMED_MERGE = """
import json, sys, time
import ramstream
import ramstream.runs.output as output
from ramstream.cli import main
spent = []
inner = output.run_merges
def timed(*args, **kwargs):
    t0 = time.perf_counter()
    try:
        return inner(*args, **kwargs)
    finally:
        spent.append(time.perf_counter() - t0)
output.run_merges = timed
try:
    main(sys.argv[2:], prog_name="ramstream", standalone_mode=False)
finally:
    with open(sys.argv[1], "w") as f:
        json.dump({"merge_pass": sum(spent), "code": ramstream.__file__}, f)
"""


def merge_argv(method: str, members: list[Path], out: Path, cache: Path, args: argparse.Namespace) -> list[str]:
    argv = ["merge", *map(str, members), "--out", str(out), "--method", method, *METHODS[method]]
    argv += ["--cache-dir", str(cache), "--memory", args.memory, "--quiet"]
    return argv + (["--threads", str(args.threads)] if args.threads else [])


class Version:
    """The code a merge runs: this checkout, or ``--before REV`` checked out in a worktree (its
    own Numba cache and statistics cache, so nothing compiled or cached is shared)."""

    def __init__(self, label: str, root: Path | None, runs: Path, data: Path) -> None:
        self.label = label
        self.root = root
        self.cache = runs / f"cache-{label}"
        self.numba_cache = data / ("numba-cache" if root is None else f"numba-cache-{label}")

    def activate(self) -> None:
        """Children run this version's code: ``python -c`` imports from its working directory first."""
        os.chdir(self.root or REPO)
        os.environ["NUMBA_CACHE_DIR"] = str(self.numba_cache)
        if self.root is None:
            os.environ.pop("PYTHONPATH", None)
        else:
            os.environ["PYTHONPATH"] = str(self.root)


def worktree(rev: str, runs: Path) -> Path:
    path = runs / "before"
    subprocess.run(
        ["git", "-C", str(REPO), "worktree", "add", "--detach", str(path), rev], check=True, capture_output=True
    )
    return path


def run(args: argparse.Namespace) -> int:
    data = Path(args.data).resolve()
    base, agents = ensure_family(data / ("quick" if args.quick else "full"), QUICK if args.quick else FULL)
    members = [base, *agents]
    files = input_files(base, agents)
    nbytes = sum(f.stat().st_size for f in files)
    runs = data / "runs-methods"
    shutil.rmtree(runs, ignore_errors=True)
    subprocess.run(["git", "-C", str(REPO), "worktree", "prune"], check=False)
    runs.mkdir(parents=True)
    methods = args.methods.split(",")
    unknown = sorted(set(methods) - set(METHODS))
    if unknown or "ram+" not in methods:
        sys.exit(f"--methods: choose among {', '.join(METHODS)}, ram+ included (got {args.methods})")
    versions = [Version("now", None, runs, data)]
    if args.before:
        versions.insert(0, Version("before", worktree(args.before, runs), runs, data))

    def warm() -> None:
        read_inputs(files)

    try:
        for version in versions:
            version.activate()
            log(f"{version.label}: the statistics of every method, untimed (and Numba's cache)")
            for method in methods:
                out = runs / f"prepare-{method}"
                argv = [*ramstream_cmd(), *merge_argv(method, members, out, version.cache, args)]
                if version.root is not None:  # the CLI of the worktree's code, not the installed script
                    argv = [
                        sys.executable,
                        "-c",
                        "from ramstream.cli import main; main()",
                        *argv[len(ramstream_cmd()) :],
                    ]
                measure(argv, runs / "measure.json")
                shutil.rmtree(out)

        figures: dict[str, dict[str, list[dict[str, float]]]] = {v.label: {m: [] for m in methods} for v in versions}
        reads: list[float] = []
        for round_ in range(args.repeat):
            reads.append(read_inputs(files)["seconds"])
            for method in methods:
                for version in versions:
                    version.activate()
                    fig = step(method, lambda v=version, m=method: timed_merge(v, m, members, runs, args), args, warm)
                    figures[version.label][method].append(fig)
                    log(f"round {round_ + 1}: {version.label} {method} merge pass {fig['merge_pass']:.2f} s")
    finally:
        versions[-1].activate()
        if args.before:
            subprocess.run(["git", "-C", str(REPO), "worktree", "remove", "--force", str(runs / "before")], check=False)

    report(args, figures, reads, nbytes)
    if args.json:
        Path(args.json).write_text(json.dumps({"figures": figures, "read": reads, "bytes": nbytes}, indent=1))
    if not args.keep:
        shutil.rmtree(runs, ignore_errors=True)
    return 0


def timed_merge(
    version: Version, method: str, members: list[Path], runs: Path, args: argparse.Namespace
) -> dict[str, float]:
    out, timing = runs / f"out-{method}", runs / "pass.json"
    argv = [sys.executable, "-c", _TIMED_MERGE, str(timing), *merge_argv(method, members, out, version.cache, args)]
    doc = measure(argv, runs / "measure.json")
    fig = {"wall": float(doc["wall"]), "cpu": float(doc["user"]) + float(doc["sys"])}  # type: ignore[arg-type]
    fig["rss_mib"] = float(doc["maxrss_mib"])  # type: ignore[arg-type]
    timed = json.loads(timing.read_text())
    fig["merge_pass"] = float(timed["merge_pass"])
    expected = (version.root or REPO) / "ramstream" / "__init__.py"
    if Path(timed["code"]).resolve() != expected.resolve():  # a merge of other code measures nothing
        sys.exit(f"{version.label}: the merge ran {timed['code']}, not {expected}")
    shutil.rmtree(out)
    return fig


def report(
    args: argparse.Namespace, figures: dict[str, dict[str, list[dict[str, float]]]], reads: list[float], nbytes: int
) -> None:
    print(f"machine: {machine()}")
    print(
        f"commit: {git_commit()}"
        + (f" (before: {args.before})" if args.before else "")
        + f"   {time.strftime('%Y-%m-%d %H:%M')}"
    )
    print(f"inputs: {nbytes / 1e9:.2f} GB; one read (warm page cache, one thread): {statistics.median(reads):.2f} s")
    print(f"medians of {args.repeat} round(s), statistics cached, inputs in the page cache, --memory {args.memory}")
    for label, by_method in figures.items():

        def median(method: str, key: str, by_method: dict[str, list[dict[str, float]]] = by_method) -> float:
            return statistics.median(f[key] for f in by_method[method])

        ram = median("ram+", "merge_pass")
        print()
        print(f"{label}:")
        print()
        print("| method | merge pass | × RAM+ | goal | whole run | peak RSS |")
        print("|---|---:|---:|---:|---:|---:|")
        for method in by_method:
            passed = median(method, "merge_pass")
            goal = GOALS.get(method)
            mark = "" if goal is None else f"≤ {goal:g} ×" + (" ✓" if passed / ram <= goal else " ✗")
            print(
                f"| {method} | {passed:.2f} s | {passed / ram:.2f} | {mark} | {median(method, 'wall'):.2f} s "
                f"| {median(method, 'rss_mib'):.0f} MiB |"
            )


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    add_run_options(parser)
    parser.add_argument("--methods", default=",".join(METHODS), help=f"which, ram+ included [{','.join(METHODS)}]")
    parser.add_argument("--before", default=None, help="also measure this git revision, interleaved (say HEAD~1)")
    parser.add_argument("--keep", action="store_true", help="keep the cache and outputs under DATA/runs-methods")
    return run(parse_run_args(parser))


if __name__ == "__main__":
    sys.exit(main())
