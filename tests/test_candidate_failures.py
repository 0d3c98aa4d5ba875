"""One sweep candidate's failure is that candidate's: a refusal that depends on the values (a
merged value beyond f16, weights that give no direction) names the candidate, is recorded as its
failure in sweep.json, and the other candidates still finish, with the bytes their own merges
write. A single merge refuses the same values in one line, as before. The same holds when the
candidates are merged on a Dask cluster (two worker processes on loopback, started and stopped
inside the test).
"""

from __future__ import annotations

import json
import threading
from collections.abc import Callable
from pathlib import Path
from typing import Any, TypeVar

import pytest

from ramstream.api import SweepResult, sweep
from ramstream.config import RunOptions
from ramstream.sweep.grid import parse_grids
from tests.families import Family, build_family
from tests.test_cli import as_process, assert_nothing_finished, in_process, ok, one_line_error
from tests.test_sweep import tree

T = TypeVar("T")

OVERFLOWS = "task_arithmetic-lambda=100000000.0"  # 1e8 x a task vector of ~0.01: beyond f16's 65504


@pytest.fixture(scope="module")
def family(tmp_path_factory: pytest.TempPathFactory) -> Family:
    return build_family(tmp_path_factory.mktemp("candidate-failures"), densities=(0.2, 0.45), seed=41)


def members(family: Family) -> list[str]:
    return [str(family.base), *map(str, family.agents)]


def statuses(out: Path) -> dict[str, dict[str, object]]:
    return {c["name"]: c for c in json.loads((out / "sweep.json").read_text())["candidates"]}


def test_an_overflowing_candidate_fails_alone_and_the_others_finish(family: Family, tmp_path: Path) -> None:
    out = tmp_path / "sweep"
    grids = ("--grid", "task_arithmetic:lambda=0.5,1e8", "--grid", "linear")
    args = ("sweep", *members(family), "--out", out, *grids, "--out-dtype", "f16", "--quiet")
    message = one_line_error(in_process(*args), "1 of 3 candidates failed", f"candidate {OVERFLOWS}")
    assert "f16" in message  # the merged value's range, as a single merge says it
    done = statuses(out)
    assert done[OVERFLOWS]["status"] == "failed" and OVERFLOWS in str(done[OVERFLOWS]["error"])
    assert done["task_arithmetic-lambda=0.5"]["status"] == "merged" and done["linear"]["status"] == "merged"
    assert_nothing_finished(out / OVERFLOWS)
    # The others hold the bytes their own merges write.
    alone = tmp_path / "alone"
    ok(in_process("merge", *members(family), "--out", alone, "--method", "linear", "--out-dtype", "f16", "--quiet"))
    assert tree(out / "linear") == tree(alone)
    # A single merge of the failing candidate refuses the same values in one line.
    single = tmp_path / "single"
    flags = ("--method", "task_arithmetic", "--lambda", "100000000", "--out-dtype", "f16", "--quiet")
    one_line_error(in_process("merge", *members(family), "--out", single, *flags), "f16")
    assert_nothing_finished(single)
    # A rerun tries the failed candidate again (it fails again); the others are already merged.
    again = in_process(*args)
    one_line_error(again, "1 of 3 candidates failed")
    assert "already merged" in again.out and f"failed: {out / OVERFLOWS}" in again.out


def within(seconds: float, call: Callable[[], T]) -> T:
    """``call()`` on a daemon thread, failing the test if it takes longer than ``seconds``."""
    got: list[Any] = []

    def run() -> None:
        try:
            got.append(("value", call()))
        except BaseException as exc:  # re-raised on the test's thread
            got.append(("error", exc))

    thread = threading.Thread(target=run, daemon=True)
    thread.start()
    thread.join(seconds)
    assert got, f"still running after {seconds} s"
    kind, value = got[0]
    if kind == "error":
        raise value
    return value  # type: ignore[no-any-return]


def test_an_overflowing_candidate_fails_alone_on_a_dask_cluster_too(family: Family, tmp_path: Path) -> None:
    """Workers compute the blocks: the worker that refuses a candidate's block stops writing that
    candidate and reports it with its batches; the driver records it before marking them."""
    distributed = pytest.importorskip("distributed")
    cluster = distributed.LocalCluster(
        n_workers=2,
        threads_per_worker=1,
        processes=True,
        host="127.0.0.1",
        dashboard_address=None,
        scheduler_kwargs={"dashboard_address": "127.0.0.1:0"},
        memory_limit=0,
        silence_logs=50,
    )
    try:
        grids = ["task_arithmetic:lambda=0.5,1e8", "linear"]
        candidates = parse_grids(grids)
        # Blocks of 64 elements: tens of tasks, on both workers, several after the refusal.
        on_cluster = RunOptions(block_elems=64, quiet=True, scheduler=cluster.scheduler_address)
        out = tmp_path / "cluster"

        def swept(into: Path, options: RunOptions) -> SweepResult:
            agents = [str(a) for a in family.agents]
            return sweep(family.base, agents, out=into, candidates=candidates, out_dtype="f16", options=options)

        result = within(120, lambda: swept(out, on_cluster))
        done = {c.name: c.status for c in result.candidates}
        assert done == {"task_arithmetic-lambda=0.5": "merged", OVERFLOWS: "failed", "linear": "merged"}
        failed = statuses(out)[OVERFLOWS]
        assert failed["status"] == "failed" and "beyond the range of f16" in str(failed["error"])
        assert_nothing_finished(out / OVERFLOWS)
        # The others hold the bytes of the same sweep run here.
        local = tmp_path / "local"
        within(120, lambda: swept(local, RunOptions(block_elems=64, quiet=True)))
        for name in ("task_arithmetic-lambda=0.5", "linear"):
            assert tree(out / name) == tree(local / name), name
        # On the command line: the same one line as a local sweep (a process, bounded by its timeout).
        flags = ("--grid", grids[0], "--grid", grids[1], "--out-dtype", "f16", "--quiet")
        cli = tmp_path / "cli"
        run = as_process("sweep", *members(family), "--out", cli, *flags, "--scheduler", cluster.scheduler_address)
        one_line_error(run, "1 of 3 candidates failed", f"candidate {OVERFLOWS}", "f16")
        assert (cli / "linear" / "ramstream_merge.json").is_file()
    finally:
        cluster.close(timeout=60)


def test_weights_that_give_no_direction_fail_their_candidate_only(family: Family, tmp_path: Path) -> None:
    config = tmp_path / "sweep.yml"
    models = [{"model": str(a), "parameters": {"weight": w}} for a, w in zip(family.agents, (1.0, -1.0), strict=True)]
    docs = [
        {"name": "cancels", "merge_method": "multislerp", "base_model": str(family.base), "models": models},
        {"name": "plain", "merge_method": "task_arithmetic", "base_model": str(family.base), "models": models},
    ]
    config.write_text(json.dumps(docs))
    out = tmp_path / "sweep"
    one_line_error(in_process("sweep", "--config", config, "--out", out, "--quiet"), "candidate cancels", "sum to 0")
    done = statuses(out)
    assert done["cancels"]["status"] == "failed" and done["plain"]["status"] == "merged"
    assert (out / "plain" / "ramstream_merge.json").is_file()
    assert_nothing_finished(out / "cancels")


@pytest.mark.parametrize(("weights", "words"), [("0,0", "every weight of tensor"), ("1,-1", "sum to 0")])
def test_multislerp_without_a_direction_is_one_clear_line(
    family: Family, tmp_path: Path, weights: str, words: str
) -> None:
    """Was a numpy warning (0 / 0), then a message about an overflow."""
    out = tmp_path / "out"
    args = ("merge", family.base, *family.agents, "--out", out, "--method", "multislerp", "--weights", weights)
    message = one_line_error(in_process(*args, "--quiet"), words)
    assert "overflow" not in message
    assert_nothing_finished(out)
