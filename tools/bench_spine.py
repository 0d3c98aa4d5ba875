"""The spine benchmark: RAM+ merge time against the time of reading the inputs once.

Writes a 0.75B-parameter Qwen2-shaped bf16 family (base + 3 agents at the paper's densities,
about 6 GB) under ``--data`` once, then measures, each step in a fresh process of the real CLI:

  (c) reading every input file once, one thread, warm page cache (sequential ``readinto`` of a
      reused 64 MiB buffer; one untimed warm-up read first);
  (a) ``ramstream merge --method ram+`` with no index (a fresh ``--cache-dir``: probe + merge);
  (b) the same merge with the index cached (a new ``--out``, the same ``--cache-dir``);
  (d) the peak RSS of (a) and (b), from ``getrusage(RUSAGE_CHILDREN)`` in a small wrapper process
      that starts the CLI (so the benchmark's own memory never leaks into the figure).

Numba's on-disk cache (a private one under ``--data``) is warmed first by one tiny merge, so JIT
compile time is not measured. The machine should be quiet: before each step the benchmark waits
(``--wait-quiet``) for an idle second, counts the CPU time other processes take during the step
(from /proc/stat), measures a disturbed step again (``--retries``) and warns when it stays disturbed.
Goals: (a)/(c) <= 3.0, (b)/(c) <= 2.0, peak RSS <= 1.3 GiB.

    python tools/bench_spine.py --data bench-data            # the full benchmark
    python tools/bench_spine.py --data bench-data --quick    # a smoke run in seconds
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import shlex
import shutil
import statistics
import subprocess
import sys
import time
from collections.abc import Callable
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent
MARKER = ".bench-complete"
READ_BUFFER = 64 * 1024 * 1024
GOALS = {"a": 3.0, "b": 2.0, "rss_mib": 1.3 * 1024}

# FamilyShape fields; FULL is ramstream.demo.samples.BENCH_SHAPE (kept here so the benchmark process
# itself never imports numpy/numba: its own footprint stays out of the children's figures).
FULL = {"hidden": 2048, "layers": 8, "vocab": 64000, "intermediate": 8448, "kv_hidden": 256}
QUICK = {"hidden": 256, "layers": 2, "vocab": 8192, "intermediate": 1024, "kv_hidden": 64}
WARMUP = {"hidden": 64, "layers": 1, "vocab": 512, "intermediate": 176, "kv_hidden": 16}
# ramstream.demo.samples.MOE_SHAPE: 8 layers x 64 experts, 1619 small tensors (108 MB a member)
MOE = {"hidden": 128, "layers": 8, "vocab": 4096, "intermediate": 0, "kv_hidden": 32, "experts": 64,
       "expert_intermediate": 64}  # fmt: skip
DENSITIES = (0.032, 0.462, 0.543)
MEMBERS = ("base", "agent1", "agent2", "agent3")

_WRITE_FAMILY = """
import json, sys
from pathlib import Path
from ramstream.demo.samples import FamilyShape, write_family
directory, shape, densities = Path(sys.argv[1]), json.loads(sys.argv[2]), tuple(json.loads(sys.argv[3]))
write_family(directory, shape=FamilyShape(**shape), densities=densities)
"""

_READ_ALL = """
import json, resource, sys, time
buf = bytearray(int(sys.argv[1]))
view = memoryview(buf)
total = 0
t0 = time.perf_counter()
for path in sys.argv[2:]:
    with open(path, "rb", buffering=0) as f:
        while True:
            n = f.readinto(view)
            if not n:
                break
            total += n
seconds = time.perf_counter() - t0
ru = resource.getrusage(resource.RUSAGE_SELF)
print(json.dumps({"seconds": seconds, "bytes": total, "cpu": ru.ru_utime + ru.ru_stime}))
"""

# Writes N bytes to a new file under a directory the way the merge writes its output (O_DIRECT from
# an aligned buffer where the file system allows it, then fdatasync); reports the seconds (and its CPU).
_WRITE_ONCE = """
import json, mmap, os, resource, sys, time
n, path = int(sys.argv[1]), sys.argv[2]
chunk = 32 * 1024 * 1024
buf = mmap.mmap(-1, chunk)
buf.write(b"\\x5a" * chunk)
t0 = time.perf_counter()
try:
    fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_TRUNC | os.O_DIRECT, 0o644)
    direct = True
except OSError:
    fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o644)
    direct = False
done = 0
while done < n:
    step = min(chunk, n - done)
    if direct and step % 4096:
        os.close(fd)
        fd = os.open(path, os.O_WRONLY)
        direct = False
    done += os.pwrite(fd, memoryview(buf)[:step], done)
os.fdatasync(fd)
os.close(fd)
seconds = time.perf_counter() - t0
os.unlink(path)
ru = resource.getrusage(resource.RUSAGE_SELF)
print(json.dumps({"seconds": seconds, "direct": direct, "cpu": ru.ru_utime + ru.ru_stime}))
"""

# Runs one command and reports its wall time and rusage: started by the benchmark, so that the
# peak RSS (ru_maxrss of RUSAGE_CHILDREN) belongs to the command alone.
_MEASURE = """
import json, resource, subprocess, sys, time
t0 = time.perf_counter()
proc = subprocess.run(sys.argv[2:], stdout=subprocess.PIPE, stderr=subprocess.PIPE)
wall = time.perf_counter() - t0
ru = resource.getrusage(resource.RUSAGE_CHILDREN)
doc = {
    "rc": proc.returncode,
    "wall": wall,
    "maxrss_mib": ru.ru_maxrss / 1024,
    "user": ru.ru_utime,
    "sys": ru.ru_stime,
    "minflt": ru.ru_minflt,
    "majflt": ru.ru_majflt,
    "stdout": proc.stdout.decode(errors="replace"),
    "stderr": proc.stderr.decode(errors="replace"),
}
with open(sys.argv[1], "w") as f:
    json.dump(doc, f)
"""


def log(msg: str) -> None:
    print(f"[bench {time.strftime('%H:%M:%S')}] {msg}", file=sys.stderr, flush=True)


def ramstream_cmd() -> list[str]:
    script = Path(sys.executable).parent / "ramstream"
    if script.is_file() and os.access(script, os.X_OK):
        return [str(script)]
    return [sys.executable, "-c", "from ramstream.cli import main; main()"]


def ensure_family(directory: Path, shape: dict[str, int]) -> tuple[Path, list[Path]]:
    """Write the family once; a marker file records that (and what) it finished writing."""
    want = {"shape": shape, "densities": list(DENSITIES), "seed": 0}
    marker = directory / MARKER
    paths = [directory / m for m in MEMBERS]
    if marker.is_file():
        try:
            if json.loads(marker.read_text()) == want:
                return paths[0], paths[1:]
        except ValueError:
            pass
    if directory.exists():
        shutil.rmtree(directory)
    directory.mkdir(parents=True)
    log(f"writing the family {shape} to {directory} (once)")
    t0 = time.perf_counter()
    subprocess.run(
        [sys.executable, "-c", _WRITE_FAMILY, str(directory), json.dumps(shape), json.dumps(list(DENSITIES))],
        check=True,
    )
    marker.write_text(json.dumps(want))
    log(f"family written in {time.perf_counter() - t0:.1f} s")
    return paths[0], paths[1:]


def input_files(base: Path, agents: list[Path]) -> list[Path]:
    return [f for d in (base, *agents) for f in sorted(d.glob("*.safetensors"))]


def measure(argv: list[str], result: Path) -> dict[str, object]:
    """Run ``argv`` under the measuring wrapper; fail loudly if it fails."""
    subprocess.run([sys.executable, "-c", _MEASURE, str(result), *argv], check=True)
    doc: dict[str, object] = json.loads(result.read_text())
    result.unlink()
    if doc["rc"] != 0:
        sys.exit(f"command failed (exit {doc['rc']}): {shlex.join(argv)}\n{doc['stderr']}")
    return doc


def read_inputs(files: list[Path]) -> dict[str, float]:
    out = subprocess.run(
        [sys.executable, "-c", _READ_ALL, str(READ_BUFFER), *map(str, files)],
        check=True,
        stdout=subprocess.PIPE,
    )
    doc: dict[str, float] = json.loads(out.stdout)
    return doc


def write_once(nbytes: int, path: Path) -> dict[str, float]:
    out = subprocess.run(
        [sys.executable, "-c", _WRITE_ONCE, str(nbytes), str(path)], check=True, stdout=subprocess.PIPE
    )
    doc: dict[str, float] = json.loads(out.stdout)
    return doc


def kernels_alone(data: Path, runs: Path, args: argparse.Namespace) -> dict[str, float]:
    """Medians of tools/bench_kernels.py: one read of the inputs, the probe and merge kernels."""
    out = runs / "kernels.json"
    cmd = [sys.executable, str(REPO / "tools" / "bench_kernels.py"), "--data", str(data), "--repeat", "3"]
    subprocess.run([*cmd, "--json", str(out)], check=True, stdout=subprocess.DEVNULL)
    doc: dict[str, float] = json.loads(out.read_text())
    return doc


def merge_argv(base: Path, agents: list[Path], out: Path, cache: Path, args: argparse.Namespace) -> list[str]:
    argv = [*ramstream_cmd(), "merge", str(base), *map(str, agents), "--out", str(out), "--method", "ram+"]
    argv += ["--cache-dir", str(cache), "--memory", args.memory, "--quiet"]
    if args.threads:
        argv += ["--threads", str(args.threads)]
    return argv


def machine() -> str:
    mem_kib = 0
    cpu = platform.processor() or platform.machine()
    try:
        for line in Path("/proc/meminfo").read_text().splitlines():
            if line.startswith("MemTotal:"):
                mem_kib = int(line.split()[1])
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("model name"):
                cpu = line.split(":", 1)[1].strip()
                break
    except OSError:
        pass
    return f"{os.cpu_count()} CPUs ({cpu}), {mem_kib / 1024**2:.1f} GiB RAM, {platform.system()} {platform.release()}"


def git_commit() -> str:
    try:
        head = subprocess.run(
            ["git", "-C", str(REPO), "rev-parse", "--short", "HEAD"], check=True, capture_output=True, text=True
        ).stdout.strip()
        dirty = subprocess.run(
            ["git", "-C", str(REPO), "status", "--porcelain", "--", "ramstream"],
            check=True,
            capture_output=True,
            text=True,
        ).stdout.strip()
    except (OSError, subprocess.CalledProcessError):
        return "unknown"
    return head + (" (+ uncommitted changes in ramstream/)" if dirty else "")


def numba_cache_state() -> dict[str, int]:
    """The benchmark's own numba cache files and their mtimes: a change means a kernel was compiled."""
    directory = Path(os.environ["NUMBA_CACHE_DIR"])
    return {str(f): f.stat().st_mtime_ns for f in directory.rglob("*.nb[ic]")}


def busy_cpu_seconds() -> float:
    """CPU seconds the whole machine has spent busy since boot (from /proc/stat; 0 if unknown)."""
    try:
        fields = [int(x) for x in Path("/proc/stat").read_text().splitlines()[0].split()[1:]]
    except (OSError, ValueError, IndexError):
        return 0.0
    idle = fields[3] + (fields[4] if len(fields) > 4 else 0)  # idle + iowait
    busy = sum(fields[:8]) - idle  # user nice system idle iowait irq softirq steal
    return busy / os.sysconf("SC_CLK_TCK")


# A step counts as disturbed when other processes used more than this many cores on average.
DISTURBED = 0.1


def wait_quiet(limit: float) -> None:
    """Wait (up to ``limit`` s) for a one-second window in which the machine is all but idle."""
    deadline = time.monotonic() + limit
    while time.monotonic() < deadline:
        busy = busy_cpu_seconds()
        time.sleep(1.0)
        if busy_cpu_seconds() - busy < DISTURBED:
            return


def step(
    label: str,
    once: Callable[[], dict[str, float]],
    args: argparse.Namespace,
    prepare: Callable[[], None] | None = None,
) -> dict[str, float]:
    """Run one measured step, retried when other processes took a share of the CPUs meanwhile;
    the least disturbed attempt counts. ``prepare`` (untimed) runs before every attempt, before
    the wait for a quiet machine: say, setting the page cache up."""
    best: dict[str, float] | None = None
    for attempt in range(args.retries + 1):
        if prepare is not None:
            prepare()
        wait_quiet(args.wait_quiet)
        busy, t0 = busy_cpu_seconds(), time.perf_counter()
        fig = once()
        # What the machine spent beyond the step's own CPU time: other processes (and the wrapper),
        # as cores on average over the step (process start and exit included).
        fig["others"] = max(0.0, busy_cpu_seconds() - busy - fig["cpu"]) / (time.perf_counter() - t0)
        if best is None or fig["others"] < best["others"]:
            best = fig
        if fig["others"] <= DISTURBED:
            break
        if attempt < args.retries:
            log(f"{label}: other processes used {fig['others']:.2f} cores meanwhile ({fig['wall']:.2f} s); again")
    assert best is not None
    return best


def merge_step(argv: list[str], result: Path) -> dict[str, float]:
    doc = measure(argv, result)
    return {
        "wall": float(doc["wall"]),  # type: ignore[arg-type]
        "cpu": float(doc["user"]) + float(doc["sys"]),  # type: ignore[arg-type]
        "rss_mib": float(doc["maxrss_mib"]),  # type: ignore[arg-type]
    }


def run(args: argparse.Namespace) -> int:
    data = Path(args.data).resolve()
    shape = QUICK if args.quick else FULL
    base, agents = ensure_family(data / ("quick" if args.quick else "full"), shape)
    files = input_files(base, agents)
    nbytes = sum(f.stat().st_size for f in files)
    runs = data / "runs"
    shutil.rmtree(runs, ignore_errors=True)
    runs.mkdir(parents=True)
    result = runs / "measure.json"
    # A private numba cache (kept across runs): other processes compiling kernels (say a test run)
    # neither share nor disturb it, and any compile during the measured steps shows up in it.
    os.environ["NUMBA_CACHE_DIR"] = str(data / "numba-cache")

    # Numba caches its compiled kernels on disk (cache=True): one tiny merge of the same dtypes and
    # agent count compiles them, so the measured merges below load them instead of compiling.
    wbase, wagents = ensure_family(data / "warmup", WARMUP)
    log("warming numba's cache with one tiny merge (JIT compile time is excluded from the figures)")
    warm = measure(merge_argv(wbase, wagents, runs / "warm-out", runs / "warm-cache", args), result)
    log(f"warm-up merge: {warm['wall']:.2f} s")
    commit_before, cache_before = git_commit(), numba_cache_state()
    startup = measure([*ramstream_cmd(), "--version"], result)
    imports = measure([sys.executable, "-c", "import ramstream.api"], result)

    # Two floors every merge pays: the fixed cost of a run (a merge with next to nothing to merge,
    # its index cached: interpreter, imports, numba's set-up, index and output bookkeeping) and
    # writing the output's bytes once to this disk, synced.
    tiny_argv = [merge_argv(wbase, wagents, runs / f"tiny-{k}", runs / "warm-cache", args) for k in range(3)]
    tiny = [measure(argv, result) for argv in tiny_argv]
    fixed = statistics.median(float(t["wall"]) for t in tiny)  # type: ignore[arg-type]
    out_bytes = sum(f.stat().st_size for f in sorted(base.glob("*.safetensors")))
    written = statistics.median(write_once(out_bytes, runs / "write-once.bin")["seconds"] for _ in range(3))
    log(f"fixed cost of a merge run {fixed:.2f} s; writing {out_bytes / 1e9:.2f} GB once {written:.2f} s")
    # The probe kernel alone (tools/bench_kernels.py), in this run: (a) pays it beside (b)'s floors.
    kernels = kernels_alone(data, runs, args) if not args.quick else None

    log(f"inputs: {len(files)} files, {nbytes / 1e9:.2f} GB; warm-up read (untimed)")
    read_inputs(files)
    cache, out_a, out_b = runs / "cache", runs / "out-a", runs / "out-b"

    def read_once() -> dict[str, float]:
        doc = read_inputs(files)
        if doc["bytes"] != nbytes:
            sys.exit(f"read {doc['bytes']} bytes of inputs, expected {nbytes}")
        return {"wall": doc["seconds"], "cpu": doc["cpu"]}

    def merge_a() -> dict[str, float]:
        for path in (cache, out_a):
            shutil.rmtree(path, ignore_errors=True)
        return merge_step(merge_argv(base, agents, out_a, cache, args), result)

    def merge_b() -> dict[str, float]:
        shutil.rmtree(out_b, ignore_errors=True)
        return merge_step(merge_argv(base, agents, out_b, cache, args), result)

    figs: dict[str, list[dict[str, float]]] = {"c": [], "a": [], "b": []}
    for rep in range(args.repeat):
        tag = f"[{rep + 1}/{args.repeat}]"
        c = step("(c)", read_once, args)
        figs["c"].append(c)
        log(f"{tag} (c) read once: {c['wall']:.3f} s ({nbytes / c['wall'] / 1e9:.2f} GB/s)")
        a = step("(a)", merge_a, args)
        figs["a"].append(a)
        log(f"{tag} (a) ram+, no index: {a['wall']:.2f} s, CPU {a['cpu']:.1f} s, peak RSS {a['rss_mib']:.0f} MiB")
        b = step("(b)", merge_b, args)
        figs["b"].append(b)
        log(f"{tag} (b) ram+, cached index: {b['wall']:.2f} s, CPU {b['cpu']:.1f} s, peak RSS {b['rss_mib']:.0f} MiB")
    shutil.rmtree(runs, ignore_errors=True)

    med = {k: {f: statistics.median(x[f] for x in v) for f in v[0]} for k, v in figs.items()}
    ratio_a, ratio_b = med["a"]["wall"] / med["c"]["wall"], med["b"]["wall"] / med["c"]["wall"]
    rss = max(med["a"]["rss_mib"], med["b"]["rss_mib"])
    ok = {"a": ratio_a <= GOALS["a"], "b": ratio_b <= GOALS["b"], "rss": rss <= GOALS["rss_mib"]}

    warnings = []
    if numba_cache_state() != cache_before:
        warnings.append("numba compiled kernels during the measured steps (ramstream changed?): figures include JIT")
    if git_commit() != commit_before:
        warnings.append(f"the ramstream commit changed during the run (from {commit_before})")
    disturbed = [k for k, v in figs.items() for x in v if x["others"] > DISTURBED]
    if disturbed:
        warnings.append(
            f"other processes took more than {DISTURBED} of a core during {len(disturbed)} of the "
            f"{3 * args.repeat} measured steps ({', '.join(sorted(set(disturbed)))}) even after retries: "
            "those wall times are inflated; rerun on a quiet machine"
        )

    def mark(good: bool) -> str:
        return "yes" if good else "**no**"

    def cores(k: str) -> str:
        return f"{med[k]['others']:.2f}"

    params = sum(shape_numel(shape))
    command = shlex.join(["python", os.path.relpath(__file__), *sys.argv[1:]])
    print(f"(a)/(c) = {ratio_a:.2f}   (b)/(c) = {ratio_b:.2f}   peak RSS = {rss:.0f} MiB")
    print()
    print(f"Command: `{command}`  ")
    print(f"Machine: {machine()}  ")
    print(f"ramstream: commit {git_commit()}  ")
    print(
        f"Family: {'quick' if args.quick else '0.75B'} Qwen2-shaped bf16, {params / 1e9:.3f}B parameters, "
        f"base + {len(agents)} agents (densities {', '.join(map(str, DENSITIES))}), "
        f"{len(files)} input files, {nbytes / 1e9:.2f} GB  "
    )
    print(
        f"Settings: --memory {args.memory}, --threads {args.threads or 'default (all)'}, "
        f"median of {args.repeat}; numba cache warmed by a tiny merge first (no JIT time measured)  "
    )
    print(
        f"Fixed cost in every CLI run: python + `import ramstream.api` {imports['wall']:.2f} s "
        f"(`ramstream --version` {startup['wall']:.2f} s); a merge with next to nothing to merge (the "
        f"warm-up family, index cached) {fixed:.2f} s  "
    )
    print(f"Writing the output's {out_bytes / 1e9:.2f} GB once to this disk (O_DIRECT, synced): {written:.2f} s  ")
    if kernels:
        print(
            f"Kernels alone (tools/bench_kernels.py, median of 3): read {kernels['read']:.3f} s, "
            f"probe {kernels['probe']:.3f} s, merge {kernels['merge']:.3f} s  "
        )
        floor_b = (fixed + written) / med["c"]["wall"]
        floor_a = (fixed + kernels["probe"] + written) / med["c"]["wall"]
        print(f"Floors in this run: (b) >= {floor_b:.2f} x (c), (a) >= {floor_a:.2f} x (c)")
    print()
    print("| step | seconds | GB/s of input | x (c) | peak RSS MiB | CPU s | others' cores | goal | met |")
    print("|---|---:|---:|---:|---:|---:|---:|---|---|")
    print(
        f"| (c) read inputs once, 1 thread, warm cache | {med['c']['wall']:.3f} | "
        f"{nbytes / med['c']['wall'] / 1e9:.2f} | 1.00 | | {med['c']['cpu']:.2f} | {cores('c')} | | |"
    )
    for k, label, ratio in (
        ("a", "(a) merge ram+, no index (probe + merge)", ratio_a),
        ("b", "(b) merge ram+, index cached", ratio_b),
    ):
        m = med[k]
        print(
            f"| {label} | {m['wall']:.3f} | {nbytes / m['wall'] / 1e9:.2f} | {ratio:.2f} | {m['rss_mib']:.0f} | "
            f"{m['cpu']:.1f} | {cores(k)} | <= {GOALS[k]:.1f} x (c) | {mark(ok[k])} |"
        )
    print(f"| (d) peak RSS of (a), (b) | | | | {rss:.0f} | | | <= {GOALS['rss_mib']:.0f} MiB | {mark(ok['rss'])} |")
    for w in warnings:
        print(f"\nWARNING: {w}")
    if args.json:
        doc = {
            "figures": figs,
            "median": med,
            "bytes": nbytes,
            "ratios": [ratio_a, ratio_b],
            "ok": ok,
            "fixed_run_seconds": fixed,
            "write_once_seconds": written,
            "kernels_alone": kernels,
        }
        Path(args.json).write_text(json.dumps(doc, indent=1))
    return 0


def shape_numel(shape: dict[str, int]) -> list[int]:
    h, kv, inter, v = shape["hidden"], shape["kv_hidden"], shape["intermediate"], shape["vocab"]
    per_layer = 2 * h + 2 * h * h + h + 2 * (kv * h + kv) + 3 * inter * h
    return [2 * v * h, shape["layers"] * per_layer, h]


def add_quiet_options(parser: argparse.ArgumentParser) -> None:
    """--wait-quiet and --retries: how a step waits for, and retries after, a busy machine."""
    parser.add_argument(
        "--wait-quiet",
        type=float,
        default=None,
        help="seconds to wait for an idle machine before each step [30; 0 with --quick]",
    )
    parser.add_argument(
        "--retries",
        type=int,
        default=None,
        help="measure a step again when other processes used the CPUs meanwhile [2; 0 with --quick]",
    )


def settle_quiet(args: argparse.Namespace) -> None:
    """Their defaults once --quick is known: a smoke run neither waits nor retries."""
    if args.wait_quiet is None:
        args.wait_quiet = 0.0 if args.quick else 30.0
    if args.retries is None:
        args.retries = 0 if args.quick else 2


def add_run_options(parser: argparse.ArgumentParser) -> None:
    """The options of the benchmarks that merge the spine's family: where it lives, the merges'
    --memory and --threads, rounds, a quick family, a JSON copy, and how to wait for quiet."""
    parser.add_argument("--data", default="bench-data", help="where the family is written once [bench-data]")
    parser.add_argument("--memory", default="1GiB", help="--memory for the merges [1GiB]")
    parser.add_argument("--threads", type=int, default=None, help="--threads for the merges [all cores]")
    parser.add_argument("--repeat", type=int, default=1, help="rounds; the median is reported [1]")
    parser.add_argument("--quick", action="store_true", help="a much smaller family: a smoke run in seconds")
    parser.add_argument("--json", default=None, help="also write the raw figures to this JSON file")
    add_quiet_options(parser)


def parse_run_args(parser: argparse.ArgumentParser) -> argparse.Namespace:
    """Parse, check --repeat, and settle the quiet options' defaults."""
    args = parser.parse_args()
    if args.repeat < 1:
        parser.error("--repeat must be at least 1")
    settle_quiet(args)
    return args


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    add_run_options(parser)
    return run(parse_run_args(parser))


if __name__ == "__main__":
    sys.exit(main())
