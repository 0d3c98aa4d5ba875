"""Bounded memory: a merge whose largest tensor is twice the budget stays within the budget.

DESIGN.md promises "peak RSS <= --memory budget + a fixed interpreter overhead, for any model
size, including a single tensor larger than the budget; mapped file pages count". The family is a
bf16 base and three agents with a 128 MiB embedding (64M elements); the merge runs with
``--memory 64MiB`` in a child of a fresh intermediate process, which reports its children's peak
RSS (``RUSAGE_CHILDREN``), so neither the test process nor the family writing is measured. The
fixed overhead is measured too: the same command's peak on a tiny family, after a first tiny run
has compiled the kernels (compiling is a one-time cost of a kernel's first use on a machine,
outside the budget: docs/architecture.md, "Memory").

The agents' task vectors follow a pattern with period 64 over each tensor's flat index, so the
whole-model overlap counts, rho and lambda are known without reading the files back, and a few
sampled output elements are checked bit for bit against a direct computation.
"""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest

from tests.families import bf16_to_f32, f32_to_bf16, model_file_of, read_elements, write_safetensors_chunked

MiB = 1024**2
BUDGET = 64 * MiB
# Beyond the same command's peak on a tiny family (``measured``: the interpreter, the libraries
# and the kernels), a run may hold the budget and this: its larger plan and index, a statistic's
# chunks in flight, more of the libraries' code (measured in all: merge 11, ties 33, sweep 52, TIES
# of 385 tensors 34 MiB; before the C heap's thresholds followed the budget, ``ramstream/io/heap.py``,
# what it kept of freed buffers made it ties 66, sweep 97-138, 385 tensors 157 MiB).
MARGIN = 80 * MiB
SHAPES: dict[str, tuple[int, ...]] = {
    "model.embed_tokens.weight": (32768, 2048),  # 64M elements, 128 MiB in bf16: twice the budget
    "model.norm.weight": (2048,),
    "lm_head.weight": (512, 2048),
}
PERIOD = 64
# Agent t changes element i of every tensor iff i % PERIOD is in ACTIVE[t].
ACTIVE: tuple[frozenset[int], ...] = (
    frozenset(range(4)),  # sparse, half of it shared
    frozenset({0, 1, *range(8, 16)}),
    frozenset({1, *range(12, 20)}),
)
N_AGENTS = len(ACTIVE)
R, ALPHA, EPS = 0.1, 2.0, 1e-5

# Runs argv[1:] as its only child; prints that child's peak RSS in KiB.
MEASURE = (
    "import resource, subprocess, sys\n"
    "done = subprocess.run(sys.argv[1:])\n"
    "print(resource.getrusage(resource.RUSAGE_CHILDREN).ru_maxrss)\n"
    "sys.exit(done.returncode)\n"
)
# The family of the warm-up runs: the same dtype and agent count, a few KiB.
TINY_SHAPES: dict[str, tuple[int, ...]] = {name: (8, 128) for name in SHAPES}


def measured(tmp: Path, family: tuple[Path, list[Path]], command: list[str], cache: Path) -> tuple[str, int, int]:
    """Run ``ramstream COMMAND BASE AGENT... --out --cache-dir --memory 64MiB --quiet`` on the
    family: its stdout, its peak RSS and the peak RSS of the same command on a tiny family of the
    same dtype and agent count (the overhead: the interpreter, the libraries and the kernels), in
    bytes.

    The tiny run goes first twice: a kernel's first use on a machine compiles it (LLVM: a few
    hundred MiB, once, then cached on disk), which the second run does not. The overhead is
    measured, not assumed, because it is not the same everywhere: the libraries' pages that
    count in RSS depend on how much of their files the OS has cached (numba's LLVM library alone:
    68 MiB in one venv, 103 MiB in a freshly installed one, same versions).
    """
    tiny = tmp / "tiny"
    if not tiny.exists():
        write_family(tiny, TINY_SHAPES)

    def run(base: Path, agents: list[Path], name: str, cache: Path) -> tuple[str, int]:
        paths = [str(base), *map(str, agents), "--out", str(tmp / name), "--cache-dir", str(cache)]
        argv = [sys.executable, "-m", "ramstream.cli", command[0], *paths, *command[1:], "--memory", "64MiB", "--quiet"]
        done = subprocess.run([sys.executable, "-c", MEASURE, *argv], capture_output=True, text=True, timeout=600)
        assert done.returncode == 0, done.stderr
        assert "Traceback" not in done.stderr
        return done.stdout, int(done.stdout.strip().splitlines()[-1]) * 1024  # ru_maxrss is in KiB on Linux

    tiny_members = (tiny / "base", [tiny / f"agent{t}" for t in range(N_AGENTS)])
    run(*tiny_members, "compile-out", tmp / "compile-cache")
    _, overhead = run(*tiny_members, "tiny-out", tmp / "tiny-cache")
    stdout, peak = run(*family, "out", cache)
    return stdout, peak, overhead


def within(peak: int, overhead: int, what: str) -> str:
    return (
        f"{what}: peak RSS {peak / MiB:.0f} MiB, {(peak - overhead) / MiB:.0f} MiB over the same command on a tiny "
        f"family, for a {BUDGET // MiB} MiB budget"
    )


def base_values(name: str, start: int, stop: int) -> np.ndarray:
    """bf16-exact float32 values in [-0.05, 0.05) for elements [start, stop), seeded by both."""
    rng = np.random.default_rng([len(name), sum(map(ord, name)), start])
    values = (rng.random(stop - start, dtype=np.float32) - np.float32(0.5)) * np.float32(0.1)
    return bf16_to_f32(f32_to_bf16(values))


def deltas(t: int) -> np.ndarray:
    """Agent t's change over two periods (the sign flips every period): +-0.01 (t + 1) or 0."""
    row = np.array([0.01 * (t + 1) if q in ACTIVE[t] else 0.0 for q in range(PERIOD)], np.float32)
    return np.concatenate([row, -row])


def agent_values(t: int, name: str, start: int, stop: int) -> np.ndarray:
    assert start % (2 * PERIOD) == 0 and (stop - start) % (2 * PERIOD) == 0
    base = base_values(name, start, stop).reshape(-1, 2 * PERIOD)
    return (base + deltas(t)).ravel()


def write_family(root: Path, shapes: dict[str, tuple[int, ...]] = SHAPES) -> tuple[Path, list[Path]]:
    specs = [(name, "BF16", shape) for name, shape in shapes.items()]
    paths = [root / "base", *(root / f"agent{t}" for t in range(N_AGENTS))]
    for m, path in enumerate(paths):
        path.mkdir(parents=True)
        (path / "config.json").write_text('{"model_type": "llama", "torch_dtype": "bfloat16"}')

        def chunk(name: str, start: int, stop: int, m: int = m) -> np.ndarray:
            values = base_values(name, start, stop) if m == 0 else agent_values(m - 1, name, start, stop)
            return f32_to_bf16(values)

        write_safetensors_chunked(path / "model.safetensors", specs, chunk)
    return paths[0], paths[1:]


def expected_lambdas(shapes: dict[str, tuple[int, ...]] = SHAPES) -> np.ndarray:
    """lambda_t from the whole-model counts of the periodic pattern (float64, as the spec)."""
    shared, unique = np.zeros(N_AGENTS), np.zeros(N_AGENTS)
    periods = sum(int(np.prod(shape)) for shape in shapes.values()) // PERIOD
    for q in range(PERIOD):
        c = sum(q in a for a in ACTIVE)
        for t in range(N_AGENTS):
            if q in ACTIVE[t]:
                shared[t] += periods * (c >= 2)
                unique[t] += periods * (c == 1)
    assert (unique > 0).all()
    return 1.0 + R * np.clip(shared / unique, 0.0, ALPHA)


def direct_merge(base: np.ndarray, agents: list[np.ndarray], lam32: np.ndarray) -> np.ndarray:
    """RAM+ of a few elements, written from the spec: float32 throughout, bf16 out (RNE)."""
    taus = [(a - base).astype(np.float32) for a in agents]
    active = [np.abs(tau) > np.float32(EPS) for tau in taus]
    c = np.sum(active, axis=0)
    total = np.zeros_like(base)
    for t in range(N_AGENTS):  # in agent order
        total = np.where(active[t], total + taus[t], total)
    merged = np.zeros_like(base)
    for t in range(N_AGENTS):
        merged = np.where(active[t] & (c == 1), lam32[t] * taus[t], merged)
    merged = np.where(c >= 2, total / np.maximum(c, 1).astype(np.float32), merged)
    return f32_to_bf16((base + merged).astype(np.float32))


def test_merge_of_a_tensor_twice_the_budget_stays_within_budget(tmp_path_factory: pytest.TempPathFactory) -> None:
    _, base, agents = shared_family(tmp_path_factory)
    tmp_path = tmp_path_factory.mktemp("merge")
    out = tmp_path / "out"
    stdout, peak, overhead = measured(tmp_path, (base, agents), ["merge"], tmp_path / "cache")
    lines = stdout.strip().splitlines()
    assert lines[0].startswith(f"merged: {out} (ram+"), stdout
    assert 32 * MiB < peak, peak
    assert peak - overhead < BUDGET + MARGIN, within(peak, overhead, "merge")

    lam32 = expected_lambdas().astype(np.float32)
    lambdas_printed = lines[0].rsplit("lambda ", 1)[1].rstrip(")").split(", ")
    np.testing.assert_allclose([float(x) for x in lambdas_printed], lam32, atol=5e-5)
    for name, shape in SHAPES.items():
        numel = int(np.prod(shape))
        starts = sorted({0, (numel // 2) // PERIOD * PERIOD, numel - PERIOD})
        picks = np.array([s + q for s in starts for q in (*range(20), PERIOD - 1)], dtype=np.int64)
        raw_base = read_elements(base / "model.safetensors", name, picks)
        values = [bf16_to_f32(read_elements(a / "model.safetensors", name, picks)) for a in agents]
        for t, v in enumerate(values):  # the files hold the intended pattern
            changed = v != bf16_to_f32(raw_base)
            np.testing.assert_array_equal(changed, [int(i % PERIOD) in ACTIVE[t] for i in picks])
        want = direct_merge(bf16_to_f32(raw_base), values, lam32)
        got = read_elements(model_file_of(out, name), name, picks)
        np.testing.assert_array_equal(got, want, err_msg=name)


def shared_family(tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, Path, list[Path]]:
    """The family of the budget tests, written once per session: its root, base and agents."""
    root = tmp_path_factory.getbasetemp() / "memory-family"
    if not (root / "done").exists():
        root.mkdir(exist_ok=True)
        write_family(root / "family")
        (root / "done").write_text("ok\n")
    return root, root / "family" / "base", [root / "family" / f"agent{t}" for t in range(N_AGENTS)]


# Every method family within the same budget: the generalized task arithmetic kernels (linear,
# task arithmetic), magnitude trimming with its histogram pass (ties), DARE's draws with its exact
# L1 sums (dare_ties), DELLA's row-aligned blocks (della) and model stock's per-tensor statistics.
FAMILIES = {
    "linear": [],
    "task_arithmetic": ["--lambda", "0.7"],
    "ties": ["--density", "0.3"],
    "dare_ties": ["--density", "0.5", "--seed", "1"],
    "della": ["--density", "0.5", "--epsilon", "0.1"],
    "model_stock": [],
}


@pytest.mark.slow
@pytest.mark.parametrize("method", list(FAMILIES))
def test_every_method_family_stays_within_budget(tmp_path_factory: pytest.TempPathFactory, method: str) -> None:
    root, base, agents = shared_family(tmp_path_factory)
    merge = ["merge", "--method", method, *FAMILIES[method]]
    _, peak, overhead = measured(tmp_path_factory.mktemp(method), (base, agents), merge, root / "cache")
    assert peak - overhead < BUDGET + MARGIN, within(peak, overhead, method)


# A sweep of K = 6 (ram+ for three r, task arithmetic for two lambda, ties): one read of the
# inputs, six outputs' buffers in each block, the same budget.
SWEEP_GRIDS = ("ram+:r=0.05,0.1,0.2", "task_arithmetic:lambda=0.5,1.0", "ties:density=0.3")


@pytest.mark.slow
def test_a_sweep_of_six_candidates_stays_within_budget(tmp_path_factory: pytest.TempPathFactory) -> None:
    root, base, agents = shared_family(tmp_path_factory)
    sweep = ["sweep", *(x for grid in SWEEP_GRIDS for x in ("--grid", grid))]
    stdout, peak, overhead = measured(tmp_path_factory.mktemp("sweep"), (base, agents), sweep, root / "cache")
    assert stdout.count("merged: ") == 6, stdout
    assert peak - overhead < BUDGET + MARGIN, within(peak, overhead, "sweep")


# An FP8 base whose one quantized tensor is larger than the budget in its own bytes (72 MiB of
# FP8; 144 MiB as the bf16 the base is read as, 288 MiB dequantized to float32), bf16 agents.
FP8_NAME = "model.layers.0.mlp.down_proj.weight"
FP8_SHAPES: dict[str, tuple[int, ...]] = {FP8_NAME: (36864, 2048), "model.norm.weight": (2048,)}
FP8_TINY_SHAPES: dict[str, tuple[int, ...]] = {FP8_NAME: (256, 2048), "model.norm.weight": (2048,)}
FP8_CONFIG = '{"model_type": "deepseek_v3", "torch_dtype": "bfloat16", "quantization_config": {"quant_method": "fp8", "fmt": "e4m3", "weight_block_size": [128, 128]}}'  # noqa: E501


def fp8_scales(shape: tuple[int, ...]) -> np.ndarray:
    rows, cols = shape
    return np.random.default_rng(1).uniform(0.002, 0.006, (-(-rows // 128), -(-cols // 128))).astype(np.float32)


def fp8_codes(start: int, stop: int) -> np.ndarray:
    """E4M3 codes of magnitude 0.25 to 8 (exponents 5 to 9), either sign: a hash of each index."""
    mixed = (np.arange(start, stop, dtype=np.uint64) * np.uint64(0x9E3779B97F4A7C15)) >> np.uint64(40)
    return ((0x28 + mixed % np.uint64(40)) | ((mixed >> np.uint64(20)) & np.uint64(1)) << np.uint64(7)).astype(np.uint8)


def fp8_base_as_bf16(start: int, stop: int, shape: tuple[int, ...] = FP8_SHAPES[FP8_NAME]) -> np.ndarray:
    """float32: the FP8 tensor's elements [start, stop) dequantized by torch, rounded to bf16 (what
    bf16 agents of this base were trained from, and what the merge reads the base as)."""
    import torch

    cols = shape[1]
    fp8 = torch.from_numpy(fp8_codes(start, stop)).view(torch.float8_e4m3fn).to(torch.float32).numpy()
    rows, columns = np.divmod(np.arange(start, stop), cols)
    values = (fp8 * fp8_scales(shape)[rows // 128, columns // 128]).astype(np.float32)
    return bf16_to_f32(f32_to_bf16(values))


def write_fp8_family(root: Path, shapes: dict[str, tuple[int, ...]] = FP8_SHAPES) -> tuple[Path, list[Path]]:
    paths = [root / "base", *(root / f"agent{t}" for t in range(N_AGENTS))]
    scale_name = FP8_NAME + "_scale_inv"
    scales = fp8_scales(shapes[FP8_NAME])
    for m, path in enumerate(paths):
        path.mkdir(parents=True)
        (path / "config.json").write_text(FP8_CONFIG if m == 0 else '{"model_type": "deepseek_v3"}')

        def chunk(name: str, start: int, stop: int, m: int = m) -> np.ndarray:
            if name == scale_name:
                return scales.reshape(-1)[start:stop]
            if m == 0:
                return fp8_codes(start, stop) if name == FP8_NAME else f32_to_bf16(base_values(name, start, stop))
            base = (
                fp8_base_as_bf16(start, stop, shapes[FP8_NAME]) if name == FP8_NAME else base_values(name, start, stop)
            )
            return f32_to_bf16((base.reshape(-1, 2 * PERIOD) + deltas(m - 1)).ravel())

        specs = [(n, "BF16", s) for n, s in shapes.items()]
        if m == 0:
            specs = [(FP8_NAME, "F8_E4M3", shapes[FP8_NAME]), (scale_name, "F32", scales.shape)]
            specs.append(("model.norm.weight", "BF16", shapes["model.norm.weight"]))
        write_safetensors_chunked(path / "model.safetensors", specs, chunk)
    return paths[0], paths[1:]


def test_merge_of_an_fp8_base_with_a_quantized_tensor_over_the_budget_stays_within_budget(tmp_path: Path) -> None:
    """The base's blocks are decoded (by the backend, into bf16) a block at a time: the peak stays
    within the budget, and sampled elements are RAM+ of the base converted to bf16."""
    write_fp8_family(
        tmp_path / "tiny", FP8_TINY_SHAPES
    )  # the overhead's run: the same kernels, the dequantization's too
    base, agents = write_fp8_family(tmp_path / "family")
    out = tmp_path / "out"
    stdout, peak, overhead = measured(tmp_path, (base, agents), ["merge"], tmp_path / "cache")
    assert stdout.strip().splitlines()[0].startswith(f"merged: {out} (ram+"), stdout
    assert peak - overhead < BUDGET + MARGIN, within(peak, overhead, "FP8 merge")

    lam32 = expected_lambdas(FP8_SHAPES).astype(np.float32)
    numel = int(np.prod(FP8_SHAPES[FP8_NAME]))
    starts = (0, (numel // 2) // PERIOD * PERIOD, numel - 2 * PERIOD)
    picks = np.array([s + q for s in starts for q in (*range(20), PERIOD - 1, PERIOD + 3)], dtype=np.int64)
    base_at = np.concatenate(
        [fp8_base_as_bf16(s, s + 2 * PERIOD)[[*range(20), PERIOD - 1, PERIOD + 3]] for s in starts]
    )
    values = [bf16_to_f32(read_elements(a / "model.safetensors", FP8_NAME, picks)) for a in agents]
    want = direct_merge(base_at, values, lam32)
    got = read_elements(model_file_of(out, FP8_NAME), FP8_NAME, picks)
    np.testing.assert_array_equal(got, want)


# A MoE's thousands of small tensors: TIES's statistics are a histogram per block (384 KiB, and
# 768 KiB for the low halves), hundreds of MiB for the model where its weights are 24 MiB in all.
# They are computed, stored and read back a bounded chunk at a time (the regression: a batch's
# partials held whole, each chunk copied again by the store, the last one read kept through the
# merge pass).
MANY_SHAPES: dict[str, tuple[int, ...]] = {
    f"model.layers.{layer}.mlp.experts.{expert}.{part}.weight": (32, 128)
    for layer in range(4)
    for expert in range(32)
    for part in ("gate_proj", "up_proj", "down_proj")
} | {"model.norm.weight": (128,)}


@pytest.mark.slow
def test_a_ties_merge_of_many_small_tensors_stays_within_budget(tmp_path: Path) -> None:
    base, agents = write_family(tmp_path / "family", MANY_SHAPES)
    ties = ["merge", "--method", "ties", "--density", "0.3"]
    stdout, peak, overhead = measured(tmp_path, (base, agents), ties, tmp_path / "cache")
    assert stdout.startswith(f"merged: {tmp_path / 'out'} (ties"), stdout
    assert peak - overhead < BUDGET + MARGIN, within(peak, overhead, f"ties of {len(MANY_SHAPES)} tensors")


# What a run's backend sets: glibc's thresholds at an eighth of the budget, 1 to 32 MiB (read back
# in a fresh process, so this test process keeps its own).
HEAP_SET = (
    "import sys\n"
    "from ramstream.backends.registry import backend_for\n"
    "from ramstream.config import RunOptions\n"
    "from ramstream.io import heap\n"
    "backend_for(RunOptions(memory=int(sys.argv[1]), quiet=True))\n"
    "print(heap._set)\n"
)


@pytest.mark.parametrize(("budget", "threshold"), [(16 * MiB, 2 * MiB), (64 * MiB, 8 * MiB), (256 * MiB, 32 * MiB),
                                                   (1 << 40, 32 * MiB)])  # fmt: skip
def test_a_run_sets_the_heap_thresholds_from_its_budget(budget: int, threshold: int) -> None:
    from ramstream.io.heap import threshold_for

    assert threshold_for(budget) == threshold
    if sys.platform.startswith("linux"):
        argv = [sys.executable, "-c", HEAP_SET, str(budget)]
        done = subprocess.run(argv, capture_output=True, text=True, timeout=120)
        assert done.returncode == 0, done.stderr
        assert int(done.stdout) == threshold
