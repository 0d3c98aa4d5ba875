"""The README's quick start, run as written, on the agents shipped with ramstream.

The quick start's ``console`` blocks are transcripts: a ``$ `` line is a command (a trailing ``\\``
continues it), the lines under it are what it prints (``...`` stands for any lines). Every command
runs in process (click's ``CliRunner``), in a fresh directory, with ``ramstream/data/agents_lab``
read as the shipped lab agents and ``./base``, ``./coder``, ``./solver`` as three of them; it must
exit 0 and print those lines. The files the README shows (``score.py``, ``ties.yml``) are written
from the README itself.

What needs a machine this one may not have is checked as far as it can be here:

- ``--backend torch --device cuda``: run on the CPU (``--device cpu``, no ``--gpu-memory``), where
  the torch backend must print the same line and write the Numba merge's bytes; skipped
  without torch;
- ``--dask-workers`` and ``--scheduler``: parsed only (``--help``): no cluster is started;
- the lab evaluator's sweep needs torch (skipped without it): the evaluator really runs;
- ``score.py`` needs lm-evaluation-harness and a GPU-sized model: it runs against a stand-in
  ``lm_eval`` module that checks the arguments and returns a fixed score, so the sweep and the
  wrapper's protocol are checked, not GSM8K.
"""

from __future__ import annotations

import os
import re
import shlex
import sys
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import pytest
from click.testing import CliRunner

from ramstream.cli import main
from ramstream.lab.shipped import DATA

README = Path(__file__).resolve().parents[1] / "README.md"
LAB = "ramstream/data/agents_lab"  # the shipped agents, as the README names them from a clone
OWN_MODELS = {"base": "base", "coder": "inc", "solver": "rev"}  # the README's "your own" models

STUB_LM_EVAL = """
from pathlib import Path


def simple_evaluate(model, model_args, tasks, batch_size):
    assert model == "hf" and tasks == ["gsm8k"], (model, tasks)
    args = dict(kv.split("=", 1) for kv in model_args.split(","))
    assert (Path(args["pretrained"]) / "config.json").is_file(), model_args
    return {"results": {"gsm8k": {"exact_match,strict-match": 0.25, "exact_match,flexible-extract": 0.5}}}
"""


@dataclass(frozen=True)
class Command:
    line: str  # as the README writes it, continuations joined
    prints: tuple[str, ...]  # what the README says it prints


def quick_start() -> str:
    text = README.read_text()
    start = text.index("\n## Quick start\n")
    return text[start : text.index("\n## ", start + 1)]


def blocks(language: str) -> Iterator[tuple[str, str]]:
    """(the text just before, the content) of each ``language`` block of the quick start."""
    section = quick_start()
    for match in re.finditer(rf"```{language}\n(.*?)```", section, flags=re.S):
        yield section[: match.start()], match.group(1)


def transcripts() -> list[Command]:
    commands: list[Command] = []
    for _, content in blocks("console"):
        lines = content.splitlines()
        i = 0
        while i < len(lines):
            assert lines[i].startswith("$ "), f"a console block starts with a command: {lines[i]!r}"
            line = lines[i][2:]
            while line.endswith("\\"):
                i += 1
                line = line[:-1] + lines[i].strip()
            i += 1
            prints = []
            while i < len(lines) and not lines[i].startswith("$ "):
                prints.append(lines[i].rstrip())
                i += 1
            commands.append(Command(line, tuple(prints)))
    return commands


def shown_files() -> dict[str, str]:
    """The files the quick start shows, by the name the paragraph before each gives it."""
    files = {}
    for language in ("python", "yaml"):
        for before, content in blocks(language):
            name = re.findall(r"`([\w.-]+\.(?:py|yml))`", before)[-1]
            files[name] = content.replace(LAB, str(DATA))
    return files


def matches(printed: list[str], expected: tuple[str, ...]) -> bool:
    """Whether ``printed`` is ``expected``, each ``...`` standing for any number of lines."""
    if not expected:
        return not printed
    if expected[0] == "...":
        return any(matches(printed[k:], expected[1:]) for k in range(len(printed) + 1))
    return bool(printed) and printed[0] == expected[0] and matches(printed[1:], expected[1:])


@pytest.fixture
def workdir(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    """A fresh directory holding what the README's commands expect besides the shipped agents."""
    monkeypatch.chdir(tmp_path)
    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path / "cache"))
    for name, agent in OWN_MODELS.items():
        (tmp_path / name).symlink_to(DATA / agent, target_is_directory=True)
    for name, content in shown_files().items():
        (tmp_path / name).write_text(content)
    # `--eval` commands run `python`: this interpreter, this checkout, and the stand-in lm_eval.
    stub = tmp_path / "stub"
    (stub / "lm_eval").mkdir(parents=True)
    (stub / "lm_eval" / "__init__.py").write_text(STUB_LM_EVAL)
    bin_dir = tmp_path / "bin"
    bin_dir.mkdir()
    python = bin_dir / "python"  # a script, not a link: a venv's interpreter knows its venv by its path
    python.write_text(f'#!/bin/sh\nexec "{sys.executable}" "$@"\n')
    python.chmod(0o755)
    monkeypatch.setenv("PATH", f"{bin_dir}{os.pathsep}{os.environ['PATH']}")
    monkeypatch.setenv("PYTHONPATH", os.pathsep.join([str(README.parent), str(stub)]))
    return tmp_path


def argv(line: str, variables: dict[str, str]) -> list[str]:
    expanded = re.sub(r"\$(\w+)", lambda m: variables[m.group(1)], line)
    return shlex.split(expanded, comments=True)


def run(command: Command, variables: dict[str, str], replace: dict[str, str | None] | None = None) -> str:
    """Run ``command`` (its ``replace``d options: a value, or None to drop the option) and check
    that it exits 0 and prints what the README says."""
    words = argv(command.line, variables)
    assert words[0] == "ramstream", command.line
    args = words[1:]
    for option, value in (replace or {}).items():
        at = args.index(option)
        args[at : at + 2] = [] if value is None else [option, value]
    result = CliRunner().invoke(main, args)
    assert result.exit_code == 0, f"{command.line}\nexit {result.exit_code}\n{result.stderr}"
    printed = [p.rstrip() for p in result.stdout.rstrip("\n").split("\n")]
    if command.prints:
        assert matches(printed, command.prints), f"{command.line} printed:\n{result.stdout}"
    return result.stdout


def needs(command: Command) -> str | None:
    """What a command needs that this test cannot take for granted."""
    words = argv(command.line, {"lab": LAB})
    if "--dask-workers" in words or "--scheduler" in words:
        return "cluster"
    if "cuda" in words:
        return "gpu"
    if any("ramstream.lab.evaluate" in w for w in words):
        return "lab evaluator"
    return None


def out_dir(command: Command, variables: dict[str, str]) -> str:
    words = argv(command.line, variables)
    return words[words.index("--out") + 1]


def test_the_quick_start_runs_as_written(workdir: Path) -> None:
    variables: dict[str, str] = {}
    ran = []
    for command in transcripts():
        words = shlex.split(command.line, comments=True)
        if len(words) == 1 and "=" in words[0]:  # a shell variable
            name, value = words[0].split("=", 1)
            variables[name] = str(DATA) if value == LAB else value
            continue
        need = needs(command)
        if need == "cluster":  # the options parse; starting a cluster is tests/test_dask.py's
            result = CliRunner().invoke(main, [*argv(command.line, variables)[1:], "--help"])
            assert result.exit_code == 0, result.stderr
            assert "--dask-workers" in result.stdout and "--scheduler" in result.stdout
        elif need is None:
            printed = run(command, variables)
            if not command.prints:  # the README says in words what it prints: a sweep's table
                assert re.search(r"^selected: .+ \(\w+ [\d.]+\)$", printed, flags=re.M), printed
        ran.append(command.line)
    assert any("--config" in line for line in ran) and any(" inspect " in line for line in ran)
    assert any(" status " in line for line in ran) and any("--eval" in line for line in ran)


def test_the_gpu_command_on_the_cpu_gives_the_same_bytes(workdir: Path) -> None:
    pytest.importorskip("torch")
    variables = {"lab": str(DATA)}
    commands = [c for c in transcripts() if not c.line.startswith("lab=")]
    run(commands[0], variables)  # the first merge: the Numba backend's bytes
    (gpu,) = [c for c in commands if needs(c) == "gpu"]
    run(gpu, variables, replace={"--device": "cpu", "--gpu-memory": None})
    numba, torch = workdir / out_dir(commands[0], variables), workdir / out_dir(gpu, variables)
    shards = sorted(p.name for p in numba.glob("*.safetensors"))
    assert shards and shards == sorted(p.name for p in torch.glob("*.safetensors"))
    for name in shards:
        assert (torch / name).read_bytes() == (numba / name).read_bytes(), name


def test_the_sweep_scored_by_the_lab_evaluator(workdir: Path) -> None:
    pytest.importorskip("torch")
    (sweep,) = [c for c in transcripts() if needs(c) == "lab evaluator"]
    run(sweep, {"lab": str(DATA)})
