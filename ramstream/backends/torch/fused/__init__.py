"""Fused Triton kernels for the torch backend: one launch per tile and operation on CUDA.

``ram.py`` (the RAM / RAM+ merge, K outputs), ``gta.py`` (the GTA merge where every element
survives or magnitude cuts or random draws decide, K outputs), ``probe.py`` (masks, coverage and
overlap counts), ``magnitude.py`` (the |tau| histograms and tie searches of the magnitude cuts),
``linear.py`` (the linear merge) and ``vectors.py`` (the per-vector merge) each decode the inputs,
compute, encode and reduce their side results (the first NaN/Inf input, the outputs' NaN/Inf
flags, the counts) in one kernel, launched with ``ram.EXACT``; ``codecs.py`` holds the element
functions they share. The torch-op code (``merges.py``, ``probe.py``, ``codecs.py`` one level up)
stays the CPU path and the reference these kernels are tested against. Both give the Numba
kernels' bytes: no contraction into fused multiply-adds (compiled with ``enable_fp_fusion=False``),
IEEE division (``div_rn``), the codecs in integer ops. See docs/torch.md.

Used where the device is CUDA and triton (3.6 or newer) imports, or where triton's interpreter is on
(``TRITON_INTERPRET=1`` before triton is imported: the kernels then run on CPU tensors, which is
how the tests check their arithmetic without a GPU). ``MODE = "ops"`` turns them off (the
torch-op path, for comparisons).
"""

from __future__ import annotations

from collections.abc import Sequence
from types import ModuleType
from typing import Literal

import numpy as np
import torch

from ramstream.format.dtypes import FloatCode

MODE: Literal["auto", "ops"] = "auto"

# the output carriers of ``codecs.encode`` (the torch codecs' too), by output format
CARRIERS: dict[int, torch.dtype] = {
    FloatCode.BF16: torch.int16,
    FloatCode.F16: torch.int16,
    FloatCode.F32: torch.float32,
    FloatCode.F64: torch.float64,
}


OLDEST = (3, 6)  # the triton the kernels are written and tested against (torch 2.11's and 2.13's)


def _triton() -> ModuleType | None:
    """triton, where it imports and is recent enough; else None (the torch ops run instead)."""
    try:
        import triton
    except ImportError:
        return None
    try:
        version = tuple(int(part) for part in triton.__version__.split(".")[:2])
    except ValueError:
        return None
    return triton if version >= OLDEST else None


def interpreting() -> bool:
    """Whether triton imports with its interpreter on (kernels on CPU tensors)."""
    triton = _triton()
    return triton is not None and bool(triton.knobs.runtime.interpret)


def available(device: torch.device, workers: int) -> bool:
    """Whether the fused kernels run for a backend on ``device`` with ``workers`` tile threads:
    on CUDA where triton (``OLDEST`` or newer) imports, on any device under triton's interpreter
    (one thread: the interpreter is not thread-safe)."""
    if MODE == "ops":
        return False
    if device.type == "cuda":
        return _triton() is not None
    return workers == 1 and interpreting()


def uniform_agents(codes: Sequence[int]) -> bool:
    """Whether the agents (``codes[1:]``, the base first) share one format, as a fused kernel
    takes them (one format, one stride in the staged slot); mixed agents take the torch ops."""
    return len(codes) > 1 and len(set(codes[1:])) == 1


def key(out: np.ndarray, out_code: int) -> tuple[int, int, int]:
    """An output buffer as the NaN/Inf flags a fused merge found in it are kept: its address,
    bytes and format."""
    return int(out.__array_interface__["data"][0]), int(out.nbytes), int(out_code)
