"""LoRA agents against the same agents materialised: one merge each way, in one run.

Uses the 0.75B family's base (written under ``--data`` by tools/bench_spine.py's writer) and
writes, once, beside it:

  lora{k}/  a PEFT LoRA adapter of rank 64 (alpha 128) on every attention and MLP projection,
            bf16 factors, as ``save_pretrained`` writes them (``adapter_config.json`` +
            ``adapter_model.safetensors``);
  full{k}/  the same agent materialised as a bf16 checkpoint: bf16(base + scale * B @ A), what
            a user has after ``merge_and_unload()`` and ``save_pretrained`` in bf16.

Then, per method, ``ramstream merge BASE lora1 lora2 lora3`` and ``ramstream merge BASE full1
full2 full3`` (fresh process, empty ``--cache-dir``: the probe is counted; ``--memory 1GiB``),
alternating, each measured by the spine benchmark's wrapper (wall time, peak RSS of the command
alone) and retried when other processes took the CPUs meanwhile. Reported: time, peak RSS, the
inputs' bytes on disk, and how many output elements the two merges share bit for bit (the
materialised agents' task vectors are rounded to bf16, the adapters' are not).

    python tools/bench_lora.py --data bench-data             # rank 64 on the 0.75B family
    python tools/bench_lora.py --data bench-data --quick     # a smoke run in seconds
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import sys
from pathlib import Path
from typing import Any

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parent))
import bench_spine as spine  # the family writer, the measuring wrapper, the quiet-machine checks

from ramstream.format import codecs
from ramstream.format.dtypes import FloatCode

AGENTS = 3
ALPHA_PER_RANK = 2  # lora_alpha = 2 r: scale 2
TARGETS = ("q_proj", "k_proj", "v_proj", "o_proj", "gate_proj", "up_proj", "down_proj")
MARKER = ".lora-complete"


def read_safetensors(path: Path) -> dict[str, tuple[str, list[int], np.ndarray]]:
    """name -> (dtype, shape, raw little-endian elements) of a safetensors file, memory-mapped."""
    with path.open("rb") as f:
        size = int.from_bytes(f.read(8), "little")
        header = json.loads(f.read(size))
    data = np.memmap(path, np.uint8, mode="r", offset=8 + size)
    header.pop("__metadata__", None)
    raw_dtype = {"BF16": np.uint16, "F32": np.float32}
    return {
        name: (e["dtype"], e["shape"], data[e["data_offsets"][0] : e["data_offsets"][1]].view(raw_dtype[e["dtype"]]))
        for name, e in header.items()
    }


def write_safetensors(path: Path, tensors: dict[str, tuple[str, list[int], np.ndarray]]) -> None:
    header: dict[str, Any] = {}
    offset = 0
    for name, (dtype, shape, raw) in tensors.items():
        header[name] = {"dtype": dtype, "shape": shape, "data_offsets": [offset, offset + raw.nbytes]}
        offset += raw.nbytes
    blob = json.dumps(header).encode()
    blob += b" " * (-len(blob) % 8)
    with path.open("wb") as f:
        f.write(len(blob).to_bytes(8, "little") + blob)
        for _, _, raw in tensors.values():
            f.write(raw.tobytes())


def module_of(name: str) -> str | None:
    """The PEFT module a base tensor belongs to when the adapters target it."""
    if name.endswith(".weight") and name.split(".")[-2] in TARGETS:
        return name.removesuffix(".weight")
    return None


def ensure_agents(base: Path, root: Path, rank: int) -> tuple[list[Path], list[Path]]:
    """Write the adapters and their materialised checkpoints once (a marker records which)."""
    want = {"rank": rank, "agents": AGENTS, "base": str(base)}
    adapters = [root / f"lora{k + 1}" for k in range(AGENTS)]
    fulls = [root / f"full{k + 1}" for k in range(AGENTS)]
    marker = root / MARKER
    if marker.is_file() and json.loads(marker.read_text()) == want:
        return adapters, fulls
    shutil.rmtree(root, ignore_errors=True)
    root.mkdir(parents=True)
    spine.log(f"writing {AGENTS} rank-{rank} adapters and their materialised agents to {root} (once)")
    tensors = read_safetensors(base / "model.safetensors")
    scale = np.float32(ALPHA_PER_RANK * rank / rank)
    for k, (adapter, full) in enumerate(zip(adapters, fulls, strict=True)):
        rng = np.random.default_rng(100 + k)
        factors: dict[str, tuple[str, list[int], np.ndarray]] = {}
        weights: dict[str, tuple[str, list[int], np.ndarray]] = {}
        for name, (dtype, shape, raw) in tensors.items():
            module = module_of(name)
            if module is None:
                weights[name] = (dtype, shape, raw)
                continue
            out_dim, in_dim = shape
            a = codecs.encode(rng.standard_normal((rank, in_dim), dtype=np.float32) * np.float32(0.01), FloatCode.BF16)
            b = codecs.encode(
                rng.standard_normal((out_dim, rank), dtype=np.float32) * np.float32(0.0125), FloatCode.BF16
            )
            factors[f"base_model.model.{module}.lora_A.weight"] = ("BF16", [rank, in_dim], a)
            factors[f"base_model.model.{module}.lora_B.weight"] = ("BF16", [out_dim, rank], b)
            delta = codecs.decode(b.ravel(), FloatCode.BF16).reshape(out_dim, rank) @ codecs.decode(
                a.ravel(), FloatCode.BF16
            ).reshape(rank, in_dim)
            agent = codecs.decode(raw, FloatCode.BF16) + (delta * scale).ravel()
            weights[name] = (dtype, shape, codecs.encode(agent.astype(np.float32), FloatCode.BF16))
        adapter.mkdir()
        write_safetensors(adapter / "adapter_model.safetensors", factors)
        config = {
            "peft_type": "LORA",
            "r": rank,
            "lora_alpha": ALPHA_PER_RANK * rank,
            "target_modules": list(TARGETS),
            "base_model_name_or_path": None,
            "task_type": "CAUSAL_LM",
        }
        (adapter / "adapter_config.json").write_text(json.dumps(config, indent=1))
        full.mkdir()
        write_safetensors(full / "model.safetensors", weights)
        shutil.copy(base / "config.json", full / "config.json")
    marker.write_text(json.dumps(want))
    return adapters, fulls


def disk_bytes(paths: list[Path]) -> int:
    return sum(f.stat().st_size for p in paths for f in p.iterdir() if f.is_file())


def merge_argv(
    base: Path, agents: list[Path], out: Path, cache: Path, method: str, args: argparse.Namespace
) -> list[str]:
    argv = [*spine.ramstream_cmd(), "merge", str(base), *map(str, agents), "--out", str(out), "--method", method]
    argv += ["--cache-dir", str(cache), "--memory", args.memory, "--quiet"]
    return argv + (["--threads", str(args.threads)] if args.threads else [])


def same_elements(a: Path, b: Path) -> tuple[int, int]:
    """(elements with the same bits, elements) over the two outputs' tensors."""
    ours, theirs = (read_safetensors(next(d.glob("*.safetensors"))) for d in (a, b))
    same = total = 0
    for name, (_, _, raw) in ours.items():
        same += int((raw == theirs[name][2]).sum())
        total += raw.size
    return same, total


def run(args: argparse.Namespace) -> int:
    data = Path(args.data).resolve()
    shape = spine.QUICK if args.quick else spine.FULL
    base, _ = spine.ensure_family(data / ("quick" if args.quick else "full"), shape)
    rank = args.rank if args.rank else (8 if args.quick else 64)
    adapters, fulls = ensure_agents(base, data / ("lora-quick" if args.quick else "lora"), rank)
    runs = data / "lora-runs"
    shutil.rmtree(runs, ignore_errors=True)
    runs.mkdir()
    env_cache = os.environ.setdefault("NUMBA_CACHE_DIR", str(data / "numba-cache"))
    methods = args.methods.split(",")
    spine.log(f"numba cache {env_cache}; warming it with one untimed merge per method and input kind")
    for method in methods:
        for label, agents in (("lora", adapters), ("full", fulls)):
            warm = runs / f"warm-{method}-{label}"
            spine.measure(merge_argv(base, agents, warm, runs / f"{warm.name}-cache", method, args), runs / "m.json")
    figures: dict[str, dict[str, dict[str, float]]] = {}
    for method in methods:
        figures[method] = {}
        for label, agents in (("lora", adapters), ("full", fulls)):
            out, cache = runs / f"{method}-{label}", runs / f"{method}-cache-{label}"

            def prepare(out: Path = out, cache: Path = cache) -> None:
                shutil.rmtree(out, ignore_errors=True)
                shutil.rmtree(cache, ignore_errors=True)

            argv = merge_argv(base, agents, out, cache, method, args)
            figures[method][label] = spine.step(
                f"{method} {label}", lambda argv=argv: spine.merge_step(argv, runs / "m.json"), args, prepare
            )
        same, total = same_elements(runs / f"{method}-lora", runs / f"{method}-full")
        figures[method]["same"] = {"elements": same, "total": total}
    report(figures, disk_bytes([base]), disk_bytes(adapters), disk_bytes(fulls), rank)
    if args.json:
        Path(args.json).write_text(json.dumps(figures, indent=1))
    return 0


def report(figures: dict[str, dict[str, dict[str, float]]], base: int, adapters: int, fulls: int, rank: int) -> None:
    gib = 1024**3
    print(f"# LoRA agents (rank {rank}) against the same agents materialised in bf16 ({spine.git_commit()})")
    print(
        f"inputs on disk: base {base / gib:.2f} GiB; adapters {adapters / gib:.3f} GiB; "
        f"materialised {fulls / gib:.2f} GiB"
    )
    print("| method | adapters: time, peak RSS | materialised: time, peak RSS | time ratio | same bits |")
    print("|---|---|---|---|---|")
    for method, fig in figures.items():
        lora, full, same = fig["lora"], fig["full"], fig["same"]
        print(
            f"| {method} | {lora['wall']:.1f} s, {lora['rss_mib']:.0f} MiB | {full['wall']:.1f} s, "
            f"{full['rss_mib']:.0f} MiB | {lora['wall'] / full['wall']:.2f} | "
            f"{100 * same['elements'] / same['total']:.2f} % |"
        )
    disturbed = [
        f"{m} {k}" for m, fig in figures.items() for k in ("lora", "full") if fig[k]["others"] > spine.DISTURBED
    ]
    if disturbed:
        print(f"warning: other processes used the CPUs during {', '.join(disturbed)}")


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    spine.add_run_options(parser)
    parser.add_argument("--methods", default="ram+,task_arithmetic", help="comma-separated [ram+,task_arithmetic]")
    parser.add_argument("--rank", type=int, default=None, help="the adapters' rank [64; 8 with --quick]")
    return run(spine.parse_run_args(parser))


if __name__ == "__main__":
    sys.exit(main())
