"""``Backend.has_nonfinite``: the check every merged block gets, against numpy's ``isfinite`` of
the decoded block, for every output format, both signs of Inf and NaN, and the largest finite
values (one exponent bit short of Inf)."""

from __future__ import annotations

import numpy as np
import pytest

from ramstream.backends.registry import make_backend
from ramstream.format import codecs
from ramstream.format.dtypes import RAW_CARRIER, FloatCode

SPECIALS = (np.inf, -np.inf, np.nan, -np.nan)


@pytest.fixture(params=["numba", "torch"])
def backend(request: pytest.FixtureRequest):  # type: ignore[no-untyped-def]
    if request.param == "torch":
        pytest.importorskip("torch")
    made = make_backend(request.param, threads=2, device="cpu" if request.param == "torch" else None)
    yield made
    made.close()


@pytest.mark.parametrize("code", list(FloatCode))
@pytest.mark.parametrize("size", [0, 1, 7, 70_001])
def test_has_nonfinite_agrees_with_isfinite(backend, code: FloatCode, size: int) -> None:  # type: ignore[no-untyped-def]
    rng = np.random.default_rng(size + int(code))
    carrier = RAW_CARRIER[code]
    largest = np.finfo(np.float16).max if code == FloatCode.F16 else 3.3e38
    values = rng.uniform(-largest, largest, size).astype(np.float32)
    if size:
        values[rng.integers(size)] = largest  # finite: must not count
        values[rng.integers(size)] = -largest
    raw = codecs.encode(values, code).view(carrier)
    assert backend.has_nonfinite(raw, int(code)) is (not np.isfinite(codecs.decode(raw, code)).all())
    for special in SPECIALS if size else ():
        bad = values.copy()
        bad[rng.integers(size)] = special
        raw = codecs.encode(bad, code).view(carrier)
        assert backend.has_nonfinite(raw, int(code)), (code, special)
