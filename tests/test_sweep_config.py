"""``ramstream sweep --config``: candidates as mergekit configs, each the bytes of ``merge --config``.

Both forms (a list of configs, one config with a ``sweep:`` key) on real checkpoints through the
real CLI; the reference for every candidate is ``ramstream merge --config`` on the config that
candidate stands for, written out by the test.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest
import yaml
from click.testing import Result

from tests.families import Family, build_family
from tests.test_sweep import invoke, tree


@pytest.fixture(scope="module")
def family(tmp_path_factory: pytest.TempPathFactory) -> Family:
    return build_family(tmp_path_factory.mktemp("sweep-config"), densities=(0.2, 0.45), seed=23)


def config(family: Family, method: str, parameters: dict[str, Any] | None = None, **extra: Any) -> dict[str, Any]:
    """A mergekit config of the family, with per-model weights for the methods that read them."""
    weighted = method not in ("ramplus_tl", "model_stock")
    models = [
        {"model": str(a), **({"parameters": {"weight": 1.0 - 0.25 * i}} if weighted else {})}
        for i, a in enumerate(family.agents)
    ]
    doc: dict[str, Any] = {"merge_method": method, "base_model": str(family.base), "models": models}
    if parameters:
        doc["parameters"] = parameters
    return {**doc, **extra}


def write(path: Path, docs: Any, *, stream: bool = False) -> Path:
    path.write_text(yaml.safe_dump_all(docs, sort_keys=False) if stream else yaml.safe_dump(docs, sort_keys=False))
    return path


def sweep_config(path: Path, out: Path, cache: Path, *extra: object) -> Result:
    return invoke("sweep", "--config", path, "--out", out, "--cache-dir", cache, "--quiet", *extra)


def merged_config(doc: dict[str, Any], path: Path, out: Path, cache: Path) -> dict[str, bytes]:
    write(path, doc)
    done = invoke("merge", "--config", path, "--out", out, "--cache-dir", cache, "--quiet")
    assert done.exit_code == 0, done.output + done.stderr
    return tree(out)


@pytest.mark.parametrize("stream", [False, True], ids=["list", "documents"])
def test_a_list_of_configs_gives_each_config_s_merge(family: Family, tmp_path: Path, stream: bool) -> None:
    cache = tmp_path / "cache"
    docs = [
        config(family, "ties", {"density": 0.4, "lambda": 0.9}, out_dtype="float32"),
        {**config(family, "ramplus_tl", {"r": 0.2}, out_dtype="float32"), "name": "ram-tl"},
        config(family, "task_arithmetic", {"lambda": 0.5}, out_dtype="float32"),
    ]
    done = sweep_config(write(tmp_path / "sweep.yml", docs, stream=stream), tmp_path / "sweep", cache)
    assert done.exit_code == 0, done.output + done.stderr
    names = [c["name"] for c in json.loads((tmp_path / "sweep" / "sweep.json").read_text())["candidates"]]
    ties, arithmetic = "ties-weights=1.0,0.75-lambda=0.9-density=0.4,0.4", "task_arithmetic-weights=1.0,0.75-lambda=0.5"
    assert names == [ties, "ram-tl", arithmetic]  # per-model values are lists, one value per agent
    for name, doc in zip(names, docs, strict=True):
        plain = {k: v for k, v in doc.items() if k != "name"}
        reference = merged_config(plain, tmp_path / f"{name}.yml", tmp_path / "merge" / name, cache)
        assert tree(tmp_path / "sweep" / name) == reference, name


def test_a_sweep_key_makes_the_cross_product(family: Family, tmp_path: Path) -> None:
    cache = tmp_path / "cache"
    doc = config(family, "ties", {"lambda": 1.0})
    doc["sweep"] = {"merge_method": ["ties", "breadcrumbs"], "density": [0.3, 0.6]}
    done = sweep_config(write(tmp_path / "sweep.yml", doc), tmp_path / "sweep", cache, "--grid", "linear")
    assert done.exit_code == 0, done.output + done.stderr
    swept = json.loads((tmp_path / "sweep" / "sweep.json").read_text())["candidates"]
    expected = ["ties-density=0.3", "ties-density=0.6", "breadcrumbs-density=0.3", "breadcrumbs-density=0.6", "linear"]
    assert [c["name"] for c in swept] == expected
    for method, density in (("ties", 0.6), ("breadcrumbs", 0.3)):
        plain = config(family, method, {"lambda": 1.0, "density": density})
        name = f"{method}-density={density}"
        reference = merged_config(plain, tmp_path / f"{name}.yml", tmp_path / "merge" / name, cache)
        assert tree(tmp_path / "sweep" / name) == reference, name


def test_the_configs_shared_settings_reach_the_sweep_and_a_flag_may_not_contradict_them(
    family: Family, tmp_path: Path
) -> None:
    doc = {**config(family, "task_arithmetic"), "out_dtype": "float32", "sweep": {"lambda": [1.0]}}
    path = write(tmp_path / "sweep.yml", doc)
    clash = sweep_config(path, tmp_path / "a", tmp_path / "cache", "--out-dtype", "bf16")
    assert clash.exit_code != 0 and "--out-dtype is set by" in clash.output + clash.stderr
    same = sweep_config(path, tmp_path / "b", tmp_path / "cache", "--out-dtype", "f32")
    assert same.exit_code == 0, same.output + same.stderr
    record = json.loads((tmp_path / "b" / "task_arithmetic-lambda=1.0" / "ramstream_merge.json").read_text())
    assert record["run"]["out_dtype"] == "f32"


def bad_configs(family: Family) -> list[tuple[Any, str]]:
    ta = config(family, "task_arithmetic")
    return [
        ([ta, {**ta, "models": ta["models"][:1]}], "candidate 2 merges other models than candidate 1"),
        ([ta, {**config(family, "ties"), "out_dtype": "float32"}], "it is one value for the whole sweep"),
        ({**ta, "sweep": {"lambda": []}}, "sweep.lambda: give a list of values"),
        ({**ta, "sweep": {"lambda": [[1, 2]]}}, "each value is one number"),
        ({**ta, "sweep": "lambda"}, "sweep: must map parameters"),
        ({**ta, "name": "x", "sweep": {"lambda": [1.0]}}, "name: names one candidate"),
        ([{**ta, "name": "a/b"}], "is not a directory name"),
        ([{**ta, "name": ".hidden"}], "starts with a dot"),
        ([ta, ta], "both named"),
        ({**ta, "sweep": {"merge_method": ["nonsense"]}}, "merge_method 'nonsense' is not supported"),
        ({**ta, "sweep": {"density": [0.5]}}, "density"),
        ([ta, {**ta, "sweep": {"lambda": [1.0]}}], "a sweep: key belongs in a config of its own"),
        ([], "no candidates"),
        (["not a config"], "candidate 1 is not a mergekit config"),
    ]


def test_bad_sweep_configs_are_one_line_and_write_nothing(family: Family, tmp_path: Path) -> None:
    for i, (doc, words) in enumerate(bad_configs(family)):
        out = tmp_path / f"out{i}"
        done = sweep_config(write(tmp_path / f"bad{i}.yml", doc), out, tmp_path / "cache")
        lines = done.stderr.strip().splitlines()
        assert done.exit_code != 0 and len(lines) == 1 and words in lines[0], (doc, done.stderr)
        assert lines[0].startswith("error: ") and not out.exists()


def test_config_and_positional_inputs_are_exclusive(family: Family, tmp_path: Path) -> None:
    path = write(tmp_path / "sweep.yml", [config(family, "linear")])
    done = invoke("sweep", str(family.base), "--config", path, "--out", tmp_path / "out")
    assert done.exit_code == 2 and "either --config or BASE AGENT" in done.output
    done = invoke("sweep", "--out", tmp_path / "out", "--grid", "linear")
    assert done.exit_code == 2 and "give BASE and at least one AGENT" in done.output


def test_a_value_a_candidate_s_method_refuses_is_named_by_the_file_the_candidate_and_the_key(
    family: Family, tmp_path: Path
) -> None:
    """Each candidate is a config: its values are named as ``merge --config`` names them, after the
    file and the candidate; a refusal of the method that no key names still names both."""
    ties = config(family, "ties", {"density": 0.4})
    too_dense = config(family, "ties")
    too_dense["models"][1]["parameters"]["density"] = 1.5
    karcher = config(family, "karcher", {"tol": -1})
    karcher["models"] = [{"model": m["model"]} for m in karcher["models"]]
    dare = {**ties, "merge_method": "dare_ties", "parameters": {"density": 0}}
    cases = [
        (
            {**ties, "sweep": {"density": [0.3, 1.5]}},
            "candidate density=1.5: parameters.density must lie in [0, 1], got 1.5",
        ),
        ([ties, too_dense], "candidate 2: models[1].parameters.density must lie in [0, 1], got 1.5"),
        ([ties, dare], "candidate 2: parameters.density must lie in (0, 1], got 0"),
        ([ties, karcher], "candidate 2: parameters.tol must be >= 0, got -1"),
    ]
    for i, (doc, words) in enumerate(cases):
        path = write(tmp_path / f"bad{i}.yml", doc)
        done = sweep_config(path, tmp_path / f"out{i}", tmp_path / "cache")
        lines = done.stderr.strip().splitlines()
        assert done.exit_code == 1 and lines == [f"error: {path}: {words}"], done.stderr
        assert not (tmp_path / f"out{i}").exists()
    path = write(tmp_path / "grid.yml", [ties])
    done = sweep_config(path, tmp_path / "grid", tmp_path / "cache", "--grid", "ties:densty=0.2")
    assert done.exit_code == 1 and "--grid 'ties:densty=0.2': ties has no parameter 'densty'" in done.stderr
    assert not (tmp_path / "grid").exists()
