"""The spine kernels alone: probe and RAM merge over the benchmark family, no index, no output file.

Reads the family that ``tools/bench_spine.py`` wrote (``--data``/full), calls the Numba backend's
probe and RAM merge block by block on the blocks' inputs exactly as the passes do (16 Mi-element
blocks, every core; the kernels read them through ``sources``), and
prints the median seconds and elements per second next to one plain read of the inputs. Numba's
compile happens in an untimed first round.

    python tools/bench_kernels.py --data bench-data --repeat 5
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import sys
import time
from pathlib import Path

import numpy as np

os.environ.setdefault("OMP_WAIT_POLICY", "PASSIVE")  # as the CLI runs the kernels (before numba loads)

from ramstream.backends.numba.backend import NumbaBackend
from ramstream.blocks import BlockArrays, BlockReader
from ramstream.format.dtypes import FLOAT_CODES
from ramstream.format.family import Family, open_family
from ramstream.io.reader import InputFiles
from ramstream.plan import make_plan

BLOCK = 1 << 24
READ_BUFFER = 64 * 1024 * 1024


def block_arrays(family: Family, files: InputFiles) -> list[BlockArrays]:
    """Every block's inputs, made by the passes' own code (plan, then ``BlockReader``)."""
    reader = BlockReader(family, make_plan(family, BLOCK), files)
    return [reader.arrays(block) for block in reader.plan.blocks]


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--data", default="bench-data", help="where bench_spine.py wrote the family [bench-data]")
    parser.add_argument("--repeat", type=int, default=3, help="timed rounds; medians are reported [3]")
    parser.add_argument("--json", default=None, help="also write the medians (seconds) to this JSON file")
    args = parser.parse_args()
    root = Path(args.data) / "full"
    if not (root / ".bench-complete").is_file():
        sys.exit(f"no benchmark family under {root}: run tools/bench_spine.py --data {args.data} first")
    family = open_family(root / "base", [str(root / f"agent{k}") for k in (1, 2, 3)])
    backend = NumbaBackend()
    workers = backend.threads
    n_agents = len(family.agents)
    lambdas = np.array([1.2, 1.1, 1.05][:n_agents], np.float32)
    out = np.empty(BLOCK * 4, np.uint8)
    masks = np.empty((n_agents, BLOCK // 8), np.uint8)
    paths = [f for m in family.members for f in m.files]
    elements = sum(r.entry.numel for r in family.base.tensors.values() if r.entry.dtype in FLOAT_CODES)

    with InputFiles() as files:
        sources = block_arrays(family, files)

        def merge() -> None:
            for b in sources:
                backend.merge_ram(b, 1e-5, lambdas[None], [out[: 2 * b.size].view(np.uint16)], 0)

        def probe() -> None:
            for b in sources:
                backend.probe(b, 1e-5, masks)

        def read_once() -> None:
            view = memoryview(bytearray(READ_BUFFER))
            for path in paths:
                with open(path, "rb", buffering=0) as f:
                    while f.readinto(view):
                        pass

        timings: dict[str, list[float]] = {"read": [], "probe": [], "merge": []}
        steps = {"read": read_once, "probe": probe, "merge": merge}
        for step in steps.values():  # compile (or load) the kernels, warm the page cache
            step()
        for _ in range(args.repeat):
            for name, step in steps.items():
                t0 = time.perf_counter()
                step()
                timings[name].append(time.perf_counter() - t0)

    nbytes = sum(os.path.getsize(p) for p in paths)
    print(f"family {root}: {elements / 1e9:.3f}G elements per checkpoint, {nbytes / 1e9:.2f} GB, {workers} threads")
    medians = {name: statistics.median(t) for name, t in timings.items()}
    for name in ("read", "probe", "merge"):
        t = medians[name]
        print(f"{name:6s} {t:.3f} s  {elements / t / 1e9:.2f} G elements/s  {t / medians['read']:.2f} x read")
    if args.json:
        Path(args.json).write_text(json.dumps(medians))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
