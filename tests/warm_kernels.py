"""Compile the Numba kernels into the on-disk cache once, before the test workers start.

Each of ``make test``'s workers would otherwise compile the kernels its first tests use, several
workers the same kernel at once on CI's two cores (DELLA's took minutes, in three workers at the
same time). One process that probes a small family and merges it with every method writes them all
to ``NUMBA_CACHE_DIR``, from where each worker and child process loads them. Best effort: a method
that fails here is left to its own tests, which say why.

    NUMBA_CACHE_DIR=... python -m tests.warm_kernels [--part I/K]

``--part I/K`` takes every K-th merge from the I-th (0-based), so K processes share the work.
"""

from __future__ import annotations

import argparse
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

from ramstream.api import merge, probe
from ramstream.config import RunOptions
from ramstream.methods.registry import method_names
from tests.families import build_family
from tests.test_backends import METHODS, PER_VECTOR

# methods whose options tests/test_backends.py does not list: settings that reach their kernels
OTHERS: dict[str, tuple[dict[str, Any], int | None]] = {
    "slerp": ({"t": 0.3}, 1),
    "multislerp": ({"weights": [1.0, 2.0, 0.5]}, 3),
    "karcher": ({}, None),
    "nearswap": ({"t": 0.001}, 1),
    "arcee_fusion": ({}, 1),
}


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--part", default="0/1", help="I/K: the I-th of K processes' share [0/1]")
    part, parts = (int(x) for x in parser.parse_args().part.split("/"))
    started = time.perf_counter()
    failed: list[str] = []
    with tempfile.TemporaryDirectory(prefix="ramstream-warm-") as tmp:
        root = Path(tmp)
        family = build_family(root / "family", identical_agent=True, subset_agent=True, int_tensor=True, seed=5)
        agents = [str(a) for a in family.agents]
        options = RunOptions(cache_dir=root / "cache", quiet=True, block_elems=256)
        runs: list[tuple[str, dict[str, Any], int | None]] = [(m, dict(g), None) for m, g in METHODS]
        runs += [("nuslerp", dict(g), n) for g, n in PER_VECTOR]
        runs += [(m, g, n) for m, (g, n) in OTHERS.items()]
        runs += [(m, {}, None) for m in method_names() if m not in {r[0] for r in runs}]
        runs = runs[part::parts]
        try:
            probe(family.base, agents, options=options)
        except Exception as error:  # best effort: the probe's tests say why
            failed.append(f"probe ({error})")
        for i, (method, given, count) in enumerate(runs):
            ram = {k: given.pop(k) for k in ("rho_scope", "lambda_rule") if k in given}
            try:
                merge(
                    family.base,
                    agents[:count],
                    out=root / f"out{i}",
                    method=method,
                    method_options=given,
                    options=options,
                    **ram,
                )
            except Exception as error:  # best effort: the method's tests say why
                failed.append(f"{method} ({str(error).splitlines()[0] if str(error) else type(error).__name__})")
    elapsed = time.perf_counter() - started
    print(f"kernels of {len(runs)} merges compiled or loaded in {elapsed:.0f} s", file=sys.stderr)
    for line in failed:
        print(f"  not warmed: {line}", file=sys.stderr)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
