"""``--grid`` parsing: the cross product in order, stable names, and one line for every bad grid."""

from __future__ import annotations

import pytest

from ramstream.errors import ConfigError
from ramstream.sweep.grid import Candidate, parse_grid, parse_grids


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
