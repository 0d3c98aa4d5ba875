"""The fused kernels through the API (and the streamed loop on the simulated device) under triton's
interpreter give the Numba backend's bytes (``tests/fused_checks.py``); SCE's and DELLA's tiles too."""

from __future__ import annotations

from pathlib import Path

import pytest

from tests.fused_interpreter import run_check

pytest.importorskip("torch")
pytest.importorskip("triton")


@pytest.mark.parametrize(
    "check",
    ["merges", "histogram_merges", "linear_merges", "vectors_merges", "streamed", "sums_tiles", "sce", "della"],
)
def test_the_kernels_give_the_numba_bytes_under_the_interpreter(check: str, tmp_path: Path) -> None:
    run_check(check, tmp_path)
