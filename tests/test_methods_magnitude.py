"""TIES, breadcrumbs, breadcrumbs_ties, della and della_linear end to end: bit-identical to the
naive dense reference (tests/reference_magnitude.py: full stable sorts), in both trim scopes,
with exact ties at the thresholds, at the density edges and with zero task vectors, whatever the
block size, thread count or resume point. Families are real safetensors files on disk.
"""

from __future__ import annotations

import re
from collections.abc import Iterator
from contextlib import suppress
from pathlib import Path
from typing import Any

import numba
import numpy as np
import pytest
from hypothesis import HealthCheck, example, given, settings
from hypothesis import strategies as st

from ramstream.api import MergeResult, merge
from ramstream.backends.numba.addresses import addresses_of
from ramstream.backends.numba.codecs import F32
from ramstream.backends.numba.della import RADIX, probability_table, prune_scratch, prune_slice, sort_pairs
from ramstream.config import RunOptions
from ramstream.errors import ConfigError
from ramstream.index.store import open_index_store
from ramstream.methods.registry import method_names
from ramstream.statistics import context
from ramstream.statistics.magnitude import AbsHighHistogram
from tests import reference_magnitude as ref
from tests.checks import Interrupted, assert_bit_identical, interrupted_after
from tests.families import DEFAULT_SHAPES, Family, build_family, decode, encode, read_model_dir, write_safetensors

# Odd sizes, a scalar, an empty tensor, a 3-D tensor (DELLA ranks along dim 1 of each slice) and a
# 5120-element tensor that spans several kernel tiles (so two threads split it).
SHAPES: dict[str, tuple[int, ...]] = {
    **DEFAULT_SHAPES,
    "model.layers.1.mlp.down_proj.weight": (64, 80),
    "model.layers.0.self_attn.q_proj.bias": (37,),
    "model.layers.1.mlp.gate_proj.weight": (7, 13),
    "model.layers.1.conv.weight": (6, 5, 7),
    "model.layers.1.scale": (),
    "model.layers.1.empty": (0, 4),
}
N = 4  # three sparse agents and one equal to the base (a zero task vector)
DENSITY = [0.2, 0.05, 0.6, 0.3]


@pytest.fixture(scope="module")
def family(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Family]:
    root = tmp_path_factory.mktemp("magnitude")
    yield build_family(root, identical_agent=True, int_tensor=True, shards=2, shapes=SHAPES, seed=7)
    numba.set_num_threads(numba.config.NUMBA_NUM_THREADS)  # type: ignore[attr-defined]


@pytest.fixture(scope="module")
def tied(tmp_path_factory: pytest.TempPathFactory) -> Family:
    """Task vectors in {0, +-1/8, +-1/4, +-1/2} over bases on the 1/8 grid (exact in bf16): every
    threshold falls inside a run of hundreds of equal |tau|."""
    root = tmp_path_factory.mktemp("tied")
    rng = np.random.default_rng(0)
    shapes = {"t.a": (64, 40), "t.b": (1000,), "t.c": (33, 31)}
    fam = Family(root / "base", [], agent_values=[{} for _ in range(3)])
    base_raw: dict[str, tuple[str, tuple[int, ...], np.ndarray]] = {}
    agent_raw: list[dict[str, tuple[str, tuple[int, ...], np.ndarray]]] = [{} for _ in range(3)]
    for name, shape in shapes.items():
        n = int(np.prod(shape))
        base = (rng.integers(-16, 17, n) / 8).astype(np.float32)
        base_raw[name] = ("BF16", shape, encode(base, "BF16"))
        fam.base_values[name], fam.dtypes[name], fam.shapes[name] = base, "BF16", shape
        for t in range(3):
            steps = rng.choice([0, 1, -1, 2, -2, 4, -4], n, p=[0.3, 0.15, 0.15, 0.15, 0.15, 0.05, 0.05])
            raw = encode((base + steps / 8).astype(np.float32), "BF16")
            agent_raw[t][name] = ("BF16", shape, raw)
            fam.agent_values[t][name] = decode(raw, "BF16")
    for path, tensors in [(fam.base, base_raw), *((root / f"agent{t}", agent_raw[t]) for t in range(3))]:
        path.mkdir()
        write_safetensors(path / "model.safetensors", tensors)
    fam.agents = [root / f"agent{t}" for t in range(3)]
    return fam


def _merge(fam: Family, out: Path, method: str, opts: dict[str, Any], block_elems: int = 640, **kw: Any) -> MergeResult:
    options = RunOptions(
        cache_dir=kw.pop("cache", fam.base.parent / "cache"), quiet=True, block_elems=block_elems, **kw
    )
    return merge(fam.base, [str(a) for a in fam.agents], out=out, method=method, method_options=opts, options=options)


def test_methods_are_registered() -> None:
    assert {"ties", "breadcrumbs", "breadcrumbs_ties", "della", "della_linear"} <= set(method_names())


MAGNITUDE_CASES: list[tuple[str, dict[str, Any]]] = [
    ("ties", {"density": 0.2}),
    ("ties", {"density": 0.2, "trim_scope": "model"}),
    ("ties", {"density": DENSITY, "weights": [1.0, 0.5, 2.0, 1.0], "lambda": 0.8, "rescale": True}),
    ("ties", {"density": DENSITY, "trim_scope": "model", "rescale": True, "normalize": False}),
    ("breadcrumbs", {"density": 0.3, "gamma": 0.05}),
    ("breadcrumbs", {"density": 0.5, "gamma": [0.1, 0.0, 0.3, 0.1], "trim_scope": "model"}),
    ("breadcrumbs_ties", {"density": DENSITY, "rescale": "l1", "weights": [0.5, 1.0, -0.25, 1.0]}),
    ("breadcrumbs_ties", {"density": 0.4, "trim_scope": "model", "normalize": True, "lambda": 1.5}),
]


def _reference(fam: Family, method: str, opts: dict[str, Any]) -> ref.Output:
    kw = {"lam" if k == "lambda" else k: v for k, v in opts.items()}
    if method.startswith("della"):
        return ref.della_merge(fam, method, **kw)[0]
    return ref.magnitude_merge(fam, method, **kw)


@pytest.mark.parametrize(("method", "opts"), MAGNITUDE_CASES)
def test_magnitude_matches_reference(family: Family, tmp_path: Path, method: str, opts: dict[str, Any]) -> None:
    result = _merge(family, tmp_path / "out", method, opts)
    assert_bit_identical(tmp_path / "out", _reference(family, method, opts))
    density = opts["density"] if isinstance(opts["density"], list) else [opts["density"]] * N
    gamma = opts.get("gamma", 0.01)
    gamma = gamma if isinstance(gamma, list) else [gamma] * N
    masks = ref.magnitude_masks(
        family, "ties" if method == "ties" else "breadcrumbs", density, gamma, opts.get("trim_scope", "tensor")
    )
    total = sum(m[0].size for m in masks.values())
    kept = tuple(sum(int(m[t].sum()) for m in masks.values()) / total for t in range(N))
    assert result.per_agent["kept"] == pytest.approx(kept, rel=1e-12)


DELLA_CASES: list[tuple[str, dict[str, Any]]] = [
    ("della", {"density": 0.4}),
    ("della", {"density": DENSITY, "epsilon": [0.1, 0.02, 0.3, 0.15], "rescale": "inverse", "seed": 3}),
    ("della_linear", {"density": 0.5, "epsilon": 0.2, "weights": [1.0, -0.5, 2.0, 1.0], "rescale": "none"}),
    ("della_linear", {"density": [1.0, 0.3, 0.0, 0.5], "lambda": 0.7, "normalize": True, "seed": 11}),
]


@pytest.mark.parametrize(("method", "opts"), DELLA_CASES)
def test_della_matches_reference(family: Family, tmp_path: Path, method: str, opts: dict[str, Any]) -> None:
    _merge(family, tmp_path / "out", method, opts, block_elems=192)
    assert_bit_identical(tmp_path / "out", _reference(family, method, opts))


def _splits_a_tie_run(magnitudes: np.ndarray, k: int) -> bool:
    """True when the top k by magnitude keep some, but not all, of the elements equal to the k-th."""
    v = np.sort(magnitudes)[::-1][k - 1]
    return int((magnitudes > v).sum()) < k - 1 and k < int((magnitudes >= v).sum())


@pytest.mark.parametrize("density", [1e-4, 0.37, 0.66])
@pytest.mark.parametrize(("method", "scope"), [("ties", "tensor"), ("ties", "model"), ("breadcrumbs", "model")])
def test_exact_ties_at_the_threshold(tied: Family, tmp_path: Path, density: float, method: str, scope: str) -> None:
    """The index is built with 512-element blocks and the merge runs with 192: merge blocks start
    inside index blocks, so the ties that precede a block are counted from the data."""
    opts: dict[str, Any] = {"density": density, "trim_scope": scope}
    if method == "breadcrumbs":
        opts["gamma"] = 0.1
    tau = ref.task_vectors(tied, "t.a")[0]
    if density > 0.01:
        assert _splits_a_tie_run(np.abs(tau), int(density * tau.size))
    cache = tmp_path / "cache"
    _merge(tied, tmp_path / "first", method, opts, block_elems=512, cache=cache)
    _merge(tied, tmp_path / "out", method, opts, block_elems=192, cache=cache, threads=2)
    expected = _reference(tied, method, opts)
    assert_bit_identical(tmp_path / "first", expected)
    assert_bit_identical(tmp_path / "out", expected)


def test_ties_keeps_the_lowest_index_ties(tied: Family, tmp_path: Path) -> None:
    """One agent, weight 1, no normalize: the output changes exactly where an element is kept."""
    fam = Family(tied.base, tied.agents[:1], tied.base_values, tied.agent_values[:1], tied.dtypes, tied.shapes)
    _merge(fam, tmp_path / "out", "ties", {"density": 0.37, "normalize": False})
    got = read_model_dir(tmp_path / "out")
    tau = np.abs(ref.task_vectors(fam, "t.b")[0])
    kept = np.flatnonzero(got["t.b"][2] != encode(fam.base_values["t.b"], "BF16"))
    k = int(0.37 * tau.size)
    threshold = np.sort(tau)[::-1][k - 1]
    ties = np.flatnonzero(tau == threshold)
    n_kept_ties = k - int((tau > threshold).sum())
    assert 0 < n_kept_ties < len(ties)
    assert sorted(kept) == sorted([*np.flatnonzero(tau > threshold), *ties[:n_kept_ties]])


@pytest.mark.parametrize(
    ("method", "opts"),
    [
        ("ties", {"density": 1.0}),
        ("ties", {"density": 0.0}),
        ("ties", {"density": 1e-6}),  # k = 1 per tensor
        ("ties", {"density": 1e-6, "trim_scope": "model", "rescale": True}),
        ("breadcrumbs", {"density": 1.0}),
        ("breadcrumbs_ties", {"density": 0.0, "rescale": True}),
        ("breadcrumbs", {"density": 1e-3, "gamma": 0.0}),
        ("della", {"density": 1.0}),
        ("della_linear", {"density": 0.0}),
    ],
)
def test_density_edges(family: Family, tmp_path: Path, method: str, opts: dict[str, Any]) -> None:
    _merge(family, tmp_path / "out", method, opts)
    assert_bit_identical(tmp_path / "out", _reference(family, method, opts))


@settings(max_examples=30, deadline=None)
@given(st.lists(st.sampled_from([0, 1, 7, 0x3C000000, 0x3C000001, 0x7F7FFFFF, 2048, 4096 * 2048]), max_size=300))
def test_della_rank_order_is_a_stable_sort(keys: list[int]) -> None:
    """Rows shorter than 64 sort packed (key, index) pairs, longer ones by radix: both stable."""
    values = np.array(keys, np.uint32)
    n = len(values)
    packed = (values.astype(np.uint64) << np.uint64(32)) | np.arange(n, dtype=np.uint64)
    ordered = sort_pairs(packed, np.empty(n, np.uint64), np.empty(RADIX, np.int64))
    order = (ordered & np.uint64(0xFFFFFFFF)).astype(np.int64)
    np.testing.assert_array_equal(order, np.argsort(values, kind="stable"))


# |tau| values with many exact ties, all equal (one bucket holds every key: more undecided draws
# than the merge ranks exactly, so it sorts), or spread over binades.
_MAGNITUDES = st.one_of(
    st.builds(lambda n, v: [v] * n, st.integers(1, 400), st.sampled_from([0.25, 3.0])),
    st.lists(st.sampled_from([0.0, 0.0, 1e-3, 1e-3 + 2**-30, 0.5, 3.0]), min_size=1, max_size=400),
    st.lists(st.floats(0, 8, width=32) | st.just(0.0), min_size=1, max_size=400),
)


@settings(max_examples=60, deadline=None)
@example(magnitudes=[0.25] * 400, inner=1, lo=0.25, width=0.4375, inverse=False, seed=3)  # sorts
@given(
    magnitudes=_MAGNITUDES,
    inner=st.sampled_from([1, 3]),
    lo=st.floats(0.0625, 0.5, width=32),
    width=st.floats(0.0, 0.4375, width=32),
    inverse=st.booleans(),
    seed=st.integers(0, 2**63),
)
def test_della_merge_keep_values_are_the_ranked_ones(
    magnitudes: list[float], inner: int, lo: float, width: float, inverse: bool, seed: int
) -> None:
    """The merge's keep values (most draws decided by a bucket of ranks, the rest by the exact
    rank, or by a sort when too many are left) equal those of the full stable sort wherever tau
    is nonzero (a zero tau gets 0 there: it adds nothing to a merge)."""
    rows = max(1, len(magnitudes) // inner)
    size = rows * inner
    signs = np.where(np.arange(size) % 3 == 0, -1, 1).astype(np.float32)
    agent = (np.resize(np.array(magnitudes, np.float32), size) * signs).astype(np.float32)
    base = np.zeros(size, np.float32)
    keys, mode = np.array([seed], np.uint64), np.zeros(1, np.int64)
    lows, widths = np.array([lo], np.float32), np.array([width], np.float32)
    codes = np.array([F32], np.int64)

    def keep(merging: bool) -> np.ndarray:
        out = np.full((1, size), np.nan, np.float32)
        table = probability_table(rows, lows, widths)
        prune_slice(
            base.ctypes.data, F32, addresses_of([agent], size), codes, 5, 0, size, rows, keys, mode, lows, widths,
            inverse, out, 0, merging, table, prune_scratch(size, rows),
        )  # fmt: skip
        return out[0]

    ranked, merged = keep(False), keep(True)
    nonzero = agent != 0
    np.testing.assert_array_equal(merged[nonzero].view(np.uint32), ranked[nonzero].view(np.uint32))
    assert not merged[~nonzero].any()


@pytest.fixture(scope="module")
def dense(tmp_path_factory: pytest.TempPathFactory) -> Family:
    """One float32 agent that changes every element (so kept <=> the output differs from the base)."""
    shapes = {"w": (256, 256), "v": (4096,)}
    return build_family(tmp_path_factory.mktemp("dense"), densities=(1.0,), dtype="F32", shapes=shapes, seed=5)


def test_della_keeps_density_on_average_and_more_of_the_largest(dense: Family, tmp_path: Path) -> None:
    density, epsilon = 0.4, 0.2
    opts = {"density": density, "epsilon": epsilon, "rescale": "none", "normalize": False}
    _merge(dense, tmp_path / "out", "della_linear", opts, block_elems=4096)
    got = read_model_dir(tmp_path / "out")
    kept = got["w"][2].reshape(256, 256) != dense.base_values["w"].reshape(256, 256)
    assert abs(kept.mean() - density) < 0.01  # 65536 draws: sigma ~ 0.002
    ranks = np.argsort(np.argsort(np.abs(ref.task_vectors(dense, "w")[0]).reshape(256, 256), axis=1), axis=1)
    top, bottom = kept[ranks >= 192].mean(), kept[ranks < 64].mean()
    # p rises linearly with the rank: about density +- 0.75 epsilon in the top and bottom quarters
    assert abs(top - (density + 0.75 * epsilon)) < 0.02
    assert abs(bottom - (density - 0.75 * epsilon)) < 0.02
    assert_bit_identical(tmp_path / "out", _reference(dense, "della_linear", opts))


def test_della_seed_decides_the_draws(family: Family, tmp_path: Path) -> None:
    opts = {"density": 0.4, "seed": 5}
    _merge(family, tmp_path / "a", "della", opts)
    _merge(family, tmp_path / "b", "della", opts, block_elems=64, threads=1)
    _merge(family, tmp_path / "c", "della", {**opts, "seed": 6})
    a, b, c = (read_model_dir(tmp_path / x) for x in "abc")
    name = "model.embed_tokens.weight"
    assert all(a[k][2].tobytes() == b[k][2].tobytes() for k in a)
    assert a[name][2].tobytes() != c[name][2].tobytes()


def test_statistics_are_cached_in_the_index(family: Family, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    cache = tmp_path / "cache"
    _merge(family, tmp_path / "a", "ties", {"density": 0.2}, cache=cache)
    (index,) = [p for p in cache.rglob("zarr.json") if (p.parent / "stats").is_dir()]
    store = open_index_store(index.parent, read_only=True)
    assert store.statistic_complete("abs_hi16_v1")
    assert any(k.startswith("abs_lo16_v1-") for k in store.group.attrs["statistics"])  # type: ignore[union-attr]
    calls = []
    monkeypatch.setattr(AbsHighHistogram, "compute", lambda *a: calls.append(a))
    _merge(family, tmp_path / "b", "breadcrumbs", {"density": 0.2}, cache=cache)
    assert calls == []


@pytest.mark.parametrize("scope", ["model", "tensor"])
def test_partials_read_in_windows_of_any_size_give_the_same_bytes(
    family: Family, tmp_path: Path, monkeypatch: pytest.MonkeyPatch, scope: str
) -> None:
    """The statistics are walked a bounded window of whole units at a time, across tensors: one
    unit per read (a tensor's blocks summed across reads) or windows that end inside tensors give
    the bytes of the default windows; every statistic of breadcrumbs-TIES with an L1 rescale (both
    histograms, the tie boundaries, the kept sums) is read so. In tensor scope the low histogram
    is walked once, a tensor's cuts refined at its last block (its earlier blocks read again
    where a window began inside it)."""
    opts = {"density": 0.2, "trim_scope": scope, "rescale": "l1"}
    read = context.StatsContext.partials
    outputs: list[dict[str, Any]] = []
    reads: list[int] = []
    for name, read_bytes in (("default", context.READ_BYTES), ("one unit", 1), ("windows", 3 << 20)):
        count = [0]

        def counted(
            self: context.StatsContext,
            stat: Any,
            blocks: range,
            window: Any = None,
            keep: bool = True,
            count: list[int] = count,
        ) -> Any:
            count[0] += 1
            return read(self, stat, blocks, window, keep)

        monkeypatch.setattr(context, "READ_BYTES", read_bytes)
        monkeypatch.setattr(context.StatsContext, "partials", counted)
        _merge(family, tmp_path / name / "out", "breadcrumbs_ties", opts, cache=tmp_path / name)
        reads.append(count[0])
        if outputs:
            assert_bit_identical(tmp_path / name / "out", outputs[0])
        outputs.append(read_model_dir(tmp_path / name / "out"))
    assert reads[0] < reads[2] < reads[1], reads  # the windows are what differ


@pytest.mark.parametrize(
    ("method", "opts", "message"),
    [
        ("ties", {"gamma": 0.1}, "--gamma has no effect with --method ties"),
        ("ties", {"seed": 1}, "--seed has no effect"),
        ("della", {"trim_scope": "model"}, "--trim-scope has no effect"),
        ("breadcrumbs", {"epsilon": 0.1}, "--epsilon has no effect"),
        ("ties", {"density": 1.5}, "--density must lie in"),
        ("ties", {"density": [0.1, 0.2]}, "one value per agent"),
        ("breadcrumbs", {"gamma": -0.1}, "--gamma must lie in"),
        ("ties", {"trim_scope": "layer"}, "--trim-scope must be tensor or model"),
        ("ties", {"rescale": "inverse"}, "--rescale must be l1 or none"),
        ("della", {"density": 0.1}, "density - epsilon and density + epsilon must lie in (0, 1)"),
        ("della_linear", {"density": 0.9, "epsilon": 0.1}, "must lie in (0, 1)"),
        ("della", {"rescale": "l2"}, "--rescale must be l1, inverse or none"),
        ("della", {"seed": -1}, "--seed must be an integer"),
        ("della", {"epsilon": 1.5}, "--epsilon must lie in"),
    ],
)
def test_options_are_validated(family: Family, tmp_path: Path, method: str, opts: dict[str, Any], message: str) -> None:
    with pytest.raises(ConfigError, match=re.escape(message)):
        _merge(family, tmp_path / "out", method, opts)


PROPERTY_CASES: dict[str, tuple[str, dict[str, Any]]] = {
    "ties": ("ties", {"density": DENSITY, "rescale": True}),
    "ties-model": ("ties", {"density": 0.3, "trim_scope": "model"}),
    "breadcrumbs": ("breadcrumbs", {"density": 0.4, "gamma": 0.05}),
    "breadcrumbs_ties-model": ("breadcrumbs_ties", {"density": DENSITY, "trim_scope": "model", "rescale": True}),
    "della": ("della", {"density": 0.4, "seed": 2}),
    "della_linear": ("della_linear", {"density": [0.2, 0.3, 0.6, 0.5], "epsilon": 0.1, "rescale": "inverse"}),
}


@pytest.fixture(scope="module")
def references(family: Family) -> dict[str, ref.Output]:
    return {case: _reference(family, *PROPERTY_CASES[case]) for case in PROPERTY_CASES}


@pytest.mark.parametrize("case", list(PROPERTY_CASES))
@settings(max_examples=6, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(
    block_elems=st.integers(2, 40).map(lambda k: 64 * k),
    threads=st.sampled_from([1, 2]),
    interrupt=st.one_of(st.none(), st.integers(0, 60)),
    resume_block_elems=st.integers(2, 40).map(lambda k: 64 * k),
)
def test_bytes_do_not_depend_on_blocks_threads_or_resume(
    family: Family,
    references: dict[str, ref.Output],
    tmp_path_factory: pytest.TempPathFactory,
    case: str,
    block_elems: int,
    threads: int,
    interrupt: int | None,
    resume_block_elems: int,
) -> None:
    """A fresh index per example; an interrupted run (in a statistics pass or the merge) resumes
    with another block size, so merge blocks and index blocks are cut differently."""
    root = tmp_path_factory.mktemp("prop")
    method, opts = PROPERTY_CASES[case]

    def run(elems: int) -> None:
        _merge(family, root / "out", method, opts, block_elems=elems, cache=root / "cache", threads=threads)

    if interrupt is not None:
        with interrupted_after(interrupt), suppress(Interrupted):
            run(block_elems)
        run(resume_block_elems)
    else:
        run(block_elems)
    assert_bit_identical(root / "out", references[case])
