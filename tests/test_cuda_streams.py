"""The torch backend on a real GPU, with streams that lag (``tests/lagging_cuda.py``): every
method, the probe included, writes the Numba bytes although every copy and kernel is late; the
same run without the compute's wait for its upload is caught; the memory the CUDA allocator
reserves stays within --gpu-memory. Skipped where torch sees no CUDA GPU (the same loop runs on
the CPU through the simulated device of ``tests/test_torch_streamed.py``)."""

from __future__ import annotations

from collections.abc import Callable
from contextlib import AbstractContextManager
from pathlib import Path
from typing import Any

import pytest

torch = pytest.importorskip("torch")
if not torch.cuda.is_available():
    pytest.skip("torch sees no CUDA GPU", allow_module_level=True)

from ramstream.errors import NonFiniteOutputError, NonFiniteWeightError  # noqa: E402
from tests.families import Family, build_family  # noqa: E402
from tests.lagging_cuda import ForgetfulCudaStreams, LaggingCudaStreams  # noqa: E402
from tests.test_backends import METHODS, NumbaBytes, _merge  # noqa: E402
from tests.test_torch_streamed import SHAPES, TINY_TILES, backends_through  # noqa: E402


@pytest.fixture(scope="module")
def family(tmp_path_factory: pytest.TempPathFactory) -> Family:
    root = tmp_path_factory.mktemp("cuda-streams")
    return build_family(root, shapes=SHAPES, identical_agent=True, subset_agent=True, shards=2, seed=21)


@pytest.fixture(scope="module")
def numba_bytes() -> NumbaBytes:
    return NumbaBytes()


def lagging(
    make_streams: Callable[[torch.device], LaggingCudaStreams], tile_cap: int | None = TINY_TILES
) -> AbstractContextManager[list[LaggingCudaStreams]]:
    """Every torch backend made inside streams through fresh lagging CUDA streams."""
    return backends_through(lambda settings: make_streams(torch.device(settings.device or "cuda")), tile_cap)


@pytest.mark.parametrize(("method", "given"), METHODS, ids=[f"{m}-{i}" for i, (m, _) in enumerate(METHODS)])
def test_every_method_through_lagging_cuda_streams_writes_the_numba_bytes(
    family: Family, tmp_path: Path, method: str, given: dict[str, Any], numba_bytes: NumbaBytes
) -> None:
    expected = numba_bytes.of(family, tmp_path, method, given)
    with lagging(LaggingCudaStreams) as made:
        got = _merge(family, tmp_path / "cuda" / "out", method, given, "torch", device="cuda", gpu_memory=16 << 20)
    assert got == expected
    assert sum(s.uploads for s in made) > 0 and sum(s.downloads for s in made) > 0
    assert sum(s.straight_downloads for s in made) > 0  # into the writer's registered buffers


def test_host_memory_is_registered_and_results_land_in_it_asynchronously() -> None:
    """``host_memory`` pins exactly the bytes asked for (torch sees them as pinned, views too); a
    download into it is asynchronous and lands by its event; released, it is no longer known."""
    import gc

    import numpy as np

    from ramstream.backends.torch.streams import CudaStreams

    streams = CudaStreams(torch.device("cuda"))
    memory = streams.host_memory(3 << 20)
    view = memory[1 << 20 :]
    assert streams.straight(view) and torch.from_numpy(view).is_pinned()
    assert not streams.straight(np.empty(1 << 20, np.uint8))
    source = torch.arange(view.shape[0], device="cuda").to(torch.uint8)
    torch.cuda._sleep(1 << 24)  # the download is queued behind a spin, so it is late
    landed, event = streams.download(torch.from_numpy(view), source)
    event.synchronize()
    np.testing.assert_array_equal(view, source.cpu().numpy())
    address = view.ctypes.data
    del memory, view, landed
    gc.collect()
    assert not any(start <= address < end for start, end in streams.results._live.items())


def test_a_compute_that_does_not_wait_for_its_upload_is_caught_on_cuda(family: Family, tmp_path: Path) -> None:
    expected = _merge(family, tmp_path / "numba" / "out", "ram+", {}, "numba")
    try:
        with lagging(ForgetfulCudaStreams):
            got = _merge(
                family, tmp_path / "forgetful" / "out", "ram+", {}, "torch", device="cuda", gpu_memory=16 << 20
            )
    except (NonFiniteWeightError, NonFiniteOutputError):
        pass  # the poison was read as an input (probe pass) or reached a merged value
    else:
        assert got != expected


@pytest.mark.parametrize(("method", "given"), [("ram+", {}), ("ties", {"density": 0.3}), ("della", METHODS[12][1])])
def test_the_memory_cuda_reserves_stays_within_the_gpu_budget(
    tmp_path: Path, method: str, given: dict[str, Any]
) -> None:
    """``torch.cuda.max_memory_reserved()``: what the caching allocator took from the device for
    the whole merge (rings, accumulators, each tile's temporaries, allocator rounding)."""
    wide = build_family(tmp_path / "family", shapes={"model.layers.0.mlp.up_proj.weight": (512, 4096)}, seed=5)
    budget = 64 << 20
    torch.cuda.synchronize()
    torch.cuda.empty_cache()
    torch.cuda.reset_peak_memory_stats()
    _merge(wide, tmp_path / "out", method, given, "torch", device="cuda", gpu_memory=budget, block_elems=1 << 20)
    reserved = torch.cuda.max_memory_reserved()
    assert reserved <= budget, f"{reserved / 2**20:.1f} MiB reserved under --gpu-memory 64MiB"
