"""Baseline methods end to end: linear, task arithmetic, DARE (linear / TIES) and model stock are
bit-identical to the naive dense reference (tests/reference_baselines.py), whatever the block
size, thread count or resume point. Families are real bf16 safetensors files on disk, read back
with the test-side reader.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import numba
import numpy as np
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from ramstream.api import merge
from ramstream.config import RunOptions
from ramstream.errors import ConfigError, NonFiniteWeightError
from ramstream.methods.model_stock import interpolation
from ramstream.methods.registry import method_names
from tests import reference_baselines as ref
from tests.checks import Interrupted, assert_bit_identical, interrupted_after
from tests.families import (
    DEFAULT_SHAPES,
    Family,
    build_family,
    read_model_dir,
    read_safetensors,
    write_safetensors,
)

# Odd sizes, a scalar, an empty tensor, and a 5120-element tensor that spans several kernel
# tiles (so two threads split it).
SHAPES: dict[str, tuple[int, ...]] = {
    **DEFAULT_SHAPES,
    "model.layers.1.mlp.down_proj.weight": (64, 80),
    "model.layers.0.self_attn.q_proj.bias": (37,),
    "model.layers.1.mlp.gate_proj.weight": (7, 13),
    "model.layers.1.scale": (),
    "model.layers.1.empty": (0, 4),
}
N = 5  # three sparse agents, one with no unique element, one equal to the base (zero task vector)
WEIGHTS = [0.5, 2.0, -0.25, 1.0, 0.3]
DENSITY = [0.5, 0.3, 0.9, 1.0, 0.2]


@pytest.fixture(scope="module")
def family(tmp_path_factory: pytest.TempPathFactory) -> Family:
    root = tmp_path_factory.mktemp("baselines")
    return build_family(root, subset_agent=True, identical_agent=True, int_tensor=True, shards=2, shapes=SHAPES)


@pytest.fixture(scope="module")
def pair(tmp_path_factory: pytest.TempPathFactory) -> Family:
    """Two agents: the fewest model stock accepts."""
    root = tmp_path_factory.mktemp("pair")
    return build_family(root, densities=(0.3, 0.6), seed=3)


def _merge(fam: Family, out: Path, method: str, block_elems: int = 128, cache: Path | None = None, **kw: Any) -> Any:
    options = RunOptions(cache_dir=cache or fam.base.parent / "cache", quiet=True, block_elems=block_elems)
    return merge(fam.base, [str(a) for a in fam.agents], out=out, method=method, options=options, **kw)


def test_methods_are_registered() -> None:
    assert {"linear", "task_arithmetic", "dare_linear", "dare_ties", "model_stock"} <= set(method_names())


def test_family_covers_the_cases(family: Family) -> None:
    zero = [
        all(not tau.any() for tau in (ref.task_vectors(family, n)[t] for n in family.base_values)) for t in range(N)
    ]
    assert zero == [False, False, False, False, True]


# -- bit-identical to the reference ------------------------------------------------------------


LINEAR_CASES: list[dict[str, Any]] = [
    {},
    {"weights": WEIGHTS},
    {"weights": WEIGHTS, "normalize": False},
    {"weights": 0.1, "base_weight": 0.7},
    {"weights": [1.0, -1.0, 0.5, 0.0, 2.0], "base_weight": 1.0, "normalize": False},
]


@pytest.mark.parametrize("case", range(len(LINEAR_CASES)))
def test_linear_matches_reference(family: Family, tmp_path: Path, case: int) -> None:
    opts = LINEAR_CASES[case]
    _merge(family, tmp_path / "out", "linear", 128 + 64 * (case % 2), method_options=opts)
    weights = opts.get("weights", 1.0)
    weights = weights if isinstance(weights, list) else [weights] * N
    expected = ref.linear(family, weights, opts.get("base_weight", 0.0), opts.get("normalize", True))
    assert_bit_identical(tmp_path / "out", expected)


TA_CASES: list[dict[str, Any]] = [
    {},
    {"weights": WEIGHTS, "lambda": 0.6},
    {"weights": WEIGHTS, "lambda": 1.7, "normalize": True},
    {"weights": [1.0, -1.0, 0.0, 0.0, 0.0], "normalize": True},  # weights sum to 0: divisor 1
]


@pytest.mark.parametrize("case", range(len(TA_CASES)))
def test_task_arithmetic_matches_reference(family: Family, tmp_path: Path, case: int) -> None:
    opts = TA_CASES[case]
    out_dtype = ("auto", "f32")[case % 2]
    _merge(family, tmp_path / "out", "task_arithmetic", 128 + 64 * (case % 2), method_options=opts, out_dtype=out_dtype)
    weights = opts.get("weights", [1.0] * N)
    expected = ref.task_arithmetic(family, weights, opts.get("lambda", 1.0), opts.get("normalize", False), out_dtype)
    assert_bit_identical(tmp_path / "out", expected)


DARE_CASES: list[dict[str, Any]] = [
    {"density": DENSITY, "seed": 7},  # l1, mergekit's default rescale
    {"density": 0.4, "seed": 3, "rescale": "inverse", "lambda": 1.3},
    {"density": DENSITY, "rescale": "none", "weights": WEIGHTS, "normalize": True},
    {"density": 0.25, "seed": 11, "weights": WEIGHTS, "normalize": True, "lambda": 0.8},
    {"density": [0.7, 0.2, 0.5, 0.6, 1.0], "seed": 7, "rescale": True, "weights": [1.0, 1.0, -1.0, 0.0, 1.0]},
    {},  # density 1: no drop, no rescale
]


@pytest.mark.parametrize("method", ["dare_linear", "dare_ties"])
@pytest.mark.parametrize("case", range(len(DARE_CASES)))
def test_dare_matches_reference(family: Family, tmp_path: Path, method: str, case: int) -> None:
    opts = DARE_CASES[case]
    out_dtype = ("auto", "f16", "f32")[case % 3]
    _merge(family, tmp_path / "out", method, 128 + 64 * (case % 2), method_options=opts, out_dtype=out_dtype)
    density = opts.get("density", 1.0)
    rescale = {True: "l1", False: "none"}.get(opts.get("rescale", "l1"), opts.get("rescale", "l1"))
    expected = ref.dare(
        family,
        weights=opts.get("weights", [1.0] * N),
        density=density if isinstance(density, list) else [density] * N,
        seed=opts.get("seed", 0),
        lam=opts.get("lambda", 1.0),
        normalize=opts.get("normalize", False),
        rescale=rescale,
        consensus="sum" if method == "dare_ties" else "none",
        out_dtype=out_dtype,
    )
    assert_bit_identical(tmp_path / "out", expected)


def test_dare_ties_elects_signs(family: Family, tmp_path: Path) -> None:
    """The two DARE flavours differ exactly where agents disagree in sign."""
    opts = {"density": 0.8, "seed": 5, "rescale": "none"}
    linear = ref.dare(family, weights=[1.0] * N, density=[0.8] * N, seed=5, rescale="none")
    ties = ref.dare(family, weights=[1.0] * N, density=[0.8] * N, seed=5, rescale="none", consensus="sum")
    assert any(linear[n][2].tobytes() != ties[n][2].tobytes() for n in linear)
    _merge(family, tmp_path / "ties", "dare_ties", method_options=opts)
    assert_bit_identical(tmp_path / "ties", ties)


@pytest.mark.parametrize("which", ["family", "pair"])
def test_model_stock_matches_reference(family: Family, pair: Family, tmp_path: Path, which: str) -> None:
    fam = family if which == "family" else pair
    _merge(fam, tmp_path / "out", "model_stock", 192)
    expected, ts = ref.model_stock(fam)
    assert_bit_identical(tmp_path / "out", expected)
    assert any(0.0 < t < 1.0 for t in ts.values())


def test_model_stock_t_formula() -> None:
    """mergekit's formula from the exact sums, including its singular and zero-norm cases."""
    # two agents: |a|^2 = 4, |b|^2 = 9, a.b = 3 -> cos = 0.5, t = 2 * 0.5 / 1.5
    assert interpolation(np.array([4.0, 3.0, 9.0]), 2) == 2 * 0.5 / 1.5
    # opposite task vectors: 1 + (N - 1) cos = 0 -> t = 0 (keep the base)
    assert interpolation(np.array([4.0, -4.0, 4.0]), 2) == 0.0
    # a zero task vector: the norm product is clamped to 1e-6, cos = 0, t = 0
    assert interpolation(np.array([0.0, 0.0, 9.0]), 2) == 0.0
    # three agents, cosines 1, 0 and 0 (clamped to 1 from just above): mean 1/3
    gram = np.array([1.0, 1.0 + 1e-12, 0.0, 1.0, 0.0, 1.0])  # pairs (0,0) (0,1) (0,2) (1,1) (1,2) (2,2)
    assert interpolation(gram, 3) == 3 * (1 / 3) / (1 + 2 * (1 / 3))


# -- DARE's draws ----------------------------------------------------------------------------


@pytest.fixture(scope="module")
def dense(tmp_path_factory: pytest.TempPathFactory) -> Family:
    """Five agents that change every element of one 131072-element tensor."""
    root = tmp_path_factory.mktemp("dense")
    return build_family(root, densities=(1.0,) * N, shapes={"model.w": (256, 512)}, seed=4)


def test_dare_keeps_a_density_fraction_and_l1_matches_inverse(dense: Family, tmp_path: Path) -> None:
    density = [0.1, 0.3, 0.5, 0.7, 0.9]
    base = dense.base_values["model.w"].ravel()
    for t in range(N):
        weights = [float(t == k) for k in range(N)]
        out = tmp_path / f"out{t}"
        opts = {"density": density, "seed": 1, "weights": weights}
        _merge(dense, out, "dare_linear", 4096, method_options=opts, out_dtype="f32")
        merged = read_model_dir(out)["model.w"][2]
        tau = ref.task_vectors(dense, "model.w")[t]
        assert np.count_nonzero(tau) > 0.99 * tau.size
        kept = (merged != base) & (tau != 0)
        fraction = kept.sum() / np.count_nonzero(tau)
        sigma = np.sqrt(density[t] * (1 - density[t]) / tau.size)
        assert abs(fraction - density[t]) < 5 * sigma, (t, fraction)
        # the L1 rescale factor of a dense random task vector is close to the paper's 1 / density
        scale = np.median((merged[kept] - base[kept]) / tau[kept])
        assert scale == pytest.approx(1 / density[t], rel=0.03)


def test_dare_seed_changes_the_draws(family: Family, tmp_path: Path) -> None:
    a = ref.dare(family, weights=[1.0] * N, density=[0.5] * N, seed=1)
    b = ref.dare(family, weights=[1.0] * N, density=[0.5] * N, seed=2)
    assert any(a[n][2].tobytes() != b[n][2].tobytes() for n in a)
    for seed, expected in ((1, a), (2, b)):  # same index: each seed has its own statistic
        _merge(family, tmp_path / f"seed{seed}", "dare_linear", method_options={"density": 0.5, "seed": seed})
        assert_bit_identical(tmp_path / f"seed{seed}", expected)


# -- options ---------------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("method", "opts", "message"),
    [
        ("linear", {"lambda": 2.0}, "--lambda has no effect"),
        ("linear", {"density": 0.5}, "--density has no effect"),
        ("linear", {"weights": [1.0, -1.0, 0.0, 0.0, 0.0]}, "sum to zero"),
        ("task_arithmetic", {"density": 0.5}, "--density has no effect"),
        ("task_arithmetic", {"seed": 1}, "--seed has no effect"),
        ("task_arithmetic", {"weights": [1.0, 2.0]}, "one value per agent"),
        ("task_arithmetic", {"weights": [1.0, float("nan"), 1.0, 1.0, 1.0]}, "finite"),
        ("task_arithmetic", {"lambda": "big"}, "must be a number"),
        ("task_arithmetic", {"normalize": "yes"}, "true or false"),
        ("dare_linear", {"density": 0.0}, "--density must lie in (0, 1]"),
        ("dare_ties", {"density": [0.5, 0.5, 0.5, 0.5, 1.5]}, "--density must lie in (0, 1]"),
        ("dare_ties", {"seed": -1}, "--seed must be an integer"),
        ("dare_ties", {"seed": 1.5}, "--seed must be an integer"),
        ("dare_linear", {"rescale": "l2"}, "--rescale must be l1, inverse or none"),
        ("dare_linear", {"r": 0.1}, "--r has no effect"),
        ("model_stock", {"filter_wise": True}, "--filter-wise"),
        ("model_stock", {"weights": [1.0] * N}, "--weights has no effect"),
    ],
)
def test_options_are_validated(family: Family, tmp_path: Path, method: str, opts: dict[str, Any], message: str) -> None:
    with pytest.raises(ConfigError, match=message.replace("(", r"\(").replace("[", r"\[")):
        _merge(family, tmp_path / "out", method, method_options=opts)


def test_model_stock_needs_two_agents(family: Family, tmp_path: Path) -> None:
    options = RunOptions(cache_dir=tmp_path / "cache", quiet=True)
    with pytest.raises(ConfigError, match="at least 2"):
        merge(family.base, [str(family.agents[0])], out=tmp_path / "out", method="model_stock", options=options)


def test_mergekit_style_options_are_accepted(family: Family, tmp_path: Path) -> None:
    """model stock accepts filter_wise: false; a per-agent option may be a one-element list."""
    _merge(family, tmp_path / "ms", "model_stock", method_options={"filter_wise": False})
    result = _merge(family, tmp_path / "ta", "task_arithmetic", method_options={"weights": [0.5]})
    assert result.params["weights"] == [0.5] * N
    assert_bit_identical(tmp_path / "ta", ref.task_arithmetic(family, [0.5] * N))


# -- block size, threads and resume never change a byte --------------------------------------------


PROPERTY_CASES: dict[str, dict[str, Any]] = {
    "linear": {"weights": WEIGHTS},
    "task_arithmetic": {"weights": WEIGHTS, "lambda": 0.6},
    "dare_linear": {"density": DENSITY, "seed": 7},
    "dare_ties": {"density": 0.4, "seed": 3, "weights": WEIGHTS, "normalize": True},
    "model_stock": {},
}


def _reference(fam: Family, method: str) -> ref.Output:
    opts = PROPERTY_CASES[method]
    if method == "linear":
        return ref.linear(fam, WEIGHTS)
    if method == "task_arithmetic":
        return ref.task_arithmetic(fam, WEIGHTS, 0.6)
    if method == "model_stock":
        return ref.model_stock(fam)[0]
    density = opts["density"] if isinstance(opts["density"], list) else [opts["density"]] * N
    consensus = "sum" if method == "dare_ties" else "none"
    weights = opts.get("weights", [1.0] * N)
    return ref.dare(
        fam,
        weights=weights,
        density=density,
        seed=opts["seed"],
        normalize=opts.get("normalize", False),
        consensus=consensus,
    )


@pytest.fixture(scope="module")
def references(family: Family) -> Iterator[Callable[[str], ref.Output]]:
    cache: dict[str, ref.Output] = {}

    def get(method: str) -> ref.Output:
        if method not in cache:
            cache[method] = _reference(family, method)
        return cache[method]

    yield get
    numba.set_num_threads(numba.config.NUMBA_NUM_THREADS)  # type: ignore[attr-defined]


SETTINGS = settings(max_examples=6, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])


@pytest.mark.parametrize("method", list(PROPERTY_CASES))
@SETTINGS
@given(
    block_elems=st.integers(1, 48).map(lambda k: 64 * k),
    threads=st.sampled_from([1, 2]),
    interrupt=st.one_of(st.none(), st.integers(0, 4)),  # every run marks at least 5 batches done
    resume_block_elems=st.integers(1, 48).map(lambda k: 64 * k),
)
def test_bytes_do_not_depend_on_blocks_threads_or_resume(
    family: Family,
    references: Callable[[str], ref.Output],
    tmp_path_factory: pytest.TempPathFactory,
    method: str,
    block_elems: int,
    threads: int,
    interrupt: int | None,
    resume_block_elems: int,
) -> None:
    """A fresh index per example, so statistics are computed with these blocks too; an
    interrupted run is resumed with another block size (a resumed pass keeps its own)."""
    root = tmp_path_factory.mktemp("prop")
    out = root / "out"

    def run(elems: int) -> None:
        options = RunOptions(cache_dir=root / "cache", quiet=True, block_elems=elems, threads=threads)
        merge(
            family.base,
            [str(a) for a in family.agents],
            out=out,
            method=method,
            method_options=PROPERTY_CASES[method],
            options=options,
        )

    if interrupt is not None:
        with interrupted_after(interrupt), pytest.raises(Interrupted):
            run(block_elems)
        assert not (out / "config.json").exists()
        run(resume_block_elems)
    else:
        run(block_elems)
    assert_bit_identical(out, references(method))


@pytest.mark.parametrize(("method", "opts"), [("model_stock", {}), ("dare_linear", {"density": 0.5})])
def test_nan_in_an_agent_is_refused(tmp_path: Path, method: str, opts: dict[str, Any]) -> None:
    """The statistics pass refuses a NaN task vector, naming the file, the tensor and the element."""
    fam = build_family(tmp_path / "fam", subset_agent=True, identical_agent=True, seed=6)  # N = 5: compiled already
    path = fam.agents[1] / "model.safetensors"
    tensors = read_safetensors(path)
    dtype, shape, raw = tensors["model.norm.weight"]
    raw = raw.copy()
    raw[5] = 0x7FC0  # bf16 NaN
    tensors["model.norm.weight"] = (dtype, shape, raw)
    write_safetensors(path, tensors)
    with pytest.raises(
        NonFiniteWeightError, match=r"agent1/model.safetensors: tensor 'model.norm.weight' .* index \[5\]"
    ):
        _merge(fam, tmp_path / "out", method, method_options=opts)
