"""ramstream against mergekit 0.1.5: wall time and peak RSS of the same merges, in one run.

Uses the spine benchmark's 0.75B-parameter Qwen2-shaped bf16 family (base + 3 agents at the
paper's densities, written once under ``--data`` by tools/bench_spine.py's writer) and, for each
method, one mergekit YAML config that both tools run:

    mergekit-yaml X.yml OUT --random-seed 0 --quiet           (CPU, mergekit's default options)
    ramstream merge --config X.yml --out OUT --seed 0 --quiet (--memory 1GiB, no index cached)

with ``dtype: float32`` and ``out_dtype: bfloat16``: task_arithmetic, ties (density 0.2),
dare_ties (density 0.5), ram (weights 1), slerp (the base and the first agent, t by filter
and gradient as the hub's slerp configs write it) and multislerp (weights 1); ``--methods`` picks
some. Each command runs in a fresh process started by a
small wrapper that reads its wall time and peak RSS from ``getrusage(RUSAGE_CHILDREN)`` (wait4),
so neither the benchmark's memory nor another command's leaks into a figure. ramstream starts
each merge with an empty cache directory: its statistics passes (ties' histograms, ram's probe)
are counted. Numba's cache is warmed first by tiny merges (no JIT time measured) and the inputs
are read once so both tools start from a warm page cache. The tools alternate per method;
before each step the benchmark waits for an idle second and records the CPU time other
processes took meanwhile (the machine may be shared: a step is measured again when others used
more than 0.1 core, and the least disturbed attempt counts). At the end the outputs are
compared element by element (bf16 bits).

    python tools/bench_vs_mergekit.py --data bench-data             # the 0.75B family
    python tools/bench_vs_mergekit.py --data bench-data --quick     # a smoke run in seconds
"""

from __future__ import annotations

import argparse
import json
import os
import shlex
import shutil
import sys
import time
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent))
import bench_spine as spine  # the family writer, the measuring wrapper, the quiet-machine checks

METHODS: dict[str, dict[str, Any]] = {
    "task_arithmetic": {"weight": 1.0},
    "ties": {"weight": 1.0, "density": 0.2},
    "dare_ties": {"weight": 1.0, "density": 0.5},
    "ram": {},
    "slerp": {},  # the base and the first agent, t as the hub's slerp configs set it (below)
    "multislerp": {"weight": 1.0},
}
SLERP_T = [{"filter": "self_attn", "value": [0, 0.5, 0.3, 0.7, 1]}, {"filter": "mlp", "value": [1, 0.5, 0.7, 0.3, 0]}]
SEED = 0


def write_config(path: Path, method: str, base: Path, agents: list[Path], layers: int) -> None:
    params = METHODS[method]
    doc: dict[str, Any] = {
        "merge_method": method,
        "base_model": str(base),
        "models": [{"model": str(a), **({"parameters": params} if params else {})} for a in agents],
        "dtype": "float32",
        "out_dtype": "bfloat16",
    }
    if method == "slerp":
        doc["models"] = [{"model": str(base)}, {"model": str(agents[0])}]
        # a gradient longer than the layers is refused: small families take one t
        doc["parameters"] = {"t": [*SLERP_T, {"value": 0.5}] if layers >= 5 else 0.5}
    path.write_text(json.dumps(doc, indent=1))  # JSON is YAML


def mergekit_cmd() -> list[str]:
    script = Path(sys.executable).parent / "mergekit-yaml"
    if not script.is_file():
        sys.exit(f"mergekit-yaml not found next to {sys.executable}: pip install torch==2.13.0 mergekit==0.1.5")
    return [str(script)]


def commands(method: str, config: Path, out: Path, cache: Path, args: argparse.Namespace) -> dict[str, list[str]]:
    ramstream = [*spine.ramstream_cmd(), "merge", "--config", str(config), "--out", str(out / "ramstream")]
    ramstream += ["--cache-dir", str(cache), "--memory", args.memory, "--quiet"]
    if method == "dare_ties":
        ramstream += ["--seed", str(SEED)]
    mergekit = [*mergekit_cmd(), str(config), str(out / "mergekit"), "--random-seed", str(SEED), "--quiet"]
    if args.threads:
        ramstream += ["--threads", str(args.threads)]
        mergekit += ["--num-threads", str(args.threads)]
    return {"mergekit": mergekit, "ramstream": ramstream}


def warm_numba(data: Path, runs: Path, args: argparse.Namespace) -> None:
    """One tiny merge per method compiles ramstream's kernels into the benchmark's numba cache."""
    wbase, wagents = spine.ensure_family(data / "warmup", spine.WARMUP)
    for method in args.methods:
        config = runs / f"warm-{method}.yml"
        write_config(config, method, wbase, wagents, spine.WARMUP["layers"])
        argv = commands(method, config, runs / f"warm-{method}", runs / f"warm-cache-{method}", args)["ramstream"]
        spine.measure(argv, runs / "measure.json")


def run(args: argparse.Namespace) -> int:
    data = Path(args.data).resolve()
    shape = spine.QUICK if args.quick else spine.FULL
    base, agents = spine.ensure_family(data / ("quick" if args.quick else "full"), shape)
    files = spine.input_files(base, agents)
    nbytes = sum(f.stat().st_size for f in files)
    runs = data / "runs-vs-mergekit"
    shutil.rmtree(runs, ignore_errors=True)
    runs.mkdir(parents=True)
    result = runs / "measure.json"
    os.environ["NUMBA_CACHE_DIR"] = str(data / "numba-cache")
    spine.log("warming numba's cache with tiny merges (JIT compile time is excluded from the figures)")
    warm_numba(data, runs, args)
    spine.log(f"inputs: {len(files)} files, {nbytes / 1e9:.2f} GB; warm-up read (untimed)")
    spine.read_inputs(files)
    startup = {
        "mergekit": spine.measure([*mergekit_cmd(), "--help"], result)["wall"],
        "ramstream": spine.measure([*spine.ramstream_cmd(), "merge", "--help"], result)["wall"],
    }

    figures: dict[str, dict[str, dict[str, float]]] = {}
    for method in args.methods:
        config = runs / f"{method}.yml"
        write_config(config, method, base, agents, shape["layers"])
        out, cache = runs / method, runs / f"cache-{method}"
        argv = commands(method, config, out, cache, args)
        figures[method] = {}
        for tool in ("mergekit", "ramstream"):
            fig = tool_step(f"{method} {tool}", argv[tool], out / tool, cache, result, args)
            figures[method][tool] = fig
            spine.log(
                f"{method}: {tool} {fig['wall']:.1f} s, peak RSS {fig['rss_mib']:.0f} MiB, CPU {fig['cpu']:.1f} s"
            )
        figures[method]["agreement"] = agreement(out / "ramstream", out / "mergekit", [base, *agents])
        if not args.keep:
            shutil.rmtree(out, ignore_errors=True)
        shutil.rmtree(cache, ignore_errors=True)
    report(args, shape, agents, files, nbytes, startup, figures)
    if args.json:
        Path(args.json).write_text(json.dumps({"figures": figures, "startup": startup, "bytes": nbytes}, indent=1))
    if not args.keep:
        shutil.rmtree(runs, ignore_errors=True)
    return 0


def tool_step(
    label: str, argv: list[str], out: Path, cache: Path, result: Path, args: argparse.Namespace
) -> dict[str, float]:
    """One merge from scratch (no output, no cached index), retried while the machine is busy."""

    def once() -> dict[str, float]:
        shutil.rmtree(out, ignore_errors=True)
        shutil.rmtree(cache, ignore_errors=True)
        return spine.merge_step(argv, result)

    return spine.step(label, once, args)


def agreement(ours: Path, theirs: Path, members: list[Path]) -> dict[str, float]:
    """How the two outputs compare, element by element (bf16 bits): the share identical, how
    many differ by one ulp, how many are near-zero cancellations (both values within a float32
    rounding of the operands |base| + sum |tau|: where the exact value is 0, one order of float32
    operations gives 0 and another a residue like 2**-33, thousands of bf16 ulps near zero), and
    the largest gap in ulps among the rest (a kept vs dropped value: random draws, threshold ties)."""
    import numpy as np

    a, b = tensors(ours), tensors(theirs)
    inputs = [tensors(m) for m in members]  # base first
    if set(a) != set(b):
        return {"identical": 0.0, "differ": -1, "one_ulp": 0, "cancellations": 0, "max_ulp": float("inf")}
    same = total = one_ulp = cancellations = worst = 0
    for name, x in a.items():
        y = b[name]
        eq = x == y
        same += int(eq.sum())
        total += x.size
        if eq.all():
            continue
        idx = np.flatnonzero(~eq)
        xi, yi = x[idx].astype(np.int64), y[idx].astype(np.int64)
        ulps = np.abs(np.where(xi & 0x8000, -(xi & 0x7FFF), xi) - np.where(yi & 0x8000, -(yi & 0x7FFF), yi))
        one_ulp += int((ulps == 1).sum())
        values = [(np.asarray(m[name][idx]).astype(np.uint32) << 16).view(np.float32) for m in inputs]
        scale = np.abs(values[0]) + sum(np.abs(v - values[0]) for v in values[1:])
        gap = np.abs((xi.astype(np.uint32) << 16).view(np.float32) - (yi.astype(np.uint32) << 16).view(np.float32))
        cancelled = (ulps > 1) & (gap <= np.float32(2.0**-22) * scale)
        cancellations += int(cancelled.sum())
        rest = ulps[~cancelled]
        worst = max(worst, int(rest.max()) if rest.size else 0)
    return {
        "identical": same / total,
        "differ": total - same,
        "one_ulp": one_ulp,
        "cancellations": cancellations,
        "max_ulp": float(worst),
    }


def tensors(directory: Path) -> dict[str, Any]:
    """name -> bf16 bits (uint16 memmap) of every tensor of an output directory."""
    import numpy as np

    out = {}
    for path in sorted(directory.glob("*.safetensors")):
        with open(path, "rb") as f:
            n = int.from_bytes(f.read(8), "little")
            header = json.loads(f.read(n))
        header.pop("__metadata__", None)
        data = np.memmap(path, dtype=np.uint8, mode="r", offset=8 + n)
        for name, spec in header.items():
            lo, hi = spec["data_offsets"]
            if spec["dtype"] == "BF16":
                out[name] = data[lo:hi].view(np.uint16)
    return out


def report(
    args: argparse.Namespace,
    shape: dict[str, int],
    agents: list[Path],
    files: list[Path],
    nbytes: int,
    startup: dict[str, float],
    figures: dict[str, dict[str, dict[str, float]]],
) -> None:
    params = sum(spine.shape_numel(shape))
    command = shlex.join(["python", os.path.relpath(__file__), *sys.argv[1:]])
    print(f"Command: `{command}`  ")
    print(f"Machine: {spine.machine()}  ")
    print(f"ramstream: commit {spine.git_commit()}; mergekit {mergekit_version()}  ")
    print(
        f"Family: {'quick' if args.quick else '0.75B'} Qwen2-shaped bf16, {params / 1e9:.3f}B parameters, "
        f"base + {len(agents)} agents (densities {', '.join(map(str, spine.DENSITIES))}), "
        f"{len(files)} input files, {nbytes / 1e9:.2f} GB; float32 arithmetic, bf16 output  "
    )
    print(
        f"Settings: ramstream --memory {args.memory}, threads {args.threads or 'all'} for both; warm page cache; "
        f"process start and imports included (`--help`: mergekit {startup['mergekit']:.1f} s, "
        f"ramstream {startup['ramstream']:.1f} s)"
    )
    print()
    print(
        "| method | mergekit s | ramstream s | time ratio (mk / rs) | mergekit peak RSS MiB | "
        "ramstream peak RSS MiB | RSS ratio | identical elements | the other elements | others' cores (mk / rs) |"
    )
    print("|---|---:|---:|---:|---:|---:|---:|---:|---|---|")
    disturbed = []
    for method, fig in figures.items():
        mk, rs, agree = fig["mergekit"], fig["ramstream"], fig["agreement"]
        print(
            f"| {method} | {mk['wall']:.1f} | {rs['wall']:.1f} | {mk['wall'] / rs['wall']:.2f} | "
            f"{mk['rss_mib']:.0f} | {rs['rss_mib']:.0f} | {mk['rss_mib'] / rs['rss_mib']:.1f} | "
            f"{100 * agree['identical']:.4f} % | {differences(agree)} | "
            f"{mk['others']:.2f} / {rs['others']:.2f} |"
        )
        disturbed += [f"{method} {t}" for t in ("mergekit", "ramstream") if fig[t]["others"] > spine.DISTURBED]
    if disturbed:
        print(
            f"\nWARNING: other processes took more than {spine.DISTURBED} of a core during {', '.join(disturbed)} "
            "even after retries: those wall times are inflated; rerun on a quiet machine"
        )


def differences(agree: dict[str, float]) -> str:
    """The elements that differ: one ulp, near-zero cancellations, and the rest (up to max_ulp)."""
    if agree["differ"] < 0:
        return "the outputs hold other tensors"
    if agree["differ"] == 0:
        return "none"
    left = int(agree["differ"]) - int(agree["one_ulp"]) - int(agree["cancellations"])
    parts = [f"{agree['one_ulp']:.0f} by 1 ulp"]
    if agree["cancellations"]:
        parts.append(f"{agree['cancellations']:.0f} near-zero cancellations")
    if left > 0:
        parts.append(f"{left} by up to {agree['max_ulp']:.0f} ulp")
    return ", ".join(parts)


def mergekit_version() -> str:
    from importlib.metadata import PackageNotFoundError, version

    try:
        return version("mergekit")
    except PackageNotFoundError:
        return "not installed"


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--data", default="bench-data", help="where the family is written once [bench-data]")
    parser.add_argument("--memory", default="1GiB", help="ramstream's --memory [1GiB]")
    parser.add_argument("--threads", type=int, default=None, help="threads for both tools [all cores]")
    parser.add_argument("--quick", action="store_true", help="a much smaller family: a smoke run in seconds")
    parser.add_argument("--keep", action="store_true", help="keep the outputs under DATA/runs-vs-mergekit")
    parser.add_argument("--json", default=None, help="also write the raw figures to this JSON file")
    parser.add_argument(
        "--wait-quiet", type=float, default=None, help="seconds to wait for an idle machine before each step [30]"
    )
    parser.add_argument("--retries", type=int, default=None, help="measure a disturbed step again [1]")
    parser.add_argument("--methods", default=",".join(METHODS), help=f"comma-separated, of {', '.join(METHODS)} [all]")
    args = parser.parse_args()
    args.methods = [m for m in args.methods.split(",") if m]
    unknown = sorted(set(args.methods) - set(METHODS))
    if unknown:
        parser.error(f"unknown method(s): {', '.join(unknown)}")
    if args.wait_quiet is None:
        args.wait_quiet = 0.0 if args.quick else 30.0
    if args.retries is None:
        args.retries = 0 if args.quick else 1
    t0 = time.perf_counter()
    code = run(args)
    spine.log(f"done in {time.perf_counter() - t0:.0f} s")
    return code


if __name__ == "__main__":
    sys.exit(main())
