"""The JSON documents of ``inspect`` pinned by golden files (docs/inspect.md, schema 2): the
overlap sections, and the pairs' agreement (``--pairs --by layer``).

The family is small and deterministic (float32, seeded masks, task vectors of a few dyadic
values drawn from a second generator, so the masks do not depend on them), so every count, sum
and ratio is fixed. To regenerate after a deliberate, documented change of the documents:

    python -m tests.test_inspect_golden --update
"""

from __future__ import annotations

import json
import sys
import tempfile
from pathlib import Path
from typing import Any

import numpy as np
import pytest
from click.testing import CliRunner

from ramstream.api import probe
from ramstream.cli import main
from ramstream.config import RunOptions
from tests.families import write_safetensors

GOLDEN = Path(__file__).parent / "golden" / "inspect_v2.json"
GOLDEN_PAIRS = Path(__file__).parent / "golden" / "inspect_pairs_v2.json"
SHAPES: dict[str, tuple[int, ...]] = {
    "model.embed_tokens.weight": (16, 8),
    "model.layers.0.input_layernorm.weight": (8,),
    "model.layers.0.self_attn.q_proj.weight": (8, 8),
    "model.layers.0.self_attn.q_proj.bias": (8,),
    "model.layers.0.mlp.down_proj.weight": (8, 12),
    "model.layers.1.input_layernorm.weight": (8,),
    "model.layers.1.self_attn.q_proj.weight": (8, 8),
    "model.layers.1.mlp.down_proj.weight": (8, 12),
    "model.norm.weight": (8,),
    "lm_head.weight": (16, 8),
}
DENSITIES = (0.1, 0.4, 0.6)
ARGS = ["--json", "--by", "all", "--top", "2", "--tensor", "model.layers.0.self_attn.q_proj.weight"]
PAIR_ARGS = ["--json", "--pairs", "--by", "layer"]
STEPS = np.array([0.5, -0.25, 1.0, -1.0], np.float32)  # task vector values (exact in float32)


def write_family(root: Path) -> tuple[Path, list[Path]]:
    rng = np.random.default_rng(2024)
    steps = np.random.default_rng(7)
    base: dict[str, tuple[str, tuple[int, ...], np.ndarray]] = {}
    agents: list[dict[str, tuple[str, tuple[int, ...], np.ndarray]]] = [{} for _ in DENSITIES]
    for name, shape in SHAPES.items():
        numel = int(np.prod(shape))
        values = (np.arange(numel) % 7).astype(np.float32) * np.float32(0.125)
        base[name] = ("F32", shape, values)
        for t, density in enumerate(DENSITIES):
            changed = rng.random(numel) < density
            tau = np.where(changed, STEPS[steps.integers(0, len(STEPS), numel)], np.float32(0))
            agents[t][name] = ("F32", shape, (values + tau).astype(np.float32))
    paths = [root / "base.safetensors", *(root / f"agent{t + 1}.safetensors" for t in range(len(DENSITIES)))]
    for path, tensors in zip(paths, [base, *agents], strict=True):
        write_safetensors(path, tensors)
    return paths[0], paths[1:]


def documents(root: Path) -> tuple[dict[str, Any], dict[str, Any]]:
    """The overlap document and the pairs document."""
    base, agents = write_family(root)
    index = root / "index.zarr"
    probe(base, [str(a) for a in agents], index=index, agreement=True, options=RunOptions(block_elems=64, quiet=True))
    docs = []
    for args in (ARGS, PAIR_ARGS):
        result = CliRunner().invoke(main, ["inspect", str(index), *args])
        assert result.exit_code == 0, result.output
        doc: dict[str, Any] = json.loads(result.output)
        assert doc["index"] == str(index)
        doc["index"] = "<index>"
        doc["ramstream_version"] = "<version>"
        docs.append(doc)
    return docs[0], docs[1]


def test_golden(tmp_path: Path) -> None:
    for doc, path in zip(documents(tmp_path), (GOLDEN, GOLDEN_PAIRS), strict=True):
        golden = json.loads(path.read_text())
        assert doc == golden
        # the same keys in the same order, the same numbers to the last digit
        assert json.dumps(doc, indent=1) == json.dumps(golden, indent=1)


def dense_masks() -> dict[str, np.ndarray]:
    """The masks ``write_family`` draws, (N, numel) per tensor, straight from the generator."""
    rng = np.random.default_rng(2024)
    out = {}
    for name, shape in SHAPES.items():
        numel = int(np.prod(shape))
        out[name] = np.array([rng.random(numel) < d for d in DENSITIES])
    return out


def test_golden_numbers_are_right() -> None:
    """The pinned file itself against the dense masks; its sections add up to its summary."""
    golden = json.loads(GOLDEN.read_text())
    masks = dense_masks()
    for row in golden["tensors"]:
        m = masks[row["key"]]
        c = m.sum(axis=0)
        assert row["coverage"] == [int(np.count_nonzero(c == k)) for k in range(len(DENSITIES) + 1)]
        for t, agent in enumerate(row["agents"]):
            assert agent["overlap_histogram"] == [
                int(np.count_nonzero(m[t] & (c == k))) for k in range(1, len(DENSITIES) + 1)
            ]
            assert agent["density"] == np.count_nonzero(m[t]) / m.shape[1]
    for section in ("layers", "modules", "tensors"):
        assert sum(row["params"] for row in golden[section]) == golden["params"]
        for t, agent in enumerate(golden["agents"]):
            assert sum(row["agents"][t]["active"] for row in golden[section]) == agent["active"]
            assert sum(row["agents"][t]["unique"] for row in golden[section]) == agent["unique"]
    assert [sum(c) for c in zip(*(row["coverage"] for row in golden["tensors"]), strict=True)] == golden["coverage"]


def dense_taus() -> dict[str, np.ndarray]:
    """The task vectors ``write_family`` writes, (N, numel) float32 per tensor."""
    masks = dense_masks()
    steps = np.random.default_rng(7)
    out = {}
    for name, m in masks.items():
        out[name] = np.array(
            [np.where(row, STEPS[steps.integers(0, len(STEPS), row.size)], 0) for row in m], np.float32
        )
    return out


def test_golden_pairs_are_right() -> None:
    """The pinned pairs document against the dense task vectors, from the definitions."""
    golden = json.loads(GOLDEN_PAIRS.read_text())
    assert golden["schema"] == 2 and "layers" not in golden
    taus = dense_taus()
    rows = {r["key"]: r for r in golden["pairs"]["layers"]}
    groups = {"model": list(SHAPES), "embed_tokens": ["model.embed_tokens.weight"], "lm_head": ["lm_head.weight"]}
    groups |= {"0": [n for n in SHAPES if ".layers.0." in n], "norm": ["model.norm.weight"]}
    for key, names in groups.items():
        row = golden["pairs"]["model"] if key == "model" else rows[key]
        tau = np.concatenate([taus[n] for n in names], axis=1).astype(np.float64)
        on = tau != 0
        for entry, (i, j) in zip(row["pairs"], [(0, 1), (0, 2), (1, 2)], strict=True):
            both = on[i] & on[j]
            x, y = tau[i][both], tau[j][both]
            assert entry["both"] == int(both.sum())
            assert entry["same_sign"] == int(np.sum(np.sign(x) == np.sign(y)))
            assert entry["sum_products"] == float(np.sum(x * y))  # dyadic values: every sum is exact
            assert entry["sum_squares"] == [float(np.sum(x * x)), float(np.sum(y * y))]
            if x.size:
                assert entry["cosine"] == pytest.approx(np.dot(x, y) / np.sqrt(np.dot(x, x) * np.dot(y, y)))
        c = on.sum(axis=0)
        for t, agent in enumerate(row["agents"]):
            assert agent["unique_energy"] == float(np.sum(tau[t][on[t] & (c == 1)] ** 2))
            assert agent["shared_energy"] == float(np.sum(tau[t][on[t] & (c >= 2)] ** 2))


if __name__ == "__main__":
    if sys.argv[1:] != ["--update"]:
        sys.exit("usage: python -m tests.test_inspect_golden --update")
    with tempfile.TemporaryDirectory() as tmp:
        for doc, path in zip(documents(Path(tmp)), (GOLDEN, GOLDEN_PAIRS), strict=True):
            path.write_text(json.dumps(doc, indent=1) + "\n")
            print(f"wrote {path}")
