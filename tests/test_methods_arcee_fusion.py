"""arcee_fusion against a dense numpy reference written from mergekit's equations
(tests/reference_fusion.py), to the byte: bf16 and float32 outputs, 1-D, 2-D and 3-D tensors
(rows along the last dimension), a sparse agent (threshold 0: its change everywhere) and an agent
equal to the base; the same bytes from both backends, every block size (blocks smaller than a
row: the statistics read whole rows) and thread count; NaN inputs named; bad input refused in one
line before anything is written."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from ramstream import api
from ramstream.backends.numba.addresses import addresses_of
from ramstream.backends.numba.codecs import F32, TAU32
from ramstream.backends.numba.fusion import merge_fusion_block
from ramstream.config import RunOptions
from ramstream.errors import NonFiniteWeightError
from ramstream.statistics import fusion as fusion_stats
from tests import reference_fusion as ref
from tests.families import Family, build_family, f32_to_bf16, with_raw_value
from tests.test_cli import assert_nothing_finished, in_process, one_line_error
from tests.test_methods_nearswap import OTHER_RUNS, config_and_flags_agree, refuse_two_models, same_bytes_under
from tests.test_methods_sphere import merged, run_merge

F = np.float32
SHAPES: dict[str, tuple[int, ...]] = {
    "model.embed_tokens.weight": (96, 24),
    "model.layers.0.self_attn.q_proj.weight": (24, 24),
    "model.layers.0.mlp.experts.weight": (3, 10, 24),
    "model.layers.0.input_layernorm.weight": (24,),
    "model.layers.1.mlp.down_proj.weight": (24, 40),
    "model.layers.1.mlp.down_proj.bias": (200,),  # one row of 200: more than a block of 64
    "model.norm.weight": (24,),
    "lm_head.weight": (96, 24),
}


@pytest.fixture(scope="module")
def fam(tmp_path_factory: pytest.TempPathFactory) -> Family:
    return build_family(tmp_path_factory.mktemp("fusion"), densities=(0.05, 0.4, 0.6), shapes=SHAPES, seed=11)


def reference(fam: Family, agent: int) -> dict[str, np.ndarray]:
    """float32 per tensor (flat)."""
    return {
        name: ref.arcee_fusion(
            fam.base_values[name].astype(F).reshape(SHAPES[name]),
            fam.agent_values[agent][name].astype(F).reshape(SHAPES[name]),
        ).ravel()
        for name in fam.base_values
    }


@pytest.mark.parametrize("agent", [0, 1, 2])
def test_arcee_fusion_matches_the_reference_to_the_byte(fam: Family, tmp_path: Path, agent: int) -> None:
    ours = run_merge(tmp_path, [fam.base, fam.agents[agent]], "af", "--method", "arcee_fusion")
    values = reference(fam, agent)
    assert set(ours) == set(values)
    for name, want in values.items():
        assert np.array_equal(ours[name], f32_to_bf16(want)), name
    if agent == 2:  # dense enough that the threshold is inside: some changes kept, most dropped
        name = "model.layers.1.mlp.down_proj.weight"
        a, b = fam.base_values[name].astype(F).ravel(), fam.agent_values[2][name].astype(F).ravel()
        kept = (ours[name] != f32_to_bf16(a)) & (a != b)
        assert 0 < kept.sum() < 0.5 * (a != b).sum()


def test_float32_output_is_the_references_arithmetic_to_the_bit(fam: Family, tmp_path: Path) -> None:
    ours = run_merge(tmp_path, [fam.base, fam.agents[2]], "af32", "--method", "arcee_fusion", "--out-dtype", "f32")
    for name, want in reference(fam, 2).items():
        assert np.array_equal(ours[name].view(np.uint32), want.view(np.uint32)), name


def test_a_sparse_agent_is_taken_whole_and_an_agent_equal_to_the_base_gives_the_base(tmp_path: Path) -> None:
    """Most importances 0: q1 = median = q3 = 0, every element reaches the threshold 0, so the
    output is a + (b - a) everywhere. An agent equal to the base: d = 0, the base."""
    sparse = build_family(tmp_path / "fam", densities=(0.02,), identical_agent=True, seed=4)
    took = run_merge(
        tmp_path, [sparse.base, sparse.agents[0]], "took", "--method", "arcee_fusion", "--out-dtype", "f32"
    )
    same = run_merge(tmp_path, [sparse.base, sparse.agents[1]], "twin", "--method", "arcee_fusion")
    for name in sparse.base_values:
        a, b = sparse.base_values[name].astype(F).ravel(), sparse.agent_values[0][name].astype(F).ravel()
        assert np.array_equal(took[name].view(np.uint32), (a + (b - a)).view(np.uint32)), name
        assert np.array_equal(same[name], f32_to_bf16(a)), name


def test_rows_taken_in_any_chunks_give_the_same_kl(fam: Family, monkeypatch: pytest.MonkeyPatch) -> None:
    """The host's row KL sums in element order: taking 1 row or 100 at a time changes no bit,
    and it agrees with the reference's exact sums after the float32 rounding."""
    name = "model.embed_tokens.weight"
    a = fam.base_values[name].astype(F).reshape(SHAPES[name])
    b = fam.agent_values[2][name].astype(F).reshape(SHAPES[name])
    whole = fusion_stats.kl_rows(b, a)
    one_by_one = np.concatenate([fusion_stats.kl_rows(b[r : r + 1], a[r : r + 1]) for r in range(a.shape[0])])
    assert np.array_equal(whole.view(np.uint32), one_by_one.view(np.uint32))
    assert np.array_equal(whole.view(np.uint32), ref.row_kl(a, b).view(np.uint32))
    assert (whole > 0).all()


@settings(max_examples=10, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(agent=st.sampled_from([1, 2]), **OTHER_RUNS)
def test_block_size_threads_and_backend_change_no_byte(
    fam: Family, tmp_path_factory: pytest.TempPathFactory, block_elems: int, threads: int, backend: str, agent: int
) -> None:
    """float32 output, where a last-bit difference would show; blocks of 64 hold fewer elements
    than the bias's single row."""
    run = {"block_elems": block_elems, "threads": threads, "backend": backend, "out_dtype": "f32"}
    same_bytes_under(fam, tmp_path_factory.mktemp("prop"), agent, "arcee_fusion", {}, **run)


def test_torch_tiles_smaller_than_a_row_give_the_numba_bytes(
    fam: Family, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    pytest.importorskip("torch")
    from ramstream.backends.torch import tiles as torch_tiles

    outputs = []
    for backend in ("numba", "torch"):
        if backend == "torch":
            monkeypatch.setattr(torch_tiles, "CPU_TILE", 64)
        run = RunOptions(cache_dir=tmp_path / backend, quiet=True, block_elems=256, backend=backend)
        out = tmp_path / f"out-{backend}"
        api.merge(fam.base, [str(fam.agents[2])], out=out, method="arcee_fusion", method_options={},
                  out_dtype="f32", options=run)  # fmt: skip
        outputs.append(merged(out))
    for name in outputs[0]:
        assert np.array_equal(outputs[0][name], outputs[1][name]), name


def test_a_task_vector_input_weighs_in_as_base_plus_tau() -> None:
    """An agent given as its float32 task vector (a LoRA agent) is f32(base) + tau, in the kernel
    as in the host's KL."""
    rng = np.random.default_rng(8)
    rows, width = 40, 64
    base = rng.standard_normal(rows * width).astype(F) * F(0.05)
    tau = np.where(rng.random(rows * width) < 0.5, rng.standard_normal(rows * width).astype(F) * F(0.01), F(0))
    agent = (base + tau.astype(F)).astype(F)
    kl = ref.row_kl(base.reshape(rows, width), agent.reshape(rows, width))
    weights = ref.importance(base.reshape(rows, width), agent.reshape(rows, width), kl)
    limit = ref.threshold(weights)
    out = np.empty(rows * width, np.float32)
    tau32 = tau.astype(F)
    found = merge_fusion_block(base, F32, addresses_of([tau32], tau32.size), np.array([TAU32], np.int64), kl, width,
                               0, limit, out, F32, 2)  # fmt: skip
    assert found == -1
    want = ref.fusion(base.reshape(rows, width), agent.reshape(rows, width), weights).ravel()
    assert np.array_equal(out.view(np.uint32), want.view(np.uint32))


# -- NaN/Inf inputs --------------------------------------------------------------------------------


@pytest.mark.parametrize("backend", ["numba", "torch"])
def test_a_nan_in_the_agent_is_refused_by_name(fam: Family, tmp_path: Path, backend: str) -> None:
    """Found by the importance histogram: in the block (of 64 elements), or in the rest of the row
    whose KL it spoils."""
    if backend == "torch":
        pytest.importorskip("torch")
    bad = with_raw_value(fam.agents[0], tmp_path / "bad", "model.layers.1.mlp.down_proj.bias", 150, 0x7FC0)  # NaN
    options = RunOptions(cache_dir=tmp_path / "cache", quiet=True, backend=backend, block_elems=64)
    with pytest.raises(NonFiniteWeightError, match=r"tensor 'model.layers.1.mlp.down_proj.bias' .* index \[150\]"):
        api.merge(fam.base, [str(bad)], out=tmp_path / "out", method="arcee_fusion", method_options={},
                  options=options)  # fmt: skip


# -- bad input: one line, nothing written ---------------------------------------------------------


def test_two_agents_are_refused(fam: Family, tmp_path: Path) -> None:
    out = tmp_path / "out"
    outcome = in_process("merge", fam.base, *fam.agents[:2], "--out", out, "--method", "arcee_fusion")
    one_line_error(outcome, "arcee_fusion", "ONE agent", "2 agents")
    assert not out.exists()


def test_an_option_it_would_ignore_is_refused(fam: Family, tmp_path: Path) -> None:
    out = tmp_path / "out"
    outcome = in_process("merge", fam.base, fam.agents[0], "--out", out, "--method", "arcee_fusion", "--t", "0.5")
    one_line_error(outcome, "--t", "no effect", "arcee_fusion")
    assert_nothing_finished(out)


def test_a_config_with_two_models_is_refused(fam: Family, tmp_path: Path) -> None:
    refuse_two_models(fam, tmp_path, "arcee_fusion", {})


def test_a_config_and_flags_give_the_same_bytes(fam: Family, tmp_path: Path) -> None:
    config_and_flags_agree(fam, tmp_path, {}, ("--method", "arcee_fusion"))


def test_a_sweep_grid_runs_it(fam: Family, tmp_path: Path) -> None:
    """``--grid arcee_fusion`` (no parameters): one candidate, the merge's bytes."""
    cache = ("--cache-dir", tmp_path / "cache", "--quiet")
    swept = in_process("sweep", fam.base, fam.agents[2], "--grid", "arcee_fusion", "--out", tmp_path / "sweep", *cache)
    assert swept.code == 0, swept.err
    single = in_process("merge", fam.base, fam.agents[2], "--out", tmp_path / "one", "--method", "arcee_fusion", *cache)
    assert single.code == 0, single.err
    a, b = merged(tmp_path / "sweep" / "arcee_fusion"), merged(tmp_path / "one")
    assert a.keys() == b.keys() and all(np.array_equal(a[n], b[n]) for n in a)
