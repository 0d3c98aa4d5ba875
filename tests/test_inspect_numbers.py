"""Every number of ``inspect`` (Python view, JSON document, per agent / layer / module / tensor)
against a dense reference computed from the float values the family writer put on disk."""

from __future__ import annotations

import json
import shutil
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest
import zarr

import ramstream
from ramstream.api import probe
from ramstream.config import RunOptions
from ramstream.errors import ConfigError, IndexMismatchError
from ramstream.inspect import document
from ramstream.inspect.view import IndexView, open_index
from ramstream.methods.ram import RamParams
from tests import inspect_reference as ref
from tests.families import DEFAULT_SHAPES, Family, build_family

SHAPES: dict[str, tuple[int, ...]] = {
    **DEFAULT_SHAPES,
    "model.layers.0.self_attn.q_proj.bias": (37,),  # not a multiple of 8: masks end mid-byte
    "model.layers.1.self_attn.q_proj.weight": (24, 24),
    "model.layers.1.input_layernorm.weight": (24,),
    "model.layers.1.mlp.down_proj.weight": (24, 40),
    "model.layers.1.scale": (),
    "model.layers.1.empty": (0, 4),
    "model.layers.10.mlp.down_proj.weight": (16, 2048),  # wide: images bin whole bytes
}
BLOCK = 128


@pytest.fixture(scope="module")
def family(tmp_path_factory: pytest.TempPathFactory) -> Family:
    # agents: three sparse, one whose changes are all shared (rho inf), one equal to the base
    return build_family(
        tmp_path_factory.mktemp("family"), shapes=SHAPES, subset_agent=True, identical_agent=True, int_tensor=True
    )


@pytest.fixture(scope="module")
def index(family: Family, tmp_path_factory: pytest.TempPathFactory) -> Path:
    path = tmp_path_factory.mktemp("idx") / "index.zarr"
    options = RunOptions(block_elems=BLOCK, quiet=True, cache_dir=path.parent / "cache")
    probe(family.base, [str(a) for a in family.agents], index=path, options=options)
    return path


@pytest.fixture(scope="module")
def view(index: Path) -> IndexView:
    return open_index(index)


@pytest.fixture(scope="module")
def dense(family: Family) -> dict[str, ref.Dense]:
    return ref.tensor_counts(family)


def _check_agents(rows: list[dict[str, object]], expected: ref.Dense, agents: list[str]) -> None:
    assert [r["name"] for r in rows] == agents
    for t, row in enumerate(rows):
        want = ref.Dense.agent(expected, t)
        for key, value in want.items():
            got = row[key]
            assert (float("inf") if got == "inf" else got) == value, (row["name"], key)


def _check_table(table: ramstream.inspect.Table, row: int, expected: ref.Dense) -> None:
    assert table.params[row] == expected.params
    np.testing.assert_array_equal(table.overlap[row], expected.overlap)
    np.testing.assert_array_equal(table.coverage[row], expected.coverage)
    assert table.collide[row] == expected.collide
    for t in range(len(table.agents)):
        want = expected.agent(t)
        assert table.active[row, t] == want["active"]
        assert table.unique[row, t] == want["unique"]
        assert table.shared[row, t] == want["shared"]
        assert table.density[row, t] == want["density"]
        assert table.unique_share[row, t] == want["unique_share"]
        assert table.rho[row, t] == want["rho"]


def test_open_index_is_exported_lazily() -> None:
    code = "import sys, ramstream; assert not {'zarr', 'numba'} & set(sys.modules); ramstream.open_index"
    subprocess.run([sys.executable, "-c", code], check=True)
    assert ramstream.open_index is open_index


def test_per_tensor(view: IndexView, dense: dict[str, ref.Dense], family: Family) -> None:
    # non-float tensors are copied, not merged: they have no row
    assert list(view.tensors.keys) == [n for n in SHAPES]
    assert "model.position_ids" not in view.tensors.keys
    for name, expected in dense.items():
        _check_table(view.tensors, view.tensors.row(name), expected)


def test_per_layer_and_module(view: IndexView, dense: dict[str, ref.Dense], family: Family) -> None:
    n = len(family.agents)
    for table, key_of in ((view.layers, ref.layer_of), (view.modules, ref.module_of)):
        groups: dict[str, list[ref.Dense]] = {}
        for name, counts in dense.items():
            groups.setdefault(key_of(name), []).append(counts)
        assert sorted(table.keys) == sorted(groups)
        for key, parts in groups.items():
            _check_table(table, table.row(key), ref.summed(parts, n))
            assert table.n_tensors[table.row(key)] == len(parts)
    # embeddings first, then layers in numeric order (10 after 1), then the rest in model order
    assert view.layers.keys == ("embed_tokens", "0", "1", "10", "norm", "lm_head")


def test_per_agent_summary_and_lambda(view: IndexView, dense: dict[str, ref.Dense], family: Family) -> None:
    total = ref.summed(list(dense.values()), len(family.agents))
    _check_table(view.model, 0, total)
    for r, alpha in ((0.1, 2.0), (0.3, 0.5), (0.0, 2.0)):
        doc, _ = document.build(view, document.InspectRequest(params=RamParams(r=r, alpha=alpha)))
        assert doc["params"] == total.params and (doc["r"], doc["alpha"]) == (r, alpha)
        _check_agents(doc["agents"], total, [a.name for a in family.agents])
        for t, entry in enumerate(doc["agents"]):
            want = total.agent(t)
            assert entry["params"] == total.params
            assert entry["lambda"] == pytest.approx(ref.lam(want, r, alpha), rel=1e-12)
    # the identical agent changed nothing; the subset agent has no unique element (rho inf, lambda capped)
    assert doc["agents"][-1]["active"] == 0 and doc["agents"][-1]["rho"] == 0.0
    assert doc["agents"][-2]["rho"] == "inf" and doc["agents"][-2]["unique"] == 0


def test_document_sections(view: IndexView, dense: dict[str, ref.Dense], family: Family) -> None:
    n = len(family.agents)
    names = [a.name for a in family.agents]
    params = RamParams(r=0.2, alpha=1.5)
    tensor = "model.layers.0.self_attn.q_proj.bias"
    request = document.InspectRequest(by=("layer", "module", "tensor"), top=3, tensor=tensor, params=params)
    doc, _ = document.build(view, request)
    json.dumps(doc, allow_nan=False)  # valid JSON: no NaN / Infinity
    for entry in doc["tensors"]:
        expected = dense[entry["key"]]
        assert entry["params"] == expected.params and entry["coverage"] == expected.coverage.tolist()
        assert entry["shape"] == list(SHAPES[entry["key"]])
        _check_agents(entry["agents"], expected, names)
        for t, agent in enumerate(entry["agents"]):  # lambda with this tensor's rho (--rho-scope tensor)
            assert agent["lambda"] == pytest.approx(ref.lam(expected.agent(t), 0.2, 1.5), rel=1e-12)
    for section, key_of in (("layers", ref.layer_of), ("modules", ref.module_of)):
        for entry in doc[section]:
            parts = [c for name, c in dense.items() if key_of(name) == entry["key"]]
            expected = ref.summed(parts, n)
            assert (entry["params"], entry["tensors"]) == (expected.params, len(parts))
            assert entry["collide"] == expected.collide
            _check_agents(entry["agents"], expected, names)
    single = doc["tensor"]
    assert single["key"] == tensor and single["blocks"] == 1 and single["layer"] == 0
    assert single["module"] == "self_attn.q_proj.bias" and single["kind"] == "attention"
    _check_agents(single["agents"], dense[tensor], names)


@pytest.mark.parametrize("rank_by", ["unique_share", "unique", "density", "rho"])
def test_top(view: IndexView, dense: dict[str, ref.Dense], family: Family, rank_by: str) -> None:
    doc, _ = document.build(view, document.InspectRequest(top=4, rank_by=rank_by))  # type: ignore[arg-type]
    assert doc["top"]["k"] == 4 and doc["top"]["rank_by"] == rank_by
    for t, agent in enumerate(doc["top"]["agents"]):
        # the reference ranking: tensors the agent touched, by value, then more unique elements, then model order
        rows = [(name, c.agent(t)) for name, c in dense.items() if c.agent(t)["active"] > 0]
        order = sorted(range(len(rows)), key=lambda i: (-rows[i][1][rank_by], -rows[i][1]["unique"], i))
        want = [rows[i][0] for i in order[:4]]
        assert [e["key"] for e in agent["tensors"]] == want
        for entry in agent["tensors"]:
            expected = dense[entry["key"]].agent(t)
            value = float("inf") if entry["value"] == "inf" else entry["value"]
            assert value == expected[rank_by]
            assert (entry["active"], entry["unique"], entry["shared"]) == (
                expected["active"],
                expected["unique"],
                expected["shared"],
            )
    assert doc["top"]["agents"][-1]["tensors"] == []  # the identical agent touched nothing


def test_tensor_masks(view: IndexView, family: Family) -> None:
    for name, shape in SHAPES.items():
        mask = view.tensor_mask(name)
        assert mask.dtype == bool and mask.shape == (len(family.agents), *shape)
        np.testing.assert_array_equal(mask.reshape(len(family.agents), -1), ref.dense_masks(family, name))


@pytest.mark.parametrize(
    ("name", "max_cells"),
    [
        ("model.embed_tokens.weight", 7),  # 96 x 24: uneven bins, element columns
        ("model.layers.0.self_attn.q_proj.bias", 5),  # a vector: one row
        ("model.layers.10.mlp.down_proj.weight", 16),  # 16 x 2048: whole-byte columns
        ("model.layers.10.mlp.down_proj.weight", 300),  # more cells than byte columns
        ("model.layers.1.scale", 4),  # a scalar
    ],
)
def test_mask_image(view: IndexView, family: Family, name: str, max_cells: int) -> None:
    image = view.mask_image(name, max_cells)
    active, collide, cells = ref.image(ref.dense_masks(family, name), SHAPES[name] or (1,), max_cells)
    np.testing.assert_array_equal(image.active, active)
    np.testing.assert_array_equal(image.collide, collide)
    np.testing.assert_array_equal(image.cells, cells)
    assert image.density.shape == active.shape and image.density.max() <= 1.0


def test_to_pandas(view: IndexView, dense: dict[str, ref.Dense], family: Family) -> None:
    pytest.importorskip("pandas")
    frame = view.to_pandas("tensor")
    assert len(frame) == len(SHAPES) * len(family.agents)
    names = [a.name for a in family.agents]
    for row in frame.itertuples():
        want = dense[row.tensor].agent(names.index(row.agent))
        assert (row.active, row.unique, row.shared, row.density) == (
            want["active"],
            want["unique"],
            want["shared"],
            want["density"],
        )
        assert row.module == ref.module_of(row.tensor)
    layers = view.to_pandas("layer")
    assert set(layers["layer"]) == set(view.layers.keys)
    assert layers["active"].sum() == view.model.active.sum()


def test_missing_pandas_is_one_clear_error(view: IndexView, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setitem(sys.modules, "pandas", None)
    with pytest.raises(ramstream.errors.MissingDependencyError, match=r"ramstream\[notebook\]"):
        view.to_pandas()


def test_unknown_and_copied_tensors_are_refused(view: IndexView) -> None:
    with pytest.raises(ConfigError, match="did you mean"):
        view.tensor_mask("q_proj.weight")
    with pytest.raises(ConfigError, match="copied from the base"):
        view.tensor_mask("model.position_ids")
    with pytest.raises(ConfigError, match="no agent"):
        document.build(view, document.InspectRequest(top=1, agent="nobody"))


def test_block_size_and_rollup_do_not_change_a_number(family: Family, index: Path, tmp_path: Path) -> None:
    other = tmp_path / "big-blocks.zarr"
    probe(family.base, [str(a) for a in family.agents], index=other, options=RunOptions(block_elems=4096, quiet=True))
    request = document.InspectRequest(by=("layer", "module", "tensor"), top=3)
    docs = [document.build(open_index(p), request)[0] for p in (index, other)]
    # an index without the per-tensor roll-up (as written before it existed) sums its blocks
    copy = tmp_path / "no-rollup.zarr"
    shutil.copytree(index, copy)
    for name in ("tensor_overlap", "tensor_coverage"):
        shutil.rmtree(copy / "stats" / name)
    stats = zarr.open_group(str(copy / "stats"), mode="r")
    assert "tensor_overlap" not in stats
    docs.append(document.build(open_index(copy), request)[0])
    for doc in docs:
        doc.pop("index")
        doc.pop("block_elems")
    assert docs[0] == docs[1] == docs[2]


def test_unfinished_probe_is_refused(index: Path, tmp_path: Path) -> None:
    path = tmp_path / "index.zarr"
    shutil.copytree(index, path)
    group = zarr.open_group(str(path), mode="r+")
    group.attrs["probe"] = {"complete": False, "seconds": 1.0, "bytes": 1, "finished_at": None}
    with pytest.raises(IndexMismatchError, match="has not finished"):
        open_index(path)
