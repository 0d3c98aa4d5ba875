"""``ramstream inspect`` end to end: text and JSON, from the index alone, and its errors."""

from __future__ import annotations

import json
import shutil
import subprocess
import sys
from pathlib import Path

import pytest
from click.testing import CliRunner

from ramstream.api import probe
from ramstream.cli import main
from ramstream.config import RunOptions
from tests import inspect_reference as ref
from tests.families import build_family

TENSOR = "model.layers.0.self_attn.q_proj.weight"


@pytest.fixture(scope="module")
def probed(tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, dict[str, ref.Dense], list[str], Path]:
    """An index, the dense counts of its family, the agents' names, and the family's directory."""
    root = tmp_path_factory.mktemp("family")
    family = build_family(root, int_tensor=True, seed=11)
    index = tmp_path_factory.mktemp("idx") / "index.zarr"
    options = RunOptions(block_elems=128, quiet=True, cache_dir=index.parent / "cache")
    probe(family.base, [str(a) for a in family.agents], index=index, options=options)
    return index, ref.tensor_counts(family), [a.name for a in family.agents], root


def run(*args: str) -> tuple[int, str]:
    result = CliRunner().invoke(main, list(args))
    return result.exit_code, result.output


def test_text_tables(probed: tuple[Path, dict[str, ref.Dense], list[str], Path]) -> None:
    index, dense, names, _ = probed
    code, out = run("inspect", str(index), "--by", "all", "--top", "2", "--tensor", TENSOR)
    assert code == 0, out
    total = ref.summed(list(dense.values()), len(names))
    header, *rows = out.split("\n\n")[0].splitlines()
    assert header.split()[:4] == ["agent", "params", "active", "density"]
    for line, t in zip(rows, range(len(names)), strict=True):
        cells = line.split()
        assert cells[0] == names[t] and int(cells[1]) == total.params and int(cells[2]) == total.agent(t)["active"]
    sections = out.split("\n\n")
    assert sections[1].startswith("layer") and "embed_tokens" in sections[1] and "lm_head" in sections[1]
    assert sections[2].startswith("module") and "self_attn.q_proj" in sections[2]
    assert sections[3].startswith("tensor") and "model.layers.1.mlp.up_proj.weight" in sections[3]
    assert f"top 2 tensors of {names[0]} by unique_share:" in sections[4]
    assert sections[5].startswith(f"tensor {TENSOR}  24x24 (BF16, BF16, BF16, BF16)  layer 0")
    # the per-agent line of the single-tensor table: active, density, shared, unique
    line = next(x for x in sections[5].splitlines() if x.startswith(names[1]))
    want = dense[TENSOR].agent(1)
    assert [int(x) for x in (line.split()[1], line.split()[3], line.split()[4])] == [
        want["active"],
        want["shared"],
        want["unique"],
    ]
    # --by agent is the summary alone, as without --by
    assert run("inspect", str(index), "--by", "agent")[1] == run("inspect", str(index))[1]


def test_json_keeps_the_spine_keys(probed: tuple[Path, dict[str, ref.Dense], list[str], Path]) -> None:
    index, dense, names, _ = probed
    code, out = run("inspect", str(index), "--json", "--r", "0.3", "--alpha", "1.0")
    assert code == 0, out
    doc = json.loads(out)
    assert doc["schema"] == 2 and doc["r"] == 0.3 and doc["alpha"] == 1.0
    total = ref.summed(list(dense.values()), len(names))
    assert doc["params"] == total.params
    for t, agent in enumerate(doc["agents"]):
        assert {"name", "active", "shared", "unique", "rho", "lambda"} <= set(agent)
        want = total.agent(t)
        assert (agent["name"], agent["active"], agent["shared"], agent["unique"]) == (
            names[t],
            want["active"],
            want["shared"],
            want["unique"],
        )
        assert agent["lambda"] == pytest.approx(ref.lam(want, 0.3, 1.0), rel=1e-12)
    assert not {"layers", "modules", "tensors", "top", "tensor"} & set(doc)  # sections only when asked


def test_lambda_rules(probed: tuple[Path, dict[str, ref.Dense], list[str], Path]) -> None:
    index, dense, names, _ = probed
    total = ref.summed(list(dense.values()), len(names))
    share = json.loads(run("inspect", str(index), "--json", "--lambda-rule", "share", "--r", "0.5")[1])
    script = json.loads(run("inspect", str(index), "--json", "--lambda-rule", "script")[1])
    for t in range(len(names)):
        want = total.agent(t)
        touched = want["shared"] + want["unique"]
        assert share["agents"][t]["lambda"] == pytest.approx(1 + 0.5 * want["shared"] / touched, rel=1e-12)
        assert script["agents"][t]["lambda"] == pytest.approx(1 + 0.1 * min(1.0, want["rho"]), rel=1e-12)
    assert share["lambda_rule"] == "share" and script["lambda_rule"] == "script"


def test_inspect_with_the_checkpoints_moved_away(
    probed: tuple[Path, dict[str, ref.Dense], list[str], Path], tmp_path: Path
) -> None:
    index, dense, _, root = probed
    moved = tmp_path / "moved"
    shutil.move(str(root), moved)
    try:
        shutil.rmtree(moved)  # gone entirely
        argv = [sys.executable, "-m", "ramstream", "inspect", str(index), "--json", "--by", "tensor"]
        argv += ["--tensor", TENSOR]
        proc = subprocess.run(argv, capture_output=True, text=True, check=True)
        doc = json.loads(proc.stdout)
        for entry in doc["tensors"]:
            expected = dense[entry["key"]]
            assert entry["coverage"] == expected.coverage.tolist()
            for t, agent in enumerate(entry["agents"]):
                assert agent["overlap_histogram"] == expected.overlap[t].tolist()
        assert doc["tensor"]["coverage"] == dense[TENSOR].coverage.tolist()
        code, out = run("inspect", str(index), "--tensor", TENSOR, "--plot", str(tmp_path / "t.png"))
        assert code == 0, out
        assert (tmp_path / "t.png").stat().st_size > 0
    finally:
        root.mkdir(exist_ok=True)


@pytest.mark.parametrize(
    ("args", "message"),
    [
        (["--tensor", "nope"], "no tensor 'nope' in this index"),
        (["--tensor", "q_proj"], "did you mean model.layers.0.self_attn.q_proj.weight"),
        (["--tensor", "model.position_ids"], "copied from the base, not merged"),
        (["--agent", "agent1"], "give --top K with it"),
        (["--top", "2", "--agent", "nobody"], "no agent 'nobody'"),
        (["--plot", "figure.pdf"], "writes PNG or SVG"),
        (["--plot", "/nonexistent/dir/figure.png"], "does not exist"),
        (["--r", "-1"], "--r must be a finite number >= 0"),
    ],
)
def test_errors_are_one_line(
    probed: tuple[Path, dict[str, ref.Dense], list[str], Path], args: list[str], message: str
) -> None:
    index = probed[0]
    code, out = run("inspect", str(index), *args)
    assert code == 1
    assert out.startswith("error: ") and out.count("\n") == 1 and message in out, out


def test_not_an_index(tmp_path: Path) -> None:
    code, out = run("inspect", str(tmp_path))
    assert code == 1 and out.startswith("error: ") and "no ramstream index here" in out


def test_plot_without_matplotlib(
    probed: tuple[Path, dict[str, ref.Dense], list[str], Path], tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setitem(sys.modules, "matplotlib", None)
    code, out = run("inspect", str(probed[0]), "--plot", str(tmp_path / "f.png"))
    assert code == 1 and out.count("\n") == 1
    assert "needs matplotlib" in out and "pip install 'ramstream[plot]'" in out
    assert not (tmp_path / "f.png").exists()
