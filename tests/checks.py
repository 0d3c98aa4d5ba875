"""Assertions and interruptions shared by the merge tests."""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

import numpy as np
import pytest

from ramstream.index.journal import Journal
from tests.families import read_model_dir


def assert_bit_identical(out: Path, expected: dict[str, tuple[str, tuple[int, ...], np.ndarray]]) -> None:
    """Every tensor of the model directory ``out`` has ``expected``'s dtype, shape and bytes."""
    got = read_model_dir(out)
    assert sorted(got) == sorted(expected)
    for name, (dtype, shape, raw) in expected.items():
        g_dtype, g_shape, g_raw = got[name]
        assert (g_dtype, g_shape) == (dtype, shape), name
        if g_raw.tobytes() != raw.tobytes():
            a = g_raw.view(np.uint8).reshape(raw.size, -1)  # both non-empty: their bytes differ
            b = np.ascontiguousarray(raw).view(np.uint8).reshape(raw.size, -1)
            bad = np.flatnonzero((a != b).any(axis=-1))
            pytest.fail(f"{name}: {len(bad)} of {raw.size} elements differ, first at {list(bad[:5])}")


class Interrupted(Exception):
    """Stands for a kill: raised instead of marking the n-th block done (its data is written)."""


@contextmanager
def interrupted_after(marks: int) -> Iterator[None]:
    original = Journal.mark
    seen = [0]

    def mark(self: Journal, block: int) -> None:
        seen[0] += 1
        if seen[0] > marks:
            raise Interrupted
        original(self, block)

    with pytest.MonkeyPatch.context() as patch:
        patch.setattr(Journal, "mark", mark)
        yield
