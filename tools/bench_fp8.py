"""The FP8 benchmark: a DeepSeek-shaped FP8 base read in place against the same base converted to bf16.

Writes once, under ``--data``: a base shaped like DeepSeek-V3 at small scale (bf16 embeddings,
norms and routers; FP8 E4M3 attention and expert projections, a float32 ``weight_scale_inv`` per
128 x 128 block, ``quantization_config`` in config.json), the same base converted to bf16 (each
quantized tensor's dequantized float32 values rounded to bf16), and bf16 agents at the paper's
densities. Then, in one run, each step a fresh process of the real CLI (Numba's cache warmed
first), for both bases with the same agents:

  - ``ramstream merge --method ram+`` with a fresh ``--cache-dir`` (probe + merge passes), after
    dropping the inputs from the page cache (``POSIX_FADV_DONTNEED`` per file, so the bytes read
    from storage are measured, not the page cache's): wall seconds, bytes read from storage by the
    process (its ``ru_inblock``), peak RSS;
  - the bytes of the base's files and of all the inputs (what each pass reads).

On a tmpfs (``/dev/shm``) nothing is read from storage: give ``--data`` on a disk for the bytes.

    python tools/bench_fp8.py --data /tmp/bench-fp8
    python tools/bench_fp8.py --data /tmp/bench-fp8 --layers 4 --experts 32 --memory 256MiB
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import subprocess
import sys
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent
BLOCK = 128
DENSITIES = (0.05, 0.3, 0.4)

_WRITE = r"""
import json, math, struct, sys
from pathlib import Path
import numpy as np
import torch

data, layers, experts, hidden, inter = Path(sys.argv[1]), *map(int, sys.argv[2:6])
densities = [float(d) for d in sys.argv[6].split(",")]
BLOCK = 128
rng = np.random.default_rng(0)

def write(path, tensors, config):
    path.mkdir(parents=True, exist_ok=True)
    (path / "config.json").write_text(json.dumps(config))
    header, offset = {"__metadata__": {"format": "pt"}}, 0
    for name, (dtype, shape, raw) in tensors.items():
        header[name] = {"dtype": dtype, "shape": list(shape), "data_offsets": [offset, offset + raw.nbytes]}
        offset += raw.nbytes
    text = json.dumps(header).encode()
    text += b" " * (-len(text) % 8)
    with open(path / "model.safetensors", "wb") as f:
        f.write(struct.pack("<Q", len(text)) + text)
        for _, _, raw in tensors.values():
            f.write(np.ascontiguousarray(raw).tobytes())

def bf16(values):
    return torch.from_numpy(values).to(torch.bfloat16).view(torch.int16).numpy().view(np.uint16)

def quantize(values):
    rows, cols = values.shape
    sr, sc = math.ceil(rows / BLOCK), math.ceil(cols / BLOCK)
    padded = torch.zeros(sr * BLOCK, sc * BLOCK)
    padded[:rows, :cols] = torch.from_numpy(values)
    amax = padded.reshape(sr, BLOCK, sc, BLOCK).abs().amax(dim=(1, 3))
    scale = torch.clamp(amax / 448.0, min=1e-8)
    expanded = scale.repeat_interleave(BLOCK, 0)[:rows].repeat_interleave(BLOCK, 1)[:, :cols]
    q = (torch.from_numpy(values) / expanded).to(torch.float8_e4m3fn)
    return q.view(torch.uint8).numpy(), scale.numpy(), (q.to(torch.float32) * expanded).numpy()

shapes = {"model.embed_tokens.weight": ((4096, hidden), False)}
for layer in range(layers):
    p = f"model.layers.{layer}."
    shapes[p + "input_layernorm.weight"] = ((hidden,), False)
    for proj in ("q_proj", "kv_a_proj_with_mqa", "o_proj"):
        shapes[p + f"self_attn.{proj}.weight"] = ((hidden, hidden), True)
    shapes[p + "mlp.gate.weight"] = ((experts, hidden), False)
    for e in range(experts):
        for proj in ("gate_proj", "up_proj", "down_proj"):
            shape = (hidden, inter) if proj == "down_proj" else (inter, hidden)
            shapes[p + f"mlp.experts.{e}.{proj}.weight"] = (shape, True)
shapes["model.norm.weight"] = ((hidden,), False)
shapes["lm_head.weight"] = ((4096, hidden), False)

fp8, converted, agents = {}, {}, [{} for _ in densities]
for name, (shape, quantized) in shapes.items():
    dense = (rng.standard_normal(shape) * 0.05).astype(np.float32)
    if quantized:
        q, scale, base = quantize(dense)
        fp8[name], fp8[name + "_scale_inv"] = ("F8_E4M3", shape, q), ("F32", scale.shape, scale)
    else:
        base = dense
        fp8[name] = ("BF16", shape, bf16(base))
    converted[name] = ("BF16", shape, bf16(base))
    for t, d in enumerate(densities):
        delta = (rng.standard_normal(shape) * 0.01).astype(np.float32)
        agents[t][name] = ("BF16", shape, bf16(np.where(rng.random(shape) < d, base + delta, base)))
scheme = {"quant_method": "fp8", "fmt": "e4m3", "weight_block_size": [BLOCK, BLOCK], "activation_scheme": "dynamic"}
write(data / "base-fp8", fp8, {"model_type": "deepseek_v3", "torch_dtype": "bfloat16", "quantization_config": scheme})
write(data / "base-bf16", converted, {"model_type": "deepseek_v3", "torch_dtype": "bfloat16"})
for t, tensors in enumerate(agents):
    write(data / f"agent{t}", tensors, {"model_type": "deepseek_v3", "torch_dtype": "bfloat16"})
print(sum(math.prod(s) for s, _ in shapes.values()))
"""

# Runs a command and prints its wall time, peak RSS and storage reads (of that child only) as JSON.
_TIMED = """
import json, resource, subprocess, sys, time
start = time.perf_counter()
done = subprocess.run(sys.argv[1:], stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True)
seconds = time.perf_counter() - start
if done.returncode:
    sys.exit(done.stderr)
usage = resource.getrusage(resource.RUSAGE_CHILDREN)
print(json.dumps({"seconds": seconds, "rss_mib": usage.ru_maxrss / 1024, "read_bytes": usage.ru_inblock * 512}))
"""


def weights(directory: Path) -> list[Path]:
    return sorted(directory.glob("*.safetensors"))


def drop_from_cache(directories: list[Path]) -> None:
    """Ask the OS to drop the files' pages from its cache (clean pages of files no one maps)."""
    for directory in directories:
        for path in weights(directory):
            fd = os.open(path, os.O_RDONLY)
            try:
                os.fsync(fd)
                os.posix_fadvise(fd, 0, 0, os.POSIX_FADV_DONTNEED)
            finally:
                os.close(fd)


def timed(cmd: list[str], env: dict[str, str]) -> dict[str, float]:
    out = subprocess.run([sys.executable, "-c", _TIMED, *cmd], capture_output=True, text=True, env=env, cwd="/")
    if out.returncode:
        raise SystemExit(f"{' '.join(cmd[:4])} failed:\n{out.stderr}")
    result: dict[str, float] = json.loads(out.stdout)
    return result


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--data", type=Path, required=True, help="where the families are written (once)")
    parser.add_argument("--layers", type=int, default=2)
    parser.add_argument("--experts", type=int, default=16)
    parser.add_argument("--hidden", type=int, default=512)
    parser.add_argument("--inter", type=int, default=384, help="an expert's intermediate size")
    parser.add_argument("--method", default="ram+")
    parser.add_argument("--memory", default="256MiB")
    args = parser.parse_args()
    data: Path = args.data.resolve()
    env = {**os.environ, "PYTHONPATH": str(REPO)}
    env.setdefault("NUMBA_CACHE_DIR", str(data / ".numba-cache"))
    if not (data / "agent0" / "model.safetensors").is_file():
        shape = [str(v) for v in (args.layers, args.experts, args.hidden, args.inter)]
        written = subprocess.run(
            [sys.executable, "-c", _WRITE, str(data), *shape, ",".join(map(str, DENSITIES))],
            capture_output=True,
            text=True,
            check=True,
        )
        print(f"wrote {int(written.stdout)} parameters per checkpoint under {data}", file=sys.stderr)
    agents = [data / f"agent{t}" for t in range(len(DENSITIES))]
    work = data / "runs"
    shutil.rmtree(work, ignore_errors=True)
    results = {}
    for warm_up in (True, False):  # the first round compiles Numba's kernels into its cache
        for kind in ("bf16", "fp8"):
            base = data / f"base-{kind}"
            out, cache = work / f"out-{kind}-{warm_up}", work / f"cache-{kind}-{warm_up}"
            cli = [sys.executable, "-m", "ramstream.cli", "merge", str(base), *map(str, agents)]
            cli += ["--method", args.method, "--memory", args.memory, "--quiet", "--out", str(out)]
            drop_from_cache([base, *agents])
            measured = timed([*cli, "--cache-dir", str(cache)], env)
            if not warm_up:
                base_bytes = sum(p.stat().st_size for p in weights(base))
                agent_bytes = sum(p.stat().st_size for a in agents for p in weights(a))
                results[kind] = {**measured, "base_file_bytes": base_bytes, "input_bytes": base_bytes + agent_bytes}
    print(json.dumps(results, indent=2))


if __name__ == "__main__":
    main()
