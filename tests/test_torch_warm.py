"""The torch backend's device warm-up: CUDA's initialisation started on a thread while a run
opens its inputs, joined by the backend's construction; nothing at all on the CPU."""

from __future__ import annotations

import threading
import time
from pathlib import Path

import pytest

torch = pytest.importorskip("torch")

from ramstream.backends.registry import warm_backend  # noqa: E402
from ramstream.backends.torch import device  # noqa: E402
from ramstream.config import RunOptions  # noqa: E402
from ramstream.errors import ConfigError  # noqa: E402
from tests.families import Family, build_family  # noqa: E402
from tests.test_backends import _merge  # noqa: E402

CUDA = torch.cuda.is_available()


def _warm_threads() -> list[threading.Thread]:
    return [t for t in threading.enumerate() if t.name == "ramstream-device-init"]


@pytest.fixture(scope="module")
def family(tmp_path_factory: pytest.TempPathFactory) -> Family:
    shapes = {"model.embed_tokens.weight": (40, 50), "norm": (53,)}
    return build_family(tmp_path_factory.mktemp("warm"), shapes=shapes, subset_agent=True)


def test_a_cpu_device_starts_nothing() -> None:
    assert device.warm("cpu") is None
    warm_backend(RunOptions(backend="torch", device="cpu"))
    warm_backend(RunOptions(backend="numba"))
    assert _warm_threads() == []


@pytest.mark.skipif(CUDA, reason="this machine has a GPU")
def test_the_default_device_without_a_gpu_starts_nothing() -> None:
    assert device.warm(None) is None
    warm_backend(RunOptions(backend="torch"))
    assert _warm_threads() == []


@pytest.mark.parametrize("method", ["ram+", "ties"])
def test_a_torch_merge_on_the_cpu_warms_nothing_and_writes_the_numba_bytes(
    family: Family, tmp_path: Path, method: str
) -> None:
    given = {"density": [0.5]} if method == "ties" else {}
    expected = _merge(family, tmp_path / "numba" / "out", method, given, "numba")
    before = threading.active_count()
    assert _merge(family, tmp_path / "torch" / "out", method, given, "torch", device="cpu") == expected
    assert _warm_threads() == [] and threading.active_count() == before


def test_resolve_waits_for_a_warm_up_still_running() -> None:
    done = threading.Event()

    def slow() -> None:
        time.sleep(0.3)
        done.set()

    thread = device.start(slow)
    assert thread.is_alive()
    assert device.resolve("cpu") == torch.device("cpu")
    assert done.is_set() and not thread.is_alive()


def test_a_warm_up_that_fails_leaves_the_error_to_the_construction() -> None:
    """The thread drops its error (no unhandled exception in a thread, which pytest would report);
    the construction says the same one line as without a warm-up."""
    with pytest.raises(ConfigError) as plain:
        device.resolve("cuda:x")
    thread = device.warm("cuda:x")
    assert thread is not None
    thread.join()
    with pytest.raises(ConfigError) as warmed:
        device.resolve("cuda:x")
    assert str(warmed.value) == str(plain.value)


@pytest.mark.skipif(CUDA, reason="this machine has a GPU")
def test_device_cuda_without_a_gpu_is_the_same_one_line_after_a_warm_up() -> None:
    thread = device.warm("cuda")
    assert thread is not None
    with pytest.raises(ConfigError, match="sees no CUDA GPU; use --device cpu"):
        device.resolve("cuda")
    assert not thread.is_alive()


@pytest.mark.skipif(not CUDA, reason="torch sees no CUDA GPU")
def test_a_cuda_warm_up_initialises_the_device_before_the_construction() -> None:
    thread = device.warm("cuda")
    assert thread is not None
    assert device.resolve("cuda").type == "cuda"
    assert not thread.is_alive() and torch.cuda.is_initialized()
