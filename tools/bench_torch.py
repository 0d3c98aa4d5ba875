"""The torch backend against the Numba backend on the 0.75B benchmark family (not a test).

CPU (the default): each pass in a fresh CLI process, Numba then torch on the CPU, warm page
cache: the probe pass (``ramstream probe``, a fresh index) and the merge pass (``ramstream merge
--method ram+`` with that index cached); wall time, input GB/s and peak RSS (from
``tools/bench_spine.py``'s measuring wrapper), and the two outputs compared byte for byte.

``--cuda`` (on a machine with a GPU; one command, about 8 minutes on the 6 GB family): in this
process, against floors measured on the same files in the same run (reading every input from the
page cache into pinned host memory with one thread per core, the pinned host-to-device copy,
writing an output's bytes synced to the data's disk and to /dev/shm; each as GB/s of input: a
pass reads every member and writes one model), every pass on torch/CUDA and on Numba: the probe
(also with the torch ops instead of the fused kernels), the agreement statistics' pass, then each
merge of ``PASSES`` twice (first with the statistics it gathers into the index, then with them
cached), written to /dev/shm; torch again under ``--gpu-memory 2GiB``; RAM+ also with the torch
ops and written to the data's disk. Each as GB/s of input and % of the slowest floor; every torch
output compared byte for byte with Numba's; the kernels a torch pass launches per GB (the
profiler's device kernels) and their busy time; the host's own time by function in a RAM+ and a
TIES merge on torch (cProfile, to the log). The warm-up family's merges run first, so no timing
includes a compile. ``--cuda --device cpu --family quick`` runs the same steps with torch on the
CPU (a dry run where there is no GPU).

``--launches`` (any machine): the kernels each tile of a probe, of the agreement statistics and of
each merge (their statistics passes included) launches on the torch-op path and on the fused path
(the fused kernels under triton's interpreter on the CPU), from the profiler, on the warm-up family.

``--host`` measures the streamed (CUDA) path's host side alone, on any machine: a RAM+ merge on
the torch backend through a null device (its memory the host's, copies free, the fused kernel a
no-op) against the read and /dev/shm write floors and Numba's merge, and where its calling thread
spends its time.

``--staging`` measures the streamed path's reads alone, on any machine: every input read through
the backend's input ring (slots of ``--slot`` bytes, parts cut into pieces on a pool of one thread
per core, one barrier per tile) against the read floor, in the same run.

    python tools/bench_torch.py --data bench-data            # CPU: numba vs torch, both passes
    python tools/bench_torch.py --data bench-data --cuda     # GPU: floors, torch on cuda, numba
    python tools/bench_torch.py --data bench-data --staging  # the streamed path's reads vs the floor
    python tools/bench_torch.py --data bench-data --host     # its host side alone (a null device)
    python tools/bench_torch.py --data bench-data --launches # launches per tile, fused and torch ops
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import sys
import tempfile
import time
import traceback
import warnings
from collections import Counter
from collections.abc import Callable, Iterator
from concurrent.futures import ThreadPoolExecutor
from contextlib import contextmanager
from pathlib import Path
from typing import Any

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


# The merges of the GPU benchmark, with their settings (the statistics they need are gathered by
# their first merge on an index: timed apart, as "with statistics").
PASSES: dict[str, dict[str, object]] = {
    "ram+": {},
    "task_arithmetic": {"lambda": 1.0},
    "ties": {"density": 0.2},
    "dare_ties": {"density": 0.2, "seed": 1},
    "della": {"density": 0.2, "epsilon": 0.1, "seed": 1},
    "model_stock": {},
    "sce": {},
    "multislerp": {"weights": [1.0]},
}
SHM = Path("/dev/shm")
DISK_WRITE = "writing the output to the data's disk, synced"  # the write floors' names
SHM_WRITE = "writing the output to /dev/shm"


def _launches(run: Callable[[], object], cuda: bool) -> tuple[int, float]:
    """Kernels launched while ``run`` ran and the seconds they ran (the profiler's device
    kernels; on the CPU, its top-level ops and no time)."""
    from torch.autograd import DeviceType
    from torch.profiler import ProfilerActivity, profile

    activities = [ProfilerActivity.CPU, ProfilerActivity.CUDA] if cuda else [ProfilerActivity.CPU]
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        with profile(activities=activities) as prof:
            run()
    if cuda:
        kernels = [
            e for e in prof.events() if e.device_type == DeviceType.CUDA and not e.name.startswith(("Memcpy", "Memset"))
        ]
        return len(kernels), sum(e.time_range.elapsed_us() for e in kernels) / 1e6
    return sum(1 for e in prof.events() if e.name.startswith("aten::") and e.cpu_parent is None), 0.0


class GpuBench:
    """The passes of ``--cuda`` on one family: each timed on every engine, outputs compared."""

    def __init__(self, args: argparse.Namespace, base: Path, agents: list[Path], gb: float, runs: Path) -> None:
        from ramstream.config import RunOptions, parse_size

        self.args, self.base, self.members, self.gb, self.runs = args, base, [str(a) for a in agents], gb, runs
        self.cuda = args.device.startswith("cuda")
        torch_on = {"backend": "torch", "device": args.device}
        memory = parse_size(args.memory)
        self.engines = {
            "numba": RunOptions(memory=memory, quiet=True, threads=args.threads, backend="numba"),
            "torch": RunOptions(memory=memory, quiet=True, threads=args.threads, **torch_on),  # type: ignore[arg-type]
            "torch 2GiB": RunOptions(
                memory=memory, quiet=True, threads=args.threads, gpu_memory=2 << 30 if self.cuda else None, **torch_on
            ),  # type: ignore[arg-type]
        }
        self.rows: list[dict[str, object]] = []

    def timed(self, what: str, engine: str, run: Callable[[], object], ops: bool = False) -> float:
        from ramstream.backends.torch import fused

        before, fused.MODE = fused.MODE, "ops" if ops else fused.MODE
        try:
            t0 = time.perf_counter()
            run()
            seconds = time.perf_counter() - t0
        finally:
            fused.MODE = before
        name = engine + (" (torch ops)" if ops else "")
        self.rows.append({"pass": what, "engine": name, "seconds": seconds, "GBps": self.gb / seconds})
        bench_spine.log(f"{what} on {name}: {seconds:.2f} s ({self.gb / seconds:.2f} GB/s)")
        return seconds

    def probe(self, engine: str, index: Path, agreement: bool = False) -> Callable[[], object]:
        """The probe; with ``agreement`` on a probed index, the agreement statistics' pass alone."""
        from ramstream import api

        options = self.engines[engine]
        return lambda: api.probe(self.base, self.members, index=index, options=options, agreement=agreement)

    def merge(self, engine: str, method: str, index: Path, out: Path) -> Callable[[], object]:
        from ramstream import api

        given = PASSES[method]
        return lambda: api.merge(
            self.base, self.members, out=out, method=method, method_options=given, index=index,
            options=self.engines[engine],
        )  # fmt: skip

    def same(self, what: str, engine: str, out: Path, reference: Path) -> None:
        same = _same_outputs(out, reference)
        self.rows.append({"pass": what, "engine": engine, "identical_to_numba": same})
        shutil.rmtree(out, ignore_errors=True)
        if not same:
            bench_spine.log(f"{what} on {engine}: NOT the Numba bytes")

    def launches(self, what: str, run: Callable[[], object], ops: bool = False) -> None:
        from ramstream.backends.torch import fused

        before, fused.MODE = fused.MODE, "ops" if ops else fused.MODE
        try:
            count, busy = _launches(run, self.cuda)
        finally:
            fused.MODE = before
        name = "torch" + (" (torch ops)" if ops else "")
        self.rows.append(
            {"pass": what, "engine": name, "launches": count, "launches_per_GB": count / self.gb, "kernel_s": busy}
        )
        bench_spine.log(f"{what} on {name}: {count} launches ({count / self.gb:.0f} per GB), kernels {busy:.2f} s")

    def host_profile(self, what: str, run: Callable[[], object]) -> None:
        """Where the host's time goes in a torch pass (the main thread, which drives the streams):
        the functions by their own time, to the log."""
        import cProfile
        import io
        import pstats

        profiler = cProfile.Profile()
        profiler.enable()
        run()
        profiler.disable()
        text = io.StringIO()
        pstats.Stats(profiler, stream=text).sort_stats("tottime").print_stats(25)
        bench_spine.log(f"host profile of {what} on torch (the main thread, by own time):\n{text.getvalue()}")

    def run(self, methods: list[str]) -> None:
        runs = self.runs
        index = {e: runs / f"{e.replace(' ', '-')}.zarr" for e in ("numba", "torch")}
        for engine, path in index.items():
            self.timed("probe", engine, self.probe(engine, path))
        self.timed("probe", "torch", self.probe("torch", runs / "ops.zarr"), ops=True)
        self.launches("probe", self.probe("torch", runs / "launches.zarr"))
        self.launches("probe", self.probe("torch", runs / "launches-ops.zarr"), ops=True)
        for engine, path in index.items():  # gathered into a copy: the merges' indexes stay as they were
            agreement = runs / f"agreement-{engine}.zarr"
            shutil.copytree(path, agreement)
            self.timed("agreement statistics", engine, self.probe(engine, agreement, agreement=True))
        self.launches("agreement statistics", self.probe("torch", runs / "launches.zarr", agreement=True))
        for method in methods:
            try:
                self.method(method, index)
            except Exception as error:  # one method's failure must not cost the others' figures
                self.failed(method, error)

    def failed(self, what: str, error: Exception) -> None:
        traceback.print_exc()
        self.rows.append({"pass": what, "engine": "all", "error": f"{type(error).__name__}: {error}"})
        bench_spine.log(f"{what}: FAILED, {type(error).__name__}: {error}")

    def method(self, method: str, index: dict[str, Path]) -> None:
        """Numba then torch: the first merge (its statistics gathered into the index too), the
        merge again (statistics cached; the write-behind's busy time with it), into /dev/shm;
        torch under --gpu-memory 2GiB; RAM+ also with the torch ops, without the read-ahead and
        written to the data's disk; the launches of a merge."""
        scratch = Path(tempfile.mkdtemp(prefix="bench-out-", dir=SHM if SHM.is_dir() else self.runs))
        reference = scratch / "numba"
        try:
            for engine in ("numba", "torch"):
                out = scratch / engine
                self.timed(f"{method} with statistics", engine, self.merge(engine, method, index[engine], out))
                shutil.rmtree(out)
                with _writer_time() as spent:  # whether the write-behind bounds the pass
                    seconds = self.timed(method, engine, self.merge(engine, method, index[engine], out))
                self.rows.append({"pass": f"{method} write-behind", "engine": engine, "seconds": seconds, **spent})
                if engine != "numba":
                    self.same(method, engine, out, reference)
            out = scratch / "small"
            self.timed(method, "torch 2GiB", self.merge("torch 2GiB", method, index["torch"], out))
            self.same(method, "torch 2GiB", out, reference)
            if method == "ram+":
                self.timed(method, "torch", self.merge("torch", method, index["torch"], out), ops=True)
                self.same(method, "torch (torch ops)", out, reference)
                with _no_read_ahead():  # what reading the next block's first tile ahead gains
                    self.timed(method, "torch, no read-ahead", self.merge("torch", method, index["torch"], out))
                self.same(method, "torch, no read-ahead", out, reference)
                for engine in ("numba", "torch"):
                    disk = self.runs / f"{engine}-disk"
                    self.timed(f"{method} written to disk", engine, self.merge(engine, method, index[engine], disk))
                    self.same(f"{method} written to disk", engine, disk, reference)
                self.launches(method, self.merge("torch", method, index["torch"], out), ops=True)
                shutil.rmtree(out, ignore_errors=True)
            if method in ("ram+", "ties"):
                self.host_profile(method, self.merge("torch", method, index["torch"], out))
                shutil.rmtree(out, ignore_errors=True)
            self.launches(method, self.merge("torch", method, index["torch"], out))
        finally:
            shutil.rmtree(scratch, ignore_errors=True)


@contextmanager
def _writer_time() -> Iterator[dict[str, float]]:
    """The write-behind's seconds over a pass: how long its threads persisted batches (the
    outputs' writes and syncs, the journal marks), and how long the driving thread waited for
    them to take the next batch. Busy nearly the whole pass: the writes bound it."""
    from ramstream.execution import local

    spent = {"writer_busy_s": 0.0, "driver_waited_s": 0.0}
    persist, submit = local._Persist.__call__, local.WriteBehind.submit

    def timed_persist(self: Any) -> None:
        t0 = time.perf_counter()
        try:
            persist(self)
        finally:
            spent["writer_busy_s"] += time.perf_counter() - t0

    def timed_submit(self: Any, fn: Callable[[], None]) -> None:
        t0 = time.perf_counter()
        try:
            submit(self, fn)
        finally:
            spent["driver_waited_s"] += time.perf_counter() - t0

    local._Persist.__call__ = timed_persist  # type: ignore[method-assign]
    local.WriteBehind.submit = timed_submit  # type: ignore[method-assign]
    try:
        yield spent
    finally:
        local._Persist.__call__ = persist  # type: ignore[method-assign]
        local.WriteBehind.submit = submit  # type: ignore[method-assign]


@contextmanager
def _no_read_ahead() -> Iterator[None]:
    """The torch backend without the hint of the blocks to come: every call reads its first tile."""
    from ramstream.backends.torch import tiles

    expect = tiles.TileBackend.expect
    tiles.TileBackend.expect = lambda self, upcoming: None  # type: ignore[method-assign]
    try:
        yield
    finally:
        tiles.TileBackend.expect = expect  # type: ignore[method-assign]


def gpu(args: argparse.Namespace, base: Path, agents: list[Path], gb: float) -> None:
    import torch

    from ramstream import api
    from ramstream.config import RunOptions

    cuda = args.device.startswith("cuda")
    files = bench_spine.input_files(base, agents)
    out_bytes = sum(f.stat().st_size for f in sorted(base.glob("*.safetensors")))
    floors = {"read into pinned memory" if cuda else "read into memory": _read_floor(files, cuda)}
    if cuda:
        floors["pinned host-to-device copy"] = _h2d_floor()
    # a write floor as GB/s of input: the pass reads every member and writes one model's bytes
    disk = bench_spine.write_once(out_bytes, Path(args.data) / "write-floor.bin")
    floors[DISK_WRITE] = gb / disk["seconds"]
    if SHM.is_dir():
        shm = bench_spine.write_once(out_bytes, SHM / "ramstream-write-floor.bin")
        floors[SHM_WRITE] = gb / shm["seconds"]
    methods = args.methods.split(",") if args.methods else list(PASSES)
    runs = Path(tempfile.mkdtemp(prefix="bench-torch-", dir=args.data))
    try:
        small_base, small_agents = bench_spine.ensure_family(Path(args.data) / "warmup", bench_spine.WARMUP)
        for backend in ("numba", "torch"):  # compiles every kernel (Numba's, Triton's) before the timings
            device = {"device": args.device} if backend == "torch" else {}
            options = RunOptions(quiet=True, backend=backend, **device)  # type: ignore[arg-type]
            members = [str(a) for a in small_agents]
            for method in methods:
                try:
                    api.merge(small_base, members, out=runs / "warm", method=method, method_options=PASSES[method],
                              index=runs / f"warm-{backend}.zarr", options=options)  # fmt: skip
                except Exception:
                    traceback.print_exc()
                    bench_spine.log(f"warm-up of {method} on {backend} failed")
                shutil.rmtree(runs / "warm", ignore_errors=True)
        bench = GpuBench(args, base, agents, gb, runs)
        bench.run(methods)
    finally:
        shutil.rmtree(runs, ignore_errors=True)
    device = torch.cuda.get_device_name(torch.device(args.device)) if cuda else "cpu"
    print(
        f"machine: {bench_spine.machine()}; {device}; torch {torch.__version__}; commit {bench_spine.git_commit()}; "
        f"inputs {gb:.2f} GB; --memory {args.memory}"
    )
    # a pass's slowest floor: the reads, the copy to the device and the write to where it wrote
    shared = [v for k, v in floors.items() if k not in (DISK_WRITE, SHM_WRITE)]
    to_disk = min([*shared, floors[DISK_WRITE]])
    to_shm = min([*shared, floors.get(SHM_WRITE, to_disk)])
    for row in bench.rows:
        if "GBps" in row:
            slowest = to_disk if "disk" in str(row["pass"]) else to_shm
            row["percent_of_slowest_floor"] = round(100 * float(row["GBps"]) / slowest)  # type: ignore[arg-type]
    print(json.dumps({"floors_GBps_of_input": floors}))
    for row in bench.rows:
        print(json.dumps(row))
    print(f"slowest floor: {to_shm:.2f} GB/s of input for an output in /dev/shm, {to_disk:.2f} written to disk")
    print("| pass | engine | GB/s of input | % of the slowest floor |")
    print("|---|---|---:|---:|")
    for row in bench.rows:
        if "GBps" in row:
            print(f"| {row['pass']} | {row['engine']} | {row['GBps']:.2f} | {row['percent_of_slowest_floor']} |")
    for row in bench.rows:
        if "launches" in row:
            print(
                f"launches: {row['pass']} on {row['engine']}: {row['launches']} ({row['launches_per_GB']:.0f} per GB), "
                f"kernels busy {row['kernel_s']:.2f} s"
            )
    for row in bench.rows:
        if "writer_busy_s" in row:
            print(
                f"write-behind: {row['pass']} on {row['engine']}: pass {row['seconds']:.2f} s, writer busy "
                f"{row['writer_busy_s']:.2f} s, the driving thread waited for it {row['driver_waited_s']:.2f} s"
            )
    for row in bench.rows:
        if "error" in row:
            print(f"FAILED: {row['pass']}: {row['error']}")
    different = [f"{r['pass']} on {r['engine']}" for r in bench.rows if r.get("identical_to_numba") is False]
    print("outputs identical to Numba's: " + ("all" if not different else "NOT " + ", ".join(different)))


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


def launches_per_tile(args: argparse.Namespace) -> None:
    """On the CPU: the kernels each tile of a probe, of the agreement statistics' pass, of a RAM+, a
    linear, a TIES merge (its statistics pass's high and low magnitude histograms apart from the
    rest), an SCE merge (its variance tiles included), a DELLA merge (its L1 statistics included)
    and a model_stock merge (its Gram statistics included) launches, on the torch-op path
    (torch ops that compute, from the profiler) and on the fused path (Triton launches run by the
    interpreter, and the torch ops the tile issues around them), on the warm-up family."""
    os.environ["TRITON_INTERPRET"] = "1"  # before anything imports triton
    import torch
    from torch.profiler import ProfilerActivity, profile, record_function

    from ramstream import api
    from ramstream.backends.torch import fused
    from ramstream.backends.torch import tiles as torch_tiles
    from ramstream.backends.torch.counting import CountOps
    from ramstream.backends.torch.fused import agreement as fused_agreement
    from ramstream.backends.torch.fused import della as fused_della
    from ramstream.backends.torch.fused import gta as fused_gta
    from ramstream.backends.torch.fused import linear as fused_linear
    from ramstream.backends.torch.fused import magnitude as fused_magnitude
    from ramstream.backends.torch.fused import probe as fused_probe
    from ramstream.backends.torch.fused import ram as fused_ram
    from ramstream.backends.torch.fused import sce as fused_sce
    from ramstream.backends.torch.fused import sums as fused_sums
    from ramstream.config import RunOptions

    # what a tile's torch op launches nothing for: allocation, views, metadata
    no_kernel = ("aten::empty", "aten::view", "aten::slice", "aten::select", "aten::as_strided", "aten::reshape",
                 "aten::alias", "aten::_reshape_alias", "aten::expand", "aten::unsqueeze", "aten::squeeze",
                 "aten::lift_fresh", "aten::detach", "aten::t", "aten::empty_strided", "aten::resolve_conj",
                 "aten::resolve_neg", "aten::_unsafe_view")  # fmt: skip
    launchers = (
        (fused_ram, "merge_tile"),
        (fused_probe, "probe_tile_launch"),
        (fused_gta, "gta_tile_launch"),
        (fused_magnitude, "high_launch"),
        (fused_magnitude, "low_launch"),
        (fused_magnitude, "tie_launch"),
        (fused_linear, "linear_launch"),
        (fused_sce, "sce_launch"),
        (fused_sums, "sums_launch"),
        (fused_sums, "gram_launch"),
        (fused_agreement, "agreement_launch"),
    )
    for module, name in launchers:
        launch = getattr(module, name)

        def marked(*a: object, _launch: Callable[..., None] = launch, **k: object) -> None:
            with record_function("triton launch"):
                _launch(*a, **k)

        setattr(module, name, marked)

    class MarkedKernel:
        """A kernel launched as ``kernel[grid](...)`` inside a launcher (DELLA's two), marked."""

        def __init__(self, kernel: Any) -> None:
            self.kernel = kernel

        def __getitem__(self, grid: Any) -> Callable[..., None]:
            def run(*a: object, **k: object) -> None:
                with record_function("triton launch"):
                    self.kernel[grid](*a, **k)

            return run

    for name in ("keys_tile", "keep_tile"):
        setattr(fused_della, name, MarkedKernel(getattr(fused_della, name)))
    tiles: Counter[str] = Counter()
    current = ["tile"]  # the marker of the tiles run now: "tile", or the histogram being gathered
    for method, marker in (("abs_high_histogram", "high histogram"), ("abs_low_histogram", "low histogram")):
        histogram = getattr(CountOps, method)

        def gathered(*a: object, _histogram: Callable[..., Any] = histogram, _marker: str = marker) -> Any:
            current[0] = _marker
            try:
                return _histogram(*a)
            finally:
                current[0] = "tile"

        setattr(CountOps, method, gathered)
    loop = torch_tiles.TileBackend._loop

    def counted(w: int, rings: object, parts: object, starts: list[int], n: int, step: int, tile: Any,
                *rest: Any) -> Any:  # fmt: skip
        def marked(*a: object, _marker: str = current[0]) -> None:
            with record_function(_marker):
                tile(*a)

        tiles[current[0]] += len(starts)
        return loop(w, rings, parts, starts, n, step, marked, *rest)  # type: ignore[arg-type]

    torch_tiles.TileBackend._loop = staticmethod(counted)  # type: ignore[assignment]
    base, agents = bench_spine.ensure_family(Path(args.data) / "warmup", bench_spine.WARMUP)
    members = [str(a) for a in agents]
    runs = Path(tempfile.mkdtemp(prefix="bench-launches-", dir=args.data))
    options = RunOptions(quiet=True, backend="torch", device="cpu", threads=1, block_elems=1 << 14)
    torch_tiles.TILE_CAP = 1 << 12
    try:
        for mode in ("ops", "auto"):
            fused.MODE = mode  # type: ignore[assignment]
            for what in ("probe", "agreement", "ram+", "ties", "linear", "sce", "della", "model_stock"):
                index = runs / f"{mode}.zarr"
                tiles.clear()
                with warnings.catch_warnings():
                    warnings.simplefilter("ignore")
                    with profile(activities=[ProfilerActivity.CPU]) as prof:
                        if what in ("probe", "agreement"):  # the agreement: its pass alone, the index probed
                            api.probe(base, members, index=index, options=options, agreement=what == "agreement")
                        else:
                            given = {"ties": {"density": 0.3}, "sce": {"select_topk": 0.3},
                                     "della": {"density": 0.5, "epsilon": 0.1}}.get(what, {})  # fmt: skip
                            out = runs / f"{mode}-{what}-out"
                            api.merge(base, members, out=out, method=what, method_options=given, index=index,
                                      options=options)  # fmt: skip
                events = prof.events()
                # what the calls launched outside their tiles (constants, accumulators, read-backs)
                outside = [e.name for e in events if e.cpu_parent is None and e.name.startswith("aten::")]
                outside = [name for name in outside if name not in no_kernel]
                path = "fused" if mode == "auto" else "torch ops"
                for marker in sorted(tiles):
                    # what each tile launched: the top-level ops under the tile's marker
                    in_tiles = [e for e in events if e.cpu_parent is not None and e.cpu_parent.name == marker]
                    triton = sum(1 for e in in_tiles if e.name == "triton launch")
                    ops = [e.name for e in in_tiles if e.name.startswith("aten::") and e.name not in no_kernel]
                    label = what if marker == "tile" else f"{what} {marker}"
                    if args.verbose:
                        print(f"{label}, {path} path, per tile: {dict(Counter(ops).most_common())}")
                    print(
                        f"{label}, {path} path: {tiles[marker]} tiles, "
                        f"{(triton + len(ops)) / max(tiles[marker], 1):.1f} launches per tile ({triton} Triton "
                        f"launches, {len(ops)} computing torch ops)"
                    )
                if args.verbose:
                    print(f"{what}, {path} path, outside the tiles: {dict(Counter(outside).most_common())}")
                print(f"{what}, {path} path: {len(outside)} launches outside the tiles")
    finally:
        shutil.rmtree(runs, ignore_errors=True)
    del torch


class NullDevice:
    """The streamed (CUDA) path's host side alone: a device whose memory is the host's (a
    "device buffer" is its pinned slot itself), whose copies and events are free and whose
    kernels do nothing (``host``). What a pass then costs is the host's: the reads into the
    slots, the tile loop, the results handed to the writer's buffers and the writes.
    ``straight``: results land in the writer's buffers as on a GPU whose host memory is
    registered (no copy on the host); without it, in the output ring's slots, then copied."""

    separate = True

    def __init__(self, straight: bool = True) -> None:
        import torch

        self.device = torch.device("cpu")
        self._straight = straight

    def budget(self, given: int | None) -> int:
        return given if given is not None else 8 << 30

    def host_buffer(self, nbytes: int) -> Any:
        import numpy as np
        import torch

        return torch.from_numpy(np.empty(nbytes, np.uint8))

    def device_buffer(self, host: Any) -> Any:
        return host

    def host_memory(self, nbytes: int) -> Any:
        import numpy as np

        return np.empty(nbytes, np.uint8)

    def straight(self, target: Any) -> bool:
        return self._straight

    def upload(self, dst: Any, src: Any, after: Any) -> Any:
        return self

    def compute_waits(self, event: Any) -> None:
        pass

    def download(self, dst: Any, src: Any) -> tuple[Any, Any]:
        return dst, self

    def computed(self) -> Any:
        return self

    def constant(self, values: Any) -> Any:
        import numpy as np
        import torch

        return torch.from_numpy(np.array(values))

    def readback(self, src: Any) -> Any:
        return src.contiguous().numpy().copy()

    def readback_later(self, src: Any) -> Any:
        copy = self.readback(src)
        return lambda: copy

    def synchronize(self) -> None:
        pass

    def close(self) -> None:
        pass


def host(args: argparse.Namespace, base: Path, agents: list[Path], gb: float) -> None:
    """The streamed path's host cost: a RAM+ merge (index cached, output in /dev/shm) on the torch
    backend through ``NullDevice`` with its fused RAM kernel doing nothing, against the read
    floor, the /dev/shm write floor and the Numba backend's merge, in one process; then the
    calling thread's time by function in a second null-device merge (cProfile)."""
    import cProfile
    import pstats

    from ramstream import api
    from ramstream.backends.torch import backend as torch_backend
    from ramstream.backends.torch import fused
    from ramstream.backends.torch.fused import ram as fused_ram
    from ramstream.config import RunOptions, parse_size

    members = [str(a) for a in agents]
    runs = Path(tempfile.mkdtemp(prefix="bench-host-", dir=args.data))
    out_bytes = sum(f.stat().st_size for f in base.glob("*.safetensors"))
    floors = {
        "read into memory": max(_read_floor(bench_spine.input_files(base, agents), pinned=False) for _ in range(2)),
        SHM_WRITE: gb / bench_spine.write_once(out_bytes, SHM / "ramstream-write-floor.bin")["seconds"],
    }
    memory = parse_size(args.memory)
    threads = {"threads": args.threads} if args.threads else {}
    index = runs / "index.zarr"
    api.probe(base, members, index=index, options=RunOptions(quiet=True, memory=memory))
    straight = [True]
    torch_backend.make = lambda settings: torch_backend.TorchBackend(settings, streams=NullDevice(straight[0]))
    fused.available = lambda device, workers: True  # type: ignore[assignment]
    fused_ram.merge_tile = lambda *a, **k: None  # type: ignore[assignment]

    def merge(backend: str, results_straight: bool = True) -> float:
        straight[0] = results_straight
        out = SHM / f"ramstream-bench-host-{backend}"
        shutil.rmtree(out, ignore_errors=True)
        options = RunOptions(quiet=True, backend=backend, device="cpu" if backend == "torch" else None,
                             memory=memory, **threads)  # fmt: skip
        t0 = time.perf_counter()
        api.merge(base, members, out=out, method="ram+", index=index, options=options)
        seconds = time.perf_counter() - t0
        shutil.rmtree(out, ignore_errors=True)
        return seconds

    try:
        rates = {name: gb / min(merge(backend, results_straight) for _ in range(args.repeat)) for
                 name, backend, results_straight in
                 (("ram+ on the null device (host only)", "torch", True),
                  ("ram+ on the null device, results through the ring's slots", "torch", False),
                  ("ram+ on Numba", "numba", True))}  # fmt: skip
        print(f"machine: {bench_spine.machine()}; commit {bench_spine.git_commit()}; inputs {gb:.2f} GB")
        slowest = min(floors.values())
        for name, rate in {**floors, **rates}.items():
            print(f"{name}: {rate:.2f} GB/s of input ({100 * rate / slowest:.0f} % of the slowest floor)")
        for backend in ("torch", "numba"):
            with _writer_time() as spent:
                seconds = merge(backend)
            print(
                f"write-behind, ram+ on {'the null device' if backend == 'torch' else 'Numba'}: pass {seconds:.2f} s, "
                f"writer busy {spent['writer_busy_s']:.2f} s, the driving thread waited for it "
                f"{spent['driver_waited_s']:.2f} s"
            )
        profile = cProfile.Profile()
        profile.enable()
        merge("torch")
        profile.disable()
        pstats.Stats(profile).sort_stats("tottime").print_stats(12)
    finally:
        shutil.rmtree(runs, ignore_errors=True)


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--data", default="bench-data", help="where bench_spine.py writes the family [bench-data]")
    parser.add_argument("--memory", default="1GiB", help="--memory of the passes [1GiB]")
    parser.add_argument("--threads", type=int, default=None, help="--threads of the passes [all cores]")
    parser.add_argument("--cuda", action="store_true", help="the GPU benchmark (floors, torch on cuda, numba)")
    parser.add_argument("--device", default="cuda", help="with --cuda: torch's device (cpu: a dry run) [cuda]")
    parser.add_argument("--methods", default=None, help=f"with --cuda: these merges only [{','.join(PASSES)}]")
    parser.add_argument(
        "--family",
        choices=["full", "quick", "moe"],
        default="full",
        help="the 6 GB family, a small one (dry runs), or a MoE's 1619 small tensors (--host: per-block costs)",
    )
    parser.add_argument("--staging", action="store_true", help="the streamed path's reads alone, against the floor")
    parser.add_argument(
        "--host", action="store_true", help="the streamed path's host side alone: a null device, against the floors"
    )
    parser.add_argument("--verbose", action="store_true", help="with --launches: the torch ops by name")
    parser.add_argument(
        "--launches", action="store_true", help="kernel launches per tile, fused and torch-op paths (CPU, interpreter)"
    )
    parser.add_argument("--slot", default="32MiB", help="with --staging: bytes of a staging slot [32MiB]")
    parser.add_argument("--repeat", type=int, default=3, help="with --staging, --host: runs, the best reported [3]")
    args = parser.parse_args()
    if args.launches:
        launches_per_tile(args)
        return 0
    shape = {"full": bench_spine.FULL, "quick": bench_spine.QUICK, "moe": bench_spine.MOE}[args.family]
    base, agents = bench_spine.ensure_family(Path(args.data) / args.family, shape)
    gb = sum(f.stat().st_size for f in bench_spine.input_files(base, agents)) / 1e9
    (staging if args.staging else host if args.host else gpu if args.cuda else cpu)(args, base, agents, gb)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
