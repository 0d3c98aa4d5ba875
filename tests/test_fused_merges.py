"""The fused kernels through the API (and the streamed loop on the simulated device) under triton's
interpreter give the Numba backend's bytes (``tests/fused_checks.py``); the exact sums' tiles too."""

from __future__ import annotations

import pytest

pytest.importorskip("torch")
pytest.importorskip("triton")


@pytest.mark.parametrize(
    "check",
    ["merges", "histogram_merges", "linear_merges", "vectors_merges", "streamed", "sums_tiles", "nearswap"],
)
def test_the_kernels_give_the_numba_bytes_under_the_interpreter(check: str, interpreted: dict[str, str]) -> None:
    assert interpreted[check] == "ok", interpreted[check]
