"""The spine kernels alone: probe and RAM merge over the benchmark family, no index, no output file.

Reads the family that ``tools/bench_spine.py`` wrote (``--data``/full), calls the Numba backend's
probe and RAM merge block by block on the blocks' inputs exactly as the passes do (16 Mi-element
blocks, every core; the kernels read them through ``sources``), and
prints the median seconds and elements per second next to one plain read of the inputs. Numba's
compile happens in an untimed first round. ``--della`` adds DELLA's fused prune-and-merge kernel
(density 0.2, epsilon 0.1, no 1/p rescale, as ``bench_methods.py`` merges it) over row-aligned
blocks of the same size.

    python tools/bench_kernels.py --data bench-data --repeat 5
    python tools/bench_kernels.py --data bench-data --repeat 3 --della
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

from ramstream.backends.base import PRUNE, GtaParams, KeepMagprune
from ramstream.backends.numba.backend import NumbaBackend
from ramstream.blocks import BlockArrays, BlockReader
from ramstream.format.dtypes import FLOAT_CODES
from ramstream.format.family import Family, open_family
from ramstream.io.reader import InputFiles
from ramstream.methods.della import Magprune
from ramstream.plan import Plan, make_plan

BLOCK = 1 << 24
READ_BUFFER = 64 * 1024 * 1024


def block_arrays(family: Family, files: InputFiles, row_aligned: bool = False) -> tuple[Plan, list[BlockArrays]]:
    """Every block's inputs, made by the passes' own code (plan, then ``BlockReader``)."""
    reader = BlockReader(family, make_plan(family, BLOCK, row_aligned), files)
    return reader.plan, [reader.arrays(block) for block in reader.plan.blocks]


def magprune(plan: Plan, n_agents: int) -> list[KeepMagprune]:
    """DELLA's draw for every block of a row-aligned plan, by ``methods.della``'s own code."""
    shape = (len(plan.tensors), n_agents)
    names = tuple(tensor.name for tensor in plan.tensors)
    draw = Magprune(
        0, np.full(shape, PRUNE, np.int64), np.full(shape, 0.1, np.float32), np.full(shape, 0.2, np.float32), names
    )
    return [
        KeepMagprune(draw.params(plan.tensors[block.tensor], block.start, n_agents, False)) for block in plan.blocks
    ]


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--data", default="bench-data", help="where bench_spine.py wrote the family [bench-data]")
    parser.add_argument("--repeat", type=int, default=3, help="timed rounds; medians are reported [3]")
    parser.add_argument("--json", default=None, help="also write the medians (seconds) to this JSON file")
    parser.add_argument("--della", action="store_true", help="also time DELLA's fused prune-and-merge kernel")
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
        _, sources = block_arrays(family, files)
        aligned, rows_sources = block_arrays(family, files, row_aligned=True) if args.della else (None, [])
        draws = magprune(aligned, n_agents) if aligned is not None else []
        ones = np.ones(n_agents, np.float32)
        della_params = GtaParams(ones, ones, "sum", True, np.ones(1, np.float32))

        def merge() -> None:
            for b in sources:
                backend.merge_ram(b, 1e-5, lambdas[None], [out[: 2 * b.size].view(np.uint16)], 0)

        def probe() -> None:
            for b in sources:
                backend.probe(b, 1e-5, masks)

        def della() -> None:
            for b, keep in zip(rows_sources, draws, strict=True):
                if b.size:
                    backend.merge_gta(b, della_params, keep, [out[: 2 * b.size].view(np.uint16)], 0)

        def read_once() -> None:
            view = memoryview(bytearray(READ_BUFFER))
            for path in paths:
                with open(path, "rb", buffering=0) as f:
                    while f.readinto(view):
                        pass

        steps = {"read": read_once, "probe": probe, "merge": merge, **({"della": della} if args.della else {})}
        timings: dict[str, list[float]] = {name: [] for name in steps}
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
    for name in steps:
        t = medians[name]
        print(f"{name:6s} {t:.3f} s  {elements / t / 1e9:.2f} G elements/s  {t / medians['read']:.2f} x read")
    if args.json:
        Path(args.json).write_text(json.dumps(medians))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
