"""The GTA family's weights and lambda per tensor (gradients and filters, as mergekit reads them).

What decides which elements survive (magnitude cuts, DARE's draws, DELLA's probabilities) does
not depend on the weights or lambda, so a merge whose weights and lambda vary per tensor must
write, for each tensor, exactly the bytes of the merge with that tensor's values everywhere.
The values per tensor are worked out here from mergekit's rules: the first matching filter;
a gradient [a, b] over the family's two layers gives layer 0 a and layer 1 b, and the tensors
outside the layers a.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest

from ramstream.api import merge
from ramstream.config import RunOptions
from tests.families import Family, build_family, read_model_dir
from tests.test_cli import in_process, ok, one_line_error

# agent 0: 2.0 in the MLPs, 0.5 elsewhere; agents 1 and 2: 1.0 and a gradient over the layers
WEIGHTS: list[Any] = [[{"filter": "mlp", "value": 2.0}, {"value": 0.5}], 1.0, [0.25, 1.5]]
LAMBDA: Any = [0.6, 1.2]
CASES: list[tuple[str, dict[str, Any]]] = [
    ("task_arithmetic", {}),
    ("task_arithmetic", {"normalize": True}),
    ("ties", {"density": 0.4}),
    ("breadcrumbs", {"density": 0.6, "gamma": 0.05}),
    ("dare_ties", {"density": 0.5, "seed": 3}),
    ("della_linear", {"density": 0.5, "epsilon": 0.1}),
]


def at(name: str) -> tuple[tuple[float, ...], float]:
    """The weights and lambda of tensor ``name`` under WEIGHTS and LAMBDA."""
    second_layer = ".layers.1." in name
    return (2.0 if ".mlp." in name else 0.5, 1.0, 1.5 if second_layer else 0.25), 1.2 if second_layer else 0.6


@pytest.fixture(scope="module")
def family(tmp_path_factory: pytest.TempPathFactory) -> Family:
    return build_family(tmp_path_factory.mktemp("gta-settings"), seed=11)


def _merge(fam: Family, out: Path, method: str, opts: dict[str, Any]) -> dict[str, bytes]:
    merge(
        fam.base,
        [str(a) for a in fam.agents],
        out=out,
        method=method,
        method_options=opts,
        options=RunOptions(cache_dir=out.parent / "cache", quiet=True, block_elems=256),
    )
    return {name: raw.tobytes() for name, (_, _, raw) in read_model_dir(out).items()}


@pytest.mark.parametrize(("method", "opts"), CASES, ids=[f"{m}-{i}" for i, (m, _) in enumerate(CASES)])
def test_each_tensor_is_the_merge_with_its_own_values(
    family: Family, tmp_path: Path, method: str, opts: dict[str, Any]
) -> None:
    varying = _merge(family, tmp_path / "varying", method, {**opts, "weights": WEIGHTS, "lambda": LAMBDA})
    uniform: dict[tuple[tuple[float, ...], float], dict[str, bytes]] = {}
    for name, raw in varying.items():
        weights, lam = at(name)
        if (weights, lam) not in uniform:
            out = tmp_path / f"uniform-{len(uniform)}"
            uniform[weights, lam] = _merge(family, out, method, {**opts, "weights": list(weights), "lambda": lam})
        assert raw == uniform[weights, lam][name], name
    assert len(uniform) == 3  # layer 0 in and out of the MLPs (and the tensors outside the layers), layer 1


def test_the_cli_takes_gradients_and_filters(family: Family, tmp_path: Path) -> None:
    """``--weights`` entries and ``--lambda`` in YAML flow syntax, as a config writes them."""
    common = ["--method", "task_arithmetic", "--quiet", "--cache-dir", tmp_path / "cache"]
    flags = ["--weights", "[{filter: mlp, value: 2.0}, {value: 0.5}], 1.0, [0.25, 1.5]", "--lambda", "[0.6, 1.2]"]
    ok(in_process("merge", family.base, *family.agents, "--out", tmp_path / "cli", *common, *flags))
    api = _merge(family, tmp_path / "api", "task_arithmetic", {"weights": WEIGHTS, "lambda": LAMBDA})
    assert {n: raw.tobytes() for n, (_, _, raw) in read_model_dir(tmp_path / "cli").items()} == api


@pytest.mark.parametrize(
    ("flags", "needles"),
    [
        (["--weights", "[{filter: attention, value: 1}, {value: 0}]"], ["weights", "'attention'", "matches no tensor"]),
        (["--lambda", "[{filter: mlp, value: 1}]"], ["lambda", "no value for tensor"]),
    ],
)
def test_settings_the_model_contradicts_are_refused(
    family: Family, tmp_path: Path, flags: list[str], needles: list[str]
) -> None:
    out = tmp_path / "out"
    result = in_process("merge", family.base, *family.agents, "--out", out, "--method", "ties", "--quiet", *flags)
    one_line_error(result, *needles)
    assert not (out / "config.json").exists()
