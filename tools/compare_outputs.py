"""Byte-compare every method's merge output between two checkouts of ramstream.

A refactor must not change a single output byte. This runs the real CLI of both checkouts (the
same interpreter, each tree first on ``PYTHONPATH``, each with its own index cache and Numba
cache) over the same families and compares every file of every output directory by sha256:

- the test families of ``tests/families.py``: bf16 in 2 shards with an agent identical to the
  base (c = 0 only), one whose changes all overlap agent 0 (0 unique elements) and a copied int
  tensor; f16 in single files; agents in mixed carriers (f32, bf16, f16);
- with ``--bench DIR``, the 0.75B family that ``tools/bench_spine.py`` wrote (``DIR/full``).

    git worktree add /tmp/before <commit>
    python tools/compare_outputs.py --before /tmp/before [--bench bench-data] [--work runs-compare]

Exits 1 when any file differs.
"""

from __future__ import annotations

import argparse
import hashlib
import os
import shutil
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT / "tests"))

from families import build_family  # noqa: E402  (the tests' family writer)

METHODS: list[tuple[str, list[str]]] = [
    ("ram", ["--method", "ram"]),
    ("ram+", ["--method", "ram+"]),
    ("ram+-tensor-script", ["--method", "ram+", "--rho-scope", "tensor", "--lambda-rule", "script"]),
    ("ram+s", ["--method", "ram+s"]),
    ("linear", ["--method", "linear", "--weights", "0.5,1,2"]),
    ("task_arithmetic", ["--method", "task_arithmetic", "--lambda", "0.7"]),
    ("ties", ["--method", "ties", "--density", "0.3"]),
    ("ties-model", ["--method", "ties", "--density", "0.3", "--trim-scope", "model"]),
    ("ties-l1", ["--method", "ties", "--density", "0.3", "--rescale", "l1"]),
    ("breadcrumbs", ["--method", "breadcrumbs", "--density", "0.5", "--gamma", "0.05"]),
    ("breadcrumbs_ties", ["--method", "breadcrumbs_ties", "--density", "0.5", "--gamma", "0.05"]),
    ("dare_linear", ["--method", "dare_linear", "--density", "0.5", "--seed", "3"]),
    ("dare_ties", ["--method", "dare_ties", "--density", "0.5", "--seed", "3"]),
    ("dare_ties-inverse", ["--method", "dare_ties", "--density", "0.5", "--rescale", "inverse"]),
    ("della", ["--method", "della", "--density", "0.5", "--epsilon", "0.1", "--seed", "1"]),
    ("della_linear", ["--method", "della_linear", "--density", "0.5", "--epsilon", "0.1"]),
    ("della-inverse", ["--method", "della", "--density", "0.5", "--epsilon", "0.1", "--rescale", "inverse"]),
    ("model_stock", ["--method", "model_stock"]),
]


def families(work: Path, bench: Path | None) -> dict[str, tuple[Path, list[Path]]]:
    out: dict[str, tuple[Path, list[Path]]] = {}
    made = [
        ("bf16-sharded", dict(shards=2, identical_agent=True, subset_agent=True, int_tensor=True)),
        ("f16-single", dict(dtype="F16", single_file=True, seed=1)),
        ("mixed", dict(dtype="F32", agent_dtypes=("F32", "BF16", "F16"), seed=2)),
    ]
    for name, kwargs in made:
        (work / "families" / name).mkdir(parents=True)
        fam = build_family(work / "families" / name, **kwargs)  # type: ignore[arg-type]
        out[name] = (fam.base, fam.agents)
    if bench is not None:
        full = bench.resolve() / "full"
        out["bench-0.75B"] = (full / "base", [full / f"agent{k}" for k in (1, 2, 3)])
    return out


def digests(directory: Path) -> dict[str, str]:
    result = {}
    for path in sorted(p for p in directory.rglob("*") if p.is_file()):
        h = hashlib.sha256()
        with open(path, "rb") as f:
            while chunk := f.read(1 << 24):
                h.update(chunk)
        result[str(path.relative_to(directory))] = h.hexdigest()
    return result


def merge(tree: Path, label: str, work: Path, base: Path, agents: list[Path], args: list[str], out: Path) -> None:
    env = dict(os.environ, PYTHONPATH=str(tree), NUMBA_CACHE_DIR=str(work / "numba" / label))
    command = [sys.executable, "-m", "ramstream", "merge", str(base), *map(str, agents), "--out", str(out)]
    command += [*args, "--cache-dir", str(work / "cache" / label), "--quiet"]
    subprocess.run(command, env=env, check=True, cwd=work, stdout=subprocess.DEVNULL)


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--before", required=True, type=Path, help="the other checkout (e.g. a git worktree)")
    parser.add_argument("--after", type=Path, default=ROOT, help="this checkout [the tree of this script]")
    parser.add_argument("--bench", type=Path, default=None, help="also the 0.75B family under DIR/full")
    parser.add_argument("--work", type=Path, default=Path("runs-compare"), help="scratch directory [runs-compare]")
    args = parser.parse_args()
    work = args.work.resolve()
    shutil.rmtree(work, ignore_errors=True)
    work.mkdir(parents=True)
    differing = 0
    compared = 0
    for fam_name, (base, agents) in families(work, args.bench).items():
        n = len(agents)
        for method, flags in METHODS:
            flags = [f if f != "0.5,1,2" else ",".join(["0.5", "1", "2", "1.5", "1"][:n]) for f in flags]
            outs = {}
            for label, tree in (("before", args.before.resolve()), ("after", args.after.resolve())):
                outs[label] = work / "out" / label / fam_name / method
                merge(tree, label, work, base, agents, flags, outs[label])
            before, after = digests(outs["before"]), digests(outs["after"])
            same = before == after
            compared += 1
            differing += not same
            files = sum(1 for name in after if name.endswith(".safetensors"))
            verdict = "identical" if same else "DIFFERENT"
            print(f"{fam_name:14s} {method:20s} {verdict} ({len(after)} files, {files} shards)")
            if not same:
                for name in sorted(set(before) | set(after)):
                    if before.get(name) != after.get(name):
                        print(f"    {name}: {before.get(name, '-')[:12]} != {after.get(name, '-')[:12]}")
            if fam_name == "bench-0.75B":
                for out in outs.values():
                    shutil.rmtree(out)  # 1.5 GB per output: keep the disk free
    print(f"{compared} merges compared, {differing} differ")
    return 1 if differing else 0


if __name__ == "__main__":
    raise SystemExit(main())
