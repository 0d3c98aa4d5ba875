"""Parameters per tensor (gradients and filters): the sparsifying methods' density, gamma and
epsilon, sce's select_topk, linear's weights, and RAM+'s r and alpha.

A tensor's cuts (TIES, breadcrumbs), draws (DARE), MAGPRUNE probabilities (DELLA), L1 rescale
factors and RAM+ lambdas (rho is counted over the model or the tensor, whatever r and alpha are)
depend on that tensor's own values only. So a merge whose values vary per
tensor must write, for each tensor, exactly the bytes of the merge with that tensor's values
everywhere. The values per tensor are worked out here from mergekit's rules: the first matching
filter; a gradient [a, b] over the family's two layers gives layer 0 a and layer 1 b, and the
tensors outside the layers a.
"""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest

from tests.families import Family, build_family, read_model_dir
from tests.test_cli import in_process, ok, one_line_error
from tests.test_methods_gta_settings import _merge


def _second(name: str) -> bool:
    return ".layers.1." in name


# (method, fixed options, varying options, the uniform options of tensor ``name``)
Case = tuple[str, dict[str, Any], dict[str, Any], Callable[[str], dict[str, Any]]]
CASES: list[Case] = [
    (
        "ties",
        {"weights": [1.0, 0.5, 0.8]},
        {"density": [[0.1, 0.6], [{"filter": "mlp", "value": 0.3}, {"value": 0.7}], 0.5]},
        lambda n: {"density": [0.6 if _second(n) else 0.1, 0.3 if ".mlp." in n else 0.7, 0.5]},
    ),
    (
        "ties",
        {"rescale": True},
        {"density": [[0.2, 0.9]]},
        lambda n: {"density": 0.9 if _second(n) else 0.2},
    ),
    (
        "breadcrumbs_ties",
        {"density": 0.6},
        {"gamma": [[{"filter": "self_attn", "value": 0.1}, {"value": 0.02}]]},
        lambda n: {"gamma": 0.1 if ".self_attn." in n else 0.02},
    ),
    (
        "dare_ties",
        {"seed": 5},
        {"density": [[0.3, 0.8], 0.5, [{"filter": "mlp", "value": 0.9}, {"value": 0.4}]]},
        lambda n: {"density": [0.8 if _second(n) else 0.3, 0.5, 0.9 if ".mlp." in n else 0.4]},
    ),
    (
        "dare_linear",
        {"seed": 2, "rescale": "inverse"},
        {"density": [[0.25, 0.75]]},
        lambda n: {"density": 0.75 if _second(n) else 0.25},
    ),
    (
        "ram+",
        {},
        {"r": [0.1, 0.6], "alpha": [{"filter": "mlp", "value": 0.5}, {"value": 2.0}]},
        lambda n: {"r": 0.6 if _second(n) else 0.1, "alpha": 0.5 if ".mlp." in n else 2.0},
    ),
    (
        "ram+",
        {"rho_scope": "tensor"},
        {"r": [{"filter": "self_attn", "value": [0.3, 0.05]}, {"value": 0.2}]},
        lambda n: {"r": (0.05 if _second(n) else 0.3) if ".self_attn." in n else 0.2},
    ),
    (
        "sce",
        {},
        {"select_topk": [0.2, 0.7]},
        lambda n: {"select_topk": 0.7 if _second(n) else 0.2},
    ),
    (
        "sce",
        {},
        {"select_topk": [{"filter": "mlp", "value": 1.0}, {"filter": "self_attn", "value": 0.0}, {"value": 0.4}]},
        lambda n: {"select_topk": 1.0 if ".mlp." in n else 0.0 if ".self_attn." in n else 0.4},
    ),
    (
        "linear",
        {},
        {"weights": [[0.2, 1.0], 1.0, [{"filter": "mlp", "value": 0.5}, {"value": 2.0}]], "base_weight": [0.0, 0.3]},
        lambda n: {
            "weights": [1.0 if _second(n) else 0.2, 1.0, 0.5 if ".mlp." in n else 2.0],
            "base_weight": 0.3 if _second(n) else 0.0,
        },
    ),
    (
        "della",
        {"seed": 1},
        {"density": [[0.3, 0.6]], "epsilon": [[{"filter": "mlp", "value": 0.2}, {"value": 0.05}]]},
        lambda n: {"density": 0.6 if _second(n) else 0.3, "epsilon": 0.2 if ".mlp." in n else 0.05},
    ),
]


@pytest.fixture(scope="module")
def family(tmp_path_factory: pytest.TempPathFactory) -> Family:
    return build_family(tmp_path_factory.mktemp("sparse-settings"), seed=13)


@pytest.mark.parametrize("case", CASES, ids=[f"{c[0]}-{i}" for i, c in enumerate(CASES)])
def test_each_tensor_is_the_merge_with_its_own_values(family: Family, tmp_path: Path, case: Case) -> None:
    method, fixed, varying_opts, at = case
    varying = _merge(family, tmp_path / "varying", method, {**fixed, **varying_opts})
    uniform: dict[str, dict[str, bytes]] = {}
    for name, raw in varying.items():
        opts = at(name)
        key = repr(sorted(opts.items()))
        if key not in uniform:
            uniform[key] = _merge(family, tmp_path / f"uniform-{len(uniform)}", method, {**fixed, **opts})
        assert raw == uniform[key][name], name
    assert len(uniform) >= 2


def test_the_cli_takes_density_gradients(family: Family, tmp_path: Path) -> None:
    flags = ["--method", "ties", "--quiet", "--cache-dir", tmp_path / "cache", "--density", "[0.1, 0.6], 0.3, 0.5"]
    ok(in_process("merge", family.base, *family.agents, "--out", tmp_path / "cli", *flags))
    api = _merge(family, tmp_path / "api", "ties", {"density": [[0.1, 0.6], 0.3, 0.5]})
    assert {n: raw.tobytes() for n, (_, _, raw) in read_model_dir(tmp_path / "cli").items()} == api


@pytest.mark.parametrize(
    ("flags", "needles"),
    [
        (["--method", "ties", "--density", "[0.1, 1.5]"], ["--density", "[0, 1]", "1.5"]),
        (["--method", "ties", "--density", "[{filter: attention, value: 0.2}, {value: 0.5}]"], ["'attention'"]),
        (["--method", "ties", "--density", "[0.1, 0.6]", "--trim-scope", "model"], ["--trim-scope tensor"]),
        (["--method", "breadcrumbs", "--gamma", "[{filter: mlp, value: 0.1}]"], ["gamma", "no value for tensor"]),
        (["--method", "linear", "--weights", "[1, -1],[-1, 1],0"], ["weights sum to zero for tensor", "embed_tokens"]),
        (["--method", "ram+", "--r", "[0.1, -0.2]"], ["--r", ">= 0", "-0.2"]),
        (["--method", "ram", "--r", "[0.1, 0.2]"], ["--r has no effect with --method ram"]),
        (
            ["--method", "della", "--density", "[0.3, 0.9]", "--epsilon", "0.2"],
            ["--density 0.9 with --epsilon 0.2 for tensor", "(0, 1)"],
        ),
    ],
)
def test_settings_the_model_contradicts_are_refused(
    family: Family, tmp_path: Path, flags: list[str], needles: list[str]
) -> None:
    out = tmp_path / "out"
    result = in_process("merge", family.base, *family.agents, "--out", out, "--quiet", *flags)
    one_line_error(result, *needles)
    assert not (out / "config.json").exists()
