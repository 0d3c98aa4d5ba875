"""What the suite spent compiling Numba kernels, printed after the slowest tests; a real disk for
the tests that need one; the longest test files handed out first.

pytest-xdist (``--dist loadfile``) hands out whole files; by default it sorts them by their number
of tests, which sends the files of a few long end-to-end tests last and leaves the other workers
idle while they finish. Here those files (``LONG_FEW``) go first, the others after them by their
number of tests, as xdist would.

Every test process (each xdist worker) listens to Numba's ``numba:compile`` events and sums the
top-level ones (a kernel with the helpers it compiled on the way); the controller adds up the
workers' sums. Kernels compiled in child processes (the CLI run as a subprocess) are not counted:
they compile into the same on-disk cache, so the next test process loads them instead.
"""

from __future__ import annotations

import multiprocessing
import os
import shutil
import tempfile
import time
from collections import Counter
from collections.abc import Iterator
from concurrent.futures import ProcessPoolExecutor
from pathlib import Path
from typing import Any

import pytest

_COMPILED: dict[str, Any] = {"seconds": 0.0, "kernels": 0, "by_kernel": {}}  # by_kernel: name -> seconds
_FIRST: dict[str, float] = {}  # --compile-first: kernels compiled, processes, wall seconds
_KEY = "ramstream_numba_compile"
_CPU_TIMES: dict[str, Any] = {}  # --cpu-times: the file, the test running, the compiles seen in it
_STASH = pytest.StashKey[list[dict[str, Any]]]()  # each worker's _COMPILED


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
                name = getattr(getattr(ev.data.get("dispatcher"), "py_func", None), "__qualname__", "?")
                _COMPILED["by_kernel"][name] = _COMPILED["by_kernel"].get(name, 0.0) + spent
                if _CPU_TIMES:
                    _CPU_TIMES["compiles"].append(
                        f"compile\t{spent:.2f}\t{name}{ev.data.get('args')}\t{_CPU_TIMES['test']}"
                    )

    event.register("numba:compile", _Timer())


# Files of a few long tests (interpreter checks, end-to-end pipelines): handed out first, so that
# they do not run alone at the end.
LONG_FEW = (
    "test_fused_gta_merges.py",
    "test_fused_merges.py",
    "test_agents_lab.py",
    "test_demo_sweep.py",
    "test_fused_kernels.py",
)


def pytest_addoption(parser: pytest.Parser) -> None:
    parser.addoption(
        "--compile-first",
        action="store_true",
        help="compile every method's recorded Numba kernels into the cache, a process per core, before the tests",
    )
    parser.addoption(
        "--cpu-times",
        metavar="FILE",
        help="append each test's CPU seconds (its process and the child processes it waited for) to FILE, "
        "and each Numba compile inside a test with its argument types",
    )


def pytest_configure(config: pytest.Config) -> None:
    if config.getoption("cpu_times"):
        _CPU_TIMES.update(file=config.getoption("cpu_times"), test="", compiles=[])
    _listen()
    config.stash[_STASH] = []
    if hasattr(config.option, "loadscopereorder"):  # pytest-xdist: keep the order set below
        config.option.loadscopereorder = False
    if config.getoption("compile_first") and not hasattr(config, "workerinput"):
        _compile_first()


def pytest_collection_modifyitems(items: list[pytest.Item]) -> None:
    rank = {name: k for k, name in enumerate(LONG_FEW)}
    count = Counter(item.path for item in items)
    items.sort(key=lambda item: (rank.get(item.path.name, len(rank)), -count[item.path]))  # stable within a file


def compile_recorded(position: int) -> None:
    """In a child of --compile-first: compile the recorded kernel at ``position`` of the list
    ``recorded_kernels`` makes (made once per child)."""
    global _KERNELS
    if _KERNELS is None:
        _KERNELS = recorded_kernels()
    _KERNELS[position].compile()


_KERNELS: list[Any] | None = None


def recorded_kernels() -> list[Any]:
    """prewarm's ``Kernel`` of every distinct recorded kernel: each method's, then the inputs'."""
    from ramstream.backends.numba import prewarm

    entries = [entry for method in prewarm.KERNELS.values() for entry in method] + list(prewarm.INPUT_KERNELS)
    distinct = {(module, name, tuple(types)): None for module, name, types in entries}
    return [prewarm.Kernel.of(module, name, types) for module, name, types in distinct]


def _compile_first() -> None:
    """Compile the recorded kernels not cached yet, a child per core taking the next one as it
    finishes the last (they take 0.1 to 8 s each: a fixed share per child left one core idle
    for half the time)."""
    try:
        kernels = recorded_kernels()
    except ImportError:  # numba absent: nothing compiles
        return
    start = time.perf_counter()
    todo = [k for k, kernel in enumerate(kernels) if not kernel.cached()]
    cores = len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else os.cpu_count() or 1
    processes = max(1, min(cores, 4, len(todo)))
    if todo:
        with ProcessPoolExecutor(processes, mp_context=multiprocessing.get_context("spawn")) as pool:
            try:
                list(pool.map(compile_recorded, todo, timeout=900))
            except Exception as error:
                raise pytest.UsageError(f"--compile-first: compiling the recorded kernels failed: {error!r}") from error
    _FIRST.update(kernels=len(todo), processes=processes if todo else 0, seconds=time.perf_counter() - start)


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
    if _FIRST:
        terminalreporter.write_line(
            f"numba: --compile-first compiled {_FIRST['kernels']:.0f} recorded kernels in "
            f"{_FIRST['seconds']:.1f} s before the tests ({_FIRST['processes']:.0f} processes)"
        )
    terminalreporter.write_line(
        f"numba: {kernels} kernel compiles took {seconds:.1f} s in all "
        f"(summed over {len(parts)} test process(es); subprocesses not counted)"
    )
    by_kernel: dict[str, float] = {}
    for part in parts:
        for name, spent in part.get("by_kernel", {}).items():
            by_kernel[name] = by_kernel.get(name, 0.0) + spent
    slowest = sorted(by_kernel.items(), key=lambda item: -item[1])[:8]
    if slowest:
        terminalreporter.write_line("numba: the longest: " + ", ".join(f"{n} {s:.1f} s" for n, s in slowest))


@pytest.hookimpl(wrapper=True)
def pytest_runtest_protocol(item: pytest.Item) -> Iterator[None]:
    """--cpu-times: what a test cost in CPU, not in wall time (the suite shares two cores)."""
    if not _CPU_TIMES:
        return (yield)
    _CPU_TIMES["test"] = item.nodeid
    before = _cpu_seconds()
    try:
        return (yield)
    finally:
        lines = [f"test\t{_cpu_seconds() - before:.2f}\t{item.nodeid}", *_CPU_TIMES["compiles"]]
        _CPU_TIMES["compiles"].clear()
        with open(_CPU_TIMES["file"], "a") as out:
            out.write("".join(line + "\n" for line in lines))


def _cpu_seconds() -> float:
    import resource

    own, children = resource.getrusage(resource.RUSAGE_SELF), resource.getrusage(resource.RUSAGE_CHILDREN)
    return own.ru_utime + own.ru_stime + children.ru_utime + children.ru_stime


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


@pytest.fixture(scope="module")
def interpreted(request: pytest.FixtureRequest, tmp_path_factory: pytest.TempPathFactory) -> dict[str, str]:
    """The results of the fused-kernel checks this module's selected tests name (their ``check``
    parameter), run under triton's interpreter in one process (``tests/fused_interpreter.py``)."""
    from tests.fused_interpreter import checks_of, run_checks

    return run_checks(checks_of(request.session, request.module), tmp_path_factory.mktemp("interpreted"))
