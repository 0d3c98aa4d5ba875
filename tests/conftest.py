"""What the suite spent compiling Numba kernels, printed after the slowest tests; a real disk for
the tests that need one; the longest test files handed out first.

pytest-xdist (``--dist loadfile``) hands out whole files; by default it sorts them by their number
of tests, which sends the files of a few long end-to-end tests last and leaves the other workers
idle while they finish. Here the files are handed out in collection order, the longest first
(``LONGEST_FIRST``, from ``--durations=0`` summed per file on CI's two cores), the others after
them as collected.

Every test process (each xdist worker) listens to Numba's ``numba:compile`` events and sums the
top-level ones (a kernel with the helpers it compiled on the way); the controller adds up the
workers' sums. Kernels compiled in child processes (the CLI run as a subprocess) are not counted:
they compile into the same on-disk cache, so the next test process loads them instead.
"""

from __future__ import annotations

import shutil
import tempfile
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

_COMPILED = {"seconds": 0.0, "kernels": 0}
_KEY = "ramstream_numba_compile"
_STASH = pytest.StashKey[list[dict[str, float]]]()


def _listen() -> None:
    try:
        from numba.core import event
    except ImportError:  # numba absent: nothing compiles
        return
    starts: list[float] = []

    class _Timer(event.Listener):  # type: ignore[misc]
        def on_start(self, ev: Any) -> None:
            starts.append(time.perf_counter())

        def on_end(self, ev: Any) -> None:
            spent = time.perf_counter() - starts.pop()
            if not starts:  # a top-level compile: its nested ones are inside it
                _COMPILED["seconds"] += spent
                _COMPILED["kernels"] += 1

    event.register("numba:compile", _Timer())


# The test files that take longest (seconds in all, longest first), so that the short ones fill
# the workers' gaps at the end instead of a long one running alone.
LONGEST_FIRST = (
    "test_quantized.py",
    "test_torch_backend.py",
    "test_resume.py",
    "test_memory.py",
    "test_backends.py",
    "test_dask.py",
    "test_moe.py",
    "test_methods_magnitude.py",
    "test_fused_merges.py",
    "test_agents_lab.py",
    "test_fused_kernels.py",
    "test_mergekit_parity.py",
    "test_fused_gta_merges.py",
    "test_torch_streamed.py",
    "test_prewarm.py",
    "test_reliability.py",
    "test_demo_sweep.py",
    "test_lora.py",
    "test_sweep.py",
)


def pytest_configure(config: pytest.Config) -> None:
    _listen()
    config.stash[_STASH] = []
    if hasattr(config.option, "loadscopereorder"):  # pytest-xdist: keep the order set below
        config.option.loadscopereorder = False


def pytest_collection_modifyitems(items: list[pytest.Item]) -> None:
    rank = {name: k for k, name in enumerate(LONGEST_FIRST)}
    items.sort(key=lambda item: rank.get(item.path.name, len(rank)))  # stable: the rest as collected


def pytest_sessionfinish(session: pytest.Session) -> None:
    workeroutput = getattr(session.config, "workeroutput", None)
    if workeroutput is not None:  # an xdist worker: hand the sum to the controller
        workeroutput[_KEY] = dict(_COMPILED)


@pytest.hookimpl(optionalhook=True)  # an xdist hook: absent without xdist
def pytest_testnodedown(node: Any, error: Any) -> None:
    found = getattr(node, "workeroutput", {}).get(_KEY)
    if found is not None:
        node.config.stash[_STASH].append(found)


def pytest_terminal_summary(terminalreporter: Any, config: pytest.Config) -> None:
    parts = config.stash[_STASH] or [_COMPILED]
    seconds = sum(p["seconds"] for p in parts)
    kernels = sum(p["kernels"] for p in parts)
    terminalreporter.write_line(
        f"numba: {kernels} kernel compiles took {seconds:.1f} s in all "
        f"(summed over {len(parts)} test process(es); subprocesses not counted)"
    )


@pytest.fixture
def tmp_path(request: pytest.FixtureRequest, tmp_path: Path) -> Iterator[Path]:
    """pytest's ``tmp_path``, but on a real disk for a test marked ``disk``: ``make test`` puts the
    base temp on a tmpfs, which has no O_DIRECT and no page cache to ask about. The disk one lies
    under the repository's ``.pytest-disk/`` and is removed after the test."""
    if request.node.get_closest_marker("disk") is None:
        yield tmp_path
        return
    root = request.config.rootpath / ".pytest-disk"
    root.mkdir(exist_ok=True)
    path = Path(tempfile.mkdtemp(prefix=request.node.name[:40] + "-", dir=root))
    try:
        yield path
    finally:
        shutil.rmtree(path, ignore_errors=True)
