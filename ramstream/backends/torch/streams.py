"""Where the torch backend's copies and compute are queued: a small interface with a CPU and a
CUDA implementation, so that the staging logic (``staging.py``) is one piece of code, tested on
the CPU.

On CUDA, host-to-device copies go on a copy stream beside the compute stream, ordered by
events: the compute stream waits for a tile's upload, the copy stream waits until the compute
that last read a device buffer is done before overwriting it; results come back on the compute
stream into pinned host buffers, and an event says when they have landed. On the CPU nothing is
queued: a "device" buffer is the host buffer itself, every copy happens at once and every event
has already fired.
"""

from __future__ import annotations

from typing import Protocol

import torch


class Event(Protocol):
    def synchronize(self) -> None:
        """Block until the work recorded before this event is done."""
        ...


class Streams(Protocol):
    device: torch.device

    def host_buffer(self, nbytes: int) -> torch.Tensor:
        """A uint8 host buffer of ``nbytes`` (pinned on CUDA, so copies from it are asynchronous)."""
        ...

    def device_buffer(self, host: torch.Tensor) -> torch.Tensor:
        """The device buffer that ``host`` is uploaded into (on the CPU: ``host`` itself)."""
        ...

    def upload(self, dst: torch.Tensor, src: torch.Tensor, after: Event | None) -> Event:
        """Copy host ``src`` into device ``dst`` once ``after`` fired; the compute stream waits for
        the copy. The returned event fires when ``src`` may be refilled."""
        ...

    def download(self, dst: torch.Tensor, src: torch.Tensor) -> tuple[torch.Tensor, Event]:
        """Copy device ``src`` (computed on the compute stream) into host ``dst``; returns the host
        tensor that holds the bytes once the event fired (on the CPU, ``src`` itself)."""
        ...

    def computed(self) -> Event:
        """An event that fires when the compute queued so far is done."""
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
    def __init__(self) -> None:
        self.device = torch.device("cpu")

    def host_buffer(self, nbytes: int) -> torch.Tensor:
        return torch.empty(nbytes, dtype=torch.uint8)

    def device_buffer(self, host: torch.Tensor) -> torch.Tensor:
        return host

    def upload(self, dst: torch.Tensor, src: torch.Tensor, after: Event | None) -> Event:
        if dst.data_ptr() != src.data_ptr():
            dst.copy_(src)
        return DONE

    def download(self, dst: torch.Tensor, src: torch.Tensor) -> tuple[torch.Tensor, Event]:
        return src, DONE

    def computed(self) -> Event:
        return DONE

    def synchronize(self) -> None:
        pass


class CudaStreams:
    """A copy stream beside the device's current (compute) stream."""

    def __init__(self, device: torch.device) -> None:
        self.device = device
        self.compute = torch.cuda.current_stream(device)
        self.copy = torch.cuda.Stream(device)

    def host_buffer(self, nbytes: int) -> torch.Tensor:
        return torch.empty(nbytes, dtype=torch.uint8, pin_memory=True)

    def device_buffer(self, host: torch.Tensor) -> torch.Tensor:
        return torch.empty(host.shape[0], dtype=torch.uint8, device=self.device)

    def upload(self, dst: torch.Tensor, src: torch.Tensor, after: Event | None) -> Event:
        if after is not None:
            self.copy.wait_event(after)  # type: ignore[arg-type]
        with torch.cuda.stream(self.copy):
            dst.copy_(src, non_blocking=True)
            event = torch.cuda.Event()
            event.record(self.copy)
        self.compute.wait_event(event)
        return event

    def download(self, dst: torch.Tensor, src: torch.Tensor) -> tuple[torch.Tensor, Event]:
        dst.copy_(src, non_blocking=True)  # on the compute stream, after the kernels that made src
        return dst, self.computed()

    def computed(self) -> Event:
        event = torch.cuda.Event()
        event.record(self.compute)
        return event

    def synchronize(self) -> None:
        self.copy.synchronize()
        self.compute.synchronize()
