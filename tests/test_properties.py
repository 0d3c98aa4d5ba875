"""Execution details never change results: block size, thread count, the memory budget and the
backend leave every output byte and every index statistic as they were."""

from __future__ import annotations

from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from ramstream.api import merge, probe
from ramstream.config import RunOptions
from ramstream.index.store import IndexStore
from ramstream.methods.report import agent_reports
from ramstream.statistics.overlap import per_tensor
from tests import reference as ref
from tests.families import DEFAULT_SHAPES, Family, build_family
from tests.test_backends import installed_backends

# A tensor of 5120 elements spans several 2048-element kernel tiles (so threads split it), and
# odd sizes end blocks mid-byte.
SHAPES: dict[str, tuple[int, ...]] = {
    **DEFAULT_SHAPES,
    "model.layers.1.mlp.down_proj.weight": (64, 80),
    "model.layers.1.self_attn.o_proj.bias": (37,),
    "model.layers.1.mlp.gate_proj.weight": (7, 13),
}

SETTINGS = settings(max_examples=15, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
BLOCKS = st.integers(1, 64).map(lambda k: 64 * k)
THREADS = st.sampled_from([1, 2])
BACKENDS = st.sampled_from(installed_backends())
MEMORY = st.integers(16 * 1024**2, 8 * 1024**3)


@dataclass(frozen=True)
class Baseline:
    family: Family
    cache: Path
    files: dict[str, bytes]  # every file of the merged output directory
    reports: list[object]
    overlap: np.ndarray
    coverage: np.ndarray
    masks: dict[int, np.ndarray]


def _agents(family: Family) -> list[str]:
    return [str(a) for a in family.agents]


def _stats(store: IndexStore) -> tuple[list[object], np.ndarray, np.ndarray, dict[int, np.ndarray]]:
    tensors = per_tensor(store.plan, *store.block_stats())
    masks = {i: store.tensor_mask(i) for i, t in enumerate(store.plan.tensors) if t.merged}
    return list(agent_reports(store)), tensors.overlap, tensors.coverage, masks


def _files(out: Path) -> dict[str, bytes]:
    return {str(p.relative_to(out)): p.read_bytes() for p in sorted(out.rglob("*")) if p.is_file()}


@pytest.fixture(scope="module")
def baseline(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Baseline]:
    root = tmp_path_factory.mktemp("properties")
    family = build_family(
        root / "family", shapes=SHAPES, subset_agent=True, identical_agent=True, int_tensor=True, shards=3, seed=11
    )
    cache = root / "cache"
    options = RunOptions(cache_dir=cache, quiet=True, block_elems=128, threads=1)
    merge(family.base, _agents(family), out=root / "out", options=options)
    store = probe(family.base, _agents(family), options=options)
    reports, overlap, coverage, masks = _stats(store)
    # the baseline itself is right: same counts as the dense reference
    expected = ref.model_counts(family, 1e-5)
    assert [r.overlap for r in reports] == [tuple(int(x) for x in row) for row in expected.overlap]  # type: ignore[attr-defined]
    yield Baseline(family, cache, _files(root / "out"), reports, overlap, coverage, masks)


@SETTINGS
@given(block_elems=BLOCKS, threads=THREADS, backend=BACKENDS)
def test_probe_statistics_do_not_depend_on_blocks_threads_or_backend(
    baseline: Baseline, tmp_path_factory: pytest.TempPathFactory, block_elems: int, threads: int, backend: str
) -> None:
    cache = tmp_path_factory.mktemp("cache")  # a fresh index, probed with these blocks
    options = RunOptions(cache_dir=cache, quiet=True, block_elems=block_elems, threads=threads, backend=backend)
    store = probe(baseline.family.base, _agents(baseline.family), options=options)
    assert store.plan.block_elems == block_elems
    reports, overlap, coverage, masks = _stats(store)
    assert reports == baseline.reports
    np.testing.assert_array_equal(overlap, baseline.overlap)
    np.testing.assert_array_equal(coverage, baseline.coverage)
    assert masks.keys() == baseline.masks.keys()
    for i, packed in masks.items():
        np.testing.assert_array_equal(packed, baseline.masks[i])


@SETTINGS
@given(
    block_elems=st.one_of(st.none(), BLOCKS),
    memory=MEMORY,
    threads=THREADS,
    fresh_index=st.booleans(),
    backend=BACKENDS,
)
def test_merge_bytes_do_not_depend_on_blocks_threads_memory_or_backend(
    baseline: Baseline,
    tmp_path_factory: pytest.TempPathFactory,
    block_elems: int | None,
    memory: int,
    threads: int,
    fresh_index: bool,
    backend: str,
) -> None:
    """With block_elems None the block size comes from the memory budget."""
    cache = tmp_path_factory.mktemp("cache") if fresh_index else baseline.cache
    out = tmp_path_factory.mktemp("merged") / "out"
    options = RunOptions(
        cache_dir=cache, quiet=True, block_elems=block_elems, threads=threads, memory=memory, backend=backend
    )
    merge(baseline.family.base, _agents(baseline.family), out=out, options=options)
    files = _files(out)
    assert files.keys() == baseline.files.keys()
    for name, data in files.items():
        assert data == baseline.files[name], name
