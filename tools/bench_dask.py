"""The Dask benchmark: the probe and merge passes locally and on a LocalCluster of 1 and 2 workers.

On the spine benchmark's 0.75B-parameter bf16 family (``tools/bench_spine.py`` writes it under
``--data`` once), each step in a fresh process of the real CLI, in one run:

  read      reading every input file once, one thread, warm page cache (the floor);
  local     ``ramstream probe`` into a fresh index, then ``ramstream merge --method ram+`` from it;
  dask-N    the same with ``--dask-workers N`` (N = 1, 2): a LocalCluster started by the command,
            its start-up included in the wall time, reported apart as ``startup``;

and the cluster's own costs, measured on a LocalCluster of 2 workers: ``task_ms``, the round trip
of a no-op task (500 submitted at once, gathered), and ``startup_s``, from starting the cluster to
a first task that imports ramstream's kernels. Every merge's output is compared byte for byte with
the local one. Wall times and peak RSS (of the largest process, driver or worker: the wrapper's
``RUSAGE_CHILDREN`` covers every waited-for descendant) are printed as JSON and a table.

    python tools/bench_dask.py --data bench-data
"""

from __future__ import annotations

import argparse
import filecmp
import json
import os
import shutil
import subprocess
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))

from bench_spine import FULL, QUICK, WARMUP, ensure_family, input_files, log, measure, ramstream_cmd, read_inputs

_CLUSTER_COSTS = """
import json, sys, time
import distributed
def noop(i):
    return i
def kernels():
    import ramstream.backends.numba.backend  # what a worker's first ramstream task imports
    return 0
if __name__ == "__main__":
    t0 = time.perf_counter()
    cluster = distributed.LocalCluster(n_workers=int(sys.argv[1]), threads_per_worker=1, processes=True,
        host="127.0.0.1", dashboard_address=None, scheduler_kwargs={"dashboard_address": "127.0.0.1:0"},
        memory_limit=0, silence_logs=50)
    client = distributed.Client(cluster, set_as_default=False)
    client.gather(client.map(lambda _: kernels(), range(int(sys.argv[1])), pure=False))
    startup = time.perf_counter() - t0
    client.gather(client.map(noop, range(50), pure=False))  # warm
    t1 = time.perf_counter()
    client.gather(client.map(noop, range(500), key=[f"n-{i}" for i in range(500)]))
    task_ms = (time.perf_counter() - t1) / 500 * 1000
    client.close(); cluster.close()
    print(json.dumps({"startup_s": startup, "task_ms": task_ms}))
"""


def same_tree(a: Path, b: Path) -> bool:
    files_a = sorted(p.relative_to(a) for p in a.rglob("*") if p.is_file())
    files_b = sorted(p.relative_to(b) for p in b.rglob("*") if p.is_file())
    return files_a == files_b and all(filecmp.cmp(a / f, b / f, shallow=False) for f in files_a)


def run(args: argparse.Namespace) -> int:
    data = Path(args.data).resolve()
    os.environ["NUMBA_CACHE_DIR"] = str(data / "numba-cache")  # the spine benchmark's private cache
    base, agents = ensure_family(data / ("quick" if args.quick else "full"), QUICK if args.quick else FULL)
    runs = data / "dask-runs"
    shutil.rmtree(runs, ignore_errors=True)
    runs.mkdir(parents=True)
    files = input_files(base, agents)
    nbytes = sum(f.stat().st_size for f in files)
    read_inputs(files)  # warm the page cache
    results: dict[str, object] = {"input_gb": nbytes / 1e9, "read": read_inputs(files)["seconds"]}
    costs = subprocess.run([sys.executable, "-c", _CLUSTER_COSTS, "2"], check=True, capture_output=True, text=True)
    results["cluster"] = json.loads(costs.stdout)
    members = [str(base), *map(str, agents)]
    common = ["--memory", args.memory, "--quiet"]
    warm_base, warm_agents = ensure_family(data / "warmup", WARMUP)  # JIT compile into Numba's cache, untimed
    warm = [*ramstream_cmd(), "merge", str(warm_base), *map(str, warm_agents), "--cache-dir", str(runs / "warm")]
    subprocess.run([*warm, "--out", str(runs / "warm-out"), "--method", "ram+", *common], check=True)
    for name, extra in (("local", []), ("dask-1", ["--dask-workers", "1"]), ("dask-2", ["--dask-workers", "2"])):
        index, out = runs / f"{name}.zarr", runs / f"{name}-out"
        log(f"{name}: probe")
        probe = measure([*ramstream_cmd(), "probe", *members, "--index", str(index), *common, *extra], runs / "m.json")
        log(f"{name}: merge")
        merge_argv = [*ramstream_cmd(), "merge", *members, "--out", str(out), "--index", str(index), "--method", "ram+"]
        merged = measure([*merge_argv, *common, *extra], runs / "m.json")
        results[name] = {"probe": probe["wall"], "merge": merged["wall"], "rss_mib": merged["maxrss_mib"]}
        if name != "local":
            results[name]["same_bytes"] = same_tree(out, runs / "local-out")  # type: ignore[index]
            shutil.rmtree(out)
        shutil.rmtree(index)
    print(json.dumps(results, indent=1))
    read = float(results["read"])  # type: ignore[arg-type]
    print(f"\ninputs {nbytes / 1e9:.2f} GB, read once {read:.1f} s; cluster start-up {results['cluster']}")
    print(f"{'run':<8} {'probe s':>8} {'merge s':>8} {'probe/read':>10} {'merge/read':>10}")
    for name in ("local", "dask-1", "dask-2"):
        r = results[name]
        assert isinstance(r, dict)
        print(f"{name:<8} {r['probe']:8.1f} {r['merge']:8.1f} {r['probe'] / read:10.2f} {r['merge'] / read:10.2f}")
    shutil.rmtree(runs)
    return 0


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--data", default="bench-data", help="where the family lives (written once)")
    parser.add_argument("--memory", default="1GiB", help="--memory of every run (each worker's too)")
    parser.add_argument("--quick", action="store_true", help="a small family: a smoke run")
    return run(parser.parse_args())


if __name__ == "__main__":
    sys.exit(main())
