"""Compute backends: the ``Backend`` protocol (``base``), the definitions every backend shares
(the exact-sum accumulator format, the counter RNG's keys), a registry, and the backends
themselves (``numba/``: the CPU kernels). Only a backend's own folder imports its library."""
