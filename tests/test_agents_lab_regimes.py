"""Lab II: the ``dec`` task on ``inc``'s digit tokens, the regimes' definitions, the agreement
statistics of a family (against a dense numpy reference written here from the definitions and a
hand-checked example), and the rendering of the doc's section. No training: it stays fast."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest
from click.testing import CliRunner

pytest.importorskip("torch")  # the lab's tools import it (make test-lowest runs without torch)

from ramstream.lab import tasks
from ramstream.lab.shipped import DATA
from tests.families import encode, write_safetensors
from tools.agents_lab.agreement import agreement
from tools.agents_lab.build import RECIPE
from tools.agents_lab.regimes import DEFAULT_REGIMES, LAB2_RECIPE, REGIME_METHODS, REGIMES, regime_agents

# -- the dec task ---------------------------------------------------------------------------------


def test_dec_writes_with_incs_digits_and_a_token_of_its_own() -> None:
    assert [tasks.task_token(t) for t in tasks.ALL_TASKS] == [1, 12, 23, 34]
    assert tasks.vocab_for(tasks.TASKS) == tasks.VOCAB == 34 and tasks.vocab_for(tasks.ALL_TASKS) == 35
    digits = np.array([[0, 1, 2, 3, 4, 5, 9]])
    assert tasks.digit_tokens("dec", digits).tolist() == tasks.digit_tokens("inc", digits).tolist()
    assert tasks.sequences("dec", digits).tolist() == [[34, 2, 3, 4, 5, 6, 7, 11, 0, 11, 2, 3, 4, 5, 6, 10]]
    # the three tasks keep their layout
    assert tasks.sequences("inc", digits).tolist() == [[1, 2, 3, 4, 5, 6, 7, 11, 0, 3, 4, 5, 6, 7, 8, 2]]


@pytest.mark.parametrize(("prompt", "answer"), [("0123459", "9012348"), ("0000000", "9999999"), ("5", "4")])
def test_dec_answers_by_hand(prompt: str, answer: str) -> None:
    digits = np.array([[int(c) for c in prompt]])
    assert "".join(map(str, tasks.answers("dec", digits)[0])) == answer
    inc = tasks.answers("inc", tasks.answers("dec", digits))
    assert inc.tolist() == digits.tolist()  # dec undoes inc on the same tokens


def test_dec_has_fixed_splits_of_its_own() -> None:
    test, val = tasks.eval_digits("dec", "test"), tasks.eval_digits("dec", "validation")
    assert test.shape == (1000, 7) and val.shape == (500, 7)
    assert len({tuple(r) for r in np.concatenate([test, val])}) == 1500
    assert not np.array_equal(test, tasks.eval_digits("inc", "test"))
    rng = np.random.default_rng(0)
    drawn = tasks.train_digits("dec", 2000, rng)
    assert not {tuple(r) for r in drawn} & {tuple(r) for r in np.concatenate([test, val])}
    with pytest.raises(ValueError, match="unknown task 'mul'"):
        tasks.task_token("mul")


def test_the_evaluator_scores_chosen_tasks_and_refuses_a_task_the_model_lacks() -> None:
    pytest.importorskip("torch")
    from ramstream.lab.evaluate import main

    ok = CliRunner().invoke(main, [str(DATA / "rev"), "--json", "--limit", "20", "--tasks", "rev"])
    assert ok.exit_code == 0, ok.output
    assert list(__import__("json").loads(ok.stdout.splitlines()[-1])) == ["mean", "rev"]
    for flag, needle in [("inc,dec", "its 34 tokens do not include task dec's"), ("inc,inc", "--tasks 'inc,inc'")]:
        result = CliRunner().invoke(main, [str(DATA / "base"), "--json", "--tasks", flag])
        assert result.exit_code == 1 and result.stdout == ""
        lines = result.stderr.splitlines()
        assert len(lines) == 1 and lines[0].startswith("error: ") and needle in lines[0], result.stderr


# -- the regimes ------------------------------------------------------------------------------------


def test_regimes_by_hand() -> None:
    by_name = {r.name: r for r in REGIMES}
    seeds = [0, 1, 2]
    assert [by_name["redundant"].agents(s, seeds) for s in seeds] == [
        [("inc", 0), ("inc", 1)],
        [("inc", 1), ("inc", 2)],
        [("inc", 2), ("inc", 0)],
    ]
    assert by_name["redundant"].tasks == ("inc",)
    assert by_name["conflicting"].agents(2, seeds) == [("inc", 2), ("dec", 2)]
    assert by_name["conflicting"].tasks == ("inc", "dec")
    assert by_name["disjoint"].tasks == ("inc", "rev") and by_name["disjoint-3"].tasks == tasks.TASKS
    assert {r.expect for r in REGIMES} == {"agree", "conflict", "add"}
    default = tuple(by_name[n] for n in DEFAULT_REGIMES)
    wanted = regime_agents(default, seeds)
    assert len(wanted) == len(set(wanted)) == 9  # inc, dec, rev of seeds 0, 1, 2
    assert sorted({t for t, _ in wanted}) == ["dec", "inc", "rev"]
    assert len(regime_agents(REGIMES, seeds)) == 12
    with pytest.raises(ValueError, match="regime redundant needs agents of distinct seeds"):
        regime_agents(default, [5])


def test_lab2_recipe_adds_dec_with_incs_budget_and_keeps_the_labs() -> None:
    assert RECIPE.tasks == tasks.TASKS and LAB2_RECIPE.tasks == tasks.ALL_TASKS
    assert LAB2_RECIPE.agents[:3] == RECIPE.agents and LAB2_RECIPE.pretrain == RECIPE.pretrain
    assert RECIPE.base_init is None and LAB2_RECIPE.base_init == DATA / "base"
    dec, inc = LAB2_RECIPE.agent("dec", 4), LAB2_RECIPE.agent("inc", 4)
    assert (dec.lr, dec.steps, dec.seed) == (inc.lr, inc.steps, 4)
    keys = [m.key for m in REGIME_METHODS]
    assert len(keys) == len(set(keys)) and {"ta_val", "ram+_val", "ties_val", "dare_ties_val"} <= set(keys)
    grids = {m.key: m.grid for m in REGIME_METHODS if m.grid}
    assert grids["ta_val"] is not None and 0.5 in grids["ta_val"][1]  # averaging two agents is a candidate
    assert grids["ram+_val"] is not None and grids["ram+_val"][0] == "r"


# -- the agreement statistics --------------------------------------------------------------------


def dense_reference(base: dict[str, np.ndarray], agents: list[dict[str, np.ndarray]], eps: float) -> dict:
    """The definitions over one flat vector per agent."""
    flat = np.concatenate([np.asarray(v, np.float64).ravel() for v in base.values()])
    taus = [np.concatenate([np.asarray(a[k], np.float64).ravel() for k in base]) - flat for a in agents]
    masks = np.array([np.abs(t) > eps for t in taus])
    out: dict = {"active": [int(m.sum()) for m in masks], "unique_energy": [], "pairs": {}}
    for i, t in enumerate(taus):
        alone = masks[i] & (masks.sum(axis=0) == 1)
        out["unique_energy"].append((t[alone] ** 2).sum() / (t[masks[i]] ** 2).sum())
    for i in range(len(taus)):
        for j in range(i + 1, len(taus)):
            both = masks[i] & masks[j]
            a, b = taus[i][both], taus[j][both]
            out["pairs"][(i, j)] = (
                int(both.sum()),
                float(np.mean(np.sign(a) == np.sign(b))),
                float(a @ b / np.sqrt((a @ a) * (b @ b))),
            )
    return out


def test_agreement_by_hand() -> None:
    base = {"w": np.zeros(6, np.float32)}
    a = {"w": np.array([1, 2, 0, 3, 0, 0], np.float32)}
    b = {"w": np.array([1, -2, 4, 0, 0, 0], np.float32)}
    got = agreement(base, [a, b])
    assert got.active == (3, 3)
    (pair,) = got.pairs
    assert (pair.i, pair.j, pair.both, pair.share_i, pair.share_j) == (0, 1, 2, 2 / 3, 2 / 3)
    assert pair.sign_agreement == 0.5
    assert pair.cosine == pytest.approx((1 - 4) / 5)
    assert got.unique_energy == pytest.approx((9 / 14, 16 / 21))


def test_agreement_equals_the_dense_reference_on_bf16_checkpoints(tmp_path: Path) -> None:
    """Sparse bf16 task vectors of three agents in two tensors, written as safetensors files,
    read back by the lab's loader (a step below eps counts as unchanged)."""
    pytest.importorskip("torch")
    from tools.agents_lab.agreement import family_agreement, read_f32

    rng = np.random.default_rng(7)
    shapes = {"a.weight": (16, 24), "b.weight": (40,)}
    base = {k: rng.normal(0, 0.05, s).astype(np.float32) for k, s in shapes.items()}
    dirs = [tmp_path / n for n in ("base", "x", "y", "z")]
    members = [base]
    for k in range(3):
        tensors = {}
        for name, ref in base.items():
            step = rng.normal(0, 0.01, ref.shape) * (rng.random(ref.shape) < 0.3 + 0.2 * k)
            tensors[name] = (ref + step.astype(np.float32)).astype(np.float32)
        members.append(tensors)
    for directory, tensors in zip(dirs, members, strict=True):
        directory.mkdir()
        write_safetensors(
            directory / "model.safetensors", {k: ("BF16", v.shape, encode(v, "BF16")) for k, v in tensors.items()}
        )
    stored = [read_f32(d) for d in dirs]
    want = dense_reference(stored[0], stored[1:], 1e-5)
    got = family_agreement(dirs[0], dirs[1:])
    assert list(got.active) == want["active"] and min(got.active) > 0
    assert got.unique_energy == pytest.approx(want["unique_energy"], rel=1e-12)
    assert [(p.i, p.j) for p in got.pairs] == [(0, 1), (0, 2), (1, 2)]
    for p in got.pairs:
        both, sign, cosine = want["pairs"][(p.i, p.j)]
        assert p.both == both > 0 and p.sign_agreement == pytest.approx(sign, rel=1e-12)
        assert p.cosine == pytest.approx(cosine, rel=1e-9)
        assert p.share_i == both / got.active[p.i] and p.share_j == both / got.active[p.j]


def test_agreement_of_identical_and_opposite_agents() -> None:
    rng = np.random.default_rng(1)
    base = {"w": rng.normal(size=50).astype(np.float32)}
    tau = (rng.normal(size=50) * (rng.random(50) < 0.5)).astype(np.float32)
    same, flipped = {"w": base["w"] + tau}, {"w": base["w"] - tau}
    twin, opposite = agreement(base, [same, same]).pairs[0], agreement(base, [same, flipped]).pairs[0]
    assert (twin.sign_agreement, twin.share_i) == (1.0, 1.0) and twin.cosine == pytest.approx(1.0)
    assert opposite.sign_agreement == 0.0 and opposite.cosine == pytest.approx(-1.0)
    assert agreement(base, [same, same]).unique_energy == (0.0, 0.0)


# -- the doc's section ---------------------------------------------------------------------------


def _synthetic_results() -> dict:
    """Two seeds of one regime, with made-up accuracies and statistics."""

    def seed_run(acc: float, cosine: float) -> dict:
        test = {"inc": acc, "dec": acc - 0.1}
        pair = {"i": 0, "j": 1, "both": 10, "share_i": 0.5, "share_j": 0.25, "sign_agreement": 0.6, "cosine": cosine}
        return {
            "agents": [{"task": "inc", "seed": 0, "test": test}, {"task": "dec", "seed": 0, "test": test}],
            "agreement": {"active": [20, 40], "unique_energy": [0.2, 0.4], "pairs": [pair]},
            "merges": {
                "average": {"source": "ramstream", "test": test},
                "ta_val": {"source": "ramstream", "lambda": 0.5, "test": {"inc": acc + 0.1, "dec": acc}},
                "ram+_val": {"source": "ramstream", "r": 0.2, "test": test},
                "ties_val": {"source": "failed", "note": "x"},
            },
        }

    methods = {
        "average": {"label": "averaging (λ = 1/N)"},
        "ta_val": {"label": "task arithmetic, λ on validation"},
        "ram+_val": {"label": "RAM+, r on validation"},
        "ties_val": {"label": "TIES, density on validation"},
    }
    regime = {"name": "conflicting", "expect": "conflict", "members": [["inc", 0], ["dec", 0]]}
    regime |= {"about": "inc and dec", "tasks": ["inc", "dec"], "per_seed": {"0": seed_run(0.5, -0.2)}}
    regime["per_seed"]["1"] = seed_run(0.7, 0.0)
    base = {"inc": 0.4, "rev": 0.4, "srt": 0.4, "dec": 0.2}
    return {"recipe": {"eval_prompts": None}, "seeds": [0, 1], "eps": 1e-5, "methods": methods, "base": base} | {
        "regimes": {"conflicting": regime}
    }


def test_the_section_renders_statistics_and_merges_per_regime() -> None:
    from tools.agents_lab import regimes_doc

    text = regimes_doc.render_regimes(_synthetic_results())
    assert text.startswith(regimes_doc.BEGIN) and text.endswith(regimes_doc.END)
    # shared share (0.5 + 0.25) / 2, sign agreement, cosine -0.2 and 0 -> -0.1 ± 0.1, unique energy 0.3
    assert (
        "| conflicting | inc + dec | conflict | 37.5 ± 0.0 % | 60.0 ± 0.0 % | -0.100 ± 0.100 | 30.0 ± 0.0 % |" in text
    )
    # mean over inc and dec: 0.45 and 0.65; task arithmetic 0.55 and 0.75: RAM+ - TA = -0.1 on both seeds
    assert "| averaging (λ = 1/N) | 0.600 ± 0.100 | 0.500 ± 0.100 | 0.550 ± 0.100 | -0.100 ± 0.000 |" in text
    assert "| task arithmetic, λ on validation (chosen: 0.5, 0.5) | 0.700 ± 0.100 |" in text
    assert "| RAM+, r on validation (chosen: 0.2, 0.2) |" in text
    assert "| TIES, density on validation (chosen: —) | — | — | — | — |" in text
    assert "| conflicting | 0 | 37.5 % | 60.0 % | -0.200 | — | -0.100 | task arithmetic, λ on validation |" in text
    assert "| base | 0.400 | 0.200 | 0.300 |  |" in text
    headline = next(line for line in text.splitlines() if line.startswith("| conflicting | 0.550"))
    assert headline.endswith("| -0.100 ± 0.000 |")


def test_a_rerun_with_other_regimes_keeps_the_earlier_ones(tmp_path: Path) -> None:
    import json

    from tools.agents_lab.regimes import _keep_others

    earlier = _synthetic_results() | {"agents": {"inc seed 0": {"inc": 0.5}}}
    path = tmp_path / "results.json"
    path.write_text(json.dumps(earlier))
    disjoint = next(r for r in REGIMES if r.name == "disjoint")
    doc = {k: earlier[k] for k in ("recipe", "seeds", "base")} | {"agents": {"rev seed 0": {"rev": 0.9}}, "regimes": {}}
    _keep_others(path, doc, (disjoint,))
    assert list(doc["regimes"]) == ["conflicting"] and set(doc["agents"]) == {"inc seed 0", "rev seed 0"}
    conflicting = next(r for r in REGIMES if r.name == "conflicting")
    rerun = {k: earlier[k] for k in ("recipe", "seeds", "base")} | {"agents": {}, "regimes": {}}
    _keep_others(path, rerun, (conflicting,))  # the regime being rerun is not carried over
    assert rerun["regimes"] == {}
    other_seeds = {**doc, "seeds": [0, 1, 2], "regimes": {}}
    _keep_others(path, other_seeds, (disjoint,))
    assert other_seeds["regimes"] == {}
