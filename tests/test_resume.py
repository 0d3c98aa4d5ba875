"""Resumability: SIGKILL a real ``ramstream`` process, rerun the same command, get the same bytes.

DESIGN.md promises "kill -9 at any moment, rerun the same command, get byte-identical output".
Two kinds of kill, both a real ``SIGKILL`` of a real ``python -m ramstream.cli`` process:

- at random instants: the parent sleeps a seeded random delay, then ``os.kill(pid, SIGKILL)``;
- at chosen steps that a timer rarely hits (index creation, journal creation, each step of the
  output's finalisation): the child runs the CLI under an audit hook that sends ``SIGKILL`` to
  its own process when the n-th matching file operation (a rename into place, a removal) is
  about to happen.

After every kill the output directory must not look finished, and the rerun must produce what an
uninterrupted run produced, byte for byte.
"""

from __future__ import annotations

import json
import os
import random
import shutil
import signal
import subprocess
import sys
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import pytest
import zarr

from tests.families import build_family, read_safetensors, write_safetensors

# Timed kills: ~28M bf16 elements per checkpoint. With --memory 16MiB a block is 262144
# elements, so a pass has ~110 blocks and takes one to two seconds on one thread.
LARGE: dict[str, tuple[int, ...]] = {
    "model.embed_tokens.weight": (4096, 2048),
    "model.layers.0.mlp.up_proj.weight": (4096, 2048),
    "model.layers.0.mlp.down_proj.weight": (2048, 3072),
    "model.norm.weight": (2048,),
    "lm_head.weight": (2048, 3072),
}
# Kills at chosen steps need no long pass: ~3M elements, 13 blocks.
SMALL: dict[str, tuple[int, ...]] = {
    "model.embed_tokens.weight": (1024, 1024),
    "model.layers.0.mlp.up_proj.weight": (1024, 1024),
    "model.norm.weight": (1024,),
    "lm_head.weight": (1024, 1024),
}
PROBE_OPTS = ("--memory", "16MiB", "--quiet")
MERGE_OPTS = ("--memory", "16MiB", "--quiet")
ONE_THREAD = ("--threads", "1")  # longer, steadier passes for the timed kills
LOOKS_FINISHED = ("config.json", "ramstream_merge.json")
KILLED = -signal.SIGKILL
KILLS = 5

# Runs the CLI; sends SIGKILL to itself just before the n-th audit event ``event`` whose
# argument ``arg`` ends with ``suffix`` (counted only after the optional ``arm`` event).
KILL_AT_STEP = r"""
import json, os, signal, sys
spec = json.loads(sys.argv.pop(1))
state = {"armed": spec.get("arm") is None, "seen": 0}
def matches(rule, event, args):
    return event == rule["event"] and len(args) > rule["arg"] and str(args[rule["arg"]]).endswith(rule["suffix"])
def hook(event, args):
    if not state["armed"]:
        state["armed"] = matches(spec["arm"], event, args)
    elif matches(spec, event, args):
        state["seen"] += 1
        if state["seen"] == spec["n"]:
            os.kill(os.getpid(), signal.SIGKILL)
sys.addaudithook(hook)
from ramstream.cli import main
main()
"""


def cli(*args: str | Path) -> list[str]:
    return [sys.executable, "-m", "ramstream.cli", *map(str, args)]


def run(cmd: list[str]) -> subprocess.CompletedProcess[str]:
    return subprocess.run(cmd, capture_output=True, text=True, timeout=120)


def run_ok(cmd: list[str]) -> subprocess.CompletedProcess[str]:
    done = run(cmd)
    assert done.returncode == 0, f"{cmd[3:5]} failed ({done.returncode}):\n{done.stderr}"
    assert "Traceback" not in done.stderr
    return done


def kill_after(cmd: list[str], delay: float) -> int:
    """Start ``cmd``, SIGKILL it after ``delay`` seconds; its exit status (KILLED if it was killed)."""
    proc = subprocess.Popen(cmd, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True)
    try:
        _, err = proc.communicate(timeout=delay)
    except subprocess.TimeoutExpired:
        os.kill(proc.pid, signal.SIGKILL)
        proc.communicate()
        return KILLED
    assert proc.returncode == 0, f"run finished before its kill but failed:\n{err}"
    return 0


def kill_at_step(args: list[str | Path], step: dict[str, object]) -> None:
    """Run the CLI with ``args``; it SIGKILLs itself at ``step`` (which must be reached)."""
    cmd = [sys.executable, "-c", KILL_AT_STEP, json.dumps(step), *map(str, args)]
    done = subprocess.run(cmd, capture_output=True, text=True, timeout=120)
    assert done.returncode == KILLED, f"the kill step {step} was never reached:\n{done.stdout}{done.stderr}"


def killed_then_rerun(args: list[str | Path], step: dict[str, object], out: Path) -> bytes:
    """Kill the CLI merge ``args`` at ``step``; it left no model in ``out``; run it again to the
    end: the rerun's model bytes."""
    kill_at_step(args, step)
    assert not (out / "model.safetensors").exists()
    run_ok(cli(*args))
    return (out / "model.safetensors").read_bytes()


def renamed_to(suffix: str, n: int = 1) -> dict[str, object]:
    """The step just before the n-th rename into a path ending with ``suffix``."""
    return {"event": "os.rename", "arg": 1, "suffix": suffix, "n": n}


def tree_bytes(directory: Path) -> dict[str, bytes]:
    """Every file under ``directory`` but ramstream's work area and the trash of a finalisation."""
    return {
        str(p.relative_to(directory)): p.read_bytes()
        for p in sorted(directory.rglob("*"))
        if p.is_file() and not p.relative_to(directory).parts[0].startswith(".ramstream")
    } | {
        str(p.relative_to(directory)): b""
        for p in directory.glob(".ramstream-done-*")  # a finished run leaves none behind
    }


def output_problems(out: Path, reference: Reference) -> list[str]:
    """How ``out`` differs from the uninterrupted run's output (nothing when byte-identical)."""
    got = tree_bytes(out)
    problems = []
    differ = sorted(name for name in reference.files if got.get(name) != reference.files[name])
    extra = sorted(set(got) - set(reference.files))
    if differ:
        problems.append(f"files differ from an uninterrupted run's: {differ}")
    if extra:
        problems.append(f"files that an uninterrupted run does not leave: {extra}")
    return problems


def finished_looking(out: Path, reference: Reference) -> list[str]:
    """Model files that differ from the finished output although ``out`` presents itself as a
    finished model (a ``config.json`` or record beside the shards): what looks finished must be."""
    if not any((out / name).exists() for name in LOOKS_FINISHED):
        return []
    got = tree_bytes(out)
    # The record is the commit mark written last; every other file must already be final.
    return [n for n in reference.files if n != "ramstream_merge.json" and got.get(n) != reference.files[n]]


def index_arrays(path: Path) -> dict[str, np.ndarray]:
    group = zarr.open_group(str(path), mode="r", zarr_format=3)
    arrays = {}
    for name in ("masks", "stats/counts", "progress/probe"):
        arrays[name] = np.asarray(group[name][:])  # type: ignore[index]
    return arrays


def assert_same_index(path: Path, reference: Path) -> None:
    ours = zarr.open_group(str(path), mode="r", zarr_format=3).attrs
    theirs = zarr.open_group(str(reference), mode="r", zarr_format=3).attrs
    assert ours["state"] == "ready"
    assert ours["probe"]["complete"] is True  # type: ignore[index]
    assert ours["ramstream_index"] == theirs["ramstream_index"]
    got, want = index_arrays(path), index_arrays(reference)
    assert sorted(got) == sorted(want)
    assert got["progress/probe"].all()
    for name in want:
        np.testing.assert_array_equal(got[name], want[name], err_msg=name)


@dataclass(frozen=True)
class Reference:
    members: tuple[str, ...]  # base, then agents
    merge_opts: tuple[str, ...]  # MERGE_OPTS and a shard size that makes two output shards
    index: Path
    out: Path
    files: dict[str, bytes]
    startup: float  # seconds of a run that has nothing to do
    probe_work: float  # seconds of probing (beyond startup) on one thread
    merge_work: float


def make_reference(root: Path, shapes: dict[str, tuple[int, ...]], shard_size: str, seed: int) -> Reference:
    """Write a family, probe and merge it without interruption, and time the runs."""
    family = build_family(root / "family", shapes=shapes, int_tensor=True, shards=2, seed=seed)
    members = (str(family.base), *map(str, family.agents))
    merge_opts = (*MERGE_OPTS, "--shard-size", shard_size)
    index, out = root / "index.zarr", root / "out"
    t0 = time.monotonic()
    run_ok(cli("probe", *members, "--index", index, *PROBE_OPTS, *ONE_THREAD))
    t1 = time.monotonic()
    run_ok(cli("merge", *members, "--out", out, "--index", index, *merge_opts, *ONE_THREAD))
    t2 = time.monotonic()
    assert "already merged" in run_ok(cli("merge", *members, "--out", out, "--index", index, *merge_opts)).stdout
    startup = time.monotonic() - t2
    files = tree_bytes(out)
    assert not (out / ".ramstream").exists()
    assert {"config.json", "ramstream_merge.json", "model-00002-of-00002.safetensors"} <= set(files)
    return Reference(
        members, merge_opts, index, out, files, startup, max(t1 - t0 - startup, 0.1), max(t2 - t1 - startup, 0.1)
    )


@pytest.fixture(scope="module")
def large(tmp_path_factory: pytest.TempPathFactory) -> Reference:
    return make_reference(tmp_path_factory.mktemp("resume-large"), LARGE, "32MiB", seed=11)


@pytest.fixture(scope="module")
def small(tmp_path_factory: pytest.TempPathFactory) -> Reference:
    return make_reference(tmp_path_factory.mktemp("resume-small"), SMALL, "4MiB", seed=12)


def paced(reference: Reference) -> tuple[float, float]:
    """The seconds of a run with nothing to do, timed now, and how much slower the machine is
    now than when ``reference`` was timed: the suite's load changes between a module's fixture
    and its tests, and kills timed from a busier moment land after a quieter run has finished."""
    t0 = time.monotonic()
    run_ok(cli("merge", *reference.members, "--out", reference.out, "--index", reference.index, *reference.merge_opts))
    startup = time.monotonic() - t0
    return startup, startup / reference.startup


def kill_repeatedly(
    cmd: list[str], delays: list[float], out: Path | None, reference: Reference | None = None
) -> tuple[list[int], list[str]]:
    """Kill ``cmd`` after each delay in turn (stopping once a run finishes by itself); the exit
    statuses, and what made ``out`` look finished after a kill."""
    outcomes, looked_finished = [], []
    for delay in delays:
        outcomes.append(kill_after(cmd, delay))
        if outcomes[-1] != KILLED:
            break
        if out is not None and reference is not None and finished_looking(out, reference):
            wrong = finished_looking(out, reference)
            looked_finished.append(f"after the kill at {delay:.2f} s, {out} looked finished but {wrong} differ")
    return outcomes, looked_finished


def killed_twice(
    cmd: list[str],
    delays: list[float],
    reset: Callable[[], None],
    out: Path | None = None,
    reference: Reference | None = None,
) -> tuple[list[int], list[str], list[float]]:
    """``kill_repeatedly`` until two runs or more were killed: when a run finishes before the
    second kill (the machine sped up since its pace was timed: the suite's load comes and goes),
    the pass starts over from nothing (``reset``) with delays a fifth shorter, three times at most.
    The exit statuses, what looked finished after any kill, and the delays of the last attempt."""
    looked_finished: list[str] = []
    for attempt in range(3):
        outcomes, looked = kill_repeatedly(cmd, delays, out, reference)
        looked_finished += looked
        if outcomes.count(KILLED) >= 2 or attempt == 2:
            break
        reset()
        delays = [d * 0.8 for d in delays]
    return outcomes, looked_finished, delays


def _remove(directory: Path) -> None:
    shutil.rmtree(directory, ignore_errors=True)


def test_killed_merge_resumes_to_identical_bytes(tmp_path: Path, large: Reference) -> None:
    """A merge (from a complete index, so the kills land in the merge pass and its finalisation)
    killed at random instants, then rerun."""
    rng = random.Random(20260121)
    index, out = tmp_path / "index.zarr", tmp_path / "out"
    shutil.copytree(large.index, index)
    cmd = cli("merge", *large.members, "--out", out, "--index", index, *large.merge_opts, *ONE_THREAD)
    startup, speed = paced(large)
    delays = [startup * rng.uniform(0.8, 1.0) + large.merge_work * speed * rng.uniform(0.0, 0.2) for _ in range(KILLS)]
    outcomes, looked_finished, delays = killed_twice(cmd, delays, lambda: _remove(out), out, large)
    # Each kill lands within the first fifth of what is left, so several land even on a loaded machine.
    assert outcomes.count(KILLED) >= 2, f"too few runs were interrupted: {outcomes} for delays {delays}"
    done = run_ok(cmd)
    assert done.stdout.startswith(("merged:", "already merged:"))
    problems = output_problems(out, large) + looked_finished
    assert not problems, f"killed after {delays[: len(outcomes)]} s: " + "; ".join(problems)


def test_killed_probe_resumes_to_identical_index(tmp_path: Path, large: Reference) -> None:
    """A probe killed at random instants, then rerun: the same statistics and masks, and a merge
    from the resumed index gives the same bytes."""
    rng = random.Random(7)
    index = tmp_path / "index.zarr"
    cmd = cli("probe", *large.members, "--index", index, *PROBE_OPTS, *ONE_THREAD)
    startup, speed = paced(large)
    delays = [startup * rng.uniform(0.6, 1.0) + large.probe_work * speed * rng.uniform(0.0, 0.2) for _ in range(KILLS)]
    outcomes, _, delays = killed_twice(cmd, delays, lambda: _remove(index))
    # Each kill lands within the first fifth of what is left, so several land even on a loaded machine.
    assert outcomes.count(KILLED) >= 2, f"too few runs were interrupted: {outcomes} for delays {delays}"
    assert run_ok(cmd).stdout.strip() == f"index: {index}"
    assert_same_index(index, large.index)
    out = tmp_path / "out"
    run_ok(cli("merge", *large.members, "--out", out, "--index", index, *large.merge_opts))
    assert tree_bytes(out) == large.files


# Steps of a merge (with a complete index) that a timer rarely hits, in the order they happen.
MERGE_STEPS: dict[str, dict[str, object]] = {
    "journal-group-written": renamed_to(".ramstream/journal/merge/zarr.json"),
    "mid-merge": renamed_to(".ramstream/journal/merge/c.6"),
    "first-shard-moved": renamed_to("out/model-00002-of-00002.safetensors"),
    "shards-moved": renamed_to("out/model.safetensors.index.json"),
    "before-record": renamed_to("out/ramstream_merge.json"),
    "before-config": renamed_to("out/config.json"),
    "before-commit-rename": {"event": "os.rename", "arg": 0, "suffix": "out/.ramstream", "n": 1},
    "removing-trash": {
        "arm": {"event": "os.rename", "arg": 0, "suffix": "out/.ramstream"},
        "event": "os.remove",
        "arg": 0,
        "suffix": "",
        "n": 3,
    },
}


@pytest.mark.parametrize("step", list(MERGE_STEPS))
def test_merge_killed_at_a_step_resumes_to_identical_bytes(tmp_path: Path, small: Reference, step: str) -> None:
    index = tmp_path / "index.zarr"
    shutil.copytree(small.index, index)
    out = tmp_path / "out"
    args: list[str | Path] = ["merge", *small.members, "--out", out, "--index", index, *small.merge_opts]
    kill_at_step(args, MERGE_STEPS[step])
    problems = []
    looked_finished = finished_looking(out, small)
    if looked_finished:
        problems.append(f"after the kill, {out} looked finished but {looked_finished} differ from the output")
    done = run(cli(*args))
    if done.returncode != 0 or "Traceback" in done.stderr:
        problems.append(f"the rerun failed ({done.returncode}): {done.stderr.strip()}")
    else:
        problems += output_problems(out, small)
    assert not problems, f"killed at {step}: " + "; ".join(problems)


def test_merge_without_index_killed_while_probing_resumes(tmp_path: Path, small: Reference) -> None:
    """A merge that builds its cached index, killed in its probe pass, then rerun."""
    args: list[str | Path] = ["merge", *small.members, "--out", tmp_path / "out", "--cache-dir", tmp_path / "cache"]
    args += small.merge_opts
    kill_at_step(args, renamed_to("progress/probe/c.5"))
    assert not finished_looking(tmp_path / "out", small)
    run_ok(cli(*args))
    assert tree_bytes(tmp_path / "out") == small.files
    (index,) = (tmp_path / "cache" / "index").iterdir()
    assert_same_index(index, small.index)


def test_killed_merge_resumed_with_another_budget_gives_identical_bytes(tmp_path: Path, small: Reference) -> None:
    """The block size is an execution detail: a rerun with another --memory finishes the same merge."""
    index = tmp_path / "index.zarr"
    shutil.copytree(small.index, index)
    out = tmp_path / "out"
    args: list[str | Path] = ["merge", *small.members, "--out", out, "--index", index, *small.merge_opts]
    kill_at_step(args, MERGE_STEPS["mid-merge"])
    run_ok(cli(*args, "--memory", "48MiB"))
    assert tree_bytes(out) == small.files


# Steps of a probe: the index's root metadata is renamed into place five times (created, marked
# "creating", header written, marked "ready", and finally the probe's record).
PROBE_STEPS: dict[str, dict[str, object]] = {
    "index-directory-made": renamed_to("index.zarr/zarr.json", 1),
    "index-metadata-written": renamed_to("index.zarr/zarr.json", 2),
    "index-arrays-created": renamed_to("index.zarr/zarr.json", 3),
    "first-block-marked": renamed_to("index.zarr/progress/probe/c.0"),
    "before-probe-record": renamed_to("index.zarr/zarr.json", 4),
}


@pytest.mark.parametrize("step", list(PROBE_STEPS))
def test_probe_killed_at_a_step_resumes_to_identical_index(tmp_path: Path, small: Reference, step: str) -> None:
    index = tmp_path / "index.zarr"
    args: list[str | Path] = ["probe", *small.members, "--index", index, *PROBE_OPTS]
    kill_at_step(args, PROBE_STEPS[step])
    done = run(cli(*args))
    assert done.returncode == 0 and "Traceback" not in done.stderr, f"rerun after a kill at {step}:\n{done.stderr}"
    assert_same_index(index, small.index)


# -- a rerun that is not the same merge: the refusal names what differs ------------------------


def merge_killed_mid_merge(root: Path) -> tuple[list[str | Path], Path]:
    """A merge of a family of its own, killed in its merge pass: its arguments and its output."""
    family = build_family(root / "family", shapes=SMALL, int_tensor=True, shards=2, seed=14)
    out = root / "out"
    args: list[str | Path] = ["merge", family.base, *family.agents, "--out", out, "--cache-dir", root / "cache"]
    args += MERGE_OPTS
    kill_at_step(args, MERGE_STEPS["mid-merge"])
    return args, out


def refusal(args: list[str | Path]) -> str:
    """The one line a refused rerun prints, checked to be one error line, exit status 1."""
    done = run(cli(*args))
    assert done.returncode == 1 and "Traceback" not in done.stderr, done.stderr
    lines = done.stderr.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("error: "), done.stderr
    return lines[0]


@pytest.fixture(scope="module")
def killed_mid_merge(tmp_path_factory: pytest.TempPathFactory) -> tuple[list[str | Path], Path]:
    return merge_killed_mid_merge(tmp_path_factory.mktemp("killed-mid-merge"))


def test_a_rerun_after_an_input_changed_names_that_input(tmp_path: Path) -> None:
    """The same command after a shard was rewritten cannot finish the merge: the refusal says
    which checkpoint changed, and offers only what helps (no "rerun that command")."""
    args, out = merge_killed_mid_merge(tmp_path)
    agent = tmp_path / "family" / "agent1"
    shard = sorted(agent.glob("model-*.safetensors"))[0]
    tensors = read_safetensors(shard)
    name = next(iter(tensors))
    dtype, shape, raw = tensors[name]
    tensors[name] = (dtype, shape, raw ^ np.ones_like(raw))  # other values, same size and header
    write_safetensors(shard, tensors)
    line = refusal(args)
    assert f"{out}: holds an unfinished merge whose input {agent} changed since it started" in line, line
    assert f"({shard.name} was modified)" in line and "--force" in line and "another --out" in line, line
    assert "rerun the command" not in line, line
    assert (out / ".ramstream" / "run.json").is_file(), "a refused rerun leaves the unfinished merge alone"
    run_ok(cli(*args, "--force"))
    assert (out / "ramstream_merge.json").is_file() and not (out / ".ramstream").exists()


@pytest.mark.parametrize(
    ("changed", "named"),
    [
        (("--r", "0.3"), "started with r=0.1, not r=0.3 (a parameter of ram+)"),
        (("--method", "task_arithmetic"), "started with --method ram+, not task_arithmetic"),
        (("--eps", "0.001"), "started with --eps 1e-05, not 0.001"),
        (("--out-dtype", "f32"), "started with --out-dtype auto, not f32"),
    ],
)
def test_a_rerun_with_another_parameter_names_it(
    killed_mid_merge: tuple[list[str | Path], Path], changed: tuple[str, str], named: str
) -> None:
    """Another option than the killed merge's: the refusal names it with both values, and says
    that rerunning the command that started the merge finishes it."""
    args, out = killed_mid_merge
    before = tree_bytes(out / ".ramstream")
    line = refusal([*args, *changed])
    assert line.startswith(f"error: {out}: holds an unfinished merge {named}; "), line
    assert "rerun the command that started it to finish it" in line and "--force" in line, line
    assert tree_bytes(out / ".ramstream") == before, "a refused rerun leaves the unfinished merge alone"
