"""CUDA streams that lag, for the tests that run on a real GPU.

On a GPU, a 64-element tile's copies and kernels finish long before the host reaches its next
wait, so a missing wait (an upload the compute does not wait for, a buffer refilled while a
kernel still reads it, a download read before it landed) goes unseen. ``LaggingCudaStreams`` puts
the GPU's own idle spin (``torch.cuda._sleep``) in front of every upload on the copy stream,
after every compute wait on the compute stream and before every download, and poisons what a
missing wait would expose: a device slot is filled with 0xFF bytes (NaN in every float format)
on the copy stream before each upload into it, and a host result buffer on the host before each
download into it. ``ForgetfulCudaStreams`` drops the compute's wait for its upload: the test that
uses it must see a different or refused merge, or the lagging streams prove nothing.
"""

from __future__ import annotations

import numpy as np
import torch

from ramstream.backends.torch.streams import CudaStreams, Event

POISON = 0xFF
SPIN_CYCLES = 2_000_000  # about a millisecond on a current GPU: far longer than a tile's copy


class LaggingCudaStreams(CudaStreams):
    def __init__(self, device: torch.device, cycles: int = SPIN_CYCLES) -> None:
        super().__init__(device)
        self.cycles = cycles
        self.uploads = self.downloads = self.straight_downloads = 0

    def straight(self, target: np.ndarray) -> bool:
        straight = super().straight(target)
        self.straight_downloads += straight
        return straight

    def upload(self, dst: torch.Tensor, src: torch.Tensor, after: Event | None) -> Event:
        self.uploads += 1
        if after is not None:
            self.copy.wait_event(after)  # type: ignore[arg-type]
        with torch.cuda.stream(self.copy):
            dst.fill_(POISON)
            torch.cuda._sleep(self.cycles)
            dst.copy_(src, non_blocking=True)
            event = torch.cuda.Event()
            event.record(self.copy)
        return event

    def compute_waits(self, event: Event) -> None:
        super().compute_waits(event)
        with torch.cuda.stream(self.compute):
            torch.cuda._sleep(self.cycles)

    def download(self, dst: torch.Tensor, src: torch.Tensor) -> tuple[torch.Tensor, Event]:
        self.downloads += 1
        dst.fill_(POISON)  # the host buffer: its last sink is done (the ring drained the slot)
        with torch.cuda.stream(self.compute):
            torch.cuda._sleep(self.cycles)
        return super().download(dst, src)

    def close(self) -> None:
        self.synchronize()


class ForgetfulCudaStreams(LaggingCudaStreams):
    """A staging bug on a real GPU: the compute does not wait for the upload of its tile."""

    def compute_waits(self, event: Event) -> None:
        with torch.cuda.stream(self.compute):
            torch.cuda._sleep(self.cycles)
