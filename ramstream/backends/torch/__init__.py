"""The torch backend (``backend.TorchBackend``): the engine's operations as torch tensor code, on a
CUDA GPU (tiles staged through pinned host buffers and copied on a side stream while the previous
tile computes) or on the CPU. The only place, with ``ramstream.lab``, that imports torch.

Every operation gives the Numba backend's bytes: float32 arithmetic one rounding per torch op
(never a fused op), the codecs and the counter RNG in integer ops, exact integer histograms and
the shared exact-sum format. ``docs/torch.md`` says how.
"""
