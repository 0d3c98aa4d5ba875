"""``ramstream sweep``: K candidates from one read, each the bytes of its own ``ramstream merge``.

Real checkpoints written by the test, the real CLI through click's runner; the reference for
every candidate is ``ramstream merge`` run with the same arguments (itself checked against the
dense references in test_merge_reference.py and test_methods_*.py).
"""

from __future__ import annotations

import json
import shutil
import sys
from pathlib import Path

import pytest
from click.testing import CliRunner, Result
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from ramstream.api import sweep
from ramstream.cli import main
from ramstream.config import RunOptions
from ramstream.sweep.grid import parse_grids
from tests.families import Family, build_family
from tests.test_resume import SMALL, cli, kill_at_step, run_ok, tree_bytes

# Mixed methods in one sweep: RAM+ for two r, TIES with a model-wide cut, DARE-TIES with two
# seeds, model stock and task arithmetic; the flags each takes in ``ramstream merge``.
GRIDS = (
    "ram+:r=0.05,0.5",
    "ties:density=0.3:trim_scope=model",
    "dare_ties:density=0.5:seed=1,2",
    "dare_ties:density=0.5:seed=1:lambda=0.5",  # fuses with seed=1: only lambda differs
    "model_stock",
    "task_arithmetic:lambda=0.75,1.25",  # one kernel call per block for both
)
MERGE_FLAGS = {
    "ram+-r=0.05": ("--method", "ram+", "--r", "0.05"),
    "ram+-r=0.5": ("--method", "ram+", "--r", "0.5"),
    "ties-density=0.3-trim_scope=model": ("--method", "ties", "--density", "0.3", "--trim-scope", "model"),
    "dare_ties-density=0.5-seed=1": ("--method", "dare_ties", "--density", "0.5", "--seed", "1"),
    "dare_ties-density=0.5-seed=2": ("--method", "dare_ties", "--density", "0.5", "--seed", "2"),
    "dare_ties-density=0.5-seed=1-lambda=0.5": (
        *("--method", "dare_ties", "--density", "0.5", "--seed", "1", "--lambda", "0.5"),
    ),
    "model_stock": ("--method", "model_stock"),
    "task_arithmetic-lambda=0.75": ("--method", "task_arithmetic", "--lambda", "0.75"),
    "task_arithmetic-lambda=1.25": ("--method", "task_arithmetic", "--lambda", "1.25"),
}


@pytest.fixture(scope="module")
def family(tmp_path_factory: pytest.TempPathFactory) -> Family:
    return build_family(tmp_path_factory.mktemp("sweep"), seed=21, shards=2)


def invoke(*args: object) -> Result:
    return CliRunner().invoke(main, [str(a) for a in args])


def inputs(family: Family) -> list[str]:
    return [str(family.base), *map(str, family.agents)]


def tree(directory: Path) -> dict[str, bytes]:
    return {str(p.relative_to(directory)): p.read_bytes() for p in sorted(directory.rglob("*")) if p.is_file()}


def mtimes(directory: Path) -> dict[str, int]:
    """The modification times of an output's files (not of a lock a killed run left behind)."""
    return {
        str(p.relative_to(directory)): p.stat().st_mtime_ns
        for p in directory.rglob("*")
        if p.is_file() and not p.name.startswith(".ramstream")
    }


def run_sweep(family: Family, out: Path, grids: tuple[str, ...], *extra: object) -> Result:
    grid_args = [x for g in grids for x in ("--grid", g)]
    return invoke("sweep", *inputs(family), "--out", out, *grid_args, "--quiet", *extra)


def test_every_candidate_is_the_bytes_of_its_own_merge(family: Family, tmp_path: Path) -> None:
    cache = ("--cache-dir", tmp_path / "cache", "--shard-size", "20KB", "--memory", "16MiB")
    done = run_sweep(family, tmp_path / "sweep", GRIDS, *cache)
    assert done.exit_code == 0, done.output + done.stderr
    swept = sorted(p.name for p in (tmp_path / "sweep").iterdir() if p.is_dir())
    assert swept == sorted(MERGE_FLAGS)
    for name, flags in MERGE_FLAGS.items():
        reference = tmp_path / "merge" / name
        merged = invoke("merge", *inputs(family), "--out", reference, *flags, "--quiet", *cache)
        assert merged.exit_code == 0, merged.output + merged.stderr
        assert tree(tmp_path / "sweep" / name) == tree(reference), name
    doc = json.loads((tmp_path / "sweep" / "sweep.json").read_text())
    assert [c["name"] for c in doc["candidates"]] == list(MERGE_FLAGS)
    assert {c["status"] for c in doc["candidates"]} == {"merged"}
    ram = doc["candidates"][0]
    assert ram["settings"] == {"r": 0.05} and len(ram["per_agent"]["lambda"]) == len(family.agents)
    assert not (tmp_path / "sweep" / ".ramstream").exists()


def test_a_rerun_leaves_finished_candidates_alone_and_merges_only_a_new_one(family: Family, tmp_path: Path) -> None:
    out, cache = tmp_path / "sweep", ("--cache-dir", tmp_path / "cache")
    assert run_sweep(family, out, ("ram+:r=0.1", "linear"), *cache).exit_code == 0
    before = mtimes(out / "ram+-r=0.1")
    again = run_sweep(family, out, ("ram+:r=0.1", "linear"), *cache)
    assert again.exit_code == 0 and again.output.count("already merged") == 2, again.output
    added = run_sweep(family, out, ("ram+:r=0.1", "linear", "task_arithmetic:lambda=0.5"), *cache)
    assert added.exit_code == 0, added.output + added.stderr
    assert added.output.count("already merged") == 2 and "merged: " in added.output
    assert mtimes(out / "ram+-r=0.1") == before
    statuses = [c["status"] for c in json.loads((out / "sweep.json").read_text())["candidates"]]
    assert statuses == ["already merged", "already merged", "merged"]


@pytest.mark.parametrize(
    ("grids", "words"),
    [
        (("nonsense:r=1",), "nonsense"),
        (("ram+:density=0.5",), "--grid 'ram+:density=0.5': ram+ has no parameter 'density' (it reads"),
        (("task_arithmetic:lambda=big",), "--grid 'task_arithmetic:lambda=big': lambda must be a number"),
        (("ties:density=2",), "--grid 'ties:density=2': density must lie in"),
        ((), "at least one candidate"),
        (("ram+:r=0.1", "ram+:r=0.10"), "both named"),
    ],
)
def test_a_bad_grid_is_one_line_and_writes_nothing(
    family: Family, tmp_path: Path, grids: tuple[str, ...], words: str
) -> None:
    out = tmp_path / "sweep"
    done = run_sweep(family, out, grids, "--cache-dir", tmp_path / "cache")
    assert done.exit_code != 0 and isinstance(done.exception, SystemExit), done.output
    lines = done.stderr.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("error: ") and words in lines[0], done.stderr
    assert not out.exists()


def test_a_directory_holding_something_else_is_refused_untouched(family: Family, tmp_path: Path) -> None:
    out = tmp_path / "sweep"
    out.mkdir()
    (out / "notes.txt").write_text("mine")
    done = run_sweep(family, out, ("linear",), "--cache-dir", tmp_path / "cache")
    assert done.exit_code != 0 and "'notes.txt', which is not part of a sweep" in done.stderr, done.stderr
    assert sorted(p.name for p in out.iterdir()) == ["notes.txt"]
    shutil.rmtree(out)


KILL_GRIDS = ("ram+:r=0.1", "task_arithmetic:lambda=0.5", "dare_ties:density=0.5:seed=3")
KILL_STEPS = {
    # the sweep's journal mark of its third batch (DIR/.ramstream/journal/merge/c.2)
    "merge-pass": {"event": "os.rename", "arg": 1, "suffix": "merge/c.2", "n": 1},
    # the second candidate's record moved into place: one candidate finished, the others not
    "finalisation": {"event": "os.rename", "arg": 1, "suffix": "ramstream_merge.json", "n": 2},
    # the probe's batch marks, before any statistic or merge
    "probe": {"event": "os.rename", "arg": 1, "suffix": "probe/c.1", "n": 1},
}


@pytest.fixture(scope="module")
def killable(tmp_path_factory: pytest.TempPathFactory) -> tuple[Family, Path]:
    """A family of some batches under --memory 16MiB, and its uninterrupted sweep."""
    root = tmp_path_factory.mktemp("sweep-kill")
    family = build_family(root / "family", shapes=SMALL, int_tensor=True, shards=2, seed=13)
    out = root / "reference"
    args = ["sweep", *inputs(family), "--out", out, *[x for g in KILL_GRIDS for x in ("--grid", g)]]
    run_ok(cli(*args, "--cache-dir", root / "cache", "--memory", "16MiB", "--quiet"))
    return family, out


@pytest.mark.parametrize("step", sorted(KILL_STEPS))
def test_a_sweep_killed_anywhere_resumes_to_the_same_bytes(
    killable: tuple[Family, Path], tmp_path: Path, step: str
) -> None:
    family, reference = killable
    out = tmp_path / "sweep"
    args: list[str | Path] = ["sweep", *inputs(family), "--out", out]
    args += [x for g in KILL_GRIDS for x in ("--grid", g)]
    args += ["--cache-dir", tmp_path / "cache", "--memory", "16MiB", "--quiet"]
    kill_at_step(args, KILL_STEPS[step])
    shown = json.loads(invoke("status", out, "--json").output)
    assert shown["kind"] == "sweep" and [c["name"] for c in shown["sweep"]["candidates"]] == [
        "ram+-r=0.1",
        "task_arithmetic-lambda=0.5",
        "dare_ties-density=0.5-seed=3",
    ]
    if step == "merge-pass":
        merge = shown["passes"]["merge"]  # write-behind threads may mark batches out of order
        assert merge["state"] in ("partial", "not started") and merge["blocks_done"] < merge["blocks_total"]
    finished = [p for p in out.iterdir() if (p / "ramstream_merge.json").is_file() and not (p / ".ramstream").exists()]
    before = {p.name: mtimes(p) for p in finished}
    run_ok(cli(*args))
    for name in (p.name for p in reference.iterdir() if p.is_dir()):
        assert tree_bytes(out / name) == tree_bytes(reference / name), name
    assert {p.name: mtimes(out / p.name) for p in finished} == before  # finished candidates untouched
    assert step != "finalisation" or len(finished) == 1
    states = [c["state"] for c in json.loads(invoke("status", out, "--json").output)["sweep"]["candidates"]]
    assert states == ["done"] * 3
    assert "done         ram+-r=0.1" in invoke("status", out).output


# An evaluator that speaks the protocol: the last line of its stdout is a JSON object of metrics.
EVALUATOR = """
import json, sys
from pathlib import Path
model = Path(sys.argv[1])
print("loading", model)  # only the last line counts
record = model / "ramstream_merge.json"
metrics = {"files": len(list(model.iterdir()))}
if record.is_file():
    lambdas = json.loads(record.read_text())["per_agent"].get("lambda")
    if lambdas:
        metrics["lambda0"] = lambdas[0]
print(json.dumps(metrics))
"""


def test_candidates_are_scored_ranked_and_recorded(family: Family, tmp_path: Path) -> None:
    script = tmp_path / "my eval.py"  # a space: {model} and the script stay one argument each
    script.write_text(EVALUATOR)
    out = tmp_path / "sweep"
    command = f"{sys.executable} '{script}' {{model}}"
    grids = ("ram+:r=0.05,0.5", "linear")
    done = run_sweep(
        family, out, grids, "--eval", command, "--eval-inputs", "--select", "lambda0", "--cache-dir", tmp_path / "c"
    )
    assert done.exit_code == 0, done.output + done.stderr
    table = done.output.split("(sweep.json)")[1].strip().splitlines()
    assert table[0].split() == ["model", "lambda0", "(max)"]
    assert [line.split()[0] for line in table[1:3]] == ["ram+-r=0.5", "ram+-r=0.05"]  # the larger lambda first
    assert table[-1].startswith("selected: ram+-r=0.5 (lambda0 ")
    doc = json.loads((out / "sweep.json").read_text())["eval"]
    assert doc["command"] == command and doc["selected"] == "ram+-r=0.5"
    assert doc["select"] == {"metric": "lambda0", "best": "max"}
    assert set(doc["inputs"]) == {"base", *(a.name for a in family.agents)}
    assert all("lambda0" not in v["metrics"] and v["metrics"]["files"] >= 1 for v in doc["inputs"].values())
    assert set(doc["candidates"]["linear"]["metrics"]) == {"files"}


# An evaluator that logs every call, to count them; it fails for a model named in FAIL_ONCE once.
COUNTING = """
import json, sys
from pathlib import Path
model, log = Path(sys.argv[1]), Path(sys.argv[2])
calls = log.read_text().splitlines() if log.exists() else []
log.write_text("\\n".join([*calls, model.name]) + "\\n")
if model.name == "linear" and "linear" not in calls:
    sys.exit("not today")
print(json.dumps({"score": len(model.name)}))
"""


def test_a_rerun_reuses_the_recorded_scores(family: Family, tmp_path: Path) -> None:
    """Scores recorded with the same command are kept for candidates not merged again and for the
    inputs; a failed evaluation, a new candidate and another command are evaluated (again)."""
    script, log = tmp_path / "count.py", tmp_path / "calls.log"
    script.write_text(COUNTING)
    out, cache = tmp_path / "sweep", ("--cache-dir", tmp_path / "cache")
    command = ("--eval", f"{sys.executable} {script} {{model}} {log}", "--eval-inputs")

    def calls() -> list[str]:
        return log.read_text().splitlines()

    first = run_sweep(family, out, ("ram+:r=0.1", "linear"), *command, *cache)
    assert first.exit_code == 0, first.output + first.stderr
    n_inputs = 1 + len(family.agents)
    assert len(calls()) == n_inputs + 2 and "not today" in first.output
    again = run_sweep(family, out, ("ram+:r=0.1", "linear", "task_arithmetic"), *command, *cache)
    assert again.exit_code == 0, again.output + again.stderr
    assert calls()[n_inputs + 2 :] == ["linear", "task_arithmetic"]  # the failure again, the new one
    rows = {line.split()[0]: line.split()[1:] for line in again.output.splitlines() if "  " in line}
    assert rows["ram+-r=0.1"] == ["10", "(recorded", "earlier)"] and rows["linear"] == ["6"]
    scores = json.loads((out / "sweep.json").read_text())["eval"]["candidates"]
    assert scores["linear"]["metrics"] == {"score": 6.0} and scores["ram+-r=0.1"]["metrics"] == {"score": 10.0}
    fewer = ("--eval", f"{sys.executable} {script} {{model}} {log}")  # the same command, fewer models
    assert run_sweep(family, out, ("ram+:r=0.1",), *fewer, *cache).exit_code == 0
    assert len(calls()) == n_inputs + 4  # the same command: the recorded score is kept
    renamed = ("--eval", f"{sys.executable} {script} {{model}} {log} ")
    assert run_sweep(family, out, ("ram+:r=0.1",), *renamed, *cache).exit_code == 0
    assert calls()[-1] == "ram+-r=0.1"  # another command line: evaluated again


def test_the_plot_draws_every_candidate(family: Family, tmp_path: Path) -> None:
    pytest.importorskip("matplotlib")
    script = tmp_path / "eval.py"
    script.write_text(EVALUATOR)
    out, plot = tmp_path / "sweep", tmp_path / "scores.svg"
    command = f"{sys.executable} {script} {{model}}"
    done = run_sweep(
        family,
        out,
        ("ram+:r=0.05,0.5", "linear"),
        "--eval",
        command,
        "--select",
        "lambda0",
        "--plot",
        plot,
        "--eval-inputs",
        "--cache-dir",
        tmp_path / "c",
    )
    assert done.exit_code == 0, done.output + done.stderr
    assert done.output.strip().endswith(f"plot: {plot}")
    svg = plot.read_text()
    assert all(name in svg for name in ("ram+-r=0.05", "ram+-r=0.5", "linear", "not scored: no lambda0"))
    assert "selected: ram+-r=0.5" in svg
    png = tmp_path / "scores.png"
    again = run_sweep(family, out, ("ram+:r=0.05",), "--eval", command, "--plot", png, "--cache-dir", tmp_path / "c")
    assert again.exit_code == 0 and png.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"


@pytest.mark.parametrize(
    ("program", "error"),
    [
        ("import sys; print('boom', file=sys.stderr); sys.exit(3)", "exit status 3: boom"),
        ("import sys; sys.exit(4)", "exit status 4, printing nothing"),
        ("print('accuracy is high')", "is not a JSON object or a number: 'accuracy is high'"),
        ("print(0.75)", None),
    ],
)
def test_an_evaluation_that_fails_is_recorded_not_fatal(
    family: Family, tmp_path: Path, program: str, error: str | None
) -> None:
    script = tmp_path / "eval.py"
    script.write_text(program)
    out = tmp_path / "sweep"
    done = run_sweep(
        family, out, ("linear",), "--eval", f"{sys.executable} {script} {{model}}", "--cache-dir", tmp_path
    )
    assert done.exit_code == 0, done.output + done.stderr
    result = json.loads((out / "sweep.json").read_text())["eval"]["candidates"]["linear"]
    if error is None:
        assert result["metrics"] == {"score": 0.75} and result["error"] is None
        assert "selected: linear (score 0.75)" in done.output
    else:
        assert result["metrics"] == {} and error in result["error"]
        assert error.split(":")[0] in done.output


@pytest.mark.parametrize(
    ("extra", "words"),
    [
        (("--select", "acc"), "--eval-inputs, --select and --plot need --eval"),
        (("--plot", "scores.png"), "--eval-inputs, --select and --plot need --eval"),
        (("--eval", "x {model}", "--plot", "scores.gif"), "--plot writes PNG or SVG"),
        (("--eval", "python eval.py"), "never names {model}"),
        (("--eval", "python 'eval.py {model}"), "cannot be split into words"),
        (("--eval", "x {model}", "--select", "acc:best"), "write METRIC, METRIC:max or METRIC:min"),
    ],
)
def test_a_bad_eval_or_select_is_refused_before_any_work(
    family: Family, tmp_path: Path, extra: tuple[str, ...], words: str
) -> None:
    out = tmp_path / "sweep"
    done = run_sweep(family, out, ("linear",), *extra, "--cache-dir", tmp_path / "cache")
    assert done.exit_code != 0 and words in done.stderr and len(done.stderr.strip().splitlines()) == 1, done.stderr
    assert not out.exists()


# The same candidates computed elsewhere: torch on the CPU, and two Dask worker processes (a
# LocalCluster on loopback, started and stopped by the command itself).
ELSEWHERE = (
    "ram+:r=0.05,0.5",  # fused: one kernel call per block for both
    "ties:density=0.3:trim_scope=model",
    "dare_ties:density=0.5:seed=1",
    "task_arithmetic:lambda=0.75,1.25",  # fused
)


@pytest.mark.parametrize(
    ("where", "flags", "needs"),
    [
        ("torch-cpu", ("--backend", "torch", "--device", "cpu"), "torch"),
        ("dask", ("--dask-workers", "2"), "distributed"),
    ],
)
def test_a_sweep_elsewhere_writes_the_numba_merges_bytes(
    family: Family, tmp_path: Path, where: str, flags: tuple[str, ...], needs: str
) -> None:
    pytest.importorskip(needs)
    cache = ("--cache-dir", tmp_path / "cache", "--shard-size", "20KB")
    done = run_sweep(family, tmp_path / "sweep", ELSEWHERE, *cache, *flags)
    assert done.exit_code == 0, done.output + done.stderr
    for name in sorted(p.name for p in (tmp_path / "sweep").iterdir() if p.is_dir()):
        reference = tmp_path / "merge" / name
        assert (
            invoke("merge", *inputs(family), "--out", reference, *MERGE_FLAGS[name], "--quiet", *cache).exit_code == 0
        )
        assert tree(tmp_path / "sweep" / name) == tree(reference), (where, name)


@settings(max_examples=6, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(
    picks=st.lists(st.sampled_from(sorted(MERGE_FLAGS)), min_size=1, max_size=3, unique=True),
    block=st.sampled_from([64, 192, 1024, 1 << 16]),
)
def test_block_size_and_k_never_change_a_candidates_bytes(
    family: Family,
    references: dict[str, dict[str, bytes]],
    tmp_path_factory: pytest.TempPathFactory,
    picks: list[str],
    block: int,
) -> None:
    """Any subset of the candidates, swept with any block size, gives each its merge's bytes."""
    root = tmp_path_factory.mktemp("property")
    candidates = [c for name in picks for c in parse_grids([GRID_OF[name]])]
    options = RunOptions(block_elems=block, quiet=True, cache_dir=root / "cache")
    sweep(family.base, [str(a) for a in family.agents], out=root / "sweep", candidates=candidates, options=options)
    for name in picks:
        assert tree(root / "sweep" / name) == references[name], (name, block)


# Each candidate of MERGE_FLAGS as its own one-candidate grid.
GRID_OF = {
    "ram+-r=0.05": "ram+:r=0.05",
    "ram+-r=0.5": "ram+:r=0.5",
    "ties-density=0.3-trim_scope=model": "ties:density=0.3:trim_scope=model",
    "dare_ties-density=0.5-seed=1": "dare_ties:density=0.5:seed=1",
    "dare_ties-density=0.5-seed=2": "dare_ties:density=0.5:seed=2",
    "dare_ties-density=0.5-seed=1-lambda=0.5": "dare_ties:density=0.5:seed=1:lambda=0.5",
    "model_stock": "model_stock",
    "task_arithmetic-lambda=0.75": "task_arithmetic:lambda=0.75",
    "task_arithmetic-lambda=1.25": "task_arithmetic:lambda=1.25",
}


@pytest.fixture(scope="module")
def references(family: Family, tmp_path_factory: pytest.TempPathFactory) -> dict[str, dict[str, bytes]]:
    """Every candidate's own ``ramstream merge`` (default block size), by name."""
    root = tmp_path_factory.mktemp("references")
    out = {}
    for name, flags in MERGE_FLAGS.items():
        done = invoke("merge", *inputs(family), "--out", root / name, *flags, "--quiet", "--cache-dir", root / "cache")
        assert done.exit_code == 0, done.stderr
        out[name] = tree(root / name)
    return out
