"""The inspect benchmark: ``ramstream inspect`` / ``status`` on an index of a 7B-sized family.

Builds, with ramstream's own index API (``create_index``, ``write_batch``, ``write_rollup``,
``record_probe``, the merge pass's ``open_journal``), a synthetic index shaped like Qwen2-7B
(hidden 3584, 28 layers, intermediate 18944, vocab 152064; a bf16 base and 3 agents: 339
tensors, 7.6e9 parameters) without any weights: each block's statistics are drawn from a
multinomial over which agents changed an element (agent densities around the paper's 3 %, 46 %,
54 %, scaled per tensor by a factor in [0.5, 1.5]), so they are consistent integers. Masks are
written (random bits at those densities, with their true counts) for two tensors, for
``--tensor``; every other mask stays at its fill value. A copy with the probe 60 % done and an
unfinished merge directory (30 % done) serve ``status``.

Each command is timed in a fresh process of the real CLI (interpreter start and imports
included), warm page cache; the figure is the median of ``--repeat`` runs.

    python tools/bench_inspect.py                                  # blocks of 16 Mi elements (--memory 1GiB)
    python tools/bench_inspect.py --block-elems 1048576 --plots    # blocks of 1 Mi elements (--memory 64MiB)
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import shutil
import statistics
import subprocess
import sys
import time
from itertools import combinations
from pathlib import Path

import numpy as np

from ramstream.index.header import IndexHeader
from ramstream.index.store import SCHEMA_VERSION, IndexStore, create_index
from ramstream.merge.merge_pass import copied_tensors, open_journal
from ramstream.output import directory as output_dir
from ramstream.plan import TensorPlan, batch_positions, plan_from_tensors

HIDDEN, LAYERS, INTERMEDIATE, VOCAB, KV = 3584, 28, 18944, 152064, 512
AGENTS = ("agent1", "agent2", "agent3")
DENSITIES = (0.032, 0.462, 0.543)
MASKED = ("model.layers.0.self_attn.q_proj.weight", "model.layers.0.mlp.down_proj.weight")
FILE_BYTES = 15_231_233_024  # one bf16 checkpoint of this shape
MARKER = ".bench-complete"


def qwen2_7b() -> list[tuple[str, tuple[int, ...]]]:
    h, i = HIDDEN, INTERMEDIATE
    out: list[tuple[str, tuple[int, ...]]] = [("model.embed_tokens.weight", (VOCAB, h))]
    for layer in range(LAYERS):
        p = f"model.layers.{layer}."
        out += [
            (p + "input_layernorm.weight", (h,)),
            (p + "mlp.down_proj.weight", (h, i)),
            (p + "mlp.gate_proj.weight", (i, h)),
            (p + "mlp.up_proj.weight", (i, h)),
            (p + "post_attention_layernorm.weight", (h,)),
            (p + "self_attn.k_proj.bias", (KV,)),
            (p + "self_attn.k_proj.weight", (KV, h)),
            (p + "self_attn.o_proj.weight", (h, h)),
            (p + "self_attn.q_proj.bias", (h,)),
            (p + "self_attn.q_proj.weight", (h, h)),
            (p + "self_attn.v_proj.bias", (KV,)),
            (p + "self_attn.v_proj.weight", (KV, h)),
        ]
    return [*out, ("model.norm.weight", (h,)), ("lm_head.weight", (VOCAB, h))]


def block_statistics(rng: np.random.Generator, store: IndexStore) -> tuple[np.ndarray, np.ndarray]:
    """Consistent (overlap, coverage) per block: a multinomial over the 2^N subsets of agents."""
    plan, n = store.plan, len(AGENTS)
    subsets = [s for k in range(n + 1) for s in combinations(range(n), k)]
    density = np.clip(np.array(DENSITIES) * rng.uniform(0.5, 1.5, size=(len(plan.tensors), n)), 0.0, 0.95)
    owner = np.array([b.tensor for b in plan.blocks])
    sizes = np.array([b.size for b in plan.blocks])
    p = density[owner]  # (blocks, N)
    probs = np.stack([np.prod([p[:, t] if t in s else 1 - p[:, t] for t in range(n)], axis=0) for s in subsets], 1)
    counts = rng.multinomial(sizes, probs / probs.sum(axis=1, keepdims=True))
    overlap = np.zeros((len(sizes), n, n), np.int64)
    coverage = np.zeros((len(sizes), n + 1), np.int64)
    for j, s in enumerate(subsets):
        coverage[:, len(s)] += counts[:, j]
        for t in s:
            overlap[:, t, len(s) - 1] += counts[:, j]
    return overlap, coverage


def write_masks(rng: np.random.Generator, store: IndexStore, name: str) -> None:
    """Random masks of one tensor at the agents' densities, with the true counts of its blocks
    (its blocks are whole batches: the masked tensors are larger than a block)."""
    plan = store.plan
    tensor = next(i for i, t in enumerate(plan.tensors) if t.name == name)
    for b in plan.blocks_of(tensor):
        block = plan.blocks[b]
        batch = next(g for g in plan.batches if g.first == b)
        assert len(batch) == 1, f"{name}: block {b} shares its batch"
        masks = np.stack([rng.random(block.size, dtype=np.float32) < d for d in DENSITIES])
        c = masks.sum(axis=0)
        overlap = np.array([[np.count_nonzero(m & (c == k)) for k in range(1, len(AGENTS) + 1)] for m in masks])
        coverage = np.bincount(c, minlength=len(AGENTS) + 1)
        packed = np.zeros((len(AGENTS), plan.mask_width), np.uint8)
        packed[:, : (block.size + 7) // 8] = np.packbits(masks, axis=1, bitorder="little")
        store.write_batch(batch, packed, np.concatenate([overlap.reshape(-1), coverage])[None])


def build(directory: Path, block_elems: int) -> dict[str, Path]:
    """The finished index, a copy with the probe 60 % done, and an unfinished merge directory."""
    paths = {"index": directory / "index.zarr", "partial": directory / "partial.zarr", "out": directory / "merged"}
    want = {"block_elems": block_elems, "version": 2}
    marker = directory / MARKER
    if marker.is_file() and json.loads(marker.read_text()) == want:
        return paths
    if directory.exists():
        shutil.rmtree(directory)
    directory.mkdir(parents=True)
    t0 = time.perf_counter()
    tensors = tuple(TensorPlan(n, s, int(np.prod(s)), ("BF16",) * 4) for n, s in qwen2_7b())
    plan = plan_from_tensors(tensors, block_elems)
    inputs = tuple(
        {"name": m, "path": f"/models/qwen2-7b-{m}", "files": [{"file": "model.safetensors", "size": FILE_BYTES}]}
        for m in ("base", *AGENTS)
    )
    header = IndexHeader(SCHEMA_VERSION, "0" * 20, 1e-5, block_elems, "base", AGENTS, inputs, tensors)
    total = 4 * FILE_BYTES
    for key in ("index", "partial"):
        store = create_index(paths[key], header, plan)
        overlap, coverage = block_statistics(np.random.default_rng(0), store)
        counts = np.zeros(store.group["stats/counts"].shape, np.int64)  # type: ignore[union-attr]
        batch_of, slot_of = batch_positions(plan.batches, len(plan.blocks))
        counts[batch_of, slot_of] = np.concatenate([overlap.reshape(len(overlap), -1), coverage], axis=1)
        store.group["stats/counts"][...] = counts  # type: ignore[index]
        done = len(plan.batches) if key == "index" else int(0.6 * len(plan.batches))
        store.group["progress/probe"][:done] = 1  # type: ignore[index]  # bulk: the pass marks one at a time
        if key == "index":
            for name in MASKED:
                write_masks(np.random.default_rng(1), store, name)
            store.journal.record_rate(total, 95.0, final=True)
            store.write_rollup()
            store.record_probe(95.0, total, complete=True)
        else:
            store.journal.record_rate(int(0.6 * total), 57.0, final=True)
            store.record_probe(57.0, int(0.6 * total), complete=False)
    # An unfinished merge that used the finished index: run.json, then its journal 30 % done.
    run = {"inputs": header.content_key, "method": "ram+", "params": {"r": 0.1, "alpha": 2.0}, "eps": 1e-5}
    output_dir.prepare(paths["out"], run, force=False)
    n_items = len(plan.batches) + len(copied_tensors(plan))
    journal = open_journal(output_dir.work_dir(paths["out"]), n_items, block_elems, paths["index"])
    for item in range(int(0.3 * n_items)):
        journal.mark(item)
    journal.record_rate(int(0.3 * total), 40.0, final=True)
    marker.write_text(json.dumps(want))
    print(f"built {len(plan.blocks)} blocks in {time.perf_counter() - t0:.1f} s under {directory}", file=sys.stderr)
    return paths


def timed(argv: list[str], repeat: int) -> tuple[float, float, str]:
    """Median and min wall seconds of ``argv`` in fresh processes, and its last output."""
    walls, out = [], ""
    for _ in range(repeat):
        t0 = time.perf_counter()
        proc = subprocess.run(argv, capture_output=True, text=True)
        walls.append(time.perf_counter() - t0)
        if proc.returncode != 0:
            sys.exit(f"failed: {' '.join(argv)}\n{proc.stderr}")
        out = proc.stdout
    return statistics.median(walls), min(walls), out


def cases(cli: list[str], paths: dict[str, Path], plots: Path | None) -> list[tuple[str, list[str]]]:
    index, partial, out = (str(paths[k]) for k in ("index", "partial", "out"))
    found = [
        ("python -c 'import ramstream'", [sys.executable, "-c", "import ramstream"]),
        ("ramstream inspect INDEX", [*cli, "inspect", index]),
        ("ramstream inspect INDEX --json", [*cli, "inspect", index, "--json"]),
        ("ramstream inspect INDEX --by layer", [*cli, "inspect", index, "--by", "layer"]),
        ("ramstream inspect INDEX --by module", [*cli, "inspect", index, "--by", "module"]),
        ("ramstream inspect INDEX --top 10", [*cli, "inspect", index, "--top", "10"]),
        ("ramstream inspect INDEX --tensor NAME", [*cli, "inspect", index, "--tensor", MASKED[1]]),
        (
            "ramstream inspect INDEX --by all --top 10 --json",
            [*cli, "inspect", index, "--by", "all", "--top", "10", "--json"],
        ),
        ("ramstream status INDEX (probe done)", [*cli, "status", index]),
        ("ramstream status INDEX (probe 60 % done)", [*cli, "status", partial]),
        ("ramstream status OUT (merge 30 % done)", [*cli, "status", out]),
    ]
    if plots is not None:
        summary, tensor = str(plots / "summary.png"), str(plots / "tensor.png")
        found += [
            ("ramstream inspect INDEX --plot summary.png", [*cli, "inspect", index, "--plot", summary]),
            (
                "ramstream inspect INDEX --tensor NAME --plot tensor.png",
                [*cli, "inspect", index, "--tensor", MASKED[1], "--plot", tensor],
            ),
        ]
    return found


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--data", type=Path, default=Path("bench-data/inspect"))
    parser.add_argument("--block-elems", type=int, default=1 << 24, help="16777216 is what --memory 1GiB gives")
    parser.add_argument("--repeat", type=int, default=5)
    parser.add_argument("--plots", action="store_true", help="also time the two --plot commands")
    args = parser.parse_args()
    paths = build(args.data / f"b{args.block_elems}", args.block_elems)
    cli = [sys.executable, "-m", "ramstream"]
    doc = json.loads(timed([*cli, "inspect", str(paths["index"]), "--json"], 1)[2])
    n_blocks = sum(-(-int(np.prod(s)) // args.block_elems) for _, s in qwen2_7b())
    print(f"index: {doc['params']:,} parameters, {doc['tensor_count']} tensors, {len(AGENTS)} agents, ", end="")
    print(f"{n_blocks} blocks of {args.block_elems} elements")
    print(f"machine: {os.cpu_count()} CPUs, {platform.system()} {platform.release()}, ", end="")
    print(f"Python {platform.python_version()}; median of {args.repeat} fresh processes, warm page cache")
    print("\n| command | median s | min s |\n|---|---:|---:|")
    for label, argv in cases(cli, paths, args.data if args.plots else None):
        median, best, _ = timed(argv, args.repeat)
        print(f"| `{label}` | {median:.2f} | {best:.2f} |", flush=True)


if __name__ == "__main__":
    main()
