"""``ramstream demo --sweep``: the shipped agents swept, selected on validation, compared on test.

End to end through the CLI on the real shipped checkpoints, with the lab's evaluator run as the
sweep's ``--eval`` command; and the refusals (no torch, options that do not apply)."""

from __future__ import annotations

import json
import shlex
import sys
from pathlib import Path

import pytest
from click.testing import CliRunner

from ramstream.cli import main
from ramstream.demo.sweep import DEFAULTS, GRIDS, METRIC, eval_command
from ramstream.lab.shipped import shipped_record
from ramstream.lab.tasks import TASKS
from ramstream.runs.output import parse_method
from ramstream.sweep.evaluate import check_command
from ramstream.sweep.grid import parse_grids
from tests.test_agents_lab import demo_without_torch


def test_the_defaults_are_the_methods_own_and_candidates_of_the_grids() -> None:
    names = [c.name for c in parse_grids(GRIDS)]
    for default in DEFAULTS:
        _, given = parse_method(default.method, default.settings, 3, False)
        _, bare = parse_method(default.method, {}, 3, False)
        assert given.to_dict() == bare.to_dict(), default.name
        assert default.name in names


def test_the_eval_command_splits_into_this_python_and_names_the_model() -> None:
    words = check_command(eval_command())
    assert words == [sys.executable, "-m", "ramstream.lab.evaluate", "{model}", "--split", "validation", "--json"]
    assert shlex.split(eval_command()) == words


# Four of the demo's ten candidates, its two defaults among them: each candidate costs an evaluator
# process, and what is asserted (ranking, selection, the table) needs no more than a few.
FEWER_GRIDS = ("ram+:r=0.1,0.5", "task_arithmetic:lambda=1.0", "ties:density=0.5")


@pytest.mark.slow  # four merges, four evaluator processes and the test scoring
def test_demo_sweep_selects_the_best_on_validation_and_scores_it_on_test(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    pytest.importorskip("torch")
    import ramstream.demo.sweep as demo_sweep

    assert {c.name for c in parse_grids(FEWER_GRIDS)} <= {c.name for c in parse_grids(GRIDS)}
    monkeypatch.setattr(demo_sweep, "GRIDS", FEWER_GRIDS)
    directory = tmp_path / "demo"
    result = CliRunner().invoke(main, ["demo", "--sweep", "--dir", str(directory), "--cache-dir", str(tmp_path)])
    assert result.exit_code == 0, result.output
    doc = json.loads((directory / "sweep" / "sweep.json").read_text())
    scored = doc["eval"]["candidates"]
    assert list(scored) == [c.name for c in parse_grids(FEWER_GRIDS)]
    assert all(s["error"] is None and list(s["metrics"]) == ["mean", *TASKS] for s in scored.values())
    best = max(scored, key=lambda name: scored[name]["metrics"][METRIC])  # the first of equals, as the sweep
    assert doc["eval"]["selected"] == best and doc["eval"]["select"] == {"metric": METRIC, "best": "max"}

    lines = result.stdout.splitlines()
    head = lines.index(next(x for x in lines if x.startswith("mean validation accuracy")))
    ranking = [line.split() for line in lines[head + 1 : head + 1 + len(scored)]]
    assert [r[0] for r in ranking] == sorted(scored, key=lambda n: -scored[n]["metrics"][METRIC])
    assert ranking[0][2:] == ["<-", "selected"] and ranking[0][0] == best
    assert all(float(r[1]) == pytest.approx(scored[r[0]]["metrics"][METRIC], abs=5e-4) for r in ranking)

    table = lines[lines.index(next(x for x in lines if x.startswith("mean accuracy over the tasks"))) + 1 :]
    assert table[0].split() == ["model", "validation", "test"]
    rows = {" ".join(r.split()[:-2]): [float(x) for x in r.split()[-2:]] for r in table[1:]}
    defaults = [c.name for c in DEFAULTS]
    labels = ["base", "agent inc", "agent rev", "agent srt"]
    labels += [f"{n} (default, selected)" if n == best else f"{n} (default)" for n in defaults]
    labels += [] if best in defaults else [f"{best} (selected)"]
    assert list(rows) == labels
    record = shipped_record()["accuracy"]
    for member, label in zip(("base", "inc", "rev", "srt"), labels, strict=False):
        assert rows[label][1] == pytest.approx(sum(record[member].values()) / len(TASKS), abs=0.002)
    for label in labels[4:]:
        name = label.split(" (")[0]
        assert rows[label][0] == pytest.approx(scored[name]["metrics"][METRIC], abs=5e-4)
        assert (directory / "sweep" / name / "ramstream_merge.json").is_file()


def test_demo_sweep_without_torch_refuses_before_any_work(tmp_path: Path) -> None:
    done = demo_without_torch(tmp_path, "--sweep", timeout=120)
    assert done.returncode == 1 and done.stdout == ""
    assert done.stderr == (
        "error: demo --sweep scores its candidates with the agents lab's evaluator, which needs torch "
        "(pip install 'ramstream[torch]'); `ramstream demo` merges without it\n"
    )
    assert not (tmp_path / "demo").exists()


@pytest.mark.parametrize("extra", [["--synthetic"], ["--method", "ties"]])
def test_demo_sweep_refuses_options_it_would_ignore(tmp_path: Path, extra: list[str]) -> None:
    result = CliRunner().invoke(main, ["demo", "--sweep", "--dir", str(tmp_path / "demo"), *extra])
    assert result.exit_code == 2
    assert "--sweep merges its own candidates of the lab agents: drop --synthetic and --method" in result.stderr
    assert not (tmp_path / "demo").exists()
