"""The sweep benchmark: one ``ramstream sweep`` of K = 6 candidates against 6 separate merges.

On the spine benchmark's 0.75B-parameter Qwen2-shaped bf16 family (``tools/bench_spine.py``
writes it under ``--data`` once; base + 3 agents, about 6 GB), the candidates
``ram+`` r = 0.05, 0.1, 0.2, ``task_arithmetic`` lambda = 0.5, 1.0 and ``ties`` density = 0.2,
each step in a fresh process of the real CLI (``ramstream`` of this checkout):

  (0) untimed: Numba's cache warmed by a tiny sweep and the six tiny merges (no JIT time is
      measured), then the index cached in a shared ``--cache-dir``: ``ramstream probe`` and one
      ties merge (its statistics), so that every measured run, sweep or merge, finds the index
      and every statistic it needs ("with the index cached");
  (a) ``ramstream sweep BASE AGENT... --out DIR --grid ... --cache-dir C`` (a fresh DIR);
  (b) the six ``ramstream merge ... --method M --PARAM V --cache-dir C``, each timed, summed;
  (c) the floor "1 read + K writes": reading every input file once (one thread, sequential
      ``readinto`` of a reused 64 MiB buffer) plus K times writing one output's bytes once
      (O_DIRECT where the file system allows it, then fdatasync: the merges sync their shards
      before they finish, so a floor without the sync would be no floor);

in two page-cache modes, the page cache set up (untimed) before each timed run:

  warm  the inputs are read once (they are in the page cache);
  cold  ``os.sync()`` then ``posix_fadvise(fd, 0, 0, POSIX_FADV_DONTNEED)`` on every input file and
        every output still on disk (DONTNEED drops clean pages only, hence the sync): the inputs
        are read from the disk, as when they do not fit in the page cache. The index (small) and
        Python's and Numba's files stay cached.

Before each timed run the share of the inputs' pages in the page cache is sampled (one-byte
``preadv(RWF_NOWAIT)`` reads, which never start I/O) and reported. Outputs are deleted between
runs (the sweep writes K outputs of the base's size: 9 GB on the full family); in the first round
each separate merge's output is compared byte for byte with the sweep's candidate first. Peak RSS
comes from ``getrusage(RUSAGE_CHILDREN)`` in a small wrapper process that starts the CLI.
Goals (issue 22): cold, (a) <= 1.10 x (c) and (b)/(a) >= 3; warm, (b)/(a) >= 2. The table also
gives (b)/(a) as it would be were every run at its floor, K x (read + write) / (read + K writes):
with the K outputs as large as the base, the writes weigh on the sweep's floor as on no merge's.

    python tools/bench_sweep.py --data bench-data            # the full benchmark (~6 GB + 10 GB of runs)
    python tools/bench_sweep.py --data bench-data --quick    # a smoke run in seconds
"""

from __future__ import annotations

import argparse
import json
import os
import shlex
import shutil
import statistics
import subprocess
import sys
from collections.abc import Callable
from functools import partial
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))

from bench_dask import same_tree
from bench_spine import (
    _WRITE_ONCE,
    DISTURBED,
    FULL,
    QUICK,
    WARMUP,
    add_quiet_options,
    ensure_family,
    git_commit,
    input_files,
    log,
    machine,
    measure,
    merge_step,
    numba_cache_state,
    ramstream_cmd,
    read_inputs,
    settle_quiet,
    shape_numel,
    step,
)

REPO = Path(__file__).resolve().parent.parent
# A family between --quick and the full one (about 0.26 GB a checkpoint): a check on a real disk.
MEDIUM = {"hidden": 1024, "layers": 4, "vocab": 32000, "intermediate": 4224, "kv_hidden": 128}
# The candidates: (method, the merge option's parameter, its values as the grid writes them).
GRID = (
    ("ram+", "r", ("0.05", "0.1", "0.2")),
    ("task_arithmetic", "lambda", ("0.5", "1.0")),
    ("ties", "density", ("0.2",)),
)
CANDIDATES = [(f"{method}-{param}={value}", method, param, value) for method, param, values in GRID for value in values]
K = len(CANDIDATES)
GOALS = {"cold_floor": 1.10, "cold_speedup": 3.0, "warm_speedup": 2.0}
SAMPLES = 64  # pages sampled per input file for the page-cache residency


def grid_args() -> list[str]:
    return [a for method, param, values in GRID for a in ("--grid", f"{method}:{param}={','.join(values)}")]


def common_args(cache: Path, args: argparse.Namespace) -> list[str]:
    extra = ["--threads", str(args.threads)] if args.threads else []
    return ["--cache-dir", str(cache), "--memory", args.memory, "--quiet", *extra]


def sweep_argv(members: list[Path], out: Path, cache: Path, args: argparse.Namespace) -> list[str]:
    return [*ramstream_cmd(), "sweep", *map(str, members), "--out", str(out), *grid_args(), *common_args(cache, args)]


def merge_argv(
    members: list[Path], out: Path, method: str, param: str, value: str, cache: Path, args: argparse.Namespace
) -> list[str]:
    cli = [*ramstream_cmd(), "merge", *map(str, members), "--out", str(out), "--method", method]
    return [*cli, f"--{param}", value, *common_args(cache, args)]


def files_under(directory: Path) -> list[Path]:
    return [p for p in directory.rglob("*") if p.is_file()] if directory.exists() else []


def drop_cached(paths: list[Path]) -> None:
    """Sync, then ask the kernel to drop the files' (now clean) pages from the page cache."""
    os.sync()
    for path in paths:
        fd = os.open(path, os.O_RDONLY)
        try:
            os.posix_fadvise(fd, 0, 0, os.POSIX_FADV_DONTNEED)
        finally:
            os.close(fd)


def resident(paths: list[Path]) -> float | None:
    """The share of sampled pages of ``paths`` in the page cache (None where it cannot be told)."""
    nowait = getattr(os, "RWF_NOWAIT", None)
    if nowait is None or not hasattr(os, "preadv"):
        return None
    hits = total = 0
    byte = bytearray(1)
    for path in paths:
        size = path.stat().st_size
        with open(path, "rb", buffering=0) as f:
            n = min(SAMPLES, max(1, size // 4096))
            for i in range(n):
                total += 1
                try:
                    hits += os.preadv(f.fileno(), [byte], (size * i // n) & ~4095, nowait) == 1
                except BlockingIOError:  # EAGAIN: not cached
                    pass
                except OSError:  # EOPNOTSUPP: this file system cannot tell
                    return None
    return hits / total if total else None


def output_bytes(directory: Path) -> int:
    return sum(f.stat().st_size for f in directory.glob("*.safetensors"))


def run(args: argparse.Namespace) -> int:
    data = Path(args.data).resolve()
    size = "quick" if args.quick else "medium" if args.medium else "full"
    shape = {"quick": QUICK, "medium": MEDIUM, "full": FULL}[size]
    # Measure this checkout's ramstream, whatever the caller's path; the spine benchmark's Numba cache.
    os.environ["PYTHONPATH"] = os.pathsep.join([str(REPO), *filter(None, [os.environ.get("PYTHONPATH")])])
    os.environ["NUMBA_CACHE_DIR"] = str(data / "numba-cache")
    base, agents = ensure_family(data / size, shape)
    members = [base, *agents]
    files = input_files(base, agents)
    nbytes = sum(f.stat().st_size for f in files)
    runs = data / "sweep-runs"
    shutil.rmtree(runs, ignore_errors=True)
    runs.mkdir(parents=True)
    result = runs / "measure.json"

    wbase, wagents = ensure_family(data / "warmup", WARMUP)
    log("warming numba's cache: a tiny sweep and the six tiny merges (JIT compile time is excluded)")
    wmembers, wcache = [wbase, *wagents], runs / "warm-cache"
    measure(sweep_argv(wmembers, runs / "warm-sweep", wcache, args), result)
    for name, method, param, value in CANDIDATES:
        measure(merge_argv(wmembers, runs / f"warm-{name}", method, param, value, wcache, args), result)
    shutil.rmtree(runs / "warm-sweep")
    for name, *_ in CANDIDATES:
        shutil.rmtree(runs / f"warm-{name}")

    cache = runs / "cache"
    log(f"(0) caching the index in {cache}: ramstream probe, then one ties merge (its statistics); untimed")
    probe = measure([*ramstream_cmd(), "probe", *map(str, members), *common_args(cache, args)], result)
    ties = next(c for c in CANDIDATES if c[1] == "ties")
    stats = measure(merge_argv(members, runs / "stats-out", *ties[1:], cache, args), result)
    shutil.rmtree(runs / "stats-out")
    log(f"(0) probe {probe['wall']:.2f} s, ties merge with its statistics pass {stats['wall']:.2f} s")
    index_before = {str(f): f.stat().st_size for f in files_under(cache)}
    commit_before, numba_before = git_commit(), numba_cache_state()

    sweep_dir = runs / "sweep"
    outs = {name: runs / f"merge-{name}" for name, *_ in CANDIDATES}
    per_output: list[int] = []  # one output's bytes, from the first sweep (the K outputs have the same size)
    same: dict[str, bool] = {}
    figs: dict[str, dict[str, list[dict[str, float]]]] = {}
    residency: dict[str, list[float | None]] = {}

    for mode in args.modes:
        figs[mode] = {key: [] for key in ("sweep", "read", "write", *outs)}
        residency[mode] = []

        def settle(mode: str = mode, remove: tuple[Path, ...] = ()) -> None:
            """The page cache as the mode wants it before a timed run (untimed)."""
            for path in remove:
                shutil.rmtree(path, ignore_errors=True)
            if mode == "cold":
                drop_cached([*files, *files_under(sweep_dir), *(f for o in outs.values() for f in files_under(o))])
            else:
                os.sync()
                read_inputs(files)
            residency[mode].append(resident(files))

        def sweep_once() -> dict[str, float]:
            return merge_step(sweep_argv(members, sweep_dir, cache, args), result)

        def read_once() -> dict[str, float]:
            doc = read_inputs(files)
            if doc["bytes"] != nbytes:
                sys.exit(f"read {doc['bytes']} bytes of inputs, expected {nbytes}")
            return {"wall": doc["seconds"], "cpu": doc["cpu"]}

        def write_once() -> dict[str, float]:
            cmd = [sys.executable, "-c", _WRITE_ONCE, str(per_output[0]), str(runs / "write-once.bin")]
            doc = json.loads(subprocess.run(cmd, check=True, stdout=subprocess.PIPE).stdout)
            return {"wall": doc["seconds"], "cpu": doc["cpu"]}

        for rep in range(args.repeat):
            tag = f"[{mode} {rep + 1}/{args.repeat}]"
            compare = args.compare and not same
            fig = step(f"{tag} (a)", sweep_once, args, partial(settle, remove=(sweep_dir,)))
            figs[mode]["sweep"].append(fig)
            log(f"{tag} (a) sweep: {fig['wall']:.2f} s, CPU {fig['cpu']:.1f} s, peak RSS {fig['rss_mib']:.0f} MiB")
            sizes = [output_bytes(sweep_dir / name) for name in outs]
            if not all(sizes):
                sys.exit(f"the sweep did not write every candidate under {sweep_dir}: {sizes}")
            per_output[:] = [max(sizes)]
            if not compare:
                shutil.rmtree(sweep_dir)
            for name, method, param, value in CANDIDATES:
                argv = merge_argv(members, outs[name], method, param, value, cache, args)
                fresh = partial(settle, remove=(outs[name],))
                fig = step(f"{tag} (b) {name}", partial(merge_step, argv, result), args, fresh)
                figs[mode][name].append(fig)
                log(f"{tag} (b) merge {name}: {fig['wall']:.2f} s, peak RSS {fig['rss_mib']:.0f} MiB")
                if compare:
                    same[name] = same_tree(outs[name], sweep_dir / name)
                    shutil.rmtree(sweep_dir / name)
                shutil.rmtree(outs[name])
            shutil.rmtree(sweep_dir, ignore_errors=True)
            fig = step(f"{tag} (c) read", read_once, args, settle)
            figs[mode]["read"].append(fig)
            fig = step(f"{tag} (c) write", write_once, args, os.sync)
            figs[mode]["write"].append(fig)
            log(f"{tag} (c) read once {figs[mode]['read'][-1]['wall']:.2f} s, write one output {fig['wall']:.2f} s")
    index_after = {str(f): f.stat().st_size for f in files_under(cache)}
    shutil.rmtree(runs, ignore_errors=True)

    med: dict[str, dict[str, float]] = {}
    for mode, by_step in figs.items():
        m = {key: statistics.median(x["wall"] for x in v) for key, v in by_step.items()}
        sums = [sum(by_step[name][i]["wall"] for name in outs) for i in range(args.repeat)]
        m["separate"] = statistics.median(sums)
        m["floor"] = m["read"] + K * m["write"]
        m["separate_floor"] = K * (m["read"] + m["write"])  # each merge at its own floor: 1 read + 1 write
        m["speedup"] = m["separate"] / m["sweep"]
        m["sweep_vs_floor"] = m["sweep"] / m["floor"]
        m["sweep_rss_mib"] = max(x["rss_mib"] for x in by_step["sweep"])
        m["merge_rss_mib"] = max(x["rss_mib"] for name in outs for x in by_step[name])
        m["sweep_cpu"] = statistics.median(x["cpu"] for x in by_step["sweep"])
        m["separate_cpu"] = statistics.median(sum(by_step[n][i]["cpu"] for n in outs) for i in range(args.repeat))
        known = [r for r in residency[mode] if r is not None]
        m["resident_min"], m["resident_max"] = (min(known), max(known)) if known else (float("nan"),) * 2
        med[mode] = m
    ok: dict[str, bool] = {}
    if "cold" in med:
        ok["cold_floor"] = med["cold"]["sweep_vs_floor"] <= GOALS["cold_floor"]
        ok["cold_speedup"] = med["cold"]["speedup"] >= GOALS["cold_speedup"]
    if "warm" in med:
        ok["warm_speedup"] = med["warm"]["speedup"] >= GOALS["warm_speedup"]

    warnings = []
    if numba_cache_state() != numba_before:
        warnings.append("numba compiled kernels during the measured steps (ramstream changed?): figures include JIT")
    if git_commit() != commit_before:
        warnings.append(f"the ramstream commit changed during the run (from {commit_before})")
    if index_after != index_before:
        warnings.append("the cached index changed during the measured steps: a run computed statistics (0) had not")
    if same and not all(same.values()):
        warnings.append(f"outputs differ from the sweep's: {', '.join(n for n, s in same.items() if not s)}")
    disturbed = [
        f"{mode} {key}" for mode, v in figs.items() for key, xs in v.items() for x in xs if x["others"] > DISTURBED
    ]
    if disturbed:
        warnings.append(
            f"other processes took more than {DISTURBED} of a core during {len(disturbed)} measured steps "
            f"({', '.join(sorted(set(disturbed)))}) even after retries: those wall times are inflated"
        )

    def mark(key: str) -> str:
        return "yes" if ok[key] else "**no**"

    modes = list(med)
    command = shlex.join(["python", os.path.relpath(__file__), *sys.argv[1:]])
    print(
        " ".join(
            f"{mode}: (b)/(a) = {med[mode]['speedup']:.2f}, (a)/(c) = {med[mode]['sweep_vs_floor']:.2f};"
            for mode in modes
        )
    )
    print()
    print(f"Command: `{command}`  ")
    print(f"Machine: {machine()}  ")
    print(f"ramstream: commit {git_commit()}  ")
    print(
        f"Family: {size if size != 'full' else '0.75B'} Qwen2-shaped bf16, {sum(shape_numel(shape)) / 1e9:.3f}B "
        f"parameters, base + {len(agents)} agents, {len(files)} input files, {nbytes / 1e9:.2f} GB; "
        f"K = {K} outputs of {per_output[0] / 1e9:.2f} GB  "
    )
    print(f"Candidates: {', '.join(name for name in outs)} (`{shlex.join(grid_args())}`)  ")
    print(
        f"Settings: --memory {args.memory}, --threads {args.threads or 'default (all)'}, median of {args.repeat}; "
        f"index and statistics cached first (probe {probe['wall']:.2f} s, ties statistics + merge "
        f"{stats['wall']:.2f} s; {sum(index_before.values()) / 1e6:.1f} MB); Numba's cache warmed  "
    )
    print(
        "Page cache: warm = the inputs read once before each timed run; cold = os.sync() then "
        "posix_fadvise(POSIX_FADV_DONTNEED) on every input and output file before each timed run "
        "(no memory cgroup); sampled share of the inputs' pages cached before the timed runs: "
        + ", ".join(f"{mode} {med[mode]['resident_min']:.0%}–{med[mode]['resident_max']:.0%}" for mode in modes)
        + "  "
    )
    print(
        "Floor (c): read the inputs once (1 thread, 64 MiB readinto, in the mode's page cache) + "
        "K x writing one output's bytes once (O_DIRECT, fdatasync)  "
    )
    if same:
        print(
            f"Outputs: every separate merge's output equals the sweep's candidate byte for byte: {all(same.values())}  "
        )
    print()
    print(f"| step | {' | '.join(f'{m} s' for m in modes)} |")
    print(f"|---|{'---:|' * len(modes)}")

    def cells(value: Callable[[dict[str, float]], float], fmt: str = "{:.2f}") -> str:
        return " | ".join(fmt.format(value(med[m])) for m in modes)

    def row(label: str, key: str, fmt: str = "{:.2f}") -> None:
        print(f"| {label} | {cells(lambda m: m[key], fmt)} |")

    row(f"(a) sweep, K = {K}", "sweep")
    row(f"(b) {K} separate merges, summed", "separate")
    for name in outs:
        row(f"&nbsp;&nbsp;merge {name}", name)
    row("(c) read the inputs once", "read")
    row("(c) write one output once", "write")
    row(f"(c) floor: 1 read + {K} writes", "floor")
    row(f"each merge at its floor: {K} x (1 read + 1 write)", "separate_floor")
    row("CPU s of (a)", "sweep_cpu", "{:.1f}")
    row("CPU s of (b)", "separate_cpu", "{:.1f}")
    row("peak RSS of (a), MiB", "sweep_rss_mib", "{:.0f}")
    row("largest peak RSS of (b), MiB", "merge_rss_mib", "{:.0f}")
    print()
    print("| ratio | " + " | ".join(modes) + " | goal | met |")
    print(f"|---|{'---:|' * len(modes)}---|---|")
    speedup_goals = "; ".join(f"{m}: >= {GOALS[m + '_speedup']:.0f}" for m in modes)
    speedup_met = "; ".join(f"{m}: {mark(m + '_speedup')}" for m in modes)
    print(f"| (b)/(a), separate over sweep | {cells(lambda m: m['speedup'])} | {speedup_goals} | {speedup_met} |")
    floor_goal, floor_met = (f"cold: <= {GOALS['cold_floor']:.2f}", mark("cold_floor")) if "cold" in med else ("", "")
    print(f"| (a)/(c), sweep over its floor | {cells(lambda m: m['sweep_vs_floor'])} | {floor_goal} | {floor_met} |")
    at_floors = cells(lambda m: m["separate_floor"] / m["floor"])
    print(f"| (b)/(a) were every run at its floor: {K} x (read + write) / (read + {K} writes) | {at_floors} | | |")
    for w in warnings:
        print(f"\nWARNING: {w}")
    if args.json:
        doc = {
            "command": command,
            "family": size,
            "bytes": nbytes,
            "output_bytes": per_output[0],
            "candidates": list(outs),
            "figures": figs,
            "residency": residency,
            "median": med,
            "goals": GOALS,
            "ok": ok,
            "same_bytes": same,
            "probe_seconds": probe["wall"],
            "ties_statistics_seconds": stats["wall"],
            "warnings": warnings,
        }
        Path(args.json).write_text(json.dumps(doc, indent=1))
    return 0


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--data", default="bench-data", help="where the family is written once [bench-data]")
    parser.add_argument("--memory", default="1GiB", help="--memory of the sweep and the merges [1GiB]")
    parser.add_argument("--threads", type=int, default=None, help="--threads of the sweep and the merges [all cores]")
    parser.add_argument("--repeat", type=int, default=1, help="rounds per page-cache mode; the median is reported [1]")
    parser.add_argument(
        "--modes", default="warm,cold", help="page-cache modes, comma-separated: warm, cold [warm,cold]"
    )
    size = parser.add_mutually_exclusive_group()
    size.add_argument("--quick", action="store_true", help="a much smaller family: a smoke run in seconds")
    size.add_argument("--medium", action="store_true", help="a family of about 1 GB: a check on a real disk")
    parser.add_argument(
        "--no-compare",
        dest="compare",
        action="store_false",
        help="skip the byte comparison of the separate merges' outputs with the sweep's (first round)",
    )
    parser.add_argument("--json", default=None, help="also write the raw figures to this JSON file")
    add_quiet_options(parser)
    args = parser.parse_args()
    if args.repeat < 1:
        parser.error("--repeat must be at least 1")
    args.modes = [m.strip() for m in args.modes.split(",") if m.strip()]
    if not args.modes or any(m not in ("warm", "cold") for m in args.modes):
        parser.error("--modes takes warm, cold or both")
    settle_quiet(args)
    return run(args)


if __name__ == "__main__":
    sys.exit(main())
