"""mergekit YAML configs (``ramstream merge --config``) and the baselines' CLI options.

The translation is checked setting by setting (``mergekit_config.parse``), refusals one by one
(each names the key in one line), and end to end: a config and the same merge in flags give the
same bytes; a flag the config also sets is refused. Parity of the results with mergekit itself
is tests/test_mergekit_parity.py.
"""

from __future__ import annotations

import json
import pickle
from pathlib import Path
from typing import Any

import numpy as np
import pytest
from click.testing import CliRunner

from ramstream import mergekit_config
from ramstream.cli import main
from ramstream.errors import ConfigError
from ramstream.methods.registry import method_names
from ramstream.runs.config_values import check_config_values
from tests.families import Family, build_family, read_model_dir

SRC = Path("merge.yml")


def parse(doc: dict[str, Any]) -> mergekit_config.ConfigMerge:
    return mergekit_config.parse(doc, SRC)


def models(*names: str, **params: dict[str, Any]) -> list[dict[str, Any]]:
    return [{"model": n, **({"parameters": params[n]} if n in params else {})} for n in names]


def refused(doc: Any, *needles: str) -> str:
    """What reading ``doc`` (then checking its values as the merge command does) refuses."""
    with pytest.raises(ConfigError) as info:
        config = parse(doc)
        check_config_values(config, {}, config.settings)
    message = str(info.value)
    assert message.startswith(f"{SRC}: ") and "\n" not in message
    for needle in needles:
        assert needle in message, message
    return message


# -- translation ----------------------------------------------------------------------------


def test_ties_per_model_and_top_level_parameters() -> None:
    got = parse(
        {
            "merge_method": "ties",
            "base_model": "base",
            "models": [
                {"model": "base"},
                {"model": "a", "parameters": {"weight": 1.0, "density": 0.5}},
                {"model": "b", "parameters": {"weight": "0.5"}},
            ],
            "parameters": {"density": 0.2, "lambda": 0.9, "normalize": False, "int8_mask": False},
            "dtype": "float32",
            "out_dtype": "bfloat16",
        }
    )
    assert got.base == Path("base") and got.agents == (Path("a"), Path("b"))
    assert got.settings == {
        "method": "ties",
        "out_dtype": "bf16",
        "weights": [1.0, 0.5],
        "density": [0.5, 0.2],  # a model's own value first, then the top-level one
        "lambda": 0.9,
        "normalize": False,
    }


def test_per_model_parameter_falls_back_to_mergekit_default() -> None:
    got = parse(
        {
            "merge_method": "breadcrumbs",
            "base_model": "base",
            "models": models("a", "b", a={"gamma": 0.05}),
        }
    )
    assert got.settings == {"method": "breadcrumbs", "gamma": [0.05, 0.01]}


def test_parameters_nobody_gives_are_left_to_the_method() -> None:
    got = parse({"merge_method": "dare_ties", "base_model": "base", "models": models("a", "b")})
    assert got.settings == {"method": "dare_ties"}
    assert mergekit_config.api_arguments(got.settings) == {"method": "dare_ties"}


def test_ram_and_ramplus_tl() -> None:
    ram = parse(
        {"merge_method": "ram", "base_model": "b", "models": models("x", "y"), "parameters": {"epsilon": "1e-4"}}
    )
    assert ram.settings == {"method": "ram", "eps": 1e-4}
    plus = parse({"merge_method": "ramplus_tl", "base_model": "b", "models": models("x", "y")})
    assert plus.settings == {"method": "ram+", "alpha": 0.2, "rho_scope": "tensor"}
    plus = parse(
        {
            "merge_method": "ramplus_tl",
            "base_model": "b",
            "models": models("x", "y"),
            "parameters": {"r": 0.3, "alpha": 1.0, "epsilon": 1e-6},
        }
    )
    assert plus.settings == {"method": "ram+", "alpha": 1.0, "r": 0.3, "eps": 1e-6, "rho_scope": "tensor"}
    assert mergekit_config.api_arguments(plus.settings) == {
        "method": "ram+",
        "alpha": 1.0,
        "r": 0.3,
        "eps": 1e-6,
        "rho_scope": "tensor",
    }


def test_linear_weighs_the_base_model_like_mergekit() -> None:
    listed = parse(
        {
            "merge_method": "linear",
            "base_model": "base",
            "models": models("a", "base", "b", base={"weight": 0.3}, a={"weight": 1.0}, b={"weight": 2.0}),
        }
    )
    assert listed.base == Path("base") and listed.agents == (Path("a"), Path("b"))
    assert listed.settings == {"method": "linear", "base_weight": 0.3, "weights": [1.0, 2.0]}
    added = parse(
        {
            "merge_method": "linear",
            "base_model": "base",
            "models": models("a", "b", b={"weight": 2.0}),
            "parameters": {"weight": 1.0, "normalize": False},
        }
    )
    assert added.base == Path("base") and added.agents == (Path("a"), Path("b"))
    assert added.settings == {"method": "linear", "normalize": False, "base_weight": 1.0, "weights": [1.0, 2.0]}
    alone = parse({"merge_method": "linear", "models": models("a", "b", "c"), "parameters": {"weight": 0.5}})
    assert alone.base == Path("a") and alone.agents == (Path("b"), Path("c"))
    assert alone.settings == {"method": "linear", "base_weight": 0.5, "weights": [0.5, 0.5]}


@pytest.mark.parametrize(
    ("change", "needles"),
    [
        ({"base_model": "base"}, ["base_model is an input of linear", "weight"]),
        ({"models": models("a", "b")}, ["linear needs a weight for every model"]),
        ({"models": models("a"), "parameters": {"weight": 1.0}}, ["at least two models"]),
        ({"parameters": {"weight": 1.0, "density": 0.5}}, ["linear has no parameter 'density'"]),
    ],
)
def test_linear_refusals(change: dict[str, Any], needles: list[str]) -> None:
    doc = {"merge_method": "linear", "models": models("a", "b", a={"weight": 1.0}, b={"weight": 1.0})}
    refused({**doc, **change}, *needles)


@pytest.mark.parametrize(
    ("dtype", "out_dtype", "want"),
    [(None, None, None), ("float32", None, "f32"), ("float32", "bfloat16", "bf16"), (None, "torch.float16", "f16")],
)
def test_output_dtype(dtype: str | None, out_dtype: str | None, want: str | None) -> None:
    doc: dict[str, Any] = {"merge_method": "task_arithmetic", "base_model": "b", "models": models("x")}
    doc.update({k: v for k, v in (("dtype", dtype), ("out_dtype", out_dtype)) if v is not None})
    assert parse(doc).settings.get("out_dtype") == want


def test_nearswap_takes_t_per_tensor() -> None:
    t = [{"filter": "mlp", "value": [0.001, 0.01]}, {"value": 0.005}]
    got = parse({"merge_method": "nearswap", "base_model": "b", "models": models("b", "a"), "parameters": {"t": t}})
    assert got.base == Path("b") and got.agents == (Path("a"),)
    assert got.settings == {"method": "nearswap", "t": t}


def test_arcee_fusion_takes_the_base_and_one_model() -> None:
    got = parse({"merge_method": "arcee_fusion", "base_model": "b", "models": models("b", "a")})
    assert got.base == Path("b") and got.agents == (Path("a"),)
    assert got.settings == {"method": "arcee_fusion"}


def test_every_mergekit_method_maps_to_a_registered_method() -> None:
    assert {m.method for m in mergekit_config.METHODS.values()} <= set(method_names())


# -- refusals -------------------------------------------------------------------------------

BASE_DOC: dict[str, Any] = {"merge_method": "ties", "base_model": "base", "models": models("a", "b")}


@pytest.mark.parametrize(
    ("change", "needles"),
    [
        ({"models": None, "slices": []}, ["slices", "0 slices", "frankenmerges"]),
        ({"slices": [{"sources": [{"model": "a", "layer_range": [0, 2]}]}]}, ["slices and models are both given"]),
        (
            {"models": None, "slices": [{"sources": [{"model": "a", "layer_range": [0, 2]}]}, {"sources": []}]},
            ["2 slices"],
        ),
        ({"models": None, "slices": [{"sources": [{"model": "a", "layer_range": [0, 2]}]}]}, ["a/config.json"]),
        (
            {"models": None, "slices": [{"sources": [{"model": "a", "layer_range": 2}]}]},
            ["layer_range", "two integers"],
        ),
        ({"models": None, "slices": [{"sources": [{"model": "a", "weight": 1}]}]}, ["sources[0]", "'weight'"]),
        ({"models": None, "slices": [{"sources": "a"}]}, ["slices[0].sources must be a list"]),
        ({"modules": {}}, ["modules"]),
        ({"tokenizer": {"source": "union"}}, ["tokenizer"]),
        ({"chat_template": "chatml"}, ["chat_template"]),
        ({"tokenizer_source": "union"}, ["tokenizer_source", "union"]),
        ({"dtype": "bfloat16"}, ["dtype: bfloat16", "float32"]),
        ({"dtype": "int8"}, ["dtype", "int8"]),
        ({"out_dtype": "float8"}, ["out_dtype", "float8"]),
        ({"merge_method": "model_soup"}, ["merge_method", "model_soup", "is not supported"]),
        (
            {"merge_method": "sce", "models": models("a", a={"select_topk": 0.5})},
            ["models[0].parameters.select_topk", "top-level"],
        ),
        ({"merge_method": "sce", "parameters": {"int8_mask": True}}, ["int8_mask"]),
        ({"merge_method": "sce", "parameters": {"density": 0.5}}, ["density", "sce"]),
        ({"merge_method": "slerp"}, ["slerp", "exactly 1 model", "lists 2"]),
        ({"merge_method": "nuslerp", "models": models("a")}, ["nuslerp", "exactly 2", "lists 1"]),
        ({"merge_method": "slerp", "base_model": None}, ["base_model is required"]),
        ({"merge_method": "slerp", "models": models("a", a={"t": 0.5})}, ["models[0].parameters.t", "top-level"]),
        ({"merge_method": "nearswap"}, ["nearswap", "exactly 1 model", "lists 2"]),
        (
            {"merge_method": "nearswap", "models": models("a"), "parameters": {"t": 0.01, "weight": 1.0}},
            ["parameters.weight", "nearswap has no parameter"],
        ),
        ({"merge_method": "arcee_fusion"}, ["arcee_fusion", "exactly 1 model", "lists 2"]),
        (
            {"merge_method": "arcee_fusion", "models": models("a"), "parameters": {"t": 0.5}},
            ["parameters.t", "arcee_fusion has no parameter"],
        ),
        ({"models_typo": []}, ["unknown key", "models_typo"]),
        ({"base_model": None}, ["base_model is required"]),
        ({"models": []}, ["models"]),
        ({"models": models("base")}, ["nothing to merge"]),
        ({"models": [{"model": "a+lora"}]}, ["LoRA", "a+lora", "not base_model"]),
        ({"models": [{"model": "base+nowhere"}]}, ["models[0]", "nowhere", "not a local PEFT adapter"]),
        ({"base_model": "base+lora"}, ["base_model", "base+lora", "cannot be"]),
        (
            {"merge_method": "multislerp", "base_model": None, "models": models("a", "a+lora")},
            ["models[1]", "set base_model: a"],
        ),
        ({"models": [{"model": {"path": "a"}}]}, ["models[0]", "path"]),
        ({"models": [{"model": "a", "layer_range": [0, 2]}]}, ["models[0]", "layer_range"]),
        ({"models": models("base", "a", base={"weight": 1.0})}, ["models[0]", "base model", "weight"]),
        ({"merge_method": "ram", "parameters": {"epsilon": [1e-5, 1e-4]}}, ["parameters.epsilon", "gradients"]),
        ({"parameters": {"normalize": [{"filter": "mlp", "value": True}]}}, ["parameters.normalize", "filters"]),
        (
            {"merge_method": "karcher", "parameters": {"tol": {"filter": "mlp", "value": 0.5}}},
            ["parameters.tol", "filters"],
        ),
        ({"parameters": {"gamma": 0.1}}, ["parameters.gamma", "ties has no parameter"]),
        ({"parameters": {"int8_mask": True}}, ["int8_mask", "no effect"]),
        ({"models": models("a", "b", a={"lambda": 2.0})}, ["models[0].parameters.lambda", "top-level"]),
        ({"models": models("a", "b", a={"weight": 2.0})}, ["models[1]", "weight is missing"]),
        ({"parameters": {"density": "lots"}}, ["parameters.density", "number"]),
        ({"parameters": {"normalize": 3}}, ["parameters.normalize", "true or false"]),
        ({"parameters": {"lambda": float("nan")}}, ["parameters.lambda", "finite"]),
    ],
)
def test_unsupported_config_is_refused_by_name(change: dict[str, Any], needles: list[str]) -> None:
    refused({**BASE_DOC, **change}, *needles)


def _models_with_layers(root: Path, layers: int, *names: str) -> list[str]:
    paths = []
    for name in names:
        (root / name).mkdir()
        (root / name / "config.json").write_text(json.dumps({"num_hidden_layers": layers}))
        paths.append(str(root / name))
    return paths


def test_one_slice_over_every_layer_is_the_models_form(tmp_path: Path) -> None:
    """The hub's slerp configs: one slice whose sources span every layer; its parameters override
    the top-level ones, its sources' their own."""
    base, agent = _models_with_layers(tmp_path, 4, "base", "agent")
    t = [{"filter": "self_attn", "value": [0, 1]}, {"value": 0.5}]
    sliced = parse(
        {
            "merge_method": "slerp",
            "base_model": base,
            "slices": [
                {
                    "sources": [{"model": base, "layer_range": [0, 4]}, {"model": agent, "layer_range": [0, 4]}],
                    "parameters": {"t": t},
                }
            ],
            "parameters": {"t": 0.1},
        }
    )
    listed = parse({"merge_method": "slerp", "base_model": base, "models": models(base, agent), "parameters": {"t": t}})
    assert (sliced.base, sliced.agents, dict(sliced.settings)) == (listed.base, listed.agents, dict(listed.settings))


def test_a_slice_of_part_of_the_layers_is_refused(tmp_path: Path) -> None:
    base, agent = _models_with_layers(tmp_path, 4, "base", "agent")
    sources = [{"model": base, "layer_range": [0, 4]}, {"model": agent, "layer_range": [0, 3]}]
    doc = {"merge_method": "slerp", "base_model": base, "slices": [{"sources": sources}], "parameters": {"t": 0.5}}
    refused(doc, "slices[0].sources[1]", "[0, 3]", "4 layers", "frankenmerges")


def test_hub_ids_with_a_revision_load_as_written() -> None:
    config = parse({**BASE_DOC, "base_model": "org/base", "models": models("org/base", "org/a@v1.0", "org/b@main")})
    assert (str(config.base), [str(a) for a in config.agents]) == ("org/base", ["org/a@v1.0", "org/b@main"])


def test_inert_parameters_load_at_default_only() -> None:
    doc = {"merge_method": "task_arithmetic", "base_model": "b", "models": models("x")}
    assert parse({**doc, "parameters": {"density": 1.0, "rescale": False}}).settings == {"method": "task_arithmetic"}
    refused({**doc, "parameters": {"density": 0.5}}, "density", "no effect with task_arithmetic")
    stock = {"merge_method": "model_stock", "base_model": "b", "models": models("x", "y")}
    assert parse({**stock, "parameters": {"filter_wise": False}}).settings == {"method": "model_stock"}
    refused({**stock, "parameters": {"filter_wise": True}}, "filter_wise")


def test_not_a_mapping_and_bad_yaml(tmp_path: Path) -> None:
    refused(["merge_method"], "mapping")
    path = tmp_path / "bad.yml"
    path.write_text("merge_method: [ties\n")
    with pytest.raises(ConfigError, match="not valid YAML"):
        mergekit_config.load(path)
    with pytest.raises(ConfigError, match="cannot read"):
        mergekit_config.load(tmp_path / "missing.yml")


def test_combine_refuses_a_flag_the_config_sets() -> None:
    config = parse({**BASE_DOC, "parameters": {"density": 0.2}})
    assert mergekit_config.combine(config, {"seed": 3, "rescale": True})["seed"] == 3
    with pytest.raises(ConfigError, match=r"--density is set by merge\.yml too"):
        mergekit_config.combine(config, {"density": [0.5]})
    with pytest.raises(ConfigError, match=r"--method is set by merge\.yml too"):
        mergekit_config.combine(config, {"method": "ram"})


# -- the CLI end to end ---------------------------------------------------------------------


@pytest.fixture(scope="module")
def family(tmp_path_factory: pytest.TempPathFactory) -> Family:
    return build_family(tmp_path_factory.mktemp("cfg") / "family")


def run(*args: Any) -> Any:
    return CliRunner().invoke(main, [str(a) for a in args])


def one_line_error(result: Any, *needles: str) -> str:
    assert result.exit_code == 1, (result.exit_code, result.stderr)
    lines = result.stderr.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("error: "), result.stderr
    for needle in needles:
        assert needle in lines[0], lines[0]
    return str(lines[0])


def same_bytes(a: Path, b: Path) -> None:
    x, y = read_model_dir(a), read_model_dir(b)
    assert set(x) == set(y)
    for name in x:
        assert x[name][:2] == y[name][:2]
        np.testing.assert_array_equal(x[name][2], y[name][2], err_msg=name)


def test_help_lists_every_registered_method() -> None:
    text = run("merge", "--help").stdout
    assert "[" + "|".join(method_names()) + "]" in " ".join(text.split())


def test_config_and_flags_give_the_same_bytes(tmp_path: Path, family: Family) -> None:
    doc = {
        "merge_method": "ties",
        "base_model": str(family.base),
        "models": [
            {"model": str(a), "parameters": {"weight": w, "density": d}}
            for a, w, d in zip(family.agents, (1.0, 0.5, 0.7), (0.2, 0.5, 0.3), strict=True)
        ],
        "parameters": {"lambda": 0.9},
        "dtype": "float32",
        "out_dtype": "bfloat16",
    }
    config = tmp_path / "ties.yml"
    config.write_text(json.dumps(doc))
    cache = ("--cache-dir", tmp_path / "cache", "--quiet")
    by_config = run("merge", "--config", config, "--out", tmp_path / "a", *cache)
    assert by_config.exit_code == 0, by_config.stderr
    assert by_config.stdout.startswith(f"merged: {tmp_path / 'a'} (ties, weight 1, 0.5, 0.7")
    members = [family.base, *family.agents]
    flags = ["--method", "ties", "--weights", "1,0.5,0.7", "--density", "0.2,0.5,0.3", "--lambda", "0.9"]
    by_flags = run("merge", *members, "--out", tmp_path / "b", *flags, "--out-dtype", "bf16", *cache)
    assert by_flags.exit_code == 0, by_flags.stderr
    same_bytes(tmp_path / "a", tmp_path / "b")
    record = json.loads((tmp_path / "a" / "ramstream_merge.json").read_text())
    assert record["params"]["density"] == [0.2, 0.5, 0.3] and record["params"]["lambda"] == 0.9


def test_config_with_a_flag_it_does_not_set(tmp_path: Path, family: Family) -> None:
    config = tmp_path / "dare.yml"
    doc = {"merge_method": "dare_linear", "base_model": str(family.base), "models": [{"model": str(family.agents[0])}]}
    config.write_text(json.dumps({**doc, "parameters": {"density": 0.5, "weight": 1.0}}))
    cache = ("--cache-dir", tmp_path / "cache", "--quiet")
    for seed, out in ((1, "s1"), (1, "s1-again"), (2, "s2")):
        result = run("merge", "--config", config, "--seed", seed, "--out", tmp_path / out, *cache)
        assert result.exit_code == 0, result.stderr
    same_bytes(tmp_path / "s1", tmp_path / "s1-again")
    with pytest.raises(AssertionError):
        same_bytes(tmp_path / "s1", tmp_path / "s2")
    one_line_error(
        run("merge", "--config", config, "--density", "0.3", "--out", tmp_path / "x", *cache),
        "--density is set by",
        str(config),
    )


@pytest.mark.parametrize(
    ("args", "needles"),
    [
        (["--method", "linear", "--density", "0.2"], ["--density has no effect with --method linear"]),
        (["--method", "ties", "--weights", "1,2"], ["--weights", "one value per agent"]),
        (["--method", "ram+", "--seed", "1"], ["--seed has no effect with --method ram+"]),
        (["--method", "ties", "--base-weight", "1"], ["--base-weight has no effect with --method ties"]),
        (["--method", "ties", "--rescale", "inverse"], ["--rescale"]),
        (["--method", "task_arithmetic", "--rescale", "l1"], ["--rescale has no effect"]),
        (["--method", "della", "--density", "0.1", "--epsilon", "0.2"], ["--epsilon"]),
    ],
)
def test_options_a_method_would_ignore_or_cannot_take(
    tmp_path: Path, family: Family, args: list[str], needles: list[str]
) -> None:
    result = run("merge", family.base, *family.agents, "--out", tmp_path / "out", *args, "--quiet")
    one_line_error(result, *needles)
    assert not (tmp_path / "out" / "config.json").exists()


def test_config_errors_are_one_line(tmp_path: Path, family: Family) -> None:
    config = tmp_path / "slices.yml"
    config.write_text("merge_method: ties\nslices: []\n")
    one_line_error(run("merge", "--config", config, "--out", tmp_path / "out"), str(config), "slices")
    one_line_error(run("merge", "--config", tmp_path / "none.yml", "--out", tmp_path / "out"), "cannot read")


@pytest.mark.parametrize(
    ("args", "needle"),
    [
        (["--weights", "1,x"], "'--weights'"),
        (["--trim-scope", "layer"], "'--trim-scope'"),
        (["--rescale", "l2"], "'--rescale'"),
    ],
)
def test_usage_errors_of_method_options(tmp_path: Path, family: Family, args: list[str], needle: str) -> None:
    result = run("merge", family.base, *family.agents, "--out", tmp_path / "out", "--method", "ties", *args)
    assert result.exit_code == 2 and "Invalid value for " + needle in result.stderr


def test_config_and_positional_models_together_is_a_usage_error(tmp_path: Path, family: Family) -> None:
    config = tmp_path / "c.yml"
    config.write_text("merge_method: ties\n")
    result = run("merge", family.base, family.agents[0], "--config", config, "--out", tmp_path / "out")
    assert result.exit_code == 2 and "either --config or BASE" in result.stderr


# -- values the method refuses, named by the config's key ----------------------------------


@pytest.mark.parametrize(
    ("doc", "message"),
    [
        (
            {**BASE_DOC, "models": models("a", "b", a={"density": 1.5})},
            "models[0].parameters.density must lie in [0, 1], got 1.5",
        ),
        (
            {**BASE_DOC, "models": models("base", "a", "b", b={"density": 1.5})},
            "models[2].parameters.density must lie in [0, 1], got 1.5",
        ),
        ({**BASE_DOC, "parameters": {"density": -0.5}}, "parameters.density must lie in [0, 1], got -0.5"),
        (
            {**BASE_DOC, "models": models("a", "b", b={"density": [0.2, 3]})},
            "models[1].parameters.density must lie in [0, 1], got 3",
        ),
        (
            {**BASE_DOC, "merge_method": "dare_ties", "models": models("a", "b", b={"density": 0})},
            "models[1].parameters.density must lie in (0, 1], got 0",
        ),
        (
            {**BASE_DOC, "merge_method": "breadcrumbs", "parameters": {"gamma": 2}},
            "parameters.gamma must lie in [0, 1], got 2",
        ),
        (
            {**BASE_DOC, "merge_method": "sce", "parameters": {"select_topk": 1.5}},
            "parameters.select_topk must lie in [0, 1], got 1.5",
        ),
        (
            {
                "merge_method": "linear",
                "models": models("a", "b", a={"weight": 1.0}, b={"weight": 1e39}),
            },
            "models[1].parameters.weight overflows float32 (|x| <= 3.4e38, where merges compute), got 1e+39",
        ),
        (
            {**BASE_DOC, "merge_method": "ram", "parameters": {"epsilon": -1}},
            "parameters.epsilon must be a finite number >= 0, got -1.0",
        ),
    ],
)
def test_a_value_the_method_refuses_is_named_by_the_key_that_holds_it(doc: dict[str, Any], message: str) -> None:
    """The method's own check (a density in [0, 1]) runs while the config is read, so the message
    names the key the user wrote, and the model it belongs to, not a flag they never typed."""
    assert refused(doc) == f"{SRC}: {message}"


def test_a_slice_s_values_are_named_by_their_keys(tmp_path: Path) -> None:
    base, a, b = _models_with_layers(tmp_path, 2, "base", "a", "b")
    sources: list[dict[str, Any]] = [{"model": m, "layer_range": [0, 2]} for m in (base, a, b)]
    doc: dict[str, Any] = {
        "merge_method": "ties",
        "base_model": base,
        "slices": [{"sources": sources, "parameters": {"density": 2}}],
    }
    refused(doc, "slices[0].parameters.density must lie in [0, 1], got 2")
    sources[2]["parameters"] = {"density": -1}
    doc["slices"][0]["parameters"] = {"density": 0.5}
    refused(doc, "slices[0].sources[2].parameters.density must lie in [0, 1], got -1")


def test_what_a_flag_may_complete_is_left_to_the_merge() -> None:
    """A config may leave a required option to a flag (slerp's t): reading it refuses nothing; with
    no flag to complete it, the method's refusal names the file."""
    config = parse({**BASE_DOC, "merge_method": "slerp", "models": models("a")})
    settings = mergekit_config.combine(config, {"t": 0.5})
    check_config_values(config, {"t": 0.5}, settings)
    assert settings["t"] == 0.5
    with pytest.raises(ConfigError, match=r"^merge\.yml: --t is required with --method slerp"):
        check_config_values(config, {"out_dtype": "f32"}, mergekit_config.combine(config, {"out_dtype": "f32"}))


def test_the_flags_own_messages_are_unchanged_and_survive_pickling() -> None:
    """A value or option refused by the method reads as the flag; its fields go with it across
    processes (a sweep's candidates, a cluster's workers)."""
    from ramstream.methods.options import OptionError, UnknownOptions
    from ramstream.methods.registry import get_method

    with pytest.raises(OptionError) as value:
        get_method("ties").parse({"density": [0.5, 1.5]}, 2)
    assert str(value.value) == "--density must lie in [0, 1], got 1.5" and value.value.item == 1
    with pytest.raises(UnknownOptions) as unknown:
        get_method("ties").parse({"densty": 0.2}, 2)
    assert str(unknown.value) == "--densty has no effect with --method ties"
    for error in (value.value, unknown.value):
        copy = pickle.loads(pickle.dumps(error))
        assert (type(copy), str(copy), vars(copy)) == (type(error), str(error), vars(error))


def test_a_config_names_its_key_and_the_flag_keeps_its_own(tmp_path: Path, family: Family) -> None:
    config = tmp_path / "density_big.yml"
    models_ = [{"model": str(a), "parameters": {"density": 0.5 if i else 1.5}} for i, a in enumerate(family.agents)]
    config.write_text(json.dumps({"merge_method": "ties", "base_model": str(family.base), "models": models_}))
    line = one_line_error(run("merge", "--config", config, "--out", tmp_path / "a", "--quiet"))
    assert line == f"error: {config}: models[0].parameters.density must lie in [0, 1], got 1.5"
    members = (family.base, *family.agents)
    flag = run("merge", *members, "--method", "ties", "--density", "1.5", "--out", tmp_path / "b", "--quiet")
    assert one_line_error(flag) == "error: --density must lie in [0, 1], got 1.5"
    karcher = tmp_path / "karcher.yml"
    karcher.write_text(json.dumps({"merge_method": "karcher", "models": models_[:2], "parameters": {"tol": -1}}))
    one_line_error(run("merge", "--config", karcher, "--out", tmp_path / "c", "--quiet"), f"{karcher}: ", "tol")
    assert not any((tmp_path / out).exists() for out in "abc")


def test_a_passthrough_scale_float32_cannot_hold_is_named_by_its_key() -> None:
    """The stack scales in float32: a scale beyond it is refused while the config is read, by key."""
    doc = {"merge_method": "passthrough", "models": [{"model": "a", "parameters": {"scale": [1.0, 1e39]}}]}
    with pytest.raises(ConfigError) as info:
        mergekit_config.parse_stack(doc, SRC)
    overflow = "overflows float32 (|x| <= 3.4e38, where merges compute), got 1e+39"
    assert str(info.value) == f"{SRC}: models[0].scale {overflow}"
