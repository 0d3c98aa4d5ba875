"""``python -m ramstream.lab.evaluate``: the agents lab's evaluator as a sweep's ``--eval`` command.

Its ``--json`` line is read by the sweep's own parser and must be ``evaluate_dir``'s numbers; a
directory that is not a lab checkpoint is one line on stderr, a non-zero exit, no traceback."""

from __future__ import annotations

import json
import shutil
import subprocess
import sys
from pathlib import Path

import pytest
from click.testing import CliRunner

from ramstream.demo.samples import write_family
from ramstream.lab.shipped import DATA
from ramstream.lab.tasks import TASKS
from ramstream.sweep.evaluate import evaluate


def _run(*args: str | Path) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "ramstream.lab.evaluate", *map(str, args)],
        capture_output=True,
        text=True,
        timeout=120,
    )


def test_json_last_line_is_evaluate_dirs_scores() -> None:
    pytest.importorskip("torch")
    from ramstream.lab.evaluate import evaluate_dir, mean_accuracy

    done = _run(DATA / "rev", "--split", "validation", "--json", "--limit", "200")
    assert done.returncode == 0, done.stderr
    got = json.loads(done.stdout.splitlines()[-1])
    scores = evaluate_dir(DATA / "rev", "validation", limit=200)
    assert list(got) == ["mean", *TASKS]
    assert got == {"mean": mean_accuracy(scores), **{t: s.accuracy for t, s in scores.items()}}
    assert got["rev"] > 0.9 > got["inc"]  # the rev agent, on its own task and another


def test_the_sweep_reads_it_as_its_metrics() -> None:
    pytest.importorskip("torch")
    from ramstream.lab.evaluate import evaluate_dir, mean_accuracy

    command = f"{sys.executable} -m ramstream.lab.evaluate {{model}} --split test --json --limit 100"
    result = evaluate(command, "inc", DATA / "inc")
    assert result.error is None
    scores = evaluate_dir(DATA / "inc", "test", limit=100)
    assert result.metrics == {"mean": mean_accuracy(scores), **{t: s.accuracy for t, s in scores.items()}}


def test_table_without_json() -> None:
    pytest.importorskip("torch")
    from ramstream.lab.evaluate import main

    result = CliRunner().invoke(main, [str(DATA / "base"), "--limit", "50"])
    assert result.exit_code == 0, result.output
    lines = result.stdout.splitlines()
    assert lines[0] == f"{DATA / 'base'} (test prompts, greedy exact match)"
    assert [line.split()[0] for line in lines[1:]] == ["task", *TASKS, "mean"]
    assert all(line.split()[2].endswith("/50") for line in lines[2:5])


def _lab_copy(tmp_path: Path) -> Path:
    target = tmp_path / "lab"
    shutil.copytree(DATA / "base", target)
    return target


def _not_lab(tmp_path: Path, case: str) -> Path:
    if case == "missing":
        return tmp_path / "nowhere"
    if case == "file":
        (tmp_path / "file").write_text("x")
        return tmp_path / "file"
    if case == "no config":
        (tmp_path / "empty").mkdir()
        return tmp_path / "empty"
    if case == "other model":
        base, _ = write_family(tmp_path / "family", densities=(0.1,))
        return base
    target = _lab_copy(tmp_path)
    if case == "no weights":
        (target / "model.safetensors").unlink()
    elif case == "garbage weights":
        (target / "model.safetensors").write_bytes(b"\xff" * 64)
    elif case == "bad json":
        (target / "config.json").write_text("{")
    elif case == "other shape":
        config = json.loads((target / "config.json").read_text())
        (target / "config.json").write_text(json.dumps({**config, "intermediate_size": 256}))
    elif case == "missing tensor":
        from safetensors.torch import load_file, save_file

        tensors = load_file(str(target / "model.safetensors"))
        del tensors["lm_head.weight"]
        save_file(tensors, str(target / "model.safetensors"))
    return target


@pytest.mark.parametrize(
    ("case", "needle"),
    [
        ("missing", "nowhere: no such directory"),
        ("file", "file: not a directory"),
        ("no config", "empty: no config.json; give an agents lab checkpoint directory"),
        ("other model", "base: model_type 'qwen2', not an agents lab checkpoint ('ramstream-agents-lab')"),
        ("no weights", "lab: no model.safetensors; the checkpoint's weights are missing"),
        ("garbage weights", "lab: its weights cannot be read ("),
        ("bad json", "config.json: cannot be read as JSON ("),
        (
            "other shape",
            "lab: model.layers.0.mlp.down_proj.weight has shape (128, 512), its config.json says (128, 256)",
        ),
        ("missing tensor", "lab: lacks lm_head.weight (1 of the lab model's tensors missing)"),
    ],
)
def test_not_a_lab_checkpoint_is_one_line(tmp_path: Path, case: str, needle: str) -> None:
    pytest.importorskip("torch")
    from ramstream.lab.evaluate import main

    result = CliRunner().invoke(main, [str(_not_lab(tmp_path, case)), "--json"])
    assert result.exit_code == 1 and result.stdout == ""
    assert isinstance(result.exception, SystemExit)  # exited on purpose: no traceback
    lines = result.stderr.splitlines()
    assert len(lines) == 1 and lines[0].startswith("error: ") and needle in lines[0], result.stderr


def test_as_a_process_an_error_is_one_line(tmp_path: Path) -> None:
    pytest.importorskip("torch")
    done = _run(tmp_path / "nowhere", "--json")
    assert done.returncode == 1 and done.stdout == ""
    assert done.stderr == f"error: {tmp_path / 'nowhere'}: no such directory\n"


def test_without_torch_it_says_so_in_one_line() -> None:
    code = (
        "import runpy, sys\nsys.modules['torch'] = None\n"
        f"sys.argv = ['evaluate', {str(DATA / 'base')!r}, '--json']\n"
        "runpy.run_module('ramstream.lab.evaluate', run_name='__main__')\n"
    )
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120)
    assert done.returncode == 1 and done.stdout == ""
    assert done.stderr == "error: the agents lab's evaluator needs torch (pip install 'ramstream[torch]')\n"
