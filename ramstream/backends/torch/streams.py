"""Where the torch backend's copies and compute are queued: a small interface with a CPU and a
CUDA implementation, so that the staging logic (``staging.py``) and the backend's streamed loop
are one piece of code, run on the CPU too (the tests drive them through a simulated device whose
copies really are late).

On CUDA, host-to-device copies go on a copy stream beside the compute stream, ordered by
events: the compute stream waits for a tile's upload, the copy stream waits until the compute
that last read a device buffer is done before overwriting it; results come back on the compute
stream into pinned host buffers, and an event says when they have landed. Nothing waits on a
stream itself: every wait is on an event (a stream or device synchronisation is what CUDA's sync
debug mode reports, and what hides a missing event). On the CPU nothing is queued: a "device"
buffer is the host buffer itself, every copy happens at once and every event has already fired.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Protocol

import numpy as np
import torch

from ramstream.backends.torch.host_memory import HostBuffers


class Event(Protocol):
    def synchronize(self) -> None:
        """Block until the work recorded before this event is done."""
        ...


class Streams(Protocol):
    device: torch.device
    separate: bool  # device memory apart from the host's: tiles are staged and streamed

    def budget(self, given: int | None) -> int:
        """Bytes of device memory the backend may hold: ``given``, or the implementation's default
        (0 where device memory is host memory)."""
        ...

    def host_buffer(self, nbytes: int) -> torch.Tensor:
        """A uint8 host buffer of ``nbytes`` (pinned on CUDA, so copies from it are asynchronous)."""
        ...

    def device_buffer(self, host: torch.Tensor) -> torch.Tensor:
        """The device buffer that ``host`` is uploaded into (on the CPU: ``host`` itself)."""
        ...

    def host_memory(self, nbytes: int) -> np.ndarray:
        """``nbytes`` of host memory for the caller's result buffers (``host_memory.py``): on CUDA
        registered, so that results are downloaded straight into it."""
        ...

    def straight(self, target: np.ndarray) -> bool:
        """Whether a result may be downloaded straight into ``target`` (a view of the caller's
        buffer) rather than into a slot of the output ring and copied there."""
        ...

    def upload(self, dst: torch.Tensor, src: torch.Tensor, after: Event | None) -> Event:
        """Queue a copy of host ``src`` into device ``dst`` that starts once ``after`` fired; the
        returned event fires when the copy is done (``src`` may be refilled, ``dst`` read)."""
        ...

    def compute_waits(self, event: Event) -> None:
        """Compute queued from now on starts after ``event`` fired."""
        ...

    def download(self, dst: torch.Tensor, src: torch.Tensor) -> tuple[torch.Tensor, Event]:
        """Copy device ``src`` (computed on the compute stream) into host ``dst``; returns the host
        tensor that holds the bytes once the event fired (on the CPU, ``src`` itself)."""
        ...

    def computed(self) -> Event:
        """An event that fires when the compute queued so far is done."""
        ...

    def constant(self, values: np.ndarray) -> torch.Tensor:
        """``values`` (a small host array: parameters, indices) on the device, its upload queued
        on the compute stream (no wait for it on the host)."""
        ...

    def readback(self, src: torch.Tensor) -> np.ndarray:
        """A small result computed on the compute stream (counts, sums), on the host once the
        compute that makes it is done."""
        ...

    def readback_later(self, src: torch.Tensor) -> Callable[[], np.ndarray]:
        """``readback`` queued now and waited for by the returned function (the host goes on)."""
        ...

    def synchronize(self) -> None:
        """Wait for everything queued on every stream."""
        ...


class Done:
    """The CPU's events: the work is done when the event exists."""

    def synchronize(self) -> None:
        pass


DONE = Done()


class CpuStreams:
    separate = False

    def __init__(self) -> None:
        self.device = torch.device("cpu")

    def budget(self, given: int | None) -> int:
        return 0

    def host_buffer(self, nbytes: int) -> torch.Tensor:
        return torch.empty(nbytes, dtype=torch.uint8)

    def device_buffer(self, host: torch.Tensor) -> torch.Tensor:
        return host

    def host_memory(self, nbytes: int) -> np.ndarray:
        return np.empty(nbytes, np.uint8)

    def straight(self, target: np.ndarray) -> bool:
        return False  # a result is a host tensor already: the sink's copy is the only one

    def upload(self, dst: torch.Tensor, src: torch.Tensor, after: Event | None) -> Event:
        if dst.data_ptr() != src.data_ptr():
            dst.copy_(src)
        return DONE

    def compute_waits(self, event: Event) -> None:
        pass

    def download(self, dst: torch.Tensor, src: torch.Tensor) -> tuple[torch.Tensor, Event]:
        return src, DONE

    def computed(self) -> Event:
        return DONE

    def constant(self, values: np.ndarray) -> torch.Tensor:
        return torch.from_numpy(np.array(values))  # a copy: the caller's array may be read-only

    def readback(self, src: torch.Tensor) -> np.ndarray:
        return src.contiguous().numpy()

    def readback_later(self, src: torch.Tensor) -> Callable[[], np.ndarray]:
        copy = src.contiguous().numpy().copy()
        return lambda: copy

    def synchronize(self) -> None:
        pass


class CudaStreams:
    """A copy stream beside the compute stream: the current stream of the thread that launches the
    tile's kernels, taken at each use (a caller that runs ramstream inside its own stream gets its
    kernels ordered on that stream, not on the one current when the backend was built)."""

    separate = True
    DEFAULT_FRACTION = 0.5  # of the device's free memory, without --gpu-memory

    def __init__(self, device: torch.device) -> None:
        self.device = device
        self.copy = torch.cuda.Stream(device)
        self.results = HostBuffers(self._register, _unregister)

    @property
    def compute(self) -> torch.cuda.Stream:
        return torch.cuda.current_stream(self.device)

    def budget(self, given: int | None) -> int:
        if given is not None:
            return given
        free, _total = torch.cuda.mem_get_info(self.device)
        return int(free * self.DEFAULT_FRACTION)

    def host_buffer(self, nbytes: int) -> torch.Tensor:
        return torch.empty(nbytes, dtype=torch.uint8, pin_memory=True)

    def device_buffer(self, host: torch.Tensor) -> torch.Tensor:
        return torch.empty(host.shape[0], dtype=torch.uint8, device=self.device)

    def host_memory(self, nbytes: int) -> np.ndarray:
        return self.results.allocate(nbytes)

    def _register(self, address: int, nbytes: int) -> bool:
        """Pin host memory the caller allocated (portable: for every device); False where the
        driver refuses (results then reach it through the output ring's pinned slots)."""
        if int(torch.cuda.cudart().cudaHostRegister(address, nbytes, 1)) == 0:
            return True
        # The refusal stays CUDA's "last error", which torch's next launch check would report as
        # its own failure: a launch now reads (and clears) it.
        try:
            torch.empty(1, device=self.device).fill_(0)
        except RuntimeError:
            pass
        return False

    def straight(self, target: np.ndarray) -> bool:
        return self.results.holds(target)

    def upload(self, dst: torch.Tensor, src: torch.Tensor, after: Event | None) -> Event:
        if after is not None:
            self.copy.wait_event(after)  # type: ignore[arg-type]
        with torch.cuda.stream(self.copy):
            dst.copy_(src, non_blocking=True)
            event = torch.cuda.Event()
            event.record(self.copy)
        return event

    def compute_waits(self, event: Event) -> None:
        self.compute.wait_event(event)  # type: ignore[arg-type]

    def download(self, dst: torch.Tensor, src: torch.Tensor) -> tuple[torch.Tensor, Event]:
        dst.copy_(src, non_blocking=True)  # on the compute stream, after the kernels that made src
        return dst, self.computed()

    def computed(self) -> Event:
        event = torch.cuda.Event()
        event.record(self.compute)
        return event

    def constant(self, values: np.ndarray) -> torch.Tensor:
        # pinned, so the copy is asynchronous; the caching host allocator keeps the pinned block
        # until the copy queued from it is done
        host = torch.from_numpy(np.array(values)).pin_memory()
        return host.to(self.device, non_blocking=True)

    def readback(self, src: torch.Tensor) -> np.ndarray:
        return self.readback_later(src)()

    def readback_later(self, src: torch.Tensor) -> Callable[[], np.ndarray]:
        host = torch.empty(src.shape, dtype=src.dtype, pin_memory=True)
        host.copy_(src, non_blocking=True)
        event = self.computed()

        def landed() -> np.ndarray:
            event.synchronize()
            return host.numpy()

        return landed

    def synchronize(self) -> None:
        for stream in (self.copy, self.compute):
            event = torch.cuda.Event()
            event.record(stream)
            event.synchronize()


def _unregister(address: int) -> None:
    torch.cuda.cudart().cudaHostUnregister(address)
