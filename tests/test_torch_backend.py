"""The torch backend, piece by piece: its codecs, counter RNG and exact sums against the Numba
kernels', the staging rings' event discipline (on the CPU implementation, with events that fire
only when waited for), tiles smaller than a block, the one-line errors, a killed torch merge
resumed by either backend, and (where torch sees a GPU) every method on CUDA."""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
import warnings
from pathlib import Path
from typing import Any

import numpy as np
import pytest

torch = pytest.importorskip("torch")

from ramstream.backends.exact_sum import new_accumulator, renormalised  # noqa: E402
from ramstream.backends.numba.codecs import decode_array, encode_array  # noqa: E402
from ramstream.backends.numba.counter_rng import uniforms  # noqa: E402
from ramstream.backends.numba.exact_sum import add, renormalise  # noqa: E402
from ramstream.backends.rng import random_keys  # noqa: E402
from ramstream.backends.torch import codecs, exact_sums  # noqa: E402
from ramstream.backends.torch import tiles as torch_tiles  # noqa: E402
from ramstream.backends.torch.host_memory import HostBuffers  # noqa: E402
from ramstream.backends.torch.rng import uniform  # noqa: E402
from ramstream.backends.torch.staging import InputRing, OutputRing, Part, Sink  # noqa: E402
from ramstream.backends.torch.streams import CpuStreams  # noqa: E402
from ramstream.format.dtypes import FloatCode  # noqa: E402
from tests.families import Family, build_family  # noqa: E402
from tests.test_backends import METHODS, _merge  # noqa: E402
from tests.test_resume import MERGE_STEPS, cli, kill_at_step, renamed_to, run_ok, tree_bytes  # noqa: E402

CUDA = torch.cuda.is_available()
needs_cuda = pytest.mark.skipif(not CUDA, reason="torch sees no CUDA GPU")


# -- codecs, RNG, exact sums ----------------------------------------------------------------------
@pytest.mark.parametrize("code", [FloatCode.BF16, FloatCode.F16])
def test_decode_every_16_bit_pattern_as_the_numba_codec(code: FloatCode) -> None:
    raw = np.arange(1 << 16, dtype=np.uint32).astype(np.uint16)
    got = codecs.decode(torch.from_numpy(raw.view(np.uint8).copy()), int(code)).numpy()
    np.testing.assert_array_equal(got.view(np.uint32), decode_array(raw, int(code)).view(np.uint32))


def _hard_floats() -> np.ndarray:
    """Any pattern (NaNs, Infs, subnormals), every bf16/f16 rounding tie and its neighbours."""
    rng = np.random.default_rng(0)
    every16 = np.arange(1 << 16, dtype=np.uint32)
    bits = np.concatenate(
        [
            rng.integers(0, 1 << 32, 300_000, dtype=np.uint64).astype(np.uint32),
            np.arange(0x33000000, 0x39000000, 997, dtype=np.uint32),  # f16 subnormals and their edges
            np.arange(0, 0x00800000, 4099, dtype=np.uint32),  # f32 subnormals
            (every16 << 16) | 0x8000,  # bf16 ties
            (every16 << 16) | 0x7FFF,
            (every16 << 16) | 0x8001,
            (every16 << 13) | 0x1000,  # f16 ties (normal range)
            np.array([0, 0x80000000, 0x7F800000, 0xFF800000, 0x477FF000, 0x477FEFFF, 0x7FC00000, 0x7F800001]),
        ]
    ).astype(np.uint32)
    return bits.view(np.float32)


@pytest.mark.parametrize("code", list(FloatCode))
def test_encode_as_the_numba_codec(code: FloatCode) -> None:
    values = _hard_floats()
    carrier = {FloatCode.F32: np.float32, FloatCode.F64: np.float64}.get(code, np.uint16)
    expected = np.empty(values.shape[0], carrier)
    encode_array(values, int(code), expected)
    got = codecs.encode(torch.from_numpy(values.copy()), int(code)).numpy()
    np.testing.assert_array_equal(got.view(np.uint8), expected.view(np.uint8))


def test_the_counter_rng_draws_the_numba_bits() -> None:
    keys = [*random_keys(7, 3, "model.layers.0.mlp.up_proj.weight"), 0, 2**63, 2**64 - 1]
    for key in keys:
        for start in (0, 12_345, 2**40 + 3, 2**62):
            got = uniform(int(key), torch.arange(start, start + 4096, dtype=torch.int64)).numpy()
            np.testing.assert_array_equal(got.view(np.uint32), uniforms(np.uint64(key), start, 4096).view(np.uint32))


def test_exact_sums_fill_the_numba_accumulator() -> None:
    """Group sums in element order, and bins equal to the kernels' once renormalised, over values
    of every magnitude and both signs (a float64 sum of float32 values or products)."""
    rng = np.random.default_rng(3)
    values = (rng.standard_normal((3, 1000)) * np.exp2(rng.integers(-140, 120, (3, 1000)))).astype(np.float32)
    sums = exact_sums.product_group_sums(torch.from_numpy(values), torch.from_numpy(values[::-1].copy()))
    for r in range(3):
        products = values[r].astype(np.float64) * values[2 - r].astype(np.float64)
        expected = [sum(products[g : g + 64], 0.0) for g in range(0, 1000, 64)]
        np.testing.assert_array_equal(sums[r].numpy(), expected)
    acc = torch.zeros((3, new_accumulator().shape[1]), dtype=torch.int64)
    exact_sums.accumulate(acc, sums)
    exact_sums.accumulate(acc, sums * -0.5)
    for r in range(3):
        reference = new_accumulator()[0]
        for v in [*sums[r].tolist(), *(sums[r] * -0.5).tolist()]:
            add(reference, v)
        renormalise(reference)
        np.testing.assert_array_equal(renormalised(acc[r].numpy()), reference)


# -- the staging rings ----------------------------------------------------------------------------
class LazyEvent:
    """An event that fires only when someone waits for it (a GPU that is always behind)."""

    def __init__(self, log: list[str], name: str) -> None:
        self.log, self.name, self.fired = log, name, False

    def synchronize(self) -> None:
        self.fired = True
        self.log.append(f"wait {self.name}")


class LazyStreams(CpuStreams):
    """The CPU implementation with separate "device" buffers and events that lag."""

    def __init__(self) -> None:
        super().__init__()
        self.log: list[str] = []
        self.events: list[LazyEvent] = []
        self.uploads = 0

    def _event(self, name: str) -> LazyEvent:
        event = LazyEvent(self.log, name)
        self.events.append(event)
        return event

    def device_buffer(self, host: torch.Tensor) -> torch.Tensor:
        return torch.empty_like(host)

    def upload(self, dst: torch.Tensor, src: torch.Tensor, after: Any) -> Any:
        if after is not None:
            self.log.append(f"copy waits {after.name}")
        dst.copy_(src)
        self.uploads += 1
        event = self._event(f"upload{self.uploads}")
        self.log.append(f"upload{self.uploads} from {src.data_ptr()}")
        return event

    def download(self, dst: torch.Tensor, src: torch.Tensor) -> Any:
        dst.copy_(src)
        return dst, self._event(f"download{src[0].item()}")

    def computed(self) -> Any:
        return self._event(f"computed{len(self.events)}")


def test_a_host_buffer_is_refilled_only_after_its_upload_fired() -> None:
    streams = LazyStreams()
    ring = InputRing(streams, depth=2, capacity=64)
    source = np.arange(1024, dtype=np.uint8)
    filled: list[tuple[int, bool]] = []
    uploads: list[Any] = []

    def read(dst: np.ndarray, lo: int, m: int) -> None:
        slot_event = uploads[-2] if len(uploads) >= 2 else None  # the last upload from this slot
        filled.append((lo, slot_event is None or slot_event.fired))
        np.copyto(dst, source[lo : lo + m])

    for lo in range(0, 512, 64):
        (staged,) = ring.stage([Part(1, read)], lo, 64)
        uploads.append(streams.events[-1])
        np.testing.assert_array_equal(staged.numpy(), source[lo : lo + 64])
        ring.consumed()
    assert all(ok for _, ok in filled), filled
    # the device buffer of a slot is overwritten only after the copy stream waited for the
    # compute that read it
    assert sum(1 for line in streams.log if line.startswith("copy waits computed")) == 6


def test_results_reach_their_sinks_in_order_after_their_event() -> None:
    streams = LazyStreams()
    ring = OutputRing(streams, depth=3, capacity=8)
    got: list[int] = []

    def sink_for(k: int) -> Any:
        def sink(data: np.ndarray) -> None:
            assert f"wait download{k}" in streams.log
            got.append(int(data[0]))

        return sink

    for k in range(1, 8):
        ring.put(torch.full((4,), k, dtype=torch.uint8), sink_for(k))
        assert got == list(range(1, max(k - 2, 0)))  # at most `depth` results in flight
    ring.flush()
    assert got == list(range(1, 8))


class RegisteringStreams(LazyStreams):
    """Lazy streams whose ``host_memory`` is registered: results may go straight into it."""

    def __init__(self) -> None:
        super().__init__()
        self.results = HostBuffers()

    def host_memory(self, nbytes: int) -> np.ndarray:
        buffer = self.results.allocate(nbytes)
        buffer.fill(0)
        return buffer

    def straight(self, target: np.ndarray) -> bool:
        return self.results.holds(target)


def test_results_go_straight_into_registered_memory_and_are_waited_for_by_flush() -> None:
    """A result whose target is the streams' host memory is downloaded into it (no slot, no
    sink); one bound for plain memory, or for rows that are not contiguous, goes through a slot."""
    streams = RegisteringStreams()
    ring = OutputRing(streams, depth=2, capacity=8)
    out = streams.host_memory(24)
    for k in range(1, 4):
        ring.put(torch.full((8,), k, dtype=torch.uint8), Sink(out[8 * (k - 1) : 8 * k]))
    plain = np.zeros(8, np.uint8)
    ring.put(torch.full((8,), 7, dtype=torch.uint8), Sink(plain))
    rows = streams.host_memory(16).reshape(2, 8)
    ring.put(torch.full((2, 4), 9, dtype=torch.uint8), Sink(rows[:, 2:6]))
    assert ring.straight == 3
    assert not any(f"wait download{k}" in streams.log for k in (1, 2, 3))  # nothing waited yet
    ring.flush()
    assert [f"wait download{k}" in streams.log for k in (1, 2, 3)] == [True] * 3
    np.testing.assert_array_equal(out, np.repeat(np.arange(1, 4, dtype=np.uint8), 8))
    assert (plain == 7).all() and (rows[:, 2:6] == 9).all() and (rows[:, :2] == 0).all()


def test_host_buffers_know_their_live_buffers_and_release_them() -> None:
    import gc

    registered: list[tuple[int, int]] = []
    unregistered: list[int] = []

    def register(address: int, nbytes: int) -> bool:
        registered.append((address, nbytes))
        return len(registered) != 2  # the driver refuses the second

    buffers = HostBuffers(register, unregistered.append)
    first = buffers.allocate(1000)
    refused = buffers.allocate(1000)
    assert buffers.holds(first) and buffers.holds(first[10:20]) and buffers.holds(first[:0])
    assert not buffers.holds(refused) and not buffers.holds(np.empty(10, np.uint8))
    assert not buffers.holds(first.reshape(10, 100)[:, :5])  # rows: not one contiguous range
    view = first[500:]
    address = first.ctypes.data
    del first
    gc.collect()
    assert buffers.holds(view) and not unregistered  # a view keeps its buffer registered
    del view
    gc.collect()
    assert unregistered == [address]
    assert not buffers._live


def test_sinks_on_a_pool_run_off_the_driving_thread_and_free_their_slot_first() -> None:
    """The streamed path: a slot is refilled only once the sink of its previous result is done,
    even when that sink is slow; every sink has run when ``flush`` returns."""
    import threading
    import time
    from concurrent.futures import ThreadPoolExecutor

    streams = LazyStreams()
    driver = threading.get_ident()
    got: dict[int, tuple[int, bool]] = {}

    def sink_for(k: int) -> Any:
        def sink(data: np.ndarray) -> None:
            time.sleep(0.01 if k % 2 else 0.0)
            got[k] = (int(data[0]), threading.get_ident() != driver)

        return sink

    with ThreadPoolExecutor(2) as pool:
        ring = OutputRing(streams, depth=2, capacity=8, pool=pool)
        for k in range(1, 9):
            ring.put(torch.full((4,), k, dtype=torch.uint8), sink_for(k))
        ring.flush()
    assert got == {k: (k, True) for k in range(1, 9)}


def test_a_failed_call_leaves_nothing_to_land_in_its_buffers() -> None:
    ring = OutputRing(CpuStreams(), depth=3, capacity=8)
    landed: list[int] = []
    ring.put(torch.ones(4, dtype=torch.uint8), lambda data: landed.append(1))
    ring.discard()
    ring.put(torch.ones(4, dtype=torch.uint8), lambda data: landed.append(2))
    ring.flush()
    assert landed == [2]


# -- tiles smaller than the block -----------------------------------------------------------------
@pytest.fixture(scope="module")
def odd_family(tmp_path_factory: pytest.TempPathFactory) -> Family:
    shapes = {"model.embed_tokens.weight": (40, 50), "model.layers.0.mlp.up_proj.weight": (30, 37), "norm": (53,)}
    return build_family(tmp_path_factory.mktemp("tiles"), shapes=shapes, identical_agent=True, subset_agent=True)


@pytest.mark.parametrize(("method", "given"), METHODS, ids=[f"{m}-{i}" for i, (m, _) in enumerate(METHODS)])
def test_tiles_smaller_than_a_block_give_the_numba_bytes(
    odd_family: Family, tmp_path: Path, monkeypatch: pytest.MonkeyPatch, method: str, given: dict[str, Any]
) -> None:
    """Blocks of 256 elements in tiles of 64 (the last one partial, the exact sums' groups split
    across tiles); DELLA rounds a tile up to whole slices."""
    expected = _merge(odd_family, tmp_path / "numba" / "out", method, given, "numba")
    monkeypatch.setattr(torch_tiles, "CPU_TILE", 64)
    assert _merge(odd_family, tmp_path / "torch" / "out", method, given, "torch", device="cpu") == expected


# -- errors a user can cause ----------------------------------------------------------------------
def _cli(*args: str, env: dict[str, str] | None = None, code: str = "") -> subprocess.CompletedProcess[str]:
    program = code + "from ramstream.cli import main\nmain()\n"
    return subprocess.run([sys.executable, "-c", program, *args], capture_output=True, text=True, timeout=120, env=env)


def _one_line_error(done: subprocess.CompletedProcess[str], *needles: str) -> None:
    assert done.returncode == 1, done.stderr
    lines = done.stderr.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("error: "), done.stderr
    for needle in needles:
        assert needle in lines[0], lines[0]


def test_without_torch_the_torch_backend_says_how_to_install_it(odd_family: Family, tmp_path: Path) -> None:
    hide = "import sys\nsys.modules['torch'] = None\n"
    args = ["probe", str(odd_family.base), *map(str, odd_family.agents), "--backend", "torch"]
    done = _cli(*args, "--cache-dir", str(tmp_path), code=hide)
    _one_line_error(done, "pip install 'ramstream[torch]'")


@pytest.mark.skipif(CUDA, reason="this machine has a GPU")
def test_device_cuda_without_a_gpu_is_one_line(odd_family: Family, tmp_path: Path) -> None:
    args = ["probe", str(odd_family.base), *map(str, odd_family.agents), "--backend", "torch", "--device", "cuda"]
    _one_line_error(_cli(*args, "--cache-dir", str(tmp_path)), "--device cuda", "no CUDA GPU")


@pytest.mark.parametrize(
    ("flags", "needle"),
    [
        (["--device", "cuda"], "--backend numba computes on the CPU only"),
        (["--gpu-memory", "1GiB"], "--gpu-memory needs --backend torch"),
        (["--backend", "torch", "--device", "gpu"], "--device must be cpu, cuda or cuda:N"),
        (["--backend", "torch", "--device", "cuda:x"], "--device must be cpu, cuda or cuda:N"),
        (["--backend", "torch", "--device", "cuda:"], "--device must be cpu, cuda or cuda:N"),
        (["--backend", "torch", "--gpu-memory", "1MiB"], "--gpu-memory must be at least 16MiB"),
    ],
)
def test_device_settings_a_backend_cannot_honour_are_one_line(
    odd_family: Family, tmp_path: Path, flags: list[str], needle: str
) -> None:
    args = ["merge", str(odd_family.base), *map(str, odd_family.agents), "--out", str(tmp_path / "out"), *flags]
    _one_line_error(_cli(*args, "--cache-dir", str(tmp_path)), needle)


def test_a_mergekit_config_runs_on_the_torch_backend(odd_family: Family, tmp_path: Path) -> None:
    config = tmp_path / "merge.yml"
    models = "".join(f"  - model: {a}\n    parameters: {{weight: 1.0, density: 0.5}}\n" for a in odd_family.agents)
    config.write_text(f"merge_method: ties\nbase_model: {odd_family.base}\nmodels:\n{models}dtype: float32\n")
    outs = {}
    for backend in ("numba", "torch"):
        out = tmp_path / backend
        flags = ["--backend", backend] + (["--device", "cpu"] if backend == "torch" else [])
        run_ok(cli("merge", "--config", config, "--out", out, "--cache-dir", tmp_path / "cache", "--quiet", *flags))
        outs[backend] = tree_bytes(out)
    assert outs["torch"] == outs["numba"]


# -- resume ---------------------------------------------------------------------------------------
RESUME_SHAPES: dict[str, tuple[int, ...]] = {
    "model.embed_tokens.weight": (1024, 1024),
    "model.layers.0.mlp.up_proj.weight": (1024, 1024),
    "model.norm.weight": (1024,),
    "lm_head.weight": (1024, 1024),
}
TORCH = ("--backend", "torch", "--device", "cpu", "--threads", "1")


@pytest.fixture(scope="module")
def resume_case(tmp_path_factory: pytest.TempPathFactory) -> tuple[list[str], Path, dict[str, bytes]]:
    """A family, its complete index, and the bytes of an uninterrupted Numba merge."""
    root = tmp_path_factory.mktemp("torch-resume")
    family = build_family(root / "family", shapes=RESUME_SHAPES, int_tensor=True, shards=2, seed=12)
    members = [str(family.base), *map(str, family.agents)]
    index, out = root / "index.zarr", root / "out"
    opts = ("--memory", "16MiB", "--quiet", "--shard-size", "4MiB")
    run_ok(cli("probe", *members, "--index", index, "--memory", "16MiB", "--quiet"))
    run_ok(cli("merge", *members, "--out", out, "--index", index, *opts))
    return [*members, "--index", str(index), *opts], index, tree_bytes(out)


@pytest.mark.parametrize("rerun", ["numba", "torch"])
def test_a_killed_torch_merge_resumes_to_the_same_bytes(
    tmp_path: Path, resume_case: tuple[list[str], Path, dict[str, bytes]], rerun: str
) -> None:
    args, index, expected = resume_case
    local = tmp_path / "index.zarr"
    shutil.copytree(index, local)
    out = tmp_path / "out"
    argv: list[str | Path] = ["merge", *[str(local) if a == str(index) else a for a in args], "--out", out]
    kill_at_step([*argv, *TORCH], MERGE_STEPS["mid-merge"])
    assert (out / ".ramstream").is_dir()
    run_ok(cli(*argv, *(TORCH if rerun == "torch" else ())))
    assert tree_bytes(out) == expected


def test_a_killed_torch_probe_resumes_to_the_same_merge(
    tmp_path: Path, resume_case: tuple[list[str], Path, dict[str, bytes]]
) -> None:
    """Killed in the probe pass of a merge with no index, rerun with Numba."""
    args, _index, expected = resume_case
    members = args[: args.index("--index")]
    argv: list[str | Path] = ["merge", *members, "--out", tmp_path / "out", "--cache-dir", tmp_path / "cache"]
    argv += ["--memory", "16MiB", "--quiet", "--shard-size", "4MiB"]
    kill_at_step([*argv, *TORCH], renamed_to("progress/probe/c.5"))
    run_ok(cli(*argv))
    assert tree_bytes(tmp_path / "out") == expected


# -- CUDA ------------------------------------------------------------------------------------------
def _cuda_merge(family: Family, out: Path, method: str, given: dict[str, Any], cache: Path) -> dict[str, bytes]:
    """``method`` on the GPU, with tiles smaller than a block (a GPU budget that fits only a few
    elements; the caller caps the tiles), so the copy stream, the events and the rings are all
    used: the output's files and bytes."""
    from ramstream.api import merge
    from ramstream.config import RunOptions

    options = RunOptions(
        cache_dir=cache, quiet=True, block_elems=256, backend="torch", device="cuda", gpu_memory=16 << 20
    )
    ram = {k: given[k] for k in ("rho_scope", "lambda_rule") if k in given}
    others = {k: v for k, v in given.items() if k not in ram}
    merge(family.base, [str(a) for a in family.agents], out=out, method=method, method_options=others,
          options=options, **ram)  # fmt: skip
    return {str(p.relative_to(out)): p.read_bytes() for p in sorted(out.rglob("*")) if p.is_file()}


@needs_cuda
@pytest.mark.parametrize(("method", "given"), METHODS, ids=[f"{m}-{i}" for i, (m, _) in enumerate(METHODS)])
def test_every_method_on_cuda_writes_the_numba_bytes(
    odd_family: Family, tmp_path: Path, monkeypatch: pytest.MonkeyPatch, method: str, given: dict[str, Any]
) -> None:
    expected = _merge(odd_family, tmp_path / "numba" / "out", method, given, "numba")
    monkeypatch.setattr(torch_tiles, "TILE_CAP", 64)  # tiles of 64 elements: many per block
    assert _cuda_merge(odd_family, tmp_path / "cuda" / "out", method, given, tmp_path / "cache") == expected


@needs_cuda
@pytest.mark.parametrize(("method", "given"), METHODS, ids=[f"{m}-{i}" for i, (m, _) in enumerate(METHODS)])
def test_every_method_on_cuda_waits_only_on_events(
    odd_family: Family, tmp_path: Path, monkeypatch: pytest.MonkeyPatch, method: str, given: dict[str, Any]
) -> None:
    """The probe and every pass of ``method`` under CUDA's sync debug mode "error": a stream or
    device synchronisation, a blocking copy either way or an implicit ``.item()`` (a tensor used as
    a Python number, a boolean index) anywhere in the backend raises. Every wait is on an event."""
    expected = _merge(odd_family, tmp_path / "numba" / "out", method, given, "numba")
    monkeypatch.setattr(torch_tiles, "TILE_CAP", 64)
    with warnings.catch_warnings():  # torch says, once per process, that this mode is a prototype
        warnings.filterwarnings("ignore", message=r".*debug mode is a prototype feature")
        torch.cuda.set_sync_debug_mode("error")
        try:
            got = _cuda_merge(odd_family, tmp_path / "cuda" / "out", method, given, tmp_path / "cache")
        finally:
            torch.cuda.set_sync_debug_mode("default")
    assert got == expected


@needs_cuda
@pytest.mark.parametrize("code", list(FloatCode))
def test_cuda_codecs_and_rng_give_the_cpu_bits(code: FloatCode) -> None:
    values = torch.from_numpy(_hard_floats())
    on_gpu = codecs.encode(values.cuda(), int(code)).cpu()
    assert torch.equal(on_gpu.view(torch.uint8), codecs.encode(values, int(code)).view(torch.uint8))
    raw = torch.arange(1 << 16, dtype=torch.int32).to(torch.int16).view(torch.uint8)
    if code in (FloatCode.BF16, FloatCode.F16):
        decoded = codecs.decode(raw.cuda(), int(code)).cpu()
        assert torch.equal(decoded.view(torch.int32), codecs.decode(raw, int(code)).view(torch.int32))
    index = torch.arange(2**40, 2**40 + 100_000, dtype=torch.int64)
    assert torch.equal(uniform(12345, index.cuda()).cpu().view(torch.int32), uniform(12345, index).view(torch.int32))


def test_a_torch_backend_scopes_its_threads_and_sets_no_environment(odd_family: Family, tmp_path: Path) -> None:
    before, threads = dict(os.environ), torch.get_num_threads()
    _merge(odd_family, tmp_path / "out", "ties", {"density": 0.3}, "torch", device="cpu")
    assert dict(os.environ) == before and torch.get_num_threads() == threads


def test_status_says_which_backend_and_device_ran_a_pass(odd_family: Family, tmp_path: Path) -> None:
    from ramstream.api import probe
    from ramstream.config import RunOptions
    from ramstream.inspect.status import render, status

    options = RunOptions(cache_dir=tmp_path, quiet=True, backend="torch", device="cpu", threads=1)
    store = probe(odd_family.base, [str(a) for a in odd_family.agents], options=options)
    found = status(store.path)
    assert found.to_dict()["passes"]["probe"]["computed_on"] == "torch on cpu"
    assert "torch on cpu" in render(found)
