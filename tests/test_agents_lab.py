"""The agents lab: its tasks and evaluator against hand-checked examples, the checkpoints shipped
in the package (they load, and have the densities documented), the demo on them (with and
without torch), and a smoke run of the whole pipeline with a few steps of everything."""

from __future__ import annotations

import json
import re
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest
from click.testing import CliRunner

from ramstream import api
from ramstream.cli import main
from ramstream.config import RunOptions
from ramstream.format.family import open_family
from ramstream.lab import tasks
from ramstream.lab.shipped import DATA, MEMBERS, shipped_family, shipped_record
from ramstream.methods.report import agent_reports

ROOT = Path(__file__).resolve().parents[1]
DOC = ROOT / "docs" / "agents_lab.md"

# -- tasks: hand-checked ----------------------------------------------------------------------


def test_token_layout_by_hand() -> None:
    assert tasks.VOCAB == 34 and tasks.SEQ_LEN == 16 and tasks.PROMPT_LEN == 9
    assert [tasks.task_token(t) for t in tasks.TASKS] == [1, 12, 23]
    assert tasks.digit_tokens("inc", np.array([0, 9])).tolist() == [2, 11]
    assert tasks.digit_tokens("rev", np.array([0, 9])).tolist() == [13, 22]
    assert tasks.digit_tokens("srt", np.array([0, 9])).tolist() == [24, 33]
    digits = np.array([[1, 2, 3, 4, 5, 6, 7]])
    assert tasks.prompts("rev", digits).tolist() == [[12, 14, 15, 16, 17, 18, 19, 20, 0]]
    assert tasks.sequences("rev", digits).tolist() == [[12, 14, 15, 16, 17, 18, 19, 20, 0, 20, 19, 18, 17, 16, 15, 14]]


@pytest.mark.parametrize(
    ("task", "prompt", "answer"),
    [
        ("inc", "0123459", "1234560"),
        ("inc", "9999999", "0000000"),
        ("rev", "1234567", "7654321"),
        ("rev", "9000001", "1000009"),
        ("srt", "3141592", "1123459"),
        ("srt", "9876543", "3456789"),
        ("srt", "5555505", "0555555"),
    ],
)
def test_answers_by_hand(task: str, prompt: str, answer: str) -> None:
    digits = np.array([[int(c) for c in prompt]])
    assert "".join(map(str, tasks.answers(task, digits)[0])) == answer
    right = tasks.digit_tokens(task, np.array([[int(c) for c in answer]]))
    assert tasks.exact_match(task, digits, right).tolist() == [True]


def test_exact_match_needs_every_token_in_the_tasks_own_digits() -> None:
    digits = np.array([[3, 1, 4, 1, 5, 9, 2]] * 4)
    right = tasks.digit_tokens("srt", np.array([1, 1, 2, 3, 4, 5, 9]))
    generated = np.stack([right, right.copy(), right.copy(), right.copy()])
    generated[1, 6] += 1  # last digit wrong
    generated[2] = tasks.digit_tokens("inc", np.array([1, 1, 2, 3, 4, 5, 9]))  # right digits, inc's tokens
    generated[3, 0] = tasks.SEP
    assert tasks.exact_match("srt", digits, generated).tolist() == [True, False, False, False]
    with pytest.raises(ValueError, match="shape"):
        tasks.exact_match("srt", digits, generated[:, :6])


def test_evaluation_splits_are_fixed_distinct_and_disjoint() -> None:
    for task in tasks.TASKS:
        test, val = tasks.eval_digits(task, "test"), tasks.eval_digits(task, "validation")
        assert test.shape == (1000, 7) and val.shape == (500, 7)
        assert np.array_equal(test, tasks.eval_digits(task, "test"))
        keys = [tuple(r) for r in np.concatenate([test, val])]
        assert len(set(keys)) == 1500
    assert not np.array_equal(tasks.eval_digits("inc"), tasks.eval_digits("rev"))


def test_training_prompts_avoid_the_evaluation_prompts() -> None:
    held = tasks.eval_digits("rev", "test")[:5]

    class Replaying:
        """A generator whose first draw is five evaluation prompts, then random digits."""

        def __init__(self) -> None:
            self.rng, self.first = np.random.default_rng(0), True

        def integers(self, low: int, high: int, size: tuple[int, ...]) -> np.ndarray:
            if self.first:
                self.first = False
                return held.copy()
            return self.rng.integers(low, high, size)

    drawn = tasks.train_digits("rev", 5, Replaying())  # type: ignore[arg-type]
    assert drawn.shape == (5, 7)
    assert not {tuple(r) for r in drawn} & {tuple(r) for r in held}


# -- the evaluator (torch) ----------------------------------------------------------------------


def test_score_task_with_hand_made_decoders() -> None:
    torch = pytest.importorskip("torch")
    from ramstream.lab.evaluate import evaluate_decoder, score_task

    def oracle(prompt_tokens: torch.Tensor) -> torch.Tensor:
        out = []
        for row in prompt_tokens.numpy():
            task = tasks.TASKS[(int(row[0]) - 1) // tasks.TOKENS_PER_TASK]
            digits = row[1:8] - tasks.task_token(task) - 1
            out.append(np.concatenate([row, tasks.digit_tokens(task, tasks.answers(task, digits[None]))[0]]))
        return torch.from_numpy(np.stack(out))

    def wrong_on_odd_first_digit(prompt_tokens: torch.Tensor) -> torch.Tensor:
        seq = oracle(prompt_tokens)
        first = (prompt_tokens[:, 1] - prompt_tokens[:, 0] - 1) % 2 == 1
        seq[first, -1] = tasks.SEP
        return seq

    digits = np.array([[1, 0, 0, 0, 0, 0, 0], [2, 0, 0, 0, 0, 0, 0], [3, 5, 5, 5, 5, 5, 5], [4, 1, 2, 3, 4, 5, 6]])
    assert score_task(oracle, "srt", digits).correct == 4
    half = score_task(wrong_on_odd_first_digit, "inc", digits)
    assert (half.correct, half.total, half.accuracy) == (2, 4, 0.5)
    scores = evaluate_decoder(oracle, "validation")
    assert {t: (s.correct, s.total) for t, s in scores.items()} == {t: (500, 500) for t in tasks.TASKS}


def test_greedy_decoding_with_cache_matches_a_full_forward() -> None:
    """Greedy exact match (KV-cached decoding) equals the teacher-forced criterion: every answer
    token is the argmax given the right prefix."""
    torch = pytest.importorskip("torch")
    from ramstream.lab.checkpoint import load_checkpoint
    from ramstream.lab.evaluate import score_task
    from ramstream.lab.model import generate

    model = load_checkpoint(DATA / "base")
    digits = tasks.eval_digits("rev")[:300]
    greedy = score_task(lambda p: generate(model, p), "rev", digits)
    with torch.no_grad():
        seq = torch.from_numpy(tasks.sequences("rev", digits))
        pred = model(seq[:, :-1])[:, tasks.PROMPT_LEN - 1 :].argmax(-1)
    assert greedy.correct == int((pred == seq[:, tasks.PROMPT_LEN :]).all(dim=1).sum())
    assert 0 < greedy.correct < 300


# -- the shipped checkpoints ----------------------------------------------------------------------


def test_shipped_checkpoints_load_as_a_bf16_family() -> None:
    base, agents = shipped_family()
    family = open_family(base, [str(a) for a in agents])
    assert family.agent_names == ("inc", "rev", "srt")
    entries = list(family.base.tensors.values())
    assert {e.entry.dtype for e in entries} == {"BF16"}
    assert 550_000 < sum(e.entry.numel for e in entries) < 650_000
    for member in MEMBERS:
        config = json.loads((DATA / member / "config.json").read_text())
        assert config["model_type"] == "ramstream-agents-lab" and config["hidden_size"] == 128
        assert (DATA / member / "model.safetensors").stat().st_size < 2_000_000


def test_shipped_densities_are_the_documented_ones(tmp_path: Path) -> None:
    base, agents = shipped_family()
    record = shipped_record()
    store = api.probe(
        base, [str(a) for a in agents], index=tmp_path / "i.zarr", options=RunOptions(quiet=True, cache_dir=tmp_path)
    )
    measured = {r.name: r for r in agent_reports(store)}
    doc = DOC.read_text()
    lrs = {a["task"]: a["lr"] for a in record["recipe"]["agents"]}
    for want in record["agents"]:
        got = measured[want["name"]]
        assert (got.active, got.shared, got.unique, got.params) == (
            want["active"],
            want["shared"],
            want["unique"],
            want["params"],
        )
        # The quality table's density rows (seed 0) are the shipped agents.
        assert f"| {want['name']} | {lrs[want['name']]:g} | {100 * want['density']:.1f} % |" in doc
    densities = [measured[n].density for n in ("inc", "rev", "srt")]
    assert densities == sorted(densities) and densities[0] < 0.1 and densities[2] < 0.5


def test_shipped_accuracies_are_the_recorded_ones() -> None:
    pytest.importorskip("torch")
    from ramstream.lab.evaluate import evaluate_dir

    record = shipped_record()
    for member in MEMBERS:
        got = {t: s.accuracy for t, s in evaluate_dir(DATA / member).items()}
        # One prompt in a thousand may flip on a near tie with another CPU's arithmetic.
        assert got == pytest.approx(record["accuracy"][member], abs=0.003), member


# -- the demo ------------------------------------------------------------------------------------


def test_demo_merges_the_shipped_agents_and_scores_them(tmp_path: Path) -> None:
    pytest.importorskip("torch")
    result = CliRunner().invoke(main, ["demo", "--dir", str(tmp_path / "demo"), "--cache-dir", str(tmp_path)])
    assert result.exit_code == 0, result.output
    lines = result.stdout.splitlines()
    assert lines[0].startswith("agents lab: a base and 3 RL agents (inc, rev, srt) from ")
    header = next(i for i, line in enumerate(lines) if line.startswith("agent "))
    assert [line.split()[0] for line in lines[header + 1 : header + 4]] == ["inc", "rev", "srt"]
    merged = tmp_path / "demo" / "merged-ram+"
    assert any(line.startswith("merged model (RAM+, lambda ") and line.endswith(f": {merged}") for line in lines)
    table = lines[lines.index(next(x for x in lines if x.startswith("per-task accuracy"))) + 1 :]
    assert table[0].split() == ["model", "inc", "rev", "srt", "mean"]
    assert [row.split()[0] for row in table[1:]] == ["base", "inc", "rev", "srt", "RAM+"]
    record = shipped_record()["accuracy"]
    for row in table[1:5]:
        name, *cells = row.split()
        assert [float(c) for c in cells[:3]] == pytest.approx([record[name][t] for t in tasks.TASKS], abs=0.003)


def demo_without_torch(tmp_path: Path, *flags: str, timeout: float = 300) -> subprocess.CompletedProcess[str]:
    """``ramstream demo FLAGS --dir tmp_path/demo`` in a process where torch cannot be imported."""
    code = (
        "import sys; sys.modules['torch'] = None\n"
        "from ramstream.cli import main\n"
        f"main(['demo', *{list(flags)!r}, '--dir', {str(tmp_path / 'demo')!r}, '--cache-dir', {str(tmp_path)!r}])\n"
    )
    return subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=timeout)


def test_demo_without_torch_still_merges(tmp_path: Path) -> None:
    done = demo_without_torch(tmp_path)
    assert done.returncode == 0, done.stderr
    assert "merged model (RAM+, lambda " in done.stdout
    assert done.stdout.rstrip().endswith("per-task accuracy: needs torch (pip install 'ramstream[torch]')")
    assert (tmp_path / "demo" / "merged-ram+" / "config.json").is_file()


# -- the pipeline, a few steps of everything -------------------------------------------------------


def _lab(*args: str | Path) -> str:
    done = subprocess.run(
        [sys.executable, "-m", "tools.agents_lab", *map(str, args)],
        capture_output=True,
        text=True,
        timeout=300,
        cwd=ROOT,
    )
    assert done.returncode == 0, done.stdout + done.stderr
    return done.stdout


def test_smoke_pipeline(tmp_path: Path) -> None:
    """Pretrain, RL, ship, and the quality table, with a few steps of each (seconds, not minutes)."""
    pytest.importorskip("torch")
    work, ship, doc = tmp_path / "work", tmp_path / "ship", tmp_path / "doc.md"
    doc.write_text("# Lab\n\nbefore\n\nafter\n")
    _lab("rebuild", "--smoke", "--work", work, "--ship", "--ship-to", ship)
    record = json.loads((ship / "lab.json").read_text())
    assert [a["name"] for a in record["agents"]] == ["inc", "rev", "srt"]
    assert set(record["accuracy"]) == set(MEMBERS)
    for member in MEMBERS:
        assert (ship / member / "model.safetensors").is_file()
    # Same seeds, same bits: a second rebuild elsewhere writes identical checkpoints.
    _lab("rebuild", "--smoke", "--work", tmp_path / "again")
    for rel in ("base", "seed0/inc", "seed0/srt"):
        assert (work / rel / "model.safetensors").read_bytes() == (
            tmp_path / "again" / rel / "model.safetensors"
        ).read_bytes()

    out = _lab("table", "--smoke", "--work", work, "--seeds", "0,1", "--doc", doc)
    assert "inc seed 0: reusing" in out and "base: reusing" in out
    results = json.loads((work / "results.json").read_text())
    assert set(results["per_seed"]) == {"0", "1"}
    from tools.agents_lab.merges import METHODS

    for seed in ("0", "1"):
        assert set(results["per_seed"][seed]["merges"]) == {m.key for m in METHODS}
        for key in ("ram", "ram+", "ram+s", "average", "ta1", "ta_val"):
            row = results["per_seed"][seed]["merges"][key]
            assert set(row["test"]) == set(tasks.TASKS), key
    text = doc.read_text()
    assert text.startswith("# Lab\n\nbefore\n\nafter\n\n<!-- BEGIN quality table")
    assert re.search(r"^\| RAM \| ramstream \| \d\.\d{3} ± \d\.\d{3} \|", text, re.M)
    assert "| each agent on its own task | lab |" in text
    # Regenerating replaces the block instead of appending another (`render` writes the block as
    # `table` does, from the results.json that `table` wrote, without merging and scoring again).
    _lab("render", "--work", work, "--doc", doc)
    assert doc.read_text().count("<!-- BEGIN quality table") == 1


def test_methods_this_ramstream_lacks_are_recorded_or_fall_back_to_the_lab(tmp_path: Path) -> None:
    pytest.importorskip("torch")
    from tools.agents_lab import merges
    from tools.agents_lab.table import MergeContext, render, run_method

    base, agents = shipped_family()
    ctx = MergeContext(base, agents, tmp_path / "i.zarr", tmp_path, tmp_path / "merges", limit=8)
    lacking = merges.MethodRun("future", "a future method", "no_such_method", {"density": 0.5})
    assert run_method(ctx, lacking, print) == {"source": merges.NOT_AVAILABLE, "note": merges.NOT_AVAILABLE}
    averaging = merges.MethodRun("avg", "averaging", "no_such_linear", dense_lambda=merges.AVERAGE)
    row = run_method(ctx, averaging, print)
    assert row["source"] == merges.LAB_DENSE and set(row["test"]) == set(tasks.TASKS)
    # The lab's dense averaging is ramstream's linear merge, bit for bit here.
    from ramstream.lab.checkpoint import read_tensors

    linear = merges.MethodRun("linear", "averaging", "linear")
    assert run_method(ctx, linear, print)["source"] == merges.RAMSTREAM
    dense, engine = read_tensors(tmp_path / "merges" / "avg"), read_tensors(tmp_path / "merges" / "linear")
    assert all(bool((dense[k] == engine[k]).all()) for k in dense)

    def seed_result(acc: float) -> dict[str, object]:
        scores = dict.fromkeys(tasks.TASKS, acc)
        overlap = [
            {"name": t, "density": 0.1, "active": 10, "unique": 5, "overlap_histogram": [5, 3, 2], "rho": 1.0}
            | {"lambda": 1.1}
            for t in tasks.TASKS
        ]
        return {
            "overlap": overlap,
            "agents": {t: scores for t in tasks.TASKS},
            "merges": {
                "average": {"source": merges.LAB_DENSE, "test": scores},
                "ram+": {"source": merges.RAMSTREAM, "test": dict.fromkeys(tasks.TASKS, acc + 0.1)},
                "future": {"source": merges.NOT_AVAILABLE},
            },
        }

    doc = {
        "recipe": {"agents": [{"task": t, "lr": 0.01} for t in tasks.TASKS], "eval_prompts": None},
        "seeds": [0, 1],
        "eps": 1e-5,
        "methods": {
            "average": {"label": "averaging (λ = 1/N)"},
            "ram+": {"label": "RAM+ (r = 0.1, α = 2)"},
            "future": {"label": "a future method"},
        },
        "base": dict.fromkeys(tasks.TASKS, 0.5),
        "per_seed": {"0": seed_result(0.4), "1": seed_result(0.6)},
    }
    text = render(doc)
    assert "| averaging (λ = 1/N) | lab dense code | 0.500 ± 0.100 | 0.500 ± 0.100 |" in text
    assert "| RAM+ (r = 0.1, α = 2) | ramstream | 0.600 ± 0.100 |" in text and "| +0.100 ± 0.000 |" in text
    assert "| a future method | not available in this ramstream | — | — | — | — | — |" in text
    assert "| base (pretrained) | lab | 0.500 | 0.500 | 0.500 | 0.500 |  |" in text
    assert "Not in this table (not available in this ramstream, or failed): a future method." in text
    assert "- On the 3-task mean, the best merge is RAM+ (r = 0.1, α = 2) (0.600)." in text
