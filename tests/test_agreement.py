"""Pairwise agreement statistics (``probe --agreement``, ``IndexView.pairs``, ``inspect --pairs``).

Every count and sum against a dense reference written here from the definitions (numpy masks,
``math.fsum`` of the float64 products of float32 task-vector values: each product is exact in
float64 and fsum rounds their exact sum once, as the index's exact digits do); the same numbers
from both backends, any block size and thread count (hypothesis), two Dask workers, and a pass
killed with SIGKILL and rerun; the CLI's table, JSON, plot and its message for an index
without the statistics.
"""

from __future__ import annotations

import json
import math
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest
import zarr
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from ramstream.api import probe
from ramstream.config import RunOptions
from ramstream.inspect.pairs import PairTable
from ramstream.inspect.view import IndexView, open_index
from ramstream.statistics.agreement import Agreement
from tests.families import Family, build_family, decode, encode, write_safetensors
from tests.test_backends import installed_backends
from tests.test_cli import in_process, ok, one_line_error

EPS = 1e-5
SHAPES: dict[str, tuple[int, ...]] = {
    "model.embed_tokens.weight": (48, 40),
    "model.layers.0.self_attn.q_proj.weight": (40, 40),
    "model.layers.0.input_layernorm.weight": (40,),
    "model.layers.1.mlp.down_proj.weight": (64, 80),  # several 2048-element tiles: threads split it
    "model.layers.1.self_attn.o_proj.bias": (37,),  # ends mid-byte
    "lm_head.weight": (48, 40),
}


def _pairs(n: int) -> list[tuple[int, int]]:
    return [(i, j) for i in range(n) for j in range(i + 1, n)]


def dense(taus: list[np.ndarray], eps: float) -> tuple[np.ndarray, np.ndarray]:
    """counts (P, 2) and sums (3 P + 2 N,) of flat float32 task vectors, from the definitions."""
    active = [(np.abs(tau) > np.float32(eps)) & np.isfinite(tau) for tau in taus]
    c = np.sum(active, axis=0)
    counts, sums = [], []
    for i, j in _pairs(len(taus)):
        both = active[i] & active[j]
        x, y = taus[i][both].astype(np.float64), taus[j][both].astype(np.float64)
        counts.append((int(both.sum()), int(np.sum(np.signbit(x) == np.signbit(y)))))
        sums += [math.fsum(x * y), math.fsum(x * x), math.fsum(y * y)]
    for t, tau in enumerate(taus):
        x = tau.astype(np.float64)
        sums += [math.fsum(x[active[t] & (c == 1)] ** 2), math.fsum(x[active[t] & (c >= 2)] ** 2)]
    return np.array(counts, np.int64).reshape(-1, 2), np.array(sums, np.float64)


def reference(fam: Family, names: list[str], eps: float = EPS) -> tuple[np.ndarray, np.ndarray]:
    """The dense numbers over the tensors ``names`` together."""
    taus = [np.concatenate([fam.task_vector(t, n) for n in names]) for t in range(len(fam.agents))]
    return dense(taus, eps)


def check_against_reference(view: IndexView, fam: Family) -> None:
    tensors = view.pairs.tensors
    for r, name in enumerate(tensors.keys):
        counts, sums = reference(fam, [name])
        np.testing.assert_array_equal(tensors.counts[r], counts, err_msg=name)
        np.testing.assert_array_equal(tensors.sums[r], sums, err_msg=name)
        masks = view.tensor_mask(name).reshape(len(fam.agents), -1)  # both, from the probe's masks
        assert [int(np.sum(masks[i] & masks[j])) for i, j in _pairs(len(fam.agents))] == list(counts[:, 0])
    counts, sums = reference(fam, list(tensors.keys))
    np.testing.assert_array_equal(view.pairs.model.counts[0], counts)
    np.testing.assert_array_equal(view.pairs.model.sums[0], sums)
    layers = view.pairs.layers
    keys, rows = view.grouping("layer")
    for r, key in enumerate(keys):
        names = [n for n, row in zip(tensors.keys, rows, strict=True) if row == r]
        counts, sums = reference(fam, names)
        np.testing.assert_array_equal(layers.counts[r], counts, err_msg=key)
        np.testing.assert_array_equal(layers.sums[r], sums, err_msg=key)


def probed(fam: Family, index: Path, **options: object) -> IndexView:
    agents = [str(a) for a in fam.agents]
    probe(fam.base, agents, index=index, agreement=True, options=RunOptions(quiet=True, **options))  # type: ignore[arg-type]
    return open_index(index)


# -- the reference, on families of every dtype ------------------------------------------------


@pytest.mark.parametrize("dtype", ["BF16", "F16", "F32"])
def test_statistics_equal_the_dense_reference(tmp_path: Path, dtype: str) -> None:
    """An agent equal to the base and one with no unique element: c = 0, 1 and >= 2 all occur."""
    fam = build_family(tmp_path / "fam", dtype=dtype, shapes=SHAPES, identical_agent=True, subset_agent=True, seed=3)
    view = probed(fam, tmp_path / "index.zarr", block_elems=512)
    check_against_reference(view, fam)
    assert view.pairs.model.pair_names[0] == "agent0 ~ agent1"


def exact_family(root: Path, second: str) -> Family:
    """Two float32 agents with dyadic task vectors (every sum exact): the second agent's update
    is ``disjoint`` from the first's, ``identical`` to it, or its ``opposite``."""
    rng = np.random.default_rng(9)
    fam = Family(root / "base.safetensors", [root / "a.safetensors", root / "b.safetensors"])
    tensors: list[dict[str, tuple[str, tuple[int, ...], np.ndarray]]] = [{}, {}, {}]
    fam.agent_values = [{}, {}]
    for name, shape in SHAPES.items():
        numel = int(np.prod(shape))
        base = (rng.integers(-64, 64, numel) / 16).astype(np.float32)
        on = rng.random(numel) < 0.5
        tau = np.where(on, rng.integers(1, 64, numel) * rng.choice([-1, 1], numel) / 256, 0).astype(np.float32)
        other = {
            "disjoint": np.where(~on & (rng.random(numel) < 0.5), rng.integers(1, 64, numel) / 256, 0),
            "identical": tau,
            "opposite": -tau,
        }[second].astype(np.float32)
        fam.base_values[name], fam.shapes[name], fam.dtypes[name] = base, shape, "F32"
        for t, values in enumerate((base, base + tau, base + other)):
            tensors[t][name] = ("F32", shape, encode(values, "F32"))
            if t:
                fam.agent_values[t - 1][name] = decode(encode(values, "F32"), "F32")
    for path, content in zip([fam.base, *fam.agents], tensors, strict=True):
        write_safetensors(path, content)
    return fam


@pytest.mark.parametrize("second", ["disjoint", "identical", "opposite"])
def test_disjoint_identical_and_opposite_agents(tmp_path: Path, second: str) -> None:
    fam = exact_family(tmp_path, second)
    view = probed(fam, tmp_path / "index.zarr", block_elems=256)
    check_against_reference(view, fam)
    model: PairTable = view.pairs.model
    share_i, share_j = model.both_share
    if second == "disjoint":
        assert model.both[0, 0] == 0 and model.cosine[0, 0] == 0 and model.sign_agreement[0, 0] == 0
        assert list(model.unique_energy_share[0]) == [1.0, 1.0]
        assert list(model.shared_energy[0]) == [0.0, 0.0]
        return
    assert model.both[0, 0] == view.model.active[0, 0] > 0 and share_i[0, 0] == share_j[0, 0] == 1.0
    assert model.magnitude_ratio[0, 0] == 1.0
    assert list(model.unique_energy_share[0]) == [0.0, 0.0]
    if second == "identical":
        assert model.cosine[0, 0] == 1.0 and model.sign_agreement[0, 0] == 1.0
    else:
        assert model.cosine[0, 0] == -1.0 and model.sign_agreement[0, 0] == 0.0


# -- blocks, threads, backends, executors, resume ---------------------------------------------


@pytest.fixture(scope="module")
def family(tmp_path_factory: pytest.TempPathFactory) -> Family:
    root = tmp_path_factory.mktemp("agreement")
    return build_family(root / "fam", shapes=SHAPES, identical_agent=True, subset_agent=True, shards=2, seed=7)


@pytest.fixture(scope="module")
def baseline(family: Family, tmp_path_factory: pytest.TempPathFactory) -> IndexView:
    view = probed(family, tmp_path_factory.mktemp("baseline") / "index.zarr", block_elems=128, threads=1)
    check_against_reference(view, family)
    return view


def assert_same_pairs(got: IndexView, want: IndexView) -> None:
    for by in ("tensor", "layer", "module", "model"):
        a, b = got.pairs.table(by), want.pairs.table(by)  # type: ignore[arg-type]
        assert a.keys == b.keys
        np.testing.assert_array_equal(a.counts, b.counts, err_msg=by)
        np.testing.assert_array_equal(a.sums, b.sums, err_msg=by)


@settings(max_examples=8, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(
    block_elems=st.integers(1, 48).map(lambda k: 64 * k),
    threads=st.sampled_from([1, 2]),
    backend=st.sampled_from(installed_backends()),
)
def test_numbers_do_not_depend_on_blocks_threads_or_backend(
    family: Family,
    baseline: IndexView,
    tmp_path_factory: pytest.TempPathFactory,
    block_elems: int,
    threads: int,
    backend: str,
) -> None:
    index = tmp_path_factory.mktemp("prop") / "index.zarr"
    view = probed(family, index, block_elems=block_elems, threads=threads, backend=backend)
    assert view.store.plan.block_elems == block_elems
    assert_same_pairs(view, baseline)


@pytest.mark.parametrize("backend", installed_backends())
def test_backends_store_the_same_partials(family: Family, tmp_path: Path, backend: str) -> None:
    """The same digits block by block (not only the same totals)."""
    stat = Agreement(EPS)
    arrays = {}
    for name in ("numba", backend):
        view = probed(family, tmp_path / f"{name}.zarr", block_elems=640, threads=2, backend=name)
        arrays[name] = np.asarray(zarr.open_group(str(view.path), mode="r")[f"stats/{stat.key}"][...])  # type: ignore[index]
    np.testing.assert_array_equal(arrays[backend], arrays["numba"])


def test_streamed_through_a_late_device_the_torch_backend_stores_the_same_partials(
    family: Family, baseline: IndexView, tmp_path: Path
) -> None:
    """The torch backend's streamed (CUDA) path on a simulated device: uploads and downloads
    late, tiles of 64 elements, every buffer poisoned with NaN bytes until written."""
    pytest.importorskip("torch")
    from tests.simulated_gpu import SimulatedGpu
    from tests.test_torch_streamed import simulated_gpu

    with simulated_gpu(SimulatedGpu) as devices:
        view = probed(family, tmp_path / "index.zarr", block_elems=128, threads=1, backend="torch", device="cpu")
    assert devices and sum(d.uploads for d in devices) > 0
    key = f"stats/{Agreement(EPS).key}"
    got, want = (np.asarray(zarr.open_group(str(v.path), mode="r")[key][...]) for v in (view, baseline))  # type: ignore[index]
    np.testing.assert_array_equal(got, want)


def test_added_to_an_existing_index_and_on_two_dask_workers(
    family: Family, baseline: IndexView, tmp_path: Path
) -> None:
    """``probe --agreement`` adds the statistics to an index probed without them (which keeps its
    blocks: dozens of batches), here on a cluster of two worker processes on loopback (started
    and stopped by the command)."""
    pytest.importorskip("distributed")
    index = tmp_path / "index.zarr"
    members = [str(family.base), *map(str, family.agents)]
    probe(family.base, members[1:], index=index, options=RunOptions(quiet=True, block_elems=256))
    one_line_error(in_process("inspect", index, "--pairs"), "no agreement statistics", "--agreement", str(index))
    ok(in_process("probe", *members, "--index", index, "--quiet", "--agreement", "--dask-workers", "2"))
    assert_same_pairs(open_index(index), baseline)


KILL_AT_MARK = r"""
import os, signal, sys
marks = {"n": 0}
def hook(event, args):
    if event == "os.rename" and "/progress/agreement_v1" in str(args[1]) and "/c." in str(args[1]):
        marks["n"] += 1
        if marks["n"] == 3:
            os.kill(os.getpid(), signal.SIGKILL)
sys.addaudithook(hook)
from ramstream.cli import main
main()
"""


def test_killed_pass_resumes_to_the_same_numbers(family: Family, baseline: IndexView, tmp_path: Path) -> None:
    """SIGKILL just before the third unit of the pass is marked done (the index's blocks of 128
    elements make a pass of dozens of units); the rerun finishes it. Only the journal's chunks
    count: its metadata is rewritten too (the throughput record, every 2 s on a slow machine)."""
    index = tmp_path / "index.zarr"
    probe(family.base, [str(a) for a in family.agents], index=index, options=RunOptions(quiet=True, block_elems=128))
    args = ["probe", str(family.base), *map(str, family.agents), "--index", str(index), "--quiet", "--threads", "1"]
    killed = subprocess.run(
        [sys.executable, "-c", KILL_AT_MARK, *args, "--agreement"], capture_output=True, text=True, timeout=120
    )
    assert killed.returncode == -9, killed.stderr
    stat = Agreement(EPS)
    journal = np.asarray(zarr.open_group(str(index), mode="r")[f"progress/{stat.key}"][...])  # type: ignore[index]
    assert 0 < journal.sum() < len(journal), "the kill landed mid-pass"
    one_line_error(in_process("inspect", index, "--pairs"), "--agreement")
    ok(in_process(*args, "--agreement"))
    assert_same_pairs(open_index(index), baseline)


# -- the command line -------------------------------------------------------------------------


def test_inspect_pairs_table_json_and_plot(family: Family, baseline: IndexView, tmp_path: Path) -> None:
    index = baseline.path
    table = ok(in_process("inspect", index, "--pairs", "--by", "layer")).out
    model = baseline.pairs.model
    assert (
        "agent0 ~ agent1" in table and "agent1 ~ agent2 by layer" in table and "unique energy share by layer" in table
    )
    assert "layer" in table and "density/uniq-share" not in table  # pairs replace the overlap tables
    doc = json.loads(ok(in_process("inspect", index, "--pairs", "--by", "module", "--json")).out)
    assert doc["schema"] == 2 and "modules" not in doc
    section = doc["pairs"]
    assert len(section["modules"]) == len(baseline.modules)
    first = section["model"]["pairs"][0]
    assert first["agents"] == ["agent0", "agent1"]
    assert first["both"] == int(model.both[0, 0]) and first["same_sign"] == int(model.same_sign[0, 0])
    assert first["cosine"] == float(model.cosine[0, 0])
    assert first["sum_products"] == float(model.sum_products[0, 0])
    for p, (i, j) in enumerate(model.pairs):
        entry = section["model"]["pairs"][p]
        assert entry["both_share"] == [
            entry["both"] / doc["agents"][i]["active"] if doc["agents"][i]["active"] else 0.0,
            entry["both"] / doc["agents"][j]["active"] if doc["agents"][j]["active"] else 0.0,
        ]
        assert sum(row["pairs"][p]["both"] for row in section["modules"]) == entry["both"]
    identical = [a for a in section["model"]["agents"] if a["name"] == "agent4"]
    assert identical == [{"name": "agent4", "unique_energy": 0.0, "shared_energy": 0.0, "unique_energy_share": 0.0}]
    pytest.importorskip("matplotlib")
    for plot in (tmp_path / "pairs.png", tmp_path / "pairs.svg"):
        done = ok(in_process("inspect", index, "--pairs", "--plot", plot))
        assert plot.stat().st_size > 0 and f"plot: {plot}" in done.out
    one_line_error(
        in_process("inspect", index, "--pairs", "--tensor", "lm_head.weight", "--plot", tmp_path / "x.png"), "--pairs"
    )


def test_an_index_without_the_statistics_opens_and_says_how_to_add_them(family: Family, tmp_path: Path) -> None:
    index = tmp_path / "index.zarr"
    probe(family.base, [str(a) for a in family.agents], index=index, options=RunOptions(quiet=True))
    view = open_index(index)  # opens, and answers everything else
    assert view.model.active.shape == (1, len(family.agents))
    ok(in_process("inspect", index))
    line = one_line_error(in_process("inspect", index, "--pairs", "--json"), "ramstream probe BASE AGENTS --agreement")
    assert f"--index {index}" in line
