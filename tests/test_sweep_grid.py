"""``--grid`` parsing: the cross product in order, stable names, and one line for every bad grid."""

from __future__ import annotations

from pathlib import Path

import pytest

from ramstream.errors import ConfigError
from ramstream.sweep.grid import Candidate, parse_grid, parse_grids
from tests.families import Family, build_family
from tests.test_cli import in_process, one_line_error


def test_a_grid_is_the_cross_product_of_its_values_in_order() -> None:
    got = parse_grid("dare_ties:density=0.2,0.5:seed=1,2")
    assert [(c.method, dict(c.settings)) for c in got] == [
        ("dare_ties", {"density": 0.2, "seed": 1}),
        ("dare_ties", {"density": 0.2, "seed": 2}),
        ("dare_ties", {"density": 0.5, "seed": 1}),
        ("dare_ties", {"density": 0.5, "seed": 2}),
    ]
    assert [c.name for c in got][:2] == ["dare_ties-density=0.2-seed=1", "dare_ties-density=0.2-seed=2"]
    assert parse_grid("ram") == [Candidate("ram", {})] and parse_grid("ram")[0].name == "ram"


def test_values_are_yaml_scalars_and_names_are_file_system_safe() -> None:
    (c,) = parse_grid("ram+:rho-scope=tensor:r=1e-1:normalize=true")
    assert dict(c.settings) == {"rho_scope": "tensor", "r": 0.1, "normalize": True}
    assert c.name == "ram+-rho_scope=tensor-r=0.1-normalize=true"
    (odd,) = parse_grid("linear:weight=a/b c")
    assert "/" not in odd.name and " " not in odd.name


@pytest.mark.parametrize(
    ("grids", "words"),
    [
        ([], "at least one candidate"),
        ([""], "no method"),
        ([":r=1"], "no method"),
        (["ram+:r"], "is not PARAM=V1,V2"),
        (["ram+:r="], "empty value"),
        (["ram+:r=1,,2"], "empty value"),
        (["ram+:r=[1,2]"], "not a number, a word or true/false"),
        (["ram+:r=1:r=2"], "given twice"),
        (["ram+:method=ties"], "first field"),
        (["ram+:r=0.1", "ram+:r=0.10"], "both named 'ram+-r=0.1'"),
    ],
)
def test_a_bad_grid_is_one_clear_error(grids: list[str], words: str) -> None:
    with pytest.raises(ConfigError, match=words.replace("[", r"\[").replace("+", r"\+")):
        parse_grids(grids)


@pytest.fixture(scope="module")
def family(tmp_path_factory: pytest.TempPathFactory) -> Family:
    return build_family(tmp_path_factory.mktemp("grid-family"), densities=(0.2, 0.45), seed=11)


@pytest.mark.parametrize(
    ("grid", "message"),
    [
        (
            "ties:densty=0.2",
            "--grid 'ties:densty=0.2': ties has no parameter 'densty' "
            "(it reads density, lambda, normalize, rescale, trim_scope, weights)",
        ),
        ("dare_ties:trim-scope=model:lamda=1", "dare_ties has no parameters 'lamda', 'trim-scope' (it reads"),
        ("ties:density=0.2;0.3", "--grid 'ties:density=0.2;0.3': density must be a number, got '0.2;0.3'"),
        ("ties:density=0.2,1.5", "--grid 'ties:density=0.2,1.5': density must lie in [0, 1], got 1.5"),
        ("dare_ties:seed=-1", "--grid 'dare_ties:seed=-1': seed must be an integer in [0, 2**63), got -1"),
        ("ram:r=0.1", "--grid 'ram:r=0.1': --r has no effect with --method ram"),
        ("tie:density=0.2", "--grid 'tie:density=0.2': unknown method 'tie'"),
    ],
)
def test_a_candidate_its_method_refuses_is_named_by_the_grid(
    family: Family, tmp_path: Path, grid: str, message: str
) -> None:
    """The user wrote a grid, not flags: the refusal quotes it, and the parameter as it spells it,
    before anything is read or written."""
    out = tmp_path / "out"
    line = one_line_error(in_process("sweep", family.base, *family.agents, "--out", out, "--grid", grid, "--quiet"))
    assert message in line and line.startswith("error: --grid ")
    assert not out.exists()
