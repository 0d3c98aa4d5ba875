"""A simulated GPU for the torch backend's streamed path, on the CPU: device memory apart from
the host's, and copies that are late.

``SimulatedGpu`` implements the backend's ``Streams`` interface the way a GPU behaves, as far as
a CPU can: every upload runs on a copy thread (the copy stream, in order) after a random delay and
only once the event it must wait for fired; every download runs on a second thread (the compute
stream's copies) after a random delay; host and device buffers start filled with 0xFF bytes (NaN
in every float format), and so do the caller's result buffers (``host_memory``), into which
results are downloaded straight and land only when their event is waited for. The compute itself
runs on the host at once, so "the compute waits for an upload" is a host wait. A staging loop
that reads a device buffer before its upload landed, hands a host buffer to a sink before its
download landed, returns before a result landed in the caller's buffer, or refills a buffer too
early, then computes on NaN bytes or writes them: the merge differs from the Numba bytes, or
stops on non-finite values.
"""

from __future__ import annotations

import random
import threading
import time
from collections.abc import Callable
from concurrent.futures import Future, ThreadPoolExecutor

import numpy as np
import torch

from ramstream.backends.torch.host_memory import HostBuffers
from ramstream.backends.torch.streams import Event

POISON = 0xFF


class LateEvent:
    """Fires when the simulated copy queued before it has run."""

    def __init__(self, future: Future[None]) -> None:
        self.future = future

    def synchronize(self) -> None:
        self.future.result()


class LandsWhenWaited:
    """A download straight into the caller's buffer that lands only when its event is waited for:
    whatever reads that buffer without waiting reads 0xFF bytes, however long after."""

    def __init__(self, copy: Callable[[], None]) -> None:
        self._copy: Callable[[], None] | None = copy
        self._lock = threading.Lock()

    def synchronize(self) -> None:
        with self._lock:
            if self._copy is not None:
                self._copy()
                self._copy = None


class SimulatedGpu:
    separate = True

    def __init__(self, budget: int = 16 << 20, seed: int = 0, delay: tuple[float, float] = (0.0, 0.002)) -> None:
        self.device = torch.device("cpu")
        self._budget = budget
        self._random = random.Random(seed)
        self._lock = threading.Lock()
        self._delay_range = delay
        self._copy = ThreadPoolExecutor(1, thread_name_prefix="simulated-copy")
        self._downloads = ThreadPoolExecutor(1, thread_name_prefix="simulated-download")
        self.uploads = self.downloads = 0
        self.results = HostBuffers()  # the "registered" host memory: results download into it
        self.straight_downloads = 0

    def _delay(self) -> float:
        with self._lock:
            return self._random.uniform(*self._delay_range)

    def budget(self, given: int | None) -> int:
        return self._budget if given is None else given

    def host_buffer(self, nbytes: int) -> torch.Tensor:
        """Host memory from numpy, so that torch's allocations are the device's alone."""
        return torch.from_numpy(np.full(nbytes, POISON, dtype=np.uint8))

    def device_buffer(self, host: torch.Tensor) -> torch.Tensor:
        return torch.full_like(host, POISON)

    def host_memory(self, nbytes: int) -> np.ndarray:
        buffer = self.results.allocate(nbytes)
        buffer.fill(POISON)
        return buffer

    def straight(self, target: np.ndarray) -> bool:
        if not self.results.holds(target):
            return False
        with self._lock:
            self.straight_downloads += 1
        return True

    def upload(self, dst: torch.Tensor, src: torch.Tensor, after: Event | None) -> Event:
        delay = self._delay()
        self.uploads += 1

        def copy() -> None:
            if after is not None:
                after.synchronize()
            time.sleep(delay)
            dst.copy_(src)

        return LateEvent(self._copy.submit(copy))

    def compute_waits(self, event: Event) -> None:
        event.synchronize()

    def download(self, dst: torch.Tensor, src: torch.Tensor) -> tuple[torch.Tensor, Event]:
        delay = self._delay()
        self.downloads += 1

        def copy() -> None:
            time.sleep(delay)
            with torch.inference_mode():  # dst may be a view of the caller's buffer made in the tile loop's mode
                dst.copy_(src)

        if self.results.holds(dst.numpy()):
            return dst, LandsWhenWaited(copy)
        return dst, LateEvent(self._downloads.submit(copy))

    def computed(self) -> Event:
        """The compute has run; the downloads queued on its stream so far have not."""
        return LateEvent(self._downloads.submit(lambda: None))

    def constant(self, values: np.ndarray) -> torch.Tensor:
        return torch.from_numpy(np.array(values))

    def readback(self, src: torch.Tensor) -> np.ndarray:
        """Read back by the compute stream's copies, late: after every download queued before it."""
        return self.readback_later(src)()

    def readback_later(self, src: torch.Tensor) -> Callable[[], np.ndarray]:
        """The bytes ``src`` holds now (the compute has run: a GPU's copy, queued on the compute
        stream, reads what the work queued before it wrote), landing late. ``src`` is not held: on
        a GPU its memory may be reused at once, by work queued after the copy."""
        delay = self._delay()
        bytes_now = src.contiguous().numpy().copy()

        def copy() -> np.ndarray:
            time.sleep(delay)
            return bytes_now

        return self._downloads.submit(copy).result

    def synchronize(self) -> None:
        self._copy.submit(lambda: None).result()
        self._downloads.submit(lambda: None).result()

    def close(self) -> None:
        self._copy.shutdown()
        self._downloads.shutdown()


class ForgetfulGpu(SimulatedGpu):
    """A staging bug, simulated: the compute does not wait for the upload of its tile."""

    def compute_waits(self, event: Event) -> None:
        pass


class FullGpu(SimulatedGpu):
    """A GPU whose memory other processes took: a device allocation fails as CUDA's does."""

    def device_buffer(self, host: torch.Tensor) -> torch.Tensor:
        raise torch.cuda.OutOfMemoryError("CUDA out of memory. Tried to allocate 32.00 MiB (simulated)")
