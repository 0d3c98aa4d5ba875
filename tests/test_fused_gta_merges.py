"""The fused GTA merges (task arithmetic, TIES, breadcrumbs, DARE, model_stock) and DARE's exact sums
through the API under triton's interpreter give the Numba backend's bytes (``tests/fused_checks.py``):
the two longest checks, in a file of their own."""

from __future__ import annotations

from pathlib import Path

import pytest

from tests.fused_interpreter import run_check

pytest.importorskip("torch")
pytest.importorskip("triton")


@pytest.mark.parametrize("check", ["gta_merges", "sums_merges"])
def test_the_kernels_give_the_numba_bytes_under_the_interpreter(check: str, tmp_path: Path) -> None:
    run_check(check, tmp_path)
