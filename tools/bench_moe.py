"""The MoE benchmark: thousands of small per-expert tensors against a dense family of the same bytes.

Writes three bf16 families (base + 3 agents at the paper's densities) under ``--data`` once:

  dense   8 layers of a Qwen2-like decoder, 14 M parameters per checkpoint (99 tensors);
  moe     the same bytes as 8 layers x 64 experts (1619 tensors; ``MOE_SHAPE``);
  wide    48 layers x 128 experts, Qwen3-30B-A3B's tensor count (18 915 tensors, 20 M parameters;
          ``MOE_WIDE_SHAPE``);

then measures, each step in a fresh process of the real CLI (Numba's cache warmed first):

  (a) ``ramstream merge --method ram+`` with no index (a fresh ``--cache-dir``: probe + merge);
  (b) the same merge with the index cached (a new ``--out``);
  (c) reading every input file once (the floor), and the index's file count and peak RSS.

Goals (issue "MoE scale"): moe (a) and (b) within 1.5 x dense's, moe's index within 2 x dense's
file count, wide (a) under 30 s on a 2-core machine. The per-tensor overhead is
``(moe - dense) / (moe tensors - dense tensors)`` for (a) and (b).

    python tools/bench_moe.py --data bench-moe                     # this tree
    python tools/bench_moe.py --data bench-moe --tree ../old       # another checkout, same data
    python tools/bench_moe.py --data bench-moe --method ties --families dense,moe
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import subprocess
import sys
import time
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent
FAMILIES = ("dense", "moe", "wide")
READ_BUFFER = 64 * 1024 * 1024

_WRITE = """
import sys
from pathlib import Path
from ramstream.demo.samples import MOE_SHAPE, MOE_WIDE_SHAPE, FamilyShape, write_family
dense = FamilyShape(hidden=128, layers=8, vocab=4096, intermediate=4096, kv_hidden=32)
shape = {"dense": dense, "moe": MOE_SHAPE, "wide": MOE_WIDE_SHAPE}[sys.argv[2]]
write_family(Path(sys.argv[1]), shape=shape)
"""

# Runs a command and prints its wall time and peak RSS (of that child only) as JSON.
_TIMED = """
import json, resource, subprocess, sys, time
start = time.perf_counter()
done = subprocess.run(sys.argv[1:], stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True)
seconds = time.perf_counter() - start
if done.returncode:
    sys.exit(done.stderr)
print(json.dumps({"seconds": seconds, "rss_mib": resource.getrusage(resource.RUSAGE_CHILDREN).ru_maxrss / 1024}))
"""


def members(data: Path, family: str) -> list[str]:
    root = data / family
    return [str(root / m) for m in ("base", "agent1", "agent2", "agent3")]


def write_families(data: Path, python: str) -> None:
    for family in FAMILIES:
        marker = data / family / ".complete"
        if marker.exists():
            continue
        shutil.rmtree(data / family, ignore_errors=True)
        subprocess.run([python, "-c", _WRITE, str(data / family), family], check=True, env=_env(None))
        marker.touch()


def _env(tree: Path | None) -> dict[str, str]:
    env = dict(os.environ)
    if tree is not None:
        env["PYTHONPATH"] = str(tree)
    return env


def timed(cmd: list[str], env: dict[str, str]) -> dict[str, float]:
    # Run outside any checkout: ``python -m`` puts the working directory first on the path.
    out = subprocess.run([sys.executable, "-c", _TIMED, *cmd], capture_output=True, text=True, env=env, cwd="/")
    if out.returncode:
        raise SystemExit(f"failed: {' '.join(cmd)}\n{out.stderr}")
    return dict(json.loads(out.stdout))


def read_once(paths: list[str]) -> float:
    files = sorted(p for m in paths for p in Path(m).glob("*.safetensors"))
    buffer = bytearray(READ_BUFFER)
    start = time.perf_counter()
    for path in files:
        with open(path, "rb", buffering=0) as f:
            while f.readinto(buffer):
                pass
    return time.perf_counter() - start


def measure(data: Path, family: str, work: Path, env: dict[str, str], method: str = "ram+") -> dict[str, float]:
    cli = [sys.executable, "-m", "ramstream.cli", "merge", *members(data, family), "--method", method, "--quiet"]
    cache = work / f"cache-{family}"
    shutil.rmtree(cache, ignore_errors=True)
    for out in ("out-a", "out-b"):
        shutil.rmtree(work / f"{out}-{family}", ignore_errors=True)
    read_once(members(data, family))  # warm the page cache
    floor = read_once(members(data, family))
    a = timed([*cli, "--out", str(work / f"out-a-{family}"), "--cache-dir", str(cache)], env)
    b = timed([*cli, "--out", str(work / f"out-b-{family}"), "--cache-dir", str(cache)], env)
    index_files = sum(1 for p in (cache / "index").rglob("*") if p.is_file())
    tensors = len(json.loads(_header(Path(members(data, family)[0]))))
    return {
        "tensors": tensors,
        "read_s": floor,
        "probe_merge_s": a["seconds"],
        "cached_merge_s": b["seconds"],
        "rss_mib": max(a["rss_mib"], b["rss_mib"]),
        "index_files": index_files,
    }


def _header(directory: Path) -> str:
    """The JSON header of the family member's (first) safetensors file, less its metadata."""
    path = sorted(directory.glob("*.safetensors"))[0]
    with open(path, "rb") as f:
        n = int.from_bytes(f.read(8), "little")
        header = json.loads(f.read(n))
    header.pop("__metadata__", None)
    return json.dumps(header)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--data", type=Path, required=True, help="where the families are written (~0.5 GB)")
    parser.add_argument("--tree", type=Path, default=None, help="a ramstream checkout to measure instead of this one")
    parser.add_argument(
        "--method", default="ram+", help="the method merged (ram+; ties: its statistics passes and their index too)"
    )
    parser.add_argument("--families", default=",".join(FAMILIES), help="which families to time, comma-separated")
    args = parser.parse_args()
    data = args.data.resolve()
    data.mkdir(parents=True, exist_ok=True)
    write_families(data, sys.executable)
    tree = args.tree.resolve() if args.tree else REPO
    env = _env(tree)
    env.setdefault("NUMBA_CACHE_DIR", str(data / ".numba-cache"))
    work = data / "runs"
    work.mkdir(exist_ok=True)
    chosen = [f for f in FAMILIES if f in args.families.split(",")]
    measure(data, "dense", work, env, args.method)  # warm Numba's cache and the page cache
    results = {family: measure(data, family, work, env, args.method) for family in ("dense", "moe", *chosen)}
    dense, moe = results["dense"], results["moe"]
    extra = moe["tensors"] - dense["tensors"]
    report = {
        "tree": str(tree),
        "method": args.method,
        "families": {family: results[family] for family in chosen},
        "moe_vs_dense": {
            "probe_merge": moe["probe_merge_s"] / dense["probe_merge_s"],
            "cached_merge": moe["cached_merge_s"] / dense["cached_merge_s"],
            "index_files": moe["index_files"] / dense["index_files"],
        },
        "per_tensor_ms": {
            "probe_merge": 1000 * (moe["probe_merge_s"] - dense["probe_merge_s"]) / extra,
            "cached_merge": 1000 * (moe["cached_merge_s"] - dense["cached_merge_s"]) / extra,
        },
        "goals": {"moe_vs_dense_time": 1.5, "moe_vs_dense_index_files": 2.0, "wide_probe_merge_s": 30.0},
    }
    print(json.dumps(report, indent=2))


if __name__ == "__main__":
    main()
