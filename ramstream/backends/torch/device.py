"""The device a torch backend computes on, chosen once; an unusable choice is one line.

CUDA initialises lazily, at the first use (the context, the caching allocator's first segment,
the pinned host allocator, triton's driver): 4-5 s that a run would spend in its first tile.
``warm`` starts that on a thread as soon as a run knows its device, while the family is opened
and the plan and index are prepared; ``resolve`` (the backend's construction) waits for it. The
thread swallows its errors: the construction meets the same condition itself and says it in one
line, as without the warm-up. A CPU device starts nothing.
"""

from __future__ import annotations

import threading
from collections.abc import Callable

import torch

from ramstream.errors import ConfigError

_lock = threading.Lock()
_started: list[threading.Thread] = []


def resolve(name: str | None) -> torch.device:
    """``cpu``, ``cuda`` or ``cuda:N``; None: the current CUDA device if torch sees one, else cpu.
    Waits first for a warm-up ``warm`` started."""
    wait()
    return _choose(name)


def warm(name: str | None) -> threading.Thread | None:
    """Start CUDA's initialisation for device ``name`` on a thread when ``name`` chooses a CUDA
    device (None: when torch sees one); nothing otherwise. Returns the thread, if one started."""
    if not chooses_cuda(name):
        return None
    return start(lambda: _initialise(name))


def chooses_cuda(name: str | None) -> bool:
    """Whether ``resolve(name)`` would choose (or refuse) a CUDA device, not the CPU."""
    if name is None:
        return torch.cuda.is_available()
    return name == "cuda" or name.startswith("cuda:")


def start(work: Callable[[], object]) -> threading.Thread:
    """Run ``work`` on a thread that ``wait`` joins (non-daemon: an exit waits for it rather than
    cut a CUDA initialisation short); an error it raises is dropped."""
    thread = threading.Thread(target=_quietly, args=(work,), name="ramstream-device-init")
    with _lock:
        _started.append(thread)
    thread.start()
    return thread


def wait() -> None:
    """Join every warm-up started so far."""
    with _lock:
        threads = list(_started)
        _started.clear()
    for thread in threads:
        thread.join()


def _quietly(work: Callable[[], object]) -> None:
    try:
        work()
    except Exception:  # the backend's construction meets the same error and says it in one line
        pass


def _initialise(name: str | None) -> None:
    """What CUDA and triton do at their first use, done for device ``name`` ahead of it."""
    chosen = _choose(name)
    with torch.cuda.device(chosen):
        torch.empty(1, device=chosen)  # the context and the caching allocator's first segment
        torch.empty(1, dtype=torch.uint8, pin_memory=True)  # the pinned host allocator
        torch.cuda.Stream(chosen).synchronize()  # the stream pool
        torch.cuda.current_stream(chosen).synchronize()
    from ramstream.backends.torch.fused import _triton

    triton = _triton()
    if triton is not None:  # its driver (a small C module built or loaded at first use)
        triton.runtime.driver.active.get_current_target()
        from ramstream.backends.torch.fused import gta, probe, ram  # noqa: F401 - imported now, not in the first tile


def _choose(name: str | None) -> torch.device:
    if name is None:
        return _cuda(None) if torch.cuda.is_available() else torch.device("cpu")
    if name == "cpu":
        return torch.device("cpu")
    if name == "cuda":
        return _cuda(None)
    if name.startswith("cuda:") and name[5:].isdigit():
        return _cuda(int(name[5:]))
    raise ConfigError(f"--device must be cpu, cuda or cuda:N (N a device number, say cuda:0), got {name!r}")


def _cuda(index: int | None) -> torch.device:
    if not torch.cuda.is_available():
        built = f"built for CUDA {torch.version.cuda}" if torch.version.cuda else "a CPU-only build"
        raise ConfigError(f"--device cuda: torch {torch.__version__} ({built}) sees no CUDA GPU; use --device cpu")
    count = torch.cuda.device_count()
    if index is None:
        index = torch.cuda.current_device()
    if index >= count:
        raise ConfigError(f"--device cuda:{index}: torch sees {count} CUDA device(s), cuda:0 to cuda:{count - 1}")
    return torch.device("cuda", index)
