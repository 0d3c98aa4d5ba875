"""The torch backend against the Numba backend on the 0.75B benchmark family (not a test).

CPU (the default): each pass in a fresh CLI process, Numba then torch on the CPU, warm page
cache: the probe pass (``ramstream probe``, a fresh index) and the merge pass (``ramstream merge
--method ram+`` with that index cached); wall time, input GB/s and peak RSS (from
``tools/bench_spine.py``'s measuring wrapper), and the two outputs compared byte for byte.

``--cuda`` (on a machine with a GPU): in this process, the merge pass's input throughput (GB/s
of input, ``api.merge`` with the index cached) of torch on CUDA and of Numba, and the probe pass's,
against two floors measured on the same files in the same run: reading every input from the page
cache into pinned host memory with one thread per core, and the pinned host-to-device copy
bandwidth. Goal: the merge pass at >= 80 % of the slower floor. The outputs of torch and Numba
are compared byte for byte. ``--cuda --device cpu`` runs the same steps with torch on the CPU and
no copy floor (a dry run of this script where there is no GPU).

``--staging`` measures the streamed path's reads alone, on any machine: every input read through
the backend's input ring (slots of ``--slot`` bytes, parts cut into pieces on a pool of one thread
per core, one barrier per tile) against the read floor, in the same run.

    python tools/bench_torch.py --data bench-data            # CPU: numba vs torch, both passes
    python tools/bench_torch.py --data bench-data --cuda     # GPU: floors, torch on cuda, numba
    python tools/bench_torch.py --data bench-data --staging  # the streamed path's reads vs the floor
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import sys
import tempfile
import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
import bench_spine  # the family, the measuring wrapper, the CLI command


def _cli_pass(argv: list[str], runs: Path) -> dict[str, float]:
    doc = bench_spine.measure(argv, runs / "result.json")
    return {"wall": float(doc["wall"]), "rss_mib": float(doc["maxrss_mib"])}  # type: ignore[arg-type]


def cpu(args: argparse.Namespace, base: Path, agents: list[Path], gb: float) -> None:
    runs = Path(tempfile.mkdtemp(prefix="bench-torch-", dir=args.data))
    members = [str(base), *map(str, agents)]
    common = ["--memory", args.memory, "--quiet", *(["--threads", str(args.threads)] if args.threads else [])]
    flags = {"numba": ["--backend", "numba"], "torch": ["--backend", "torch", "--device", "cpu"]}
    figures: dict[str, dict[str, float]] = {}
    try:
        read = bench_spine.read_inputs(bench_spine.input_files(base, agents))  # warms the page cache too
        bench_spine.log(f"one read of the inputs: {read['seconds']:.2f} s")
        for name, backend in flags.items():
            index, out = runs / f"{name}.zarr", runs / f"{name}-out"
            probe = _cli_pass(
                [*bench_spine.ramstream_cmd(), "probe", *members, "--index", str(index), *common, *backend], runs
            )
            merge = _cli_pass(
                [
                    *bench_spine.ramstream_cmd(),
                    "merge",
                    *members,
                    "--out",
                    str(out),
                    "--index",
                    str(index),
                    *common,
                    *backend,
                ],
                runs,
            )
            figures[name] = {
                "probe": probe["wall"],
                "probe_rss": probe["rss_mib"],
                "merge": merge["wall"],
                "merge_rss": merge["rss_mib"],
            }
            bench_spine.log(f"{name}: probe {probe['wall']:.1f} s, merge {merge['wall']:.1f} s")
        same = all(
            (runs / "numba-out" / f.name).read_bytes() == f.read_bytes()
            for f in sorted((runs / "torch-out").glob("*.safetensors"))
        )
    finally:
        shutil.rmtree(runs, ignore_errors=True)
    print(
        f"machine: {bench_spine.machine()}; commit {bench_spine.git_commit()}; inputs {gb:.2f} GB; "
        f"read once {read['seconds']:.2f} s"
    )
    print("| pass | numba | torch (cpu) | torch / numba |")
    print("|---|---:|---:|---:|")
    for step in ("probe", "merge"):
        n, t = figures["numba"][step], figures["torch"][step]
        numba_rss, torch_rss = figures["numba"][step + "_rss"], figures["torch"][step + "_rss"]
        print(
            f"| {step} | {n:.1f} s ({gb / n:.2f} GB/s), {numba_rss:.0f} MiB "
            f"| {t:.1f} s ({gb / t:.2f} GB/s), {torch_rss:.0f} MiB | {t / n:.1f} × |"
        )
    print(f"outputs identical: {same}")


def _read_floor(files: list[Path], pinned: bool) -> float:
    """GB/s of reading every file from the page cache into (pinned) buffers, one thread per core."""
    import torch

    threads = os.cpu_count() or 1
    chunk = 64 << 20
    buffers = [torch.empty(chunk, dtype=torch.uint8, pin_memory=pinned).numpy() for _ in range(threads)]
    jobs = [(f, at) for f in files for at in range(0, f.stat().st_size, chunk)]

    def read(k: int) -> int:
        f, at = jobs[k]
        with open(f, "rb", buffering=0) as fh:
            return os.preadv(fh.fileno(), [memoryview(buffers[k % threads])], at)

    with ThreadPoolExecutor(threads) as pool:
        list(pool.map(read, range(len(jobs))))  # warm
        t0 = time.perf_counter()
        total = sum(pool.map(read, range(len(jobs))))
        return total / (time.perf_counter() - t0) / 1e9


def _h2d_floor() -> float:
    import torch

    host = torch.empty(1 << 30, dtype=torch.uint8, pin_memory=True)
    device = torch.empty_like(host, device="cuda")
    device.copy_(host, non_blocking=True)
    torch.cuda.synchronize()
    t0 = time.perf_counter()
    for _ in range(5):
        device.copy_(host, non_blocking=True)
    torch.cuda.synchronize()
    return 5 * host.numel() / (time.perf_counter() - t0) / 1e9


def _same_outputs(a: Path, b: Path) -> bool:
    names = sorted(p.name for p in a.iterdir())
    return names == sorted(p.name for p in b.iterdir()) and all(
        (a / n).read_bytes() == (b / n).read_bytes() for n in names if (a / n).is_file()
    )


def gpu(args: argparse.Namespace, base: Path, agents: list[Path], gb: float) -> None:
    import torch

    from ramstream import api
    from ramstream.config import RunOptions, parse_size

    cuda = args.device.startswith("cuda")
    files = bench_spine.input_files(base, agents)
    floors = {"read into pinned memory" if cuda else "read into memory": _read_floor(files, cuda)}
    if cuda:
        floors["pinned host-to-device copy"] = _h2d_floor()
    runs = Path(tempfile.mkdtemp(prefix="bench-torch-", dir=args.data))
    members = [str(a) for a in agents]
    rates: dict[str, dict[str, float]] = {}
    name_torch = f"torch {args.device}"
    try:
        for name, extra in ((name_torch, {"backend": "torch", "device": args.device}), ("numba", {"backend": "numba"})):
            options = RunOptions(memory=parse_size(args.memory), quiet=True, threads=args.threads, **extra)
            key = name.replace(" ", "-").replace(":", "")
            index = runs / f"{key}.zarr"
            t0 = time.perf_counter()
            api.probe(base, members, index=index, options=options)
            probe = time.perf_counter() - t0
            api.merge(base, members, out=runs / "warm", index=index, options=options)  # imports, caches
            shutil.rmtree(runs / "warm")
            t0 = time.perf_counter()
            api.merge(base, members, out=runs / f"{key}-out", index=index, options=options)
            merge = time.perf_counter() - t0
            rates[name] = {"probe": gb / probe, "merge": gb / merge}
            bench_spine.log(f"{name}: probe {probe:.2f} s, merge {merge:.2f} s")
        same = _same_outputs(runs / f"{name_torch.replace(' ', '-').replace(':', '')}-out", runs / "numba-out")
    finally:
        shutil.rmtree(runs, ignore_errors=True)
    device = torch.cuda.get_device_name(torch.device(args.device)) if cuda else "cpu"
    print(
        f"machine: {bench_spine.machine()}; {device}; torch {torch.__version__}; commit {bench_spine.git_commit()}; "
        f"inputs {gb:.2f} GB; --memory {args.memory}"
    )
    slower = min(floors.values())
    print(json.dumps({"floors_GBps": floors, "passes_GBps": rates, "outputs_identical": same}, indent=2))
    merge = rates[name_torch]["merge"]
    print(
        f"merge pass on {args.device}: {merge:.2f} GB/s of input = {100 * merge / slower:.0f} % "
        "of the slower floor (goal >= 80 %)"
    )


def staging(args: argparse.Namespace, base: Path, agents: list[Path], gb: float) -> None:
    from ramstream.backends.torch.staging import InputRing, file_part
    from ramstream.backends.torch.streams import CpuStreams
    from ramstream.config import parse_size

    threads = args.threads or len(os.sched_getaffinity(0))
    slot = parse_size(args.slot)
    floor = max(_read_floor(bench_spine.input_files(base, agents), pinned=False) for _ in range(args.repeat))
    shards = list(zip(*[sorted(d.glob("*.safetensors")) for d in (base, *agents)], strict=True))
    handles = [[os.open(f, os.O_RDONLY) for f in group] for group in shards]
    rates = []
    try:
        with ThreadPoolExecutor(threads) as pool:
            ring = InputRing(CpuStreams(), 3, slot, pool, threads)
            for _ in range(args.repeat):
                moved, t0 = 0, time.perf_counter()
                for group, fds in zip(shards, handles, strict=True):
                    n = min(f.stat().st_size for f in group) // 2
                    parts = [file_part(fd, 0, 2, lambda: OSError("short read")) for fd in fds]
                    step = (slot - 64 * len(parts)) // (2 * len(parts))
                    for lo in range(0, n, step):
                        ring.stage(parts, lo, min(step, n - lo))
                        moved += 2 * len(parts) * min(step, n - lo)
                rates.append(moved / (time.perf_counter() - t0) / 1e9)
    finally:
        for fd in (fd for fds in handles for fd in fds):
            os.close(fd)
    best = max(rates)
    print(f"machine: {bench_spine.machine()}; commit {bench_spine.git_commit()}; inputs {gb:.2f} GB")
    print(
        f"read floor ({os.cpu_count()} threads, 64 MiB chunks): {floor:.2f} GB/s; input ring ({threads} readers, "
        f"{args.slot} slots): {best:.2f} GB/s, each the best of {args.repeat} = {100 * best / floor:.0f} % of the floor"
    )


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--data", default="bench-data", help="where bench_spine.py writes the family [bench-data]")
    parser.add_argument("--memory", default="1GiB", help="--memory of the passes [1GiB]")
    parser.add_argument("--threads", type=int, default=None, help="--threads of the passes [all cores]")
    parser.add_argument("--cuda", action="store_true", help="the GPU benchmark (floors, torch on cuda, numba)")
    parser.add_argument("--device", default="cuda", help="with --cuda: torch's device (cpu: a dry run) [cuda]")
    parser.add_argument("--staging", action="store_true", help="the streamed path's reads alone, against the floor")
    parser.add_argument("--slot", default="32MiB", help="with --staging: bytes of a staging slot [32MiB]")
    parser.add_argument("--repeat", type=int, default=3, help="with --staging: runs, the best reported [3]")
    args = parser.parse_args()
    base, agents = bench_spine.ensure_family(Path(args.data) / "full", bench_spine.FULL)
    gb = sum(f.stat().st_size for f in bench_spine.input_files(base, agents)) / 1e9
    (staging if args.staging else gpu if args.cuda else cpu)(args, base, agents, gb)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
