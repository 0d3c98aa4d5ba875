"""The JSON document of ``inspect`` pinned by a golden file (docs/inspect.md, schema 1).

The family is small and deterministic (float32, seeded masks), so every count and every ratio
is fixed. To regenerate after a deliberate, documented change of the document:

    python -m tests.test_inspect_golden --update
"""

from __future__ import annotations

import json
import sys
import tempfile
from pathlib import Path
from typing import Any

import numpy as np
from click.testing import CliRunner

from ramstream.api import probe
from ramstream.cli import main
from ramstream.config import RunOptions
from tests.families import write_safetensors

GOLDEN = Path(__file__).parent / "golden" / "inspect_v1.json"
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


def write_family(root: Path) -> tuple[Path, list[Path]]:
    rng = np.random.default_rng(2024)
    base: dict[str, tuple[str, tuple[int, ...], np.ndarray]] = {}
    agents: list[dict[str, tuple[str, tuple[int, ...], np.ndarray]]] = [{} for _ in DENSITIES]
    for name, shape in SHAPES.items():
        numel = int(np.prod(shape))
        values = (np.arange(numel) % 7).astype(np.float32) * np.float32(0.125)
        base[name] = ("F32", shape, values)
        for t, density in enumerate(DENSITIES):
            changed = rng.random(numel) < density
            agents[t][name] = ("F32", shape, np.where(changed, values + np.float32(0.5), values).astype(np.float32))
    paths = [root / "base.safetensors", *(root / f"agent{t + 1}.safetensors" for t in range(len(DENSITIES)))]
    for path, tensors in zip(paths, [base, *agents], strict=True):
        write_safetensors(path, tensors)
    return paths[0], paths[1:]


def document(root: Path) -> dict[str, Any]:
    base, agents = write_family(root)
    index = root / "index.zarr"
    probe(base, [str(a) for a in agents], index=index, options=RunOptions(block_elems=64, quiet=True))
    result = CliRunner().invoke(main, ["inspect", str(index), *ARGS])
    assert result.exit_code == 0, result.output
    doc: dict[str, Any] = json.loads(result.output)
    assert doc["index"] == str(index)
    doc["index"] = "<index>"
    doc["ramstream_version"] = "<version>"
    return doc


def test_golden(tmp_path: Path) -> None:
    doc = document(tmp_path)
    golden = json.loads(GOLDEN.read_text())
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


if __name__ == "__main__":
    if sys.argv[1:] != ["--update"]:
        sys.exit("usage: python -m tests.test_inspect_golden --update")
    with tempfile.TemporaryDirectory() as tmp:
        GOLDEN.write_text(json.dumps(document(Path(tmp)), indent=1) + "\n")
    print(f"wrote {GOLDEN}")
