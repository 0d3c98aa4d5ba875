"""The fused GTA merges (task arithmetic, TIES, breadcrumbs, DARE, model_stock and its Gram sums,
DELLA with its MAGPRUNE), DARE's exact sums and SCE through the API under triton's interpreter give
the Numba backend's bytes (``tests/fused_checks.py``; DELLA's and SCE's tiles too): the longest
checks, in a file of their own."""

from __future__ import annotations

import pytest

pytest.importorskip("torch")
pytest.importorskip("triton")


@pytest.mark.parametrize("check", ["gta_merges", "sums_merges", "della", "sce"])
def test_the_kernels_give_the_numba_bytes_under_the_interpreter(check: str, interpreted: dict[str, str]) -> None:
    assert interpreted[check] == "ok", interpreted[check]
