"""The torch backend: every ``Backend`` operation as tiles streamed through torch, on a CUDA GPU
or on the CPU, with the Numba backend's bytes.

The tile machinery (rings, streams, tile sizes, the loop) is ``tiles.py``; the merges are
``merging.py``, the probe and the statistics ``counting.py``; the arithmetic of each is in its
own module (``merges.py``, ``magnitude.py``, ``exact_sums.py``...). See docs/torch.md.
"""

from __future__ import annotations

from ramstream.backends.settings import BackendSettings
from ramstream.backends.torch import device
from ramstream.backends.torch.counting import CountOps
from ramstream.backends.torch.merging import MergeOps


def make(settings: BackendSettings) -> TorchBackend:
    """The registry's factory."""
    return TorchBackend(settings)


def warm(settings: BackendSettings) -> None:
    """The registry's warm-up: CUDA's initialisation started on a thread when ``settings`` choose
    a CUDA device (the construction waits for it); nothing on the CPU."""
    device.warm(settings.device)


class TorchBackend(MergeOps, CountOps):
    name = "torch"
