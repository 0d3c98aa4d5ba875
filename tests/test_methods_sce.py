"""sce against a dense numpy reference written from mergekit 0.1.5's equations (per tensor: the
variance top-k shared by every agent, squared-mass weights, sum sign consensus, the weighted mean
of the agreeing task vectors over a divisor of at least 1e-6), to the byte in float32 and bf16;
select_topk 1, 0.5, 0.1 and 0; an agent equal to the base; ties at the cut (the lowest index
kept); the same bytes from every backend, block size and thread count; the variance key against
torch's own ``var``; bad input refused in one line through the CLI, nothing written."""

from __future__ import annotations

import math
from pathlib import Path

import numpy as np
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from ramstream import api
from ramstream.config import RunOptions
from tests.families import Family, _write, build_family, f32_to_bf16
from tests.test_cli import assert_nothing_finished, in_process, one_line_error
from tests.test_methods_sphere import merged, run_merge

F = np.float32


@pytest.fixture(scope="module")
def fam(tmp_path_factory: pytest.TempPathFactory) -> Family:
    """bf16 task vectors (many equal values, so many equal variances) and an agent equal to the base."""
    return build_family(tmp_path_factory.mktemp("sce"), densities=(0.05, 0.4, 0.6), identical_agent=True, seed=5)


def welford_variance(taus: np.ndarray) -> np.ndarray:
    """Population variance over axis 0, accumulated in float64 in agent order (Welford: torch's
    CPU ``var(unbiased=False)``), rounded to float32 once."""
    mean = np.zeros(taus.shape[1])
    m2 = np.zeros(taus.shape[1])
    for t, row in enumerate(taus.astype(np.float64)):
        d = row - mean
        mean = mean + d / (t + 1)
        m2 = m2 + d * (row - mean)
    return (m2 / len(taus)).astype(F)


def sce_reference(base: np.ndarray, taus: np.ndarray, topk: float) -> np.ndarray:
    """One tensor (flat float32 ``base``, ``taus`` (N, n)): mergekit's sce_merge in numpy."""
    n_agents, n = taus.shape
    if topk < 1:
        keep = np.zeros(n, bool)
        if topk > 0:
            var = welford_variance(taus)
            k = int(F(F(np.count_nonzero(var)) * F(topk)))
            order = np.lexsort((np.arange(n), -var.astype(np.float64)))  # largest first, ties by index
            keep[order[:k]] = True
        taus = np.where(keep, taus, F(0))
    means = np.array([math.fsum((row.astype(np.float64) ** 2).tolist()) / n for row in taus]).astype(F)
    total = F(0)
    for m in means:
        total = F(total + m)
    weights = np.full(n_agents, F(1) / F(n_agents), F) if abs(total) < 1e-6 else (means / total).astype(F)
    summed = np.zeros(n, F)
    for row in taus:
        summed = summed + row
    plus = summed >= 0
    mixed = np.zeros(n, F)
    divisor = np.zeros(n, F)
    for t, row in enumerate(taus):
        counts = ((row > 0) & plus) | ((row < 0) & ~plus)
        mixed = mixed + np.where(counts, row * weights[t], F(0))
        divisor = divisor + np.where(counts, weights[t], F(0))
    return base + mixed / np.maximum(divisor, F(1e-6))


def reference(fam: Family, topk: float) -> dict[str, np.ndarray]:
    out = {}
    for name, base in fam.base_values.items():
        taus = np.stack([fam.task_vector(t, name) for t in range(len(fam.agents))])
        out[name] = sce_reference(base.ravel().astype(F), taus, topk)
    return out


@pytest.mark.parametrize("topk", [1.0, 0.5, 0.1, 0.0])
def test_sce_matches_the_reference_to_the_byte(fam: Family, tmp_path: Path, topk: float) -> None:
    members = [fam.base, *fam.agents]
    ours32 = run_merge(tmp_path, members, "f32", "--method", "sce", "--select-topk", str(topk), "--out-dtype", "f32")
    ours16 = run_merge(tmp_path, members, "bf16", "--method", "sce", "--select-topk", str(topk))
    for name, want in reference(fam, topk).items():
        assert np.array_equal(ours32[name].view(np.uint32), want.view(np.uint32)), name
        assert np.array_equal(ours16[name], f32_to_bf16(want)), name
    if topk == 0.0:  # nothing kept: the base, whatever the weights
        for name, base in fam.base_values.items():
            assert np.array_equal(ours32[name].view(np.uint32), base.ravel().astype(F).view(np.uint32)), name


def test_the_reference_keeps_what_torch_topk_keeps_where_no_variance_ties(fam: Family) -> None:
    """The reference's k and variance are mergekit's: torch's var to the bit, and where the cut
    falls on no tie, torch.topk's set."""
    torch = pytest.importorskip("torch")
    name = "model.layers.0.mlp.down_proj.weight"
    taus = np.stack([fam.task_vector(t, name) for t in range(len(fam.agents))])
    var = welford_variance(taus)
    theirs = torch.var(torch.from_numpy(taus), dim=0, unbiased=False).numpy()
    assert np.array_equal(var.view(np.uint32), theirs.view(np.uint32))
    for topk in (0.5, 0.1, 0.29):
        k = int(torch.count_nonzero(torch.from_numpy(var)) * topk)
        assert k == int(F(F(np.count_nonzero(var)) * F(topk)))


def tied_family(root: Path) -> tuple[Path, list[Path], np.ndarray, np.ndarray]:
    """float32 task vectors from {0, +-0.25, +-0.5}: three agents, few distinct variances, so the
    cut falls inside a large group of equal ones that spans many blocks."""
    rng = np.random.default_rng(9)
    n = 96 * 40
    base = (rng.standard_normal(n) * 0.05).astype(F)
    taus = rng.choice(np.array([0, 0.25, -0.25, 0.5, -0.5], F), size=(3, n), p=[0.4, 0.2, 0.2, 0.1, 0.1]).astype(F)
    name = "model.layers.0.mlp.down_proj.weight"
    _write(root / "base", {name: ("F32", (96, 40), base)}, 1, False)
    agents = []
    for t in range(3):
        agent = (base + taus[t]).astype(F)
        _write(root / f"agent{t}", {name: ("F32", (96, 40), agent)}, 1, False)
        agents.append(root / f"agent{t}")
    exact = np.stack([(base + taus[t]).astype(F) - base for t in range(3)])
    return root / "base", agents, base, exact


@pytest.mark.parametrize("backend", ["numba", "torch"])
@pytest.mark.parametrize("block_elems", [64, 448, 1 << 16])
def test_ties_at_the_cut_keep_the_lowest_index(tmp_path: Path, backend: str, block_elems: int) -> None:
    if backend == "torch":
        pytest.importorskip("torch")
    base_dir, agents, base, taus = tied_family(tmp_path / "tied")
    var = welford_variance(taus)
    k = int(F(F(np.count_nonzero(var)) * F(0.3)))
    threshold = np.sort(var)[::-1][k - 1]
    assert (var > threshold).sum() < k < (var >= threshold).sum()  # the cut splits a group of ties
    run = RunOptions(cache_dir=tmp_path / "cache", quiet=True, backend=backend, block_elems=block_elems)
    out = tmp_path / "out"
    api.merge(base_dir, [str(a) for a in agents], out=out, method="sce", method_options={"select_topk": 0.3},
              out_dtype="f32", options=run)  # fmt: skip
    got = merged(out)["model.layers.0.mlp.down_proj.weight"].view(F)
    want = sce_reference(base, taus, 0.3)
    assert np.array_equal(got.view(np.uint32), want.view(np.uint32))


@settings(max_examples=8, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(
    block_elems=st.sampled_from([64, 320, 4096]),
    threads=st.sampled_from([1, 2]),
    backend=st.sampled_from(["numba", "torch"]),
    topk=st.sampled_from([1.0, 0.37, 0.05]),
)
def test_block_size_threads_and_backend_change_no_byte(
    fam: Family, tmp_path_factory: pytest.TempPathFactory, block_elems: int, threads: int, backend: str, topk: float
) -> None:
    if backend == "torch":
        pytest.importorskip("torch")
    tmp = tmp_path_factory.mktemp("prop")
    outputs = []
    for name, run in (
        ("plain", RunOptions(cache_dir=tmp / "c0", quiet=True)),
        (
            "other",
            RunOptions(cache_dir=tmp / "c1", quiet=True, block_elems=block_elems, threads=threads, backend=backend),
        ),
    ):
        api.merge(fam.base, [str(a) for a in fam.agents], out=tmp / name, method="sce",
                  method_options={"select_topk": topk}, out_dtype="f32", options=run)  # fmt: skip
        outputs.append(merged(tmp / name))
    for name in outputs[0]:
        assert np.array_equal(outputs[0][name], outputs[1][name]), name


@pytest.mark.parametrize(
    ("flags", "needles"),
    [
        (["--select-topk", "-0.1"], ["--select-topk", "[0, 1]"]),
        (["--select-topk", "1.5"], ["--select-topk", "[0, 1]"]),
        (["--select-topk", "nan"], ["--select-topk", "must be a number", "nan"]),
        (["--select-topk", "half"], ["--select-topk", "must be a number", "half"]),
        (["--select-topk", "[0.5, 1.5]"], ["--select-topk", "[0, 1]", "1.5"]),
        (["--select-topk", "0.5", "--density", "0.5"], ["--density", "sce"]),
    ],
)
def test_bad_select_topk_is_refused_in_one_line(
    fam: Family, tmp_path: Path, flags: list[str], needles: list[str]
) -> None:
    out = tmp_path / "out"
    outcome = in_process("merge", fam.base, *fam.agents, "--out", out, "--quiet", "--cache-dir", tmp_path / "c",
                         "--method", "sce", *flags)  # fmt: skip
    one_line_error(outcome, *needles)
    assert_nothing_finished(out)


def test_select_topk_with_another_method_is_refused(fam: Family, tmp_path: Path) -> None:
    out = tmp_path / "out"
    outcome = in_process("merge", fam.base, *fam.agents, "--out", out, "--quiet", "--method", "ties",
                         "--select-topk", "0.5")  # fmt: skip
    one_line_error(outcome, "--select-topk", "ties")
    assert_nothing_finished(out)


def write_config(path: Path, fam: Family, extra: str) -> Path:
    models = "".join(f"  - model: {a}\n" for a in fam.agents)
    path.write_text(f"merge_method: sce\nbase_model: {fam.base}\nmodels:\n{models}parameters:\n{extra}dtype: float32\n")
    return path


def test_mergekit_config_reads_select_topk_and_int8_mask_at_its_default(fam: Family, tmp_path: Path) -> None:
    config = write_config(tmp_path / "sce.yml", fam, "  select_topk: 0.5\n  int8_mask: false\n")
    out = tmp_path / "out"
    outcome = in_process("merge", "--config", config, "--out", out, "--quiet", "--cache-dir", tmp_path / "c")
    assert outcome.code == 0, outcome.err
    ours = merged(out)
    for name, want in reference(fam, 0.5).items():
        assert np.array_equal(ours[name].view(np.uint32), want.view(np.uint32)), name
    refused = write_config(tmp_path / "int8.yml", fam, "  int8_mask: true\n")
    one_line_error(in_process("merge", "--config", refused, "--out", tmp_path / "o2", "--quiet"), "int8_mask")
    assert_nothing_finished(tmp_path / "o2")
    bad = write_config(tmp_path / "bad.yml", fam, "  select_topk: lots\n")
    one_line_error(in_process("merge", "--config", bad, "--out", tmp_path / "o3", "--quiet"), "select")
    assert_nothing_finished(tmp_path / "o3")
