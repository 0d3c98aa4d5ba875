"""The torch backend's streamed path (the one CUDA runs: one host thread, a read pool cutting the
inputs into pieces, staging rings, uploads and downloads ordered by events, tiles sized to a
device budget) run on the CPU through a simulated GPU whose copies are late
(``tests/simulated_gpu.py``): every method, the probe pass included, writes the Numba bytes; the
simulation catches a compute that does not wait for its upload; block size, tile size, the device
budget and the copies' timing never change a byte."""

from __future__ import annotations

import time
import warnings
from collections.abc import Callable, Iterator
from concurrent.futures import ThreadPoolExecutor
from contextlib import AbstractContextManager, contextmanager
from pathlib import Path
from typing import Any, Protocol, TypeVar

import numpy as np
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

torch = pytest.importorskip("torch")

from ramstream.api import merge  # noqa: E402
from ramstream.backends.landing import Landing  # noqa: E402
from ramstream.backends.settings import BackendSettings  # noqa: E402
from ramstream.backends.torch import backend as torch_backend  # noqa: E402
from ramstream.backends.torch import staging  # noqa: E402
from ramstream.backends.torch import tiles as torch_tiles  # noqa: E402
from ramstream.backends.torch.counting import CountOps  # noqa: E402
from ramstream.backends.torch.staging import MIN_PIECE, InputRing, Part, pieces, slot_bytes  # noqa: E402
from ramstream.config import RunOptions  # noqa: E402
from ramstream.errors import NonFiniteOutputError, NonFiniteWeightError, RamstreamError  # noqa: E402
from ramstream.format.safetensors_header import read_header  # noqa: E402
from ramstream.merge import merge_pass  # noqa: E402
from ramstream.statistics import probe_pass, stats_pass  # noqa: E402
from tests.families import Family, build_family, with_raw_value  # noqa: E402
from tests.simulated_gpu import ForgetfulGpu, FullGpu, SimulatedGpu  # noqa: E402
from tests.test_backends import METHODS, NumbaBytes, _merge  # noqa: E402

SHAPES = {
    "model.embed_tokens.weight": (40, 50),
    "model.layers.0.mlp.up_proj.weight": (30, 37),
    "model.layers.0.self_attn.q_proj.weight": (64, 33),
    "norm": (53,),
}
TINY_TILES = 64  # elements per streamed tile at most: every block is several uploads, downloads and waits


@pytest.fixture(scope="module")
def family(tmp_path_factory: pytest.TempPathFactory) -> Family:
    root = tmp_path_factory.mktemp("streamed")
    return build_family(root, shapes=SHAPES, identical_agent=True, subset_agent=True, shards=2, seed=21)


@pytest.fixture(scope="module")
def numba_bytes() -> NumbaBytes:
    return NumbaBytes()


class Streams(Protocol):
    def close(self) -> None: ...


S = TypeVar("S", bound=Streams)


@contextmanager
def backends_through(
    make_streams: Callable[[BackendSettings], S], tile_cap: int | None = TINY_TILES, pooled: bool = True
) -> Iterator[list[S]]:
    """Every torch backend made inside streams through fresh streams from ``make_streams`` (a
    simulated device here, lagging CUDA streams on a GPU), tiles of at most ``tile_cap``.
    ``pooled``: every tile read on the pool and every block's first tile read ahead, as a
    real model's blocks are (these families' tiles are small enough to be read inline)."""
    made: list[S] = []

    def make(settings: BackendSettings) -> torch_backend.TorchBackend:
        made.append(make_streams(settings))
        return torch_backend.TorchBackend(settings, streams=made[-1])

    with pytest.MonkeyPatch.context() as patch:
        patch.setattr(torch_backend, "make", make)
        patch.setattr(torch_tiles, "TILE_CAP", tile_cap)
        if pooled:
            patch.setattr(staging, "INLINE_TILE", 0)
        try:
            yield made
        finally:
            for streams in made:
                streams.close()


def simulated_gpu(
    make_device: Callable[[], SimulatedGpu], tile_cap: int | None = TINY_TILES, pooled: bool = True
) -> AbstractContextManager[list[SimulatedGpu]]:
    """Every torch backend made inside streams through a fresh simulated device."""
    return backends_through(lambda settings: make_device(), tile_cap, pooled)


@pytest.mark.parametrize(("method", "given"), METHODS, ids=[f"{m}-{i}" for i, (m, _) in enumerate(METHODS)])
def test_every_method_streamed_through_a_late_device_writes_the_numba_bytes(
    family: Family, tmp_path: Path, method: str, given: dict[str, Any], numba_bytes: NumbaBytes
) -> None:
    """Blocks of 256 elements in tiles of 64: every block is several uploads, downloads and
    waits; the probe pass runs on the simulated device too (no index is given)."""
    expected = numba_bytes.of(family, tmp_path, method, given)
    with simulated_gpu(SimulatedGpu) as devices:
        got = _merge(family, tmp_path / "streamed" / "out", method, given, "torch", device="cpu")
    assert got == expected
    assert devices and sum(d.uploads for d in devices) > 0 and sum(d.downloads for d in devices) > 0
    # the merged tiles went device -> host straight into the writer's buffers, late like the rest
    assert sum(d.straight_downloads for d in devices) > 0


def test_the_passes_queue_the_next_batch_before_waiting_for_the_last(
    family: Family, tmp_path: Path, numba_bytes: NumbaBytes, monkeypatch: pytest.MonkeyPatch
) -> None:
    """On a device that streams, a batch's probes and merges return before their results land;
    each pass waits for batch i only once batch i + 1 is queued (``execution.local``), and still
    writes the Numba bytes (results downloaded straight into its buffers land only when waited
    for)."""
    log: list[tuple[str, str, int]] = []
    current = [""]
    wait = Landing.wait

    def logging(work: Any, name: str) -> None:
        compute_later = work.compute_later

        def queued(self: Any, batch: Any, *args: Any) -> Any:
            current[0] = name
            log.append((name, "queued", batch.index))
            return compute_later(self, batch, *args)

        monkeypatch.setattr(work, "compute_later", queued)

    def landed(self: Landing) -> dict[int, Any]:
        found = wait(self)
        log.append((current[0], "landed", len(found)))
        return found

    logging(merge_pass.Outputs, "merge")
    logging(probe_pass.ProbeWork, "probe")
    monkeypatch.setattr(Landing, "wait", landed)
    expected = numba_bytes.of(family, tmp_path, "ram+", {})
    log.clear()
    with simulated_gpu(SimulatedGpu):  # RAM+ probes first (no index given), then merges
        got = _merge(family, tmp_path / "streamed" / "out", "ram+", {}, "torch", device="cpu")
    assert got == expected
    for name in ("probe", "merge"):
        queued = [k for k, (who, what, _) in enumerate(log) if who == name and what == "queued"]
        landings = [k for k, (who, what, _) in enumerate(log) if who == name and what == "landed"]
        assert len(queued) >= 3 and len(landings) == len(queued), name  # every batch waited for, once
        assert all(nxt < at for nxt, at in zip(queued[1:], landings, strict=False)), name  # i + 1 queued first
        assert all(n > 0 for who, what, n in log if who == name and what == "landed"), name  # all deferred


@pytest.mark.parametrize(
    ("method", "given"),
    [("ties", {"density": 0.3, "rescale": "l1"}), ("dare_ties", {"density": 0.5}), ("model_stock", {})],
)
def test_the_statistics_pass_queues_the_next_batch_before_waiting_for_the_last(
    family: Family,
    tmp_path: Path,
    numba_bytes: NumbaBytes,
    monkeypatch: pytest.MonkeyPatch,
    method: str,
    given: dict[str, Any],
) -> None:
    """The histograms, exact sums and tie searches of a statistics pass return before they land,
    as merges do: batch i + 1's are queued before batch i's land (their arrays hold -1 until then,
    and the simulated device's read-backs land late), and the merge still writes the Numba bytes."""
    log: list[tuple[int, str, int]] = []  # (pass, what, batch)
    deferred: list[bool] = []
    searches: list[bool] = []
    compute_later, statistic = stats_pass.StatisticsWork.compute_later, torch_tiles.TileBackend._statistic
    find_ties = CountOps.find_ties

    def queued(self: Any, batch: Any, *args: Any) -> Any:
        log.append((id(self), "queued", batch.index))
        checked = compute_later(self, batch, *args)

        def landed() -> Any:
            log.append((id(self), "landed", batch.index))
            return checked()

        return landed

    def recorded(self: Any, *args: Any) -> Any:
        deferred.append(self._landing is not None)
        return statistic(self, *args)

    def searched(self: Any, *args: Any) -> Any:
        searches.append(self._landing is not None)
        return find_ties(self, *args)

    monkeypatch.setattr(stats_pass.StatisticsWork, "compute_later", queued)
    monkeypatch.setattr(torch_tiles.TileBackend, "_statistic", recorded)
    monkeypatch.setattr(CountOps, "find_ties", searched)
    expected = numba_bytes.of(family, tmp_path, method, given)
    log.clear()
    with simulated_gpu(SimulatedGpu):
        got = _merge(family, tmp_path / "streamed" / "out", method, given, "torch", device="cpu")
    assert got == expected
    passes = list(dict.fromkeys(who for who, _, _ in log))
    assert passes, "no statistics pass"
    for one in passes:
        queued_at = [k for k, (who, what, _) in enumerate(log) if who == one and what == "queued"]
        landed_at = [k for k, (who, what, _) in enumerate(log) if who == one and what == "landed"]
        assert len(queued_at) >= 3 and len(landed_at) == len(queued_at)  # every batch waited for, once
        assert all(nxt < at for nxt, at in zip(queued_at[1:], landed_at, strict=False))  # i + 1 queued first
    assert deferred and all(deferred)  # every histogram and exact sum read back by a landing
    assert all(searches) and (bool(searches) or method != "ties")  # and every tie search


def test_a_failure_inside_a_deferred_scope_waits_for_what_was_queued_before_it() -> None:
    """What the calls before a failure queued lands before the error leaves the scope (the
    caller frees its buffers after it); outside a streaming device nothing is deferred."""
    device = SimulatedGpu()
    backend = torch_backend.TorchBackend(BackendSettings(device="cpu", threads=1), streams=device)
    waited: list[str] = []
    try:
        with pytest.raises(RuntimeError, match="the second call"), backend.deferred() as landing:
            assert backend.defers
            landing.also_wait([lambda: waited.append("first call's results")])
            raise RuntimeError("the second call failed")
        assert waited == ["first call's results"]
    finally:
        backend.close()
        device.close()


def test_a_batch_decoded_into_memory_is_waited_for_before_the_next_is_read(
    tmp_path: Path, numba_bytes: NumbaBytes, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Agents of mixed formats are decoded to float32 in memory: such a batch is not kept alive
    beside the next one (``--memory`` counts one batch's inputs), and the bytes are Numba's."""
    family = build_family(tmp_path / "family", shapes=SHAPES, agent_dtypes=("BF16", "F32", "F16"))
    log: list[str] = []
    compute_later, wait = merge_pass.Outputs.compute_later, Landing.wait

    def queued(self: Any, *args: Any) -> Any:
        log.append("queued")
        return compute_later(self, *args)

    def landed(self: Landing) -> dict[int, Any]:
        log.append("landed")
        return wait(self)

    monkeypatch.setattr(merge_pass.Outputs, "compute_later", queued)
    monkeypatch.setattr(Landing, "wait", landed)
    expected = numba_bytes.of(family, tmp_path, "task_arithmetic", {})
    log.clear()
    with simulated_gpu(SimulatedGpu):
        got = _merge(family, tmp_path / "streamed" / "out", "task_arithmetic", {}, "torch", device="cpu")
    assert got == expected
    assert len(log) >= 6 and log == ["queued", "landed"] * (len(log) // 2)


@pytest.mark.parametrize("method", ["task_arithmetic", "ram+", "ties", "model_stock"])
def test_a_nan_input_found_by_a_deferred_call_is_refused_by_name(tmp_path: Path, method: str) -> None:
    """The first NaN/Inf input reaches the pass with the landing (the merge's, for RAM+ the
    probe's, for TIES the |tau| histogram's, for model_stock the Gram sums'): the same refusal as
    Numba's."""
    family = build_family(tmp_path / "family", shapes=SHAPES)
    bad = with_raw_value(family.agents[0], tmp_path / "bad", "model.layers.0.mlp.up_proj.weight", 700, 0x7FC0)
    members = [str(family.base), str(bad), str(family.agents[1])]
    errors = []
    for backend in ("numba", "torch"):
        options = RunOptions(cache_dir=tmp_path / backend / "cache", quiet=True, backend=backend, block_elems=256)
        with simulated_gpu(SimulatedGpu), pytest.raises(NonFiniteWeightError) as caught:
            merge(family.base, members[1:], out=tmp_path / backend / "out", method=method, options=options)
        errors.append(str(caught.value))
        assert not (tmp_path / backend / "out" / "config.json").exists()
    assert errors[0] == errors[1] and "model.layers.0.mlp.up_proj.weight" in errors[0]


def test_a_compute_that_does_not_wait_for_its_upload_is_caught(family: Family, tmp_path: Path) -> None:
    """The simulation has teeth: without the compute's wait, tiles compute on NaN bytes."""
    expected = _merge(family, tmp_path / "numba" / "out", "ram+", {}, "numba")
    try:
        with simulated_gpu(lambda: ForgetfulGpu(delay=(0.001, 0.002))):
            got = _merge(family, tmp_path / "forgetful" / "out", "ram+", {}, "torch", device="cpu")
    except (NonFiniteWeightError, NonFiniteOutputError):
        pass  # the NaN bytes were seen as inputs (probe pass) or as merged values
    else:
        assert got != expected


@settings(max_examples=12, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(
    block_elems=st.integers(1, 48).map(lambda k: 64 * k),
    tile_cap=st.sampled_from([TINY_TILES, 128, 512, None]),
    budget=st.integers(16, 64).map(lambda mib: mib << 20),
    seed=st.integers(0, 2**16),
    case=st.sampled_from([("ram+", {}), ("dare_ties", {"density": 0.5, "seed": 3}), ("della", METHODS[12][1])]),
    pooled=st.booleans(),
)
def test_blocks_tiles_budget_and_timing_never_change_a_byte(
    family: Family,
    tmp_path_factory: pytest.TempPathFactory,
    numba_bytes: NumbaBytes,
    block_elems: int,
    tile_cap: int | None,
    budget: int,
    seed: int,
    case: tuple[str, dict[str, Any]],
    pooled: bool,
) -> None:
    """``pooled``: every tile read on the pool and every block's first tile read ahead (as a
    GPU pass reads blocks of a real model), or the small tiles read on the calling thread."""
    method, options = case
    expected = numba_bytes.of(family, tmp_path_factory.mktemp("numba"), method, options)
    out = tmp_path_factory.mktemp("streamed") / "out"
    with simulated_gpu(lambda: SimulatedGpu(budget=budget, seed=seed), tile_cap, pooled):
        got = _merge(family, out, method, options, "torch", device="cpu", block_elems=block_elems)
    assert got == expected


@pytest.mark.parametrize(
    ("method", "given", "at_least"),
    [
        ("ram+", {}, 2 * 22),  # the probe's and the merge's blocks after their first
        ("ties", {"density": 0.3}, 3 * 22),  # both histograms' passes and the merge's
        # the merge's, but where a tensor's slices are of another length (3 times): the
        # statistics pass reads spans of whole slices, which no block announced
        ("della", METHODS[12][1], 22 - 3),
    ],
)
def test_the_next_blocks_first_tile_is_read_while_a_block_computes(
    family: Family, tmp_path: Path, method: str, given: dict[str, Any], at_least: int, numba_bytes: NumbaBytes
) -> None:
    """Reads go on across blocks and batches: while a block's last tile is queued, the next
    block's first is read into a slot set aside for it, cut as the first call on this block cut
    its own, and the next call takes it from there (23 blocks of 256 elements a pass). A call
    that is not the expected one (a statistic over a span) reads its own tiles; the Numba bytes
    either way."""
    taken: list[bool] = []
    take = InputRing.take

    def counted(ring: InputRing, parts: Any, lo: int, m: int) -> Any:
        staging_ = take(ring, parts, lo, m)
        taken.append(staging_ is not None)
        return staging_

    with pytest.MonkeyPatch.context() as patch, simulated_gpu(SimulatedGpu):
        patch.setattr(InputRing, "take", counted)
        got = _merge(family, tmp_path / "out", method, given, "torch", device="cpu")
    assert got == numba_bytes.of(family, tmp_path, method, given)
    assert sum(taken) >= at_least, (sum(taken), len(taken))


def test_an_input_cut_short_during_the_run_is_named_where_its_tile_was_read_ahead(tmp_path: Path) -> None:
    """An agent's file truncated after the family was opened, where its last tensor's data
    begins: the read that meets the end, that tensor's first tile read ahead while the block
    before computed, is raised by the call that takes the tile, naming the file and the tensor,
    and the output is left unfinished."""
    fam = build_family(tmp_path / "family", shapes=SHAPES, seed=3)
    shard = next(fam.agents[1].glob("*.safetensors"))
    last = max(read_header(shard).tensors, key=lambda t: t.offset)  # cut where its data begins
    expect = torch_tiles.TileBackend.expect
    reads_ahead: list[bool] = []
    take = InputRing.take

    def truncating(backend: Any, upcoming: Any) -> None:
        if not reads_ahead:  # the family is open and planned: the file changes under the run
            with open(shard, "r+b") as f:
                f.truncate(last.offset)
        expect(backend, upcoming)

    def taking(ring: InputRing, parts: Any, lo: int, m: int) -> Any:
        staging_ = take(ring, parts, lo, m)
        reads_ahead.append(staging_ is not None)
        return staging_

    out = tmp_path / "out"
    with pytest.MonkeyPatch.context() as patch, simulated_gpu(SimulatedGpu):
        patch.setattr(torch_tiles.TileBackend, "expect", truncating)
        patch.setattr(InputRing, "take", taking)
        with pytest.raises(RamstreamError) as caught:
            _merge(fam, out, "ram+", {}, "torch", device="cpu")
    message = str(caught.value)
    assert f"{shard}: could not read tensor {last.name!r}" in message and "\n" not in message, message
    assert reads_ahead[-1], "the failed read was not the tile read ahead"
    assert not (out / "config.json").exists() and not list(out.glob("*.safetensors"))


def _keyed(source: np.ndarray, key: int, fail: bool = False) -> Part:
    """A part of ``source`` that looks like a file's range (``key``: its offset), failing at will."""
    plain = _part(source)

    def read(dst: np.ndarray, lo: int, m: int) -> None:
        time.sleep(0.01)  # still reading while the caller goes on
        if fail:
            raise OSError("the file ended early")
        plain.read(dst, lo, m)

    return Part(source.itemsize, read, (3, key, source.itemsize))


def test_a_tile_read_ahead_keeps_its_slot_until_it_is_asked_for() -> None:
    """The slot of a tile read ahead is set aside: the tiles staged meanwhile (a call that was
    not the expected one) take the others, and the tile, asked for later, holds its bytes. Only
    the same file ranges, first element and length are that tile; a read ahead that failed is
    raised only where its tile is asked for, and dropped silently otherwise."""
    m = 300_000  # 600 kB per part: read in pieces on the pool
    a, b = (np.arange(m, dtype=np.uint16) + k for k in (1, 2))
    device = SimulatedGpu()
    with ThreadPoolExecutor(4) as pool:
        ring = InputRing(device, 3, 2 * m * 2 + 128, pool, readers=4)
        ring.ahead([_keyed(a, 0)], 0, m)
        assert ring.take([_keyed(a, 0)], 0, m - 64) is None  # another length
        assert ring.take([_keyed(a, 64)], 0, m) is None  # another range
        assert ring.take([_part(a)], 0, m) is None  # read from memory: never read ahead
        for _ in range(5):  # the other call's tiles cycle through the remaining slots
            staged = ring.stage([_keyed(b, 0)], 0, m)
            np.testing.assert_array_equal(_host(device, staged[0]).view(np.uint16), b)
            ring.consumed()
        ahead = ring.take([_keyed(a, 0)], 0, m)
        assert ahead is not None and ring.take([_keyed(a, 0)], 0, m) is None  # taken once
        np.testing.assert_array_equal(_host(device, ring.finish(ahead)[0]).view(np.uint16), a)
        ring.consumed()

        ring.ahead([_keyed(a, 0, fail=True)], 0, m)
        ring.ahead([_keyed(b, 0)], 0, m)  # the failed one dropped: no one asked for it
        ring.drop_ahead()
        ring.ahead([_keyed(a, 0, fail=True)], 0, m)
        failed = ring.take([_keyed(a, 0, fail=True)], 0, m)
        assert failed is not None
        with pytest.raises(OSError, match="ended early"):
            ring.finish(failed)

        single = InputRing(device, 1, 2 * m * 2 + 128, pool, readers=4)
        single.ahead([_keyed(a, 0)], 0, m)  # its one slot is the next call's: nothing is set aside
        assert single.take([_keyed(a, 0)], 0, m) is None
        np.testing.assert_array_equal(_host(device, single.stage([_keyed(b, 0)], 0, m)[0]).view(np.uint16), b)
    device.close()


def _host(device: SimulatedGpu, staged: Any) -> np.ndarray:
    """A staged part's bytes, once its upload landed."""
    device.synchronize()
    return staged.numpy().copy()


# -- the read pieces -------------------------------------------------------------------------------
def _part(source: np.ndarray) -> Part:
    raw = source.view(np.uint8)

    def read(dst: np.ndarray, lo: int, m: int) -> None:
        np.copyto(dst, raw[lo * source.itemsize : (lo + m) * source.itemsize])

    return Part(source.itemsize, read)


@settings(max_examples=60, deadline=None)
@given(
    sizes=st.lists(st.sampled_from([2, 4]), min_size=1, max_size=6),
    m=st.integers(1, 400_000),
    readers=st.integers(1, 32),
)
def test_read_pieces_cover_every_byte_of_a_slot_once(sizes: list[int], m: int, readers: int) -> None:
    sources = [np.arange(m + 7, dtype=np.uint16 if s == 2 else np.uint32) for s in sizes]
    parts = [_part(s) for s in sources]
    spans, at = [], 0
    for s in sizes:
        spans.append((at, s * m))
        at += -(-s * m // 64) * 64
    host = np.zeros(at, np.uint8)
    jobs = pieces(parts, spans, host, 5, m, readers)
    for read, dst, lo, count in jobs:
        read(dst, lo, count)
    for source, (a, n) in zip(sources, spans, strict=True):
        np.testing.assert_array_equal(host[a : a + n].view(source.dtype), source[5 : 5 + m])
    assert len(jobs) <= max(readers + len(parts), len(parts))
    if readers > 1 and sum(n for _, n in spans) >= 2 * readers * MIN_PIECE:
        assert len(jobs) >= readers  # every reader has a piece when the slot is large enough


def test_a_gpu_budget_on_the_cpu_is_one_line(family: Family, tmp_path: Path) -> None:
    with pytest.raises(RamstreamError, match="--gpu-memory needs a CUDA device"):
        _merge(family, tmp_path / "out", "ram", {}, "torch", device="cpu", gpu_memory=64 << 20)


def test_a_tile_fills_its_staging_slot() -> None:
    """Tiles are sized by the inputs' bytes per element (the slot pads each part only once), so a
    GPU pass moves a whole slot per upload, not a sliver of it."""
    device = SimulatedGpu(budget=8 << 30)
    backend = torch_backend.TorchBackend(BackendSettings(threads=2, memory=1 << 30), streams=device)
    try:
        parts = [Part(2, lambda dst, lo, m: None) for _ in range(4)]  # base and three bf16 agents
        elems = backend._tile_elems(parts, 4, 64)
        assert elems % 64 == 0
        assert 0.99 * backend._slot <= slot_bytes(parts, elems) <= backend._slot
    finally:
        backend.close()
        device.close()


@pytest.mark.parametrize(
    ("method", "given"), [("ties", {"density": 0.3}), ("model_stock", {}), ("sce", {"select_topk": 0.5})]
)
def test_every_method_reads_its_inputs_with_preadv(
    family: Family, tmp_path: Path, method: str, given: dict[str, Any], numba_bytes: NumbaBytes
) -> None:
    """Not only the probe and RAM: a method's passes read every input from its file into the
    staging slot (``preadv``), copying from the block's views only where they hold decoded
    values (agents of mixed formats, handed out as float32); the Numba bytes either way."""

    mixed = build_family(tmp_path / "mixed", shapes=SHAPES, agent_dtypes=("F32", "BF16", "F16"), seed=5)
    for fam, views in ((family, False), (mixed, True)):
        made = {"file": 0, "array": 0}
        with pytest.MonkeyPatch.context() as patch:
            for kind in made:
                patch.setattr(torch_tiles, f"{kind}_part", _counting(getattr(staging, f"{kind}_part"), made, kind))
            with simulated_gpu(SimulatedGpu):
                got = _merge(fam, tmp_path / method / str(views) / "out", method, given, "torch", device="cpu")
        assert got == numba_bytes.of(fam, tmp_path / str(views), method, given)
        assert made["array"] > 0 if views else made["file"] > 0 and made["array"] == 0, made


def _counting(make: Callable[..., Any], made: dict[str, int], kind: str) -> Callable[..., Any]:
    def counted(*args: Any) -> Any:
        made[kind] += 1
        return make(*args)

    return counted


def test_a_block_is_cut_into_tiles_of_one_length() -> None:
    """A slot of 2^k bytes holds 2^j elements of a base and three bf16 agents, so a block of
    2^i elements is whole tiles; a block a little longer is as many tiles, of one length but the
    last (not whole tiles and a 64-element tail: one more tile to stage, launch and wait for)."""
    device = SimulatedGpu(budget=8 << 30)
    backend = torch_backend.TorchBackend(BackendSettings(threads=2, memory=64 << 20), streams=device)
    try:
        parts = [Part(2, lambda dst, lo, m: dst.fill(0)) for _ in range(4)]
        most = backend._tile_elems(parts, 4, 64)
        assert most == backend._slot // 8 and most & (most - 1) == 0
        for n, count in ((4 * most, 4), (4 * most + 64, 5), (3 * most - 64, 3), (most // 2 + 64, 1)):
            lengths: list[int] = []
            backend._run(parts, n, lambda w, lo, m, raw, outputs, seen=lengths: seen.append(m))
            assert len(lengths) == count and sum(lengths) == n, (n, lengths)
            assert len(set(lengths[:-1])) <= 1 and all(m % 64 == 0 for m in lengths[:-1]), (n, lengths)
            assert lengths[0] - lengths[-1] < 64 * count, (n, lengths)
    finally:
        backend.close()
        device.close()


@given(n=st.integers(1, 1 << 20), most=st.integers(1, 4096), align=st.sampled_from([64, 192, 1000]))
def test_even_steps_cut_as_few_tiles_as_the_longest_allowed(n: int, most: int, align: int) -> None:
    step = torch_tiles.even_step(n, most * align, align)
    assert step % align == 0 and step <= most * align
    assert -(-n // step) == -(-n // (most * align))


def test_a_failed_read_is_raised_once_every_piece_of_its_tile_is_done() -> None:
    """No piece of a failed tile may still write into the slot after the error left: the next
    call reuses the ring."""
    m = 400_000  # 800 kB per part: cut into pieces for 4 readers
    finished: list[int] = []

    def slow(dst: np.ndarray, lo: int, count: int) -> None:
        time.sleep(0.05)
        finished.append(lo)

    def failing(dst: np.ndarray, lo: int, count: int) -> None:
        raise OSError("the file ended early")

    device = SimulatedGpu()
    with ThreadPoolExecutor(4) as pool:
        ring = InputRing(device, 3, 1 << 20, pool, readers=4)
        with pytest.raises(OSError, match="ended early"):
            ring.stage([Part(2, failing), Part(2, slow)], 0, m)
        assert len(finished) >= 2  # every piece of the slow part had finished
    device.close()


def test_a_tensor_larger_than_the_device_budget_streams_in_tiles(tmp_path: Path) -> None:
    """A 4 Mi-element tensor (32 MiB of inputs: a base and three bf16 agents) through a 16 MiB
    device budget, blocks from --memory as a user runs it: tiles of the 1 MiB staging slot, and
    the Numba bytes."""
    big = build_family(tmp_path / "family", shapes={"model.layers.0.mlp.up_proj.weight": (2048, 2048)}, seed=4)
    expected = _merge(big, tmp_path / "numba" / "out", "ram+", {}, "numba", block_elems=None, memory=64 << 20)
    with simulated_gpu(lambda: SimulatedGpu(budget=16 << 20), tile_cap=None) as devices:
        got = _merge(
            big, tmp_path / "gpu" / "out", "ram+", {}, "torch", device="cpu", block_elems=None, memory=64 << 20
        )
    assert got == expected
    inputs = 4 * (2048 * 2048) * 2
    assert sum(d.uploads for d in devices) >= 2 * inputs // (1 << 20)  # probe and merge, at most a slot each


@pytest.fixture(scope="module")
def wide_family(tmp_path_factory: pytest.TempPathFactory) -> Family:
    """Tensors wider than the tiles a 16 MiB budget allows, so the budget sizes every tile."""
    shapes = {"model.layers.0.mlp.up_proj.weight": (256, 512), "model.embed_tokens.weight": (300, 512)}
    return build_family(tmp_path_factory.mktemp("wide"), shapes=shapes, identical_agent=True, subset_agent=True)


def _from_the_profiler(warning: warnings.WarningMessage) -> bool:
    """A warning torch's profiler raised (from its modules, or naming it)."""
    where = warning.filename.replace("\\", "/")
    return "/torch/profiler/" in where or "/torch/autograd/profiler" in where or "rofiler" in str(warning.message)


def _peak_torch_bytes(run: Callable[[], object]) -> int:
    """The most bytes torch held at once while ``run`` ran (from the profiler's allocation events)."""
    from torch.profiler import ProfilerActivity, profile

    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        with profile(activities=[ProfilerActivity.CPU], profile_memory=True) as prof:
            run()
    # the profiler's own warnings (where torch sees a GPU, about its CUDA tracing) are expected;
    # any other is an error, as everywhere in the tests
    others = [w for w in caught if not _from_the_profiler(w)]
    for w in others:
        warnings.warn_explicit(w.message, w.category, w.filename, w.lineno)
    events = prof.profiler.kineto_results.events()
    held = peak = 0
    for _, nbytes in sorted((e.start_ns(), e.nbytes()) for e in events if e.name() == "[memory]"):
        held += nbytes
        peak = max(peak, held)
    return peak


@pytest.mark.parametrize(("method", "given"), METHODS, ids=[f"{m}-{i}" for i, (m, _) in enumerate(METHODS)])
def test_device_memory_stays_within_the_gpu_budget(
    wide_family: Family, tmp_path: Path, method: str, given: dict[str, Any]
) -> None:
    """What a GPU would hold: the simulated device's host buffers come from numpy, so every torch
    allocation of the pass (device rings, accumulators, each tile's temporaries) is device
    memory; at its peak it stays within the smallest --gpu-memory (16 MiB)."""
    budget = 16 << 20
    out = tmp_path / "out"
    # copies without delay: a late download keeps its result alive longer than a GPU stream would
    with simulated_gpu(lambda: SimulatedGpu(budget=budget, delay=(0.0, 0.0)), tile_cap=None):
        peak = _peak_torch_bytes(
            lambda: _merge(wide_family, out, method, given, "torch", device="cpu", block_elems=1 << 18)
        )
    assert budget // 8 < peak <= budget


def test_histograms_too_large_for_the_gpu_budget_are_one_line(tmp_path: Path) -> None:
    """Ten agents' fine magnitude histograms (two cuts each: 10 MiB) leave a 16 MiB budget too
    little for the tiles: refused, naming the budget that would do."""
    many = build_family(
        tmp_path / "family", shapes=SHAPES, densities=(0.05, 0.1, 0.2, 0.3, 0.4, 0.5, 0.6, 0.7, 0.8, 0.9)
    )
    with simulated_gpu(lambda: SimulatedGpu(budget=16 << 20)), pytest.raises(RamstreamError) as caught:
        _merge(many, tmp_path / "out", "breadcrumbs", {"density": 0.5, "gamma": 0.05}, "torch", device="cpu")
    message = str(caught.value)
    assert "--gpu-memory 16MiB cannot hold the fine magnitude histograms of 10 agents (10 MiB" in message
    assert "give --gpu-memory 24MiB or more" in message


def test_whole_slices_beyond_the_gpu_budget_are_one_line(tmp_path: Path) -> None:
    """DELLA ranks |tau| within dim-0 slices, so a tile holds whole ones: a slice of 65536
    elements does not fit a 16 MiB budget's temporaries, and is refused naming a budget that
    does (which then merges to the Numba bytes), not computed beyond the budget."""
    wide = build_family(tmp_path / "family", shapes={"model.layers.0.mlp.up_proj.weight": (4, 65536)}, seed=3)
    given = {"density": 0.5, "epsilon": 0.1}
    with simulated_gpu(lambda: SimulatedGpu(budget=16 << 20), tile_cap=None), pytest.raises(RamstreamError) as caught:
        _merge(wide, tmp_path / "small" / "out", "della", given, "torch", device="cpu", block_elems=1 << 18)
    message = str(caught.value)
    assert "\n" not in message and "--gpu-memory 16MiB cannot hold one dim-0 slice of 65536 elements" in message
    suggested = int(message.rsplit("give --gpu-memory ", 1)[1].split("MiB")[0])
    expected = _merge(wide, tmp_path / "numba" / "out", "della", given, "numba", block_elems=1 << 18)
    with simulated_gpu(lambda: SimulatedGpu(budget=suggested << 20), tile_cap=None):
        got = _merge(wide, tmp_path / "enough" / "out", "della", given, "torch", device="cpu", block_elems=1 << 18)
    assert got == expected


def test_a_gpu_out_of_memory_is_one_line_naming_the_budget(family: Family, tmp_path: Path) -> None:
    """CUDA's out-of-memory error, raised when the device buffers are allocated, reaches the user
    as one line naming --gpu-memory, and nothing that looks finished is left."""
    out = tmp_path / "out"
    with simulated_gpu(lambda: FullGpu()), pytest.raises(RamstreamError) as caught:
        _merge(family, out, "ties", {"density": 0.5}, "torch", device="cpu")
    message = str(caught.value)
    assert "\n" not in message and "ran out of memory" in message, message
    assert "--gpu-memory (16MiB)" in message and "give a smaller --gpu-memory" in message, message
    assert not (out / "ramstream_merge.json").exists()


def test_a_probe_of_many_agents_stays_within_the_gpu_budget(tmp_path: Path) -> None:
    """The probe's overlap counts of 64 agents (64 x 64 pairs per element, were they all held at
    once) stay inside the 16 MiB budget like every other temporary, and equal Numba's."""
    shapes = {"model.layers.0.mlp.up_proj.weight": (64, 512)}
    many = build_family(tmp_path / "family", shapes=shapes, densities=tuple(0.01 + 0.015 * k for k in range(64)))
    budget = 16 << 20
    expected = _merge(many, tmp_path / "numba" / "out", "ram+", {}, "numba", block_elems=1 << 15)
    with simulated_gpu(lambda: SimulatedGpu(budget=budget, delay=(0.0, 0.0)), tile_cap=None):
        got: dict[str, bytes] = {}
        peak = _peak_torch_bytes(
            lambda: got.update(
                _merge(many, tmp_path / "torch" / "out", "ram+", {}, "torch", device="cpu", block_elems=1 << 15)
            )
        )
    assert got == expected
    assert peak <= budget, f"{peak / 2**20:.1f} MiB"
