"""The spherical methods (slerp, nuslerp, multislerp, karcher) against dense float64 references
written from mergekit's equations over whole tensors (tests/reference_sphere.py), with gradients
and filters; the same bytes from every backend, block size and thread count; bad input refused
in one line before anything is written."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import numpy as np
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from ramstream import api
from ramstream.config import RunOptions
from tests import reference_sphere as ref
from tests.families import DEFAULT_SHAPES, Family, build_family, f32_to_bf16, read_model_dir
from tests.test_cli import assert_nothing_finished, in_process, ok, one_line_error

MIN_IDENTICAL = 0.9999
LAYERS = 2


@pytest.fixture(scope="module")
def fam(tmp_path_factory: pytest.TempPathFactory) -> Family:
    return build_family(tmp_path_factory.mktemp("sphere"), densities=(0.05, 0.4, 0.6), seed=11)


@pytest.fixture(scope="module")
def twins(tmp_path_factory: pytest.TempPathFactory) -> Family:
    """An agent equal to the base (angle 0: the linear branch) and one with a single change."""
    return build_family(tmp_path_factory.mktemp("twins"), densities=(0.0005,), identical_agent=True, seed=4)


def merged(out: Path) -> dict[str, np.ndarray]:
    return {name: raw for name, (_dtype, _shape, raw) in read_model_dir_any(out).items()}


def raw_bytes(out: Path) -> dict[str, bytes]:
    return {name: raw.tobytes() for name, raw in merged(out).items()}


def read_model_dir_any(out: Path) -> dict[str, tuple[str, tuple[int, ...], np.ndarray]]:
    from tests.families import read_safetensors

    single = out / "model.safetensors"
    return read_safetensors(single) if single.is_file() else read_model_dir(out)


def run_merge(tmp: Path, members: list[Path], out: str, *flags: str) -> dict[str, np.ndarray]:
    target = tmp / out
    ok(in_process("merge", *members, "--out", target, "--quiet", "--cache-dir", tmp / "cache", *flags))
    return merged(target)


def expect(values: dict[str, np.ndarray], ours: dict[str, np.ndarray]) -> None:
    """Ours against the reference (float64, rounded to float32 then bf16): at least 99.99 % of the
    elements identical, none more than one bf16 ulp apart."""
    total = same = 0
    for name, exact in values.items():
        want = f32_to_bf16(exact.astype(np.float32))
        got = ours[name].ravel()
        total += got.size
        same += int((got == want).sum())
        ulps = np.abs(_ordered(got) - _ordered(want))
        assert ulps.max() <= 1, (name, int(ulps.max()))
    assert same / total >= MIN_IDENTICAL, f"{same}/{total}"


def _ordered(bits: np.ndarray) -> np.ndarray:
    b = bits.astype(np.int64)
    return np.where(b & 0x8000, -(b & 0x7FFF), b)


def tvs(fam: Family, name: str, agents: range | list[int]) -> list[np.ndarray]:
    base = fam.base_values[name].astype(np.float64).ravel()
    return [fam.agent_values[t][name].astype(np.float64).ravel() - base for t in agents]


def weights_of(fam: Family, name: str, members: list[int]) -> list[np.ndarray]:
    """Member -1 is the base, t >= 0 agent t."""
    return [(fam.base_values[name] if m < 0 else fam.agent_values[m][name]).ravel() for m in members]


T_FILTERS: Any = [
    {"filter": "self_attn", "value": [0.1, 0.9]},
    {"filter": "mlp", "value": [0.7, 0.2]},
    {"value": 0.35},
]


@pytest.mark.parametrize("t", [0.0, 0.3, 1.0, T_FILTERS])
def test_slerp_matches_reference(fam: Family, tmp_path: Path, t: Any) -> None:
    ours = run_merge(tmp_path, [fam.base, fam.agents[2]], "slerp", "--method", "slerp", "--t", json.dumps(t))
    values = {}
    for name in fam.base_values:
        tv = ref.setting_value(t, name, ref.layer_x(name, LAYERS))
        assert tv is not None
        values[name] = ref.slerp(tv, *weights_of(fam, name, [-1, 2]))
    expect(values, ours)
    if t == 0.0:  # the base itself, to the bit
        for name, raw in ours.items():
            assert np.array_equal(raw, f32_to_bf16(fam.base_values[name].ravel()))


def test_slerp_of_parallel_tensors_interpolates_linearly(twins: Family, tmp_path: Path) -> None:
    ours = run_merge(tmp_path, [twins.base, twins.agents[1]], "twin", "--method", "slerp", "--t", "0.4")
    for name, raw in ours.items():  # the agent equals the base: (1 - t) x + t x is x
        assert np.array_equal(raw, f32_to_bf16(twins.base_values[name].ravel()))


@pytest.mark.parametrize("weights", [("0.3,0.9"), ("[0.2, 2.0],1")])
def test_nuslerp_matches_reference(fam: Family, tmp_path: Path, weights: str) -> None:
    ours = run_merge(
        tmp_path, [fam.base, fam.agents[0], fam.agents[1]], "nu", "--method", "nuslerp", "--weights", weights
    )
    parsed = json.loads(f"[{weights}]")
    values = {}
    for name in fam.base_values:
        x = ref.layer_x(name, LAYERS)
        w0, w1 = (ref.setting_value(w, name, x) for w in parsed)
        assert w0 is not None and w1 is not None
        t = 0.5 if abs(w0 + w1) < 1e-6 else w1 / (w0 + w1)
        base = fam.base_values[name].astype(np.float64).ravel()
        values[name] = base + ref.nuslerp(t, *tvs(fam, name, [0, 1]))
    expect(values, ours)


def test_nuslerp_without_base_interpolates_the_weights(fam: Family, tmp_path: Path) -> None:
    ours = run_merge(tmp_path, [fam.base, fam.agents[1]], "nb", "--method", "nuslerp", "--no-base", "--weights", "1,3")
    values = {name: ref.nuslerp(0.75, *weights_of(fam, name, [-1, 1])) for name in fam.base_values}
    expect(values, ours)


def vector_flags(row_wise: bool) -> list[str]:
    return ["--nuslerp-flatten", "false", "--nuslerp-row-wise", "true" if row_wise else "false"]


@pytest.mark.parametrize("row_wise", [False, True])
@pytest.mark.parametrize("weights", ["0.3,0.9", "[0.2, 2.0],1"])
def test_nuslerp_per_row_or_column_matches_reference(fam: Family, tmp_path: Path, row_wise: bool, weights: str) -> None:
    """Rows (dim -1) or columns (dim 0) each interpolated on their own; the 1-D norms are one
    vector; agent 0 is sparse enough that many of its rows and columns are zero."""
    members = [fam.base, fam.agents[0], fam.agents[1]]
    ours = run_merge(tmp_path, members, "nv", "--method", "nuslerp", "--weights", weights, *vector_flags(row_wise))
    parsed = json.loads(f"[{weights}]")
    values = {}
    for name in fam.base_values:
        x = ref.layer_x(name, LAYERS)
        w0, w1 = (ref.setting_value(w, name, x) for w in parsed)
        assert w0 is not None and w1 is not None
        t = 0.5 if abs(w0 + w1) < 1e-6 else w1 / (w0 + w1)
        base = fam.base_values[name].astype(np.float64).ravel()
        values[name] = base + ref.nuslerp_vectors(t, *tvs(fam, name, [0, 1]), DEFAULT_SHAPES[name], row_wise)
    expect(values, ours)
    flat = run_merge(tmp_path, members, "nf", "--method", "nuslerp", "--weights", weights)
    assert any(not np.array_equal(flat[name], ours[name]) for name in ours)  # not the whole-tensor merge


@pytest.mark.parametrize("row_wise", [False, True])
def test_nuslerp_per_vector_without_base_interpolates_the_weights(fam: Family, tmp_path: Path, row_wise: bool) -> None:
    members = [fam.base, fam.agents[1]]
    ours = run_merge(
        tmp_path, members, "nb", "--method", "nuslerp", "--no-base", "--weights", "1,3", *vector_flags(row_wise)
    )
    values = {
        name: ref.nuslerp_vectors(0.75, *weights_of(fam, name, [-1, 1]), DEFAULT_SHAPES[name], row_wise)
        for name in fam.base_values
    }
    expect(values, ours)


@pytest.mark.parametrize("row_wise", [False, True])
def test_nuslerp_per_vector_of_equal_and_zero_rows(twins: Family, tmp_path: Path, row_wise: bool) -> None:
    """Agent 0 changes one element, agent 1 none: every row (column) but one has a zero task
    vector, and no_base sees rows equal in both models (the colinear branch, (1 - t) x + t x)."""
    members = [twins.base, *twins.agents]
    ours = run_merge(tmp_path, members, "tw", "--method", "nuslerp", "--weights", "1,1", *vector_flags(row_wise))
    values = {}
    for name in twins.base_values:
        base = twins.base_values[name].astype(np.float64).ravel()
        values[name] = base + ref.nuslerp_vectors(0.5, *tvs(twins, name, [0, 1]), DEFAULT_SHAPES[name], row_wise)
    expect(values, ours)
    same = run_merge(
        tmp_path,
        [twins.base, twins.agents[1]],
        "eq",
        "--method",
        "nuslerp",
        "--no-base",
        "--weights",
        "1,2",
        *vector_flags(row_wise),
    )
    for name, raw in same.items():  # the agent equals the base: every vector is (1 - t) x + t x = x
        assert np.array_equal(raw, f32_to_bf16(twins.base_values[name].ravel()))


@pytest.mark.parametrize(("no_base", "normalize"), [(False, True), (True, False)])
def test_multislerp_matches_reference(fam: Family, tmp_path: Path, no_base: bool, normalize: bool) -> None:
    flags = ["--method", "multislerp", "--weights", "0.7,0.5,1.0" if not no_base else "0.7,0.5,1.0,0.2"]
    flags += ["--no-base"] if no_base else []
    flags += [] if normalize else ["--no-normalize-weights"]
    ours = run_merge(tmp_path, [fam.base, *fam.agents], "ms", *flags)
    values = {}
    for name in fam.base_values:
        if no_base:
            values[name] = ref.multislerp(weights_of(fam, name, [-1, 0, 1, 2]), [0.7, 0.5, 1.0, 0.2], normalize)
        else:
            base = fam.base_values[name].astype(np.float64).ravel()
            values[name] = base + ref.multislerp(tvs(fam, name, range(3)), [0.7, 0.5, 1.0], normalize)
    expect(values, ours)


def test_multislerp_of_one_agent_is_the_agent(fam: Family, tmp_path: Path) -> None:
    ours = run_merge(tmp_path, [fam.base, fam.agents[1]], "one", "--method", "multislerp", "--weights", "2")
    for name, raw in ours.items():
        assert np.array_equal(raw, f32_to_bf16(fam.agent_values[1][name].ravel()))


@pytest.mark.parametrize("method", [["multislerp", "--weights", "0.7,0.5,1.0"], ["karcher"]])
def test_an_integer_tensor_is_copied_not_combined(tmp_path: Path, method: list[str]) -> None:
    """Every agent moved position_ids the same way: the float tensors merge, the integer one is
    the base's (multislerp refused the whole merge, finding no direction in its zero Gram matrix)."""
    fam = build_family(tmp_path / "ints", densities=(0.05, 0.4, 0.6), int_tensor=True, seed=11)
    ours = run_merge(tmp_path, [fam.base, *fam.agents], "ints-out", "--method", *method)
    assert np.array_equal(ours["model.position_ids"].view(np.int64), fam.copied["model.position_ids"][1])
    assert set(ours) == {*fam.base_values, "model.position_ids"}


@pytest.mark.parametrize(("max_iter", "tol"), [(10, 1e-5), (2, 1e-3), (0, 1e-5)])
def test_karcher_matches_reference(fam: Family, tmp_path: Path, max_iter: int, tol: float) -> None:
    flags = ["--method", "karcher", "--max-iter", str(max_iter), "--tol", str(tol)]
    ours = run_merge(tmp_path, [fam.base, *fam.agents], "k", *flags)
    values = {name: ref.karcher(weights_of(fam, name, [-1, 0, 1, 2]), max_iter, tol) for name in fam.base_values}
    expect(values, ours)


def test_karcher_with_an_agent_equal_to_the_base(twins: Family, tmp_path: Path) -> None:
    ours = run_merge(tmp_path, [twins.base, *twins.agents], "kt", "--method", "karcher")
    values = {name: ref.karcher(weights_of(twins, name, [-1, 0, 1])) for name in twins.base_values}
    expect(values, ours)


CASES: dict[str, tuple[dict[str, Any], int]] = {
    "slerp": ({"t": T_FILTERS}, 1),
    "nuslerp": ({"weights": [0.3, 0.9]}, 2),
    "nuslerp-rows": (
        {"weights": [[{"filter": "mlp", "value": [1, 3]}, {"value": 0.5}], 0.9], "nuslerp_flatten": False},
        2,
    ),
    "nuslerp-columns": ({"weights": [0.3, 0.9], "nuslerp_flatten": False, "nuslerp_row_wise": True}, 2),
    "nuslerp-columns-no-base": (
        {"weights": [1.0, 2.0], "nuslerp_flatten": False, "nuslerp_row_wise": True, "no_base": True},
        1,
    ),
    "multislerp": ({"weights": [[{"filter": "mlp", "value": [1, 3]}, {"value": 0.5}], 1, 2]}, 3),
    "karcher": ({}, 3),
}


@settings(max_examples=8, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(
    method=st.sampled_from(sorted(CASES)),
    block_elems=st.sampled_from([64, 320, 4096]),
    threads=st.sampled_from([1, 2]),
    backend=st.sampled_from(["numba", "torch"]),
)
def test_block_size_threads_and_backend_change_no_byte(
    fam: Family, tmp_path_factory: pytest.TempPathFactory, method: str, block_elems: int, threads: int, backend: str
) -> None:
    assert_same_bytes(fam, tmp_path_factory, method, block_elems, threads, backend)


def assert_same_bytes(
    fam: Family, tmp_path_factory: pytest.TempPathFactory, method: str, block_elems: int, threads: int, backend: str
) -> None:
    if backend == "torch":
        pytest.importorskip("torch")
    given_options, n_agents = CASES[method]
    tmp = tmp_path_factory.mktemp("prop")
    members = [str(a) for a in fam.agents[:n_agents]]
    outputs = []
    for name, run in (
        ("plain", RunOptions(cache_dir=tmp / "c0", quiet=True)),
        (
            "other",
            RunOptions(cache_dir=tmp / "c1", quiet=True, block_elems=block_elems, threads=threads, backend=backend),
        ),
    ):
        kind = method.split("-")[0]
        api.merge(fam.base, members, out=tmp / name, method=kind, method_options=given_options, options=run)
        outputs.append(merged(tmp / name))
    for name in outputs[0]:
        assert np.array_equal(outputs[0][name], outputs[1][name]), name


VECTOR_CASES = sorted(c for c in CASES if c.startswith("nuslerp-"))


@settings(max_examples=8, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(
    method=st.sampled_from(VECTOR_CASES),
    block_elems=st.sampled_from([64, 192, 320, 4096]),
    threads=st.sampled_from([1, 2]),
    backend=st.sampled_from(["numba", "torch"]),
)
def test_per_vector_nuslerp_block_size_threads_and_backend_change_no_byte(
    fam: Family, tmp_path_factory: pytest.TempPathFactory, method: str, block_elems: int, threads: int, backend: str
) -> None:
    """Blocks cut rows and columns anywhere (rows of 24 and 40 elements, blocks of 64...)."""
    assert_same_bytes(fam, tmp_path_factory, method, block_elems, threads, backend)


@pytest.mark.parametrize("method", VECTOR_CASES)
def test_per_vector_nuslerp_same_bytes_from_numba_and_torch(
    fam: Family, tmp_path_factory: pytest.TempPathFactory, method: str
) -> None:
    assert_same_bytes(fam, tmp_path_factory, method, 64, 2, "torch")


# -- bad input: one line, nothing written ---------------------------------------------------------


def test_slerp_with_two_agents_is_refused(fam: Family, tmp_path: Path) -> None:
    out = tmp_path / "out"
    outcome = in_process("merge", fam.base, *fam.agents[:2], "--out", out, "--method", "slerp", "--t", "0.5")
    one_line_error(outcome, "slerp", "one agent", "2 agents")
    assert not out.exists()


def test_a_gradient_longer_than_the_layers_is_interpolated_as_mergekit_does(fam: Family, tmp_path: Path) -> None:
    """mergekit runs such a config: layer i of L takes the value at i / (L - 1) of the whole list,
    so over two layers [0.2, 0.9, 0.6] is [0.2, 0.6] (its ends)."""
    outs = [tmp_path / "long", tmp_path / "ends"]
    for out, t in zip(outs, ("[0.2, 0.9, 0.6]", "[0.2, 0.6]"), strict=True):
        ok(in_process("merge", fam.base, fam.agents[0], "--out", out, "--method", "slerp", "--t", t, "--quiet"))
    assert raw_bytes(outs[0]) == raw_bytes(outs[1])


def test_filter_matching_nothing_is_refused(fam: Family, tmp_path: Path) -> None:
    out = tmp_path / "out"
    setting = "[{filter: cross_attn, value: 0.2}, {value: 0.5}]"
    outcome = in_process("merge", fam.base, fam.agents[0], "--out", out, "--method", "slerp", "--t", setting)
    one_line_error(outcome, "'cross_attn'", "matches no tensor")
    assert_nothing_finished(out)


def test_a_config_gradient_longer_than_the_layers_runs_as_in_mergekit(fam: Family, tmp_path: Path) -> None:
    outs = []
    for values in ([0, 0.2, 0.4, 1], [0, 0.2, 0.4, 1, 0.6, 0.3, 1]):  # over two layers: the ends
        config = tmp_path / f"slerp{len(values)}.yml"
        doc = {
            "merge_method": "slerp",
            "base_model": str(fam.base),
            "models": [{"model": str(fam.base)}, {"model": str(fam.agents[0])}],
            "parameters": {"t": [{"filter": "mlp", "value": values}, {"value": 0.5}]},
        }
        config.write_text(json.dumps(doc))
        outs.append(tmp_path / f"out{len(values)}")
        ok(in_process("merge", "--config", config, "--out", outs[-1], "--quiet"))
    expected = tmp_path / "ends"
    ends = "[{filter: mlp, value: [0, 1]}, {value: 0.5}]"
    ok(in_process("merge", fam.base, fam.agents[0], "--out", expected, "--method", "slerp", "--t", ends, "--quiet"))
    assert raw_bytes(outs[0]) == raw_bytes(expected)
    assert raw_bytes(outs[1]) == raw_bytes(expected)


def test_per_row_statistics_too_large_for_a_block_are_refused(tmp_path: Path) -> None:
    """Rows of one element in a block of 200 000: a partial of 200 000 vectors (~92 MiB)."""
    short = build_family(tmp_path / "short", densities=(0.5, 0.5), shapes={"model.w.weight": (200_000, 1)}, seed=2)
    out = tmp_path / "out"
    outcome = in_process(
        "merge", short.base, *short.agents, "--out", out, "--method", "nuslerp", "--weights", "1,1",
        "--cache-dir", tmp_path / "cache", *vector_flags(False),
    )  # fmt: skip
    one_line_error(outcome, "per-vector nuslerp statistics", "200000 rows", "nuslerp_flatten: true")
    assert_nothing_finished(out)
