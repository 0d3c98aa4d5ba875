"""The command line end to end: real files, real indexes, in process (CliRunner) and as a real
``python -m ramstream.cli`` process.

User errors must come out as one line on stderr starting with ``error:`` (or click's usage
error), a non-zero exit, no traceback, and nothing in ``--out`` that looks like a finished model.
"""

from __future__ import annotations

import json
import os
import pty
import shutil
import subprocess
import sys
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import pytest
import zarr
from click.testing import CliRunner

from ramstream.cli import main
from tests import reference as ref
from tests.families import (
    DEFAULT_SHAPES,
    Family,
    build_family,
    f32_to_bf16,
    read_model_dir,
    read_safetensors,
    write_safetensors,
)

EPS = 1e-5
FINISHED_FILES = ("config.json", "ramstream_merge.json", "model.safetensors.index.json", "model.safetensors")


@dataclass(frozen=True)
class Outcome:
    """What a CLI call left: exit status, stdout, stderr, and whether a traceback escaped."""

    code: int
    out: str
    err: str
    crashed: bool


def in_process(*args: str | Path) -> Outcome:
    result = CliRunner().invoke(main, [str(a) for a in args])
    crashed = result.exception is not None and not isinstance(result.exception, SystemExit)
    return Outcome(result.exit_code, result.stdout, result.stderr, crashed)


def as_process(*args: str | Path) -> Outcome:
    done = subprocess.run(
        [sys.executable, "-m", "ramstream.cli", *map(str, args)], capture_output=True, text=True, timeout=120
    )
    return Outcome(done.returncode, done.stdout, done.stderr, "Traceback" in done.stderr)


RUNNERS: dict[str, Callable[..., Outcome]] = {"in-process": in_process, "process": as_process}


def ok(outcome: Outcome) -> Outcome:
    assert outcome.code == 0 and not outcome.crashed, f"exit {outcome.code}:\n{outcome.err}"
    assert outcome.err == "", "no progress (nor anything else) on stderr when it is not a terminal"
    return outcome


def one_line_error(outcome: Outcome, *needles: str) -> str:
    assert outcome.code != 0
    assert not outcome.crashed, outcome.err
    assert "Traceback" not in outcome.err
    lines = outcome.err.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("error: "), outcome.err
    for needle in needles:
        assert needle.lower() in lines[0].lower(), f"{needle!r} not in {lines[0]!r}"
    return lines[0]


def assert_nothing_finished(out: Path) -> None:
    if out.is_dir():
        present = [n for n in FINISHED_FILES if (out / n).exists()] + [p.name for p in out.glob("model-*")]
        assert not present, f"{out} holds {present} after a failed merge"


@pytest.fixture
def family(tmp_path: Path) -> Family:
    return build_family(tmp_path / "family", int_tensor=True, shards=2)


def members(fam: Family) -> list[str]:
    return [str(fam.base), *map(str, fam.agents)]


def cache(tmp_path: Path) -> list[str]:
    return ["--cache-dir", str(tmp_path / "cache")]


# -- python -m ------------------------------------------------------------------------------


@pytest.mark.parametrize("module", ["ramstream.cli", "ramstream"])
def test_python_dash_m_runs_the_cli(module: str) -> None:
    done = subprocess.run([sys.executable, "-m", module, "--version"], capture_output=True, text=True, timeout=60)
    assert done.returncode == 0, done.stderr
    assert done.stdout.startswith("ramstream, version ")
    assert done.stderr == ""


# -- probe and inspect ----------------------------------------------------------------------


def expected_agents(fam: Family, r: float = 0.1, alpha: float = 2.0) -> list[dict[str, object]]:
    counts = ref.model_counts(fam, EPS)
    rho = ref.rho(counts)
    lam = ref.lambdas(counts, "ram+", r=r, alpha=alpha)
    return [
        {
            "name": f"agent{t}",
            "active": int(counts.active[t]),
            "shared": int(counts.shared[t]),
            "unique": int(counts.unique[t]),
            "rho": float(rho[t]),
            "lambda": float(lam[t]),
        }
        for t in range(len(fam.agents))
    ]


def check_inspect_json(doc: dict[str, object], fam: Family, r: float = 0.1, alpha: float = 2.0) -> None:
    assert doc["params"] == sum(int(np.prod(s)) for s in DEFAULT_SHAPES.values())
    agents = doc["agents"]
    assert isinstance(agents, list)
    want = expected_agents(fam, r, alpha)
    assert [a["name"] for a in agents] == [w["name"] for w in want]
    for got, exp in zip(agents, want, strict=True):
        for key in ("active", "shared", "unique"):
            assert got[key] == exp[key], (exp["name"], key)
        assert got["rho"] == pytest.approx(exp["rho"], rel=1e-12)
        assert got["lambda"] == pytest.approx(exp["lambda"], rel=1e-12)


def test_probe_then_inspect_table_and_json(tmp_path: Path, family: Family) -> None:
    index = tmp_path / "index.zarr"
    assert ok(in_process("probe", *members(family), "--index", index, *cache(tmp_path))).out == f"index: {index}\n"
    table = ok(in_process("inspect", index)).out
    lines = table.strip().splitlines()
    header = next(line for line in lines if line.startswith("agent"))
    for column in ("active", "shared", "unique", "rho", "lambda"):
        assert column in header
    for exp in expected_agents(family):
        row = next(line for line in lines if line.split()[:1] == [exp["name"]])
        assert str(exp["active"]) in row.split() and str(exp["unique"]) in row.split()
        assert f"{exp['lambda']:.5f}" in row
    check_inspect_json(json.loads(ok(in_process("inspect", index, "--json")).out), family)
    other = json.loads(ok(in_process("inspect", index, "--json", "--r", "0.3", "--alpha", "0.5")).out)
    check_inspect_json(other, family, r=0.3, alpha=0.5)


def test_inspect_reads_only_the_index(tmp_path: Path, family: Family) -> None:
    index = tmp_path / "index.zarr"
    ok(in_process("probe", *members(family), "--index", index, *cache(tmp_path)))
    before = ok(in_process("inspect", index, "--json")).out
    table = ok(in_process("inspect", index)).out
    shutil.move(tmp_path / "family", tmp_path / "moved-away")
    assert not Path(family.base).exists()
    assert ok(in_process("inspect", index, "--json")).out == before
    assert ok(as_process("inspect", index)).out == table


def test_inspect_of_something_else_is_one_line(tmp_path: Path, family: Family) -> None:
    one_line_error(in_process("inspect", tmp_path / "nothing-here"), str(tmp_path / "nothing-here"))
    one_line_error(in_process("inspect", family.base), str(family.base))


# -- merge ----------------------------------------------------------------------------------


def index_probe_record(path: Path) -> dict[str, object]:
    record = zarr.open_group(str(path), mode="r", zarr_format=3).attrs["probe"]
    assert isinstance(record, dict) and record["complete"] is True
    return record


def test_merge_without_then_with_index(tmp_path: Path, family: Family) -> None:
    out1 = tmp_path / "out1"
    first = ok(in_process("merge", *members(family), "--out", out1, *cache(tmp_path)))
    assert first.out.startswith(f"merged: {out1} (ram+, lambda ")
    want = ref.reference_merge(family)
    got = read_model_dir(out1)
    assert set(got) == set(want)
    for name, (dtype, shape, raw) in want.items():
        assert got[name][:2] == (dtype, shape)
        np.testing.assert_array_equal(got[name][2], raw, err_msg=name)
    (cached,) = (tmp_path / "cache" / "index").iterdir()
    record = index_probe_record(cached)

    # Another r: the cached probe is reused (same index, its probe record untouched).
    out2 = tmp_path / "out2"
    second = ok(in_process("merge", *members(family), "--out", out2, "--r", "0.3", *cache(tmp_path)))
    assert [p.name for p in (tmp_path / "cache" / "index").iterdir()] == [cached.name]
    assert index_probe_record(cached) == record
    lam = ref.lambdas(ref.model_counts(family, EPS), "ram+", r=0.3)
    assert second.out.strip().endswith("lambda " + ", ".join(f"{x:.4f}" for x in lam) + ")")
    assert not np.allclose(lam, 1.0)
    shards = [p.name for p in out1.glob("model-*.safetensors")]
    assert all((out1 / n).read_bytes() != (out2 / n).read_bytes() for n in shards)

    # An explicit --index from `probe` gives the very bytes of the cached one.
    index = tmp_path / "index.zarr"
    ok(in_process("probe", *members(family), "--index", index))
    out3 = tmp_path / "out3"
    ok(as_process("merge", *members(family), "--out", out3, "--index", index, *cache(tmp_path)))
    assert tree_bytes(out3) == tree_bytes(out1)
    assert [p.name for p in (tmp_path / "cache" / "index").iterdir()] == [cached.name]


def tree_bytes(directory: Path) -> dict[str, bytes]:
    return {str(p.relative_to(directory)): p.read_bytes() for p in sorted(directory.rglob("*")) if p.is_file()}


def test_rerun_of_a_finished_merge_says_already_merged(tmp_path: Path, family: Family) -> None:
    out = tmp_path / "out"
    args = ["merge", *members(family), "--out", out, *cache(tmp_path)]
    ok(in_process(*args))
    before = {p: p.stat().st_mtime_ns for p in out.iterdir()}
    for run in (in_process, as_process):
        again = ok(run(*args))
        assert again.out.startswith(f"already merged: {out} (ram+, lambda ")
    assert {p: p.stat().st_mtime_ns for p in out.iterdir()} == before


def test_a_rerun_says_the_method_s_values_in_the_order_the_merge_said_them(tmp_path: Path, family: Family) -> None:
    """The record's JSON sorts its keys (density, kept, weight); the rerun's line keeps the
    method's own order, so the two lines read alike."""
    out = tmp_path / "ties"
    args = ["merge", *members(family), "--out", out, "--method", "ties", "--density", "0.3", *cache(tmp_path)]
    first = ok(in_process(*args)).out.strip()
    again = ok(in_process(*args)).out.strip()
    assert first.startswith("merged: ") and ", weight 1" in first
    assert again == "already " + first


# -- stale or foreign indexes ---------------------------------------------------------------


def test_index_probed_with_another_eps_is_refused(tmp_path: Path, family: Family) -> None:
    index = tmp_path / "index.zarr"
    ok(in_process("probe", *members(family), "--index", index))
    out = tmp_path / "out"
    line = one_line_error(
        in_process("merge", *members(family), "--out", out, "--index", index, "--eps", "0.001"), str(index), "eps"
    )
    assert "0.001" in line and "1e-05" in line
    assert_nothing_finished(out)
    one_line_error(as_process("probe", *members(family), "--index", index, "--eps", "0.001"), str(index), "eps")


def test_index_probed_from_other_inputs_is_refused(tmp_path: Path, family: Family) -> None:
    index = tmp_path / "index.zarr"
    ok(in_process("probe", *members(family), "--index", index))
    other = build_family(tmp_path / "other", int_tensor=True, shards=2, seed=5)
    one_line_error(in_process("probe", *members(other), "--index", index), str(index), "other inputs")
    fewer = members(family)[:3]
    one_line_error(in_process("probe", *fewer, "--index", index), str(index), "agents")
    # The same files, one of them rewritten after the probe (same size, other values).
    shard = next(Path(family.agents[1]).glob("model-*.safetensors"))
    tensors = read_safetensors(shard)
    name = next(iter(tensors))
    dtype, shape, raw = tensors[name]
    write_safetensors(shard, {**tensors, name: (dtype, shape, raw[::-1].copy())})
    out = tmp_path / "out"
    one_line_error(as_process("merge", *members(family), "--out", out, "--index", index), str(index))
    assert_nothing_finished(out)


# -- user errors ----------------------------------------------------------------------------


def rewrite_tensor(path: Path, name: str, change: Callable[[tuple[str, tuple[int, ...], np.ndarray]], object]) -> None:
    """Rewrite the shard of checkpoint directory ``path`` that holds ``name``."""
    for shard in sorted(path.glob("model-*.safetensors")):
        tensors = read_safetensors(shard)
        if name in tensors:
            new = change(tensors[name])
            if new is None:
                del tensors[name]
            else:
                tensors[name] = new  # type: ignore[assignment]
            write_safetensors(shard, tensors)
            return
    raise AssertionError(f"{name} not in {path}")


def with_nan(spec: tuple[str, tuple[int, ...], np.ndarray]) -> tuple[str, tuple[int, ...], np.ndarray]:
    dtype, shape, raw = spec
    raw = raw.copy()
    raw[5] = f32_to_bf16(np.array([np.nan], np.float32))[0]
    return dtype, shape, raw


def error_case(name: str) -> Callable[[Family, Path], tuple[list[str | Path], list[str]]]:
    """Set up a broken merge; return its arguments and what the error line must mention."""

    def setup(fam: Family, tmp: Path) -> tuple[list[str | Path], list[str]]:
        base, a0, a1, a2 = members(fam)
        out = ["--out", tmp / "out", *cache(tmp)]
        if name == "no-such-path":
            return ["merge", tmp / "nope", a0, *out], [str(tmp / "nope"), "no such file"]
        if name == "directory-without-model":
            (tmp / "empty").mkdir()
            return ["merge", base, a0, tmp / "empty", *out], [str(tmp / "empty"), "no model.safetensors"]
        if name == "agent-given-twice":
            return ["merge", base, a0, a1, a0, *out], [a0, "twice"]
        if name == "base-given-as-agent":
            return ["merge", base, base, a1, *out], [base, "twice"]
        if name == "shape-mismatch":
            norm = "model.layers.0.input_layernorm.weight"
            rewrite_tensor(Path(a1), norm, lambda s: (s[0], (12, 2), s[2]))
            return ["merge", base, a0, a1, a2, *out], [norm, "shape", "[12, 2]", "[24]"]
        if name == "tensor-missing":
            down = "model.layers.0.mlp.down_proj.weight"
            rewrite_tensor(Path(a2), down, lambda s: None)
            return ["merge", base, a0, a1, a2, *out], [down, "missing", "agent2"]
        if name == "nan-in-a-weight":
            up = "model.layers.1.mlp.up_proj.weight"
            rewrite_tensor(Path(a0), up, with_nan)
            return ["merge", base, a0, a1, a2, *out], [up, "nan", "agent0"]
        if name == "memory-below-minimum":
            return ["merge", base, a0, *out, "--memory", "1MiB"], ["--memory", "16MiB"]
        if name == "negative-eps":
            return ["merge", base, a0, *out, "--eps", "-1"], ["--eps"]
        if name == "truncated-file":
            shard = Path(a1) / "model-00002-of-00002.safetensors"
            os.truncate(shard, shard.stat().st_size - 100)
            return ["merge", base, a0, a1, a2, *out], [str(shard), "truncated"]
        if name == "not-safetensors":
            shard = Path(a0) / "model-00001-of-00002.safetensors"
            shard.write_text("this is not a model\n" * 8)
            return ["merge", base, a0, a1, a2, *out], [str(shard), "not safetensors"]
        if name == "out-holds-other-files":
            (tmp / "out").mkdir()
            (tmp / "out" / "notes.txt").write_text("mine\n")
            return ["merge", base, a0, a1, *out], [str(tmp / "out"), "no ramstream merge wrote", "notes.txt"]
        if name == "out-is-a-file":
            (tmp / "out").write_text("mine\n")
            return ["merge", base, a0, a1, *out], [str(tmp / "out")]
        if name == "out-is-an-input":
            return ["merge", base, a0, a1, "--out", a1, "--force", *cache(tmp)], [a1]
        raise AssertionError(name)

    return setup


ERRORS = [
    "no-such-path",
    "directory-without-model",
    "agent-given-twice",
    "base-given-as-agent",
    "shape-mismatch",
    "tensor-missing",
    "nan-in-a-weight",
    "memory-below-minimum",
    "negative-eps",
    "truncated-file",
    "not-safetensors",
    "out-holds-other-files",
    "out-is-a-file",
    "out-is-an-input",  # even with --force: replacing an input would destroy it
]
# Real processes for a few (the others behave the same in process, where a traceback is visible too).
IN_A_PROCESS = ("no-such-path", "nan-in-a-weight", "out-holds-other-files", "out-is-a-file", "out-is-an-input")


@pytest.mark.parametrize(
    ("case", "runner"), [(c, "in-process") for c in ERRORS] + [(c, "process") for c in IN_A_PROCESS]
)
def test_user_error_is_one_line(tmp_path: Path, family: Family, case: str, runner: str) -> None:
    args, needles = error_case(case)(family, tmp_path)
    inputs = tree_bytes(tmp_path / "family")
    one_line_error(RUNNERS[runner](*args), *needles)
    assert tree_bytes(tmp_path / "family") == inputs, "a failed merge changed its inputs"
    out = tmp_path / "out"
    assert_nothing_finished(out)
    if case == "out-holds-other-files":
        assert sorted(p.name for p in out.iterdir()) == ["notes.txt"]
        assert (out / "notes.txt").read_text() == "mine\n"
    if case == "out-is-a-file":
        assert out.read_text() == "mine\n"


USAGE_ERRORS: dict[str, tuple[list[str], str]] = {
    "memory-not-a-size": (["--memory", "lots"], "'--memory'"),
    "unknown-method": (["--method", "median"], "'--method'"),
    "threads-zero": (["--threads", "0"], "'--threads'"),
}


@pytest.mark.parametrize("runner", list(RUNNERS))
@pytest.mark.parametrize("case", list(USAGE_ERRORS))
def test_usage_error(tmp_path: Path, family: Family, case: str, runner: str) -> None:
    extra, needle = USAGE_ERRORS[case]
    out = tmp_path / "out"
    outcome = RUNNERS[runner]("merge", *members(family), "--out", out, *cache(tmp_path), *extra)
    assert outcome.code == 2 and not outcome.crashed
    assert "Traceback" not in outcome.err
    assert outcome.err.strip().splitlines()[-1].startswith("Error: Invalid value for " + needle), outcome.err
    assert not out.exists()


def test_merge_without_agents_is_a_usage_error(tmp_path: Path, family: Family) -> None:
    outcome = in_process("merge", family.base, "--out", tmp_path / "out")
    assert outcome.code == 2 and not outcome.crashed
    assert "Error:" in outcome.err and "AGENT" in outcome.err
    assert not (tmp_path / "out").exists()


# -- demo -----------------------------------------------------------------------------------


def test_demo_twice(tmp_path: Path) -> None:
    directory = tmp_path / "demo"
    outputs = [ok(in_process("demo", "--synthetic", "--dir", directory, *cache(tmp_path))).out for _ in range(2)]
    merged = directory / "merged-ram+"
    for text in outputs:
        lines = text.strip().splitlines()
        header = next(i for i, line in enumerate(lines) if line.startswith("agent"))
        assert [line.split()[0] for line in lines[header + 1 : header + 4]] == ["agent1", "agent2", "agent3"]
        assert lines[-1].startswith("merged model (RAM+, lambda ") and lines[-1].endswith(f": {merged}")
    assert "writing a sample family" in outputs[0] and "writing a sample family" not in outputs[1]
    assert outputs[0].splitlines()[1:] == outputs[1].splitlines()
    assert (merged / "config.json").is_file() and not (merged / ".ramstream").exists()
    assert read_model_dir(merged)


def test_demo_starts_over_when_its_inputs_changed(tmp_path: Path) -> None:
    directory = tmp_path / "demo"
    ok(in_process("demo", "--synthetic", "--dir", directory, *cache(tmp_path)))
    shard = next((directory / "family" / "agent2").glob("*.safetensors"))
    os.utime(shard, ns=(shard.stat().st_atime_ns, shard.stat().st_mtime_ns + 10**9))
    text = ok(in_process("demo", "--synthetic", "--dir", directory, *cache(tmp_path))).out
    assert f"the inputs changed since the last demo in {directory}: starting over" in text
    assert text.strip().splitlines()[-1].startswith("merged model (RAM+, lambda ")
    assert read_model_dir(directory / "merged-ram+")


def test_demo_refuses_an_unknown_method_first(tmp_path: Path) -> None:
    outcome = in_process("demo", "--dir", tmp_path / "demo", "--method", "nope", *cache(tmp_path))
    one_line_error(outcome, "unknown method 'nope'")
    assert not (tmp_path / "demo").exists()


# -- progress -------------------------------------------------------------------------------


def run_on_terminal(*args: str | Path) -> tuple[int, str]:
    """Run the CLI with stderr on a pseudo-terminal; its exit status and what it wrote there."""
    master, slave = pty.openpty()
    try:
        proc = subprocess.Popen(
            [sys.executable, "-m", "ramstream.cli", *map(str, args)], stdout=subprocess.DEVNULL, stderr=slave
        )
    finally:
        os.close(slave)
    chunks = []
    while True:
        try:
            data = os.read(master, 4096)
        except OSError:  # EIO: the child closed the terminal
            break
        if not data:
            break
        chunks.append(data)
    os.close(master)
    return proc.wait(timeout=120), b"".join(chunks).decode(errors="replace")


def test_progress_only_on_a_terminal_and_never_with_quiet(tmp_path: Path, family: Family) -> None:
    merge = ["merge", *members(family)]
    code, shown = run_on_terminal(*merge, "--out", tmp_path / "tty", "--cache-dir", tmp_path / "c1")
    assert code == 0
    assert "probe:" in shown and "merge:" in shown and "ETA" in shown
    code, shown = run_on_terminal(*merge, "--out", tmp_path / "tty-quiet", "--cache-dir", tmp_path / "c2", "--quiet")
    assert code == 0 and shown == ""
    done = as_process(*merge, "--out", tmp_path / "pipe", "--cache-dir", tmp_path / "c3")
    assert done.code == 0 and done.err == ""
