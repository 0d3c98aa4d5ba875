"""What a backend is made with: one small frozen record, the same for every backend.

A backend refuses (in one line) a setting it cannot honour, rather than ignoring it: the Numba
backend computes on the CPU only, so it refuses a GPU device or a GPU memory budget.
"""

from __future__ import annotations

from dataclasses import dataclass


@dataclass(frozen=True)
class BackendSettings:
    threads: int | None = None  # compute threads on the CPU (None: every core)
    device: str | None = None  # "cpu", "cuda", "cuda:N" (None: the backend's default)
    gpu_memory: int | None = None  # bytes of device memory a backend may hold (None: its default)
    memory: int | None = None  # the run's host memory budget (--memory), for staging buffers
