"""The Dask executor on a real ``distributed`` cluster of worker processes, on loopback.

Every method gives the local run's bytes on the cluster; a worker SIGKILLed mid-pass and a
driver SIGKILLed mid-pass (rerun locally, or on a cluster) end with the same bytes; a user error
raised on a worker comes back as the local run's one line. The module's cluster has two worker
processes, no dashboard, listens on 127.0.0.1 only and is closed when the module ends; the CLI
tests start (and stop) their own with ``--dask-workers``.
"""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import threading
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import numpy as np
import pytest
from click.testing import CliRunner

from ramstream.api import probe
from ramstream.cli import main
from ramstream.config import RunOptions
from ramstream.errors import ClusterError
from ramstream.execution.dask_executor import group_batches, task_bytes
from ramstream.index.journal import Journal
from ramstream.plan import Block, Plan, TensorPlan
from tests.families import Family, build_family, with_raw_value
from tests.test_backends import METHODS, SPOT_CHECKS, _files, _merge
from tests.test_moe import moe_shapes

distributed = pytest.importorskip("distributed")

CLUSTER_TIMEOUT = 60  # seconds: starting the cluster, and each test's own wait for a pass
KILLED = -signal.SIGKILL
# ~7M bf16 elements per checkpoint: with --memory 16MiB about 30 blocks, a pass of a second or two.
LARGE: dict[str, tuple[int, ...]] = {
    "model.embed_tokens.weight": (2048, 1024),
    "model.layers.0.mlp.up_proj.weight": (2048, 1024),
    "model.layers.0.mlp.down_proj.weight": (1024, 1536),
    "model.norm.weight": (1024,),
    "lm_head.weight": (1024, 1536),
}


@pytest.fixture(scope="module")
def cluster() -> Iterator[Any]:
    """Two worker processes on loopback, no dashboard; closed with the module."""
    local = distributed.LocalCluster(
        n_workers=2,
        threads_per_worker=1,
        processes=True,
        host="127.0.0.1",
        dashboard_address=None,
        scheduler_kwargs={"dashboard_address": "127.0.0.1:0"},  # its HTTP routes: loopback, any port
        memory_limit=0,
        silence_logs=50,
    )
    try:
        yield local
    finally:
        local.close(timeout=CLUSTER_TIMEOUT)


@pytest.fixture(scope="module")
def family(tmp_path_factory: pytest.TempPathFactory) -> Family:
    """bf16 in 2 shards; an agent equal to the base (c = 0 only) and one with 0 unique elements."""
    root = tmp_path_factory.mktemp("dask")
    return build_family(root, shards=2, identical_agent=True, subset_agent=True, int_tensor=True, seed=5)


def test_batches_are_grouped_into_tasks_of_about_the_target_size() -> None:
    blocks = [Block(i, 0, i * 64, (i + 1) * 64) for i in range(10)]
    tensor = TensorPlan("w", (640,), 640, ("BF16", "BF16"))  # a block reads 64 * 2 * 2 bytes
    plan = Plan(tensors=(tensor,), block_elems=64, blocks=tuple(blocks))
    batches = plan.batches  # full blocks: a batch each
    assert [b.blocks for b in batches] == [range(i, i + 1) for i in range(10)]
    groups = group_batches(batches, plan, target_bytes=3 * 256)
    assert [[b.index for b in g] for g in groups] == [[0, 1, 2], [3, 4, 5], [6, 7, 8], [9]]
    assert group_batches(batches, plan, target_bytes=1) == [[b] for b in batches]
    assert task_bytes(10**12, 4) <= 2 * 1024**3
    assert task_bytes(1000, 4) >= 1


# The cluster runs passes, not methods: RAM (the probe alone), TIES with its model-scope cut (two
# statistics passes) and one method per kernel family.
ON_THE_CLUSTER = [
    pytest.param(method, given, id=f"{method}-{i}")
    for i, (method, given) in enumerate(METHODS)
    if i in (0, 7, *SPOT_CHECKS)
]


@pytest.mark.parametrize(("method", "given"), ON_THE_CLUSTER)
def test_each_kind_of_pass_on_the_cluster_writes_the_local_bytes(
    family: Family, cluster: Any, tmp_path: Path, method: str, given: dict[str, Any]
) -> None:
    expected = _merge(family, tmp_path / "local" / "out", method, given)
    got = _merge(family, tmp_path / "dask" / "out", method, given, scheduler=cluster.scheduler_address)
    assert got == expected


def test_the_torch_backend_on_the_cluster_writes_the_numba_bytes(family: Family, cluster: Any, tmp_path: Path) -> None:
    """Workers make the run's backend from its settings (name, device, budgets)."""
    pytest.importorskip("torch")
    expected = _merge(family, tmp_path / "local" / "out", "dare_ties", {"density": 0.5, "seed": 3})
    got = _merge(
        family,
        tmp_path / "dask" / "out",
        "dare_ties",
        {"density": 0.5, "seed": 3},
        "torch",
        device="cpu",
        scheduler=cluster.scheduler_address,
    )
    assert got == expected


def test_probe_on_the_cluster_writes_the_local_index(family: Family, cluster: Any, tmp_path: Path) -> None:
    members = (family.base, [str(a) for a in family.agents])
    local = probe(*members, index=tmp_path / "local.zarr", options=RunOptions(quiet=True, block_elems=256))
    on_cluster = probe(
        *members,
        index=tmp_path / "dask.zarr",
        options=RunOptions(quiet=True, block_elems=256, scheduler=cluster.scheduler_address),
    )
    assert np.array_equal(local.block_stats()[0], on_cluster.block_stats()[0])
    assert np.array_equal(local.block_stats()[1], on_cluster.block_stats()[1])
    for t in (t for t, tensor in enumerate(local.plan.tensors) if tensor.merged):
        assert np.array_equal(local.tensor_mask(t), on_cluster.tensor_mask(t))


def test_a_worker_address_given_as_the_scheduler_is_refused_by_name(
    family: Family, cluster: Any, tmp_path: Path
) -> None:
    with distributed.Client(cluster, set_as_default=False) as client:
        worker = next(iter(client.scheduler_info()["workers"]))
    options = RunOptions(quiet=True, scheduler=worker, scheduler_timeout=5)
    with pytest.raises(ClusterError, match="is a Dask worker, not the scheduler"):
        probe(family.base, [str(a) for a in family.agents], index=tmp_path / "index.zarr", options=options)


class _KillOnce(distributed.WorkerPlugin):
    """Kills its worker's process (SIGKILL) when the n-th ramstream task starts there, once per
    test: the marker file tells the restarted worker (and the other one) not to do it again."""

    def __init__(self, marker: str, nth: int) -> None:
        self.marker, self.nth, self.seen = marker, nth, 0

    def setup(self, worker: Any) -> None:
        self.seen = 0

    def transition(self, key: Any, start: str, finish: str, **kwargs: Any) -> None:
        if finish != "executing" or not str(key).startswith("ramstream-"):
            return
        self.seen += 1
        if self.seen == self.nth:
            try:
                os.close(os.open(self.marker, os.O_CREAT | os.O_EXCL | os.O_WRONLY))
            except FileExistsError:
                return
            os.kill(os.getpid(), signal.SIGKILL)


def test_a_worker_killed_mid_pass_leaves_the_same_bytes(family: Family, cluster: Any, tmp_path: Path) -> None:
    expected = _merge(family, tmp_path / "local" / "out", "ties", {"density": 0.3})
    marker = tmp_path / "killed"
    with distributed.Client(cluster, set_as_default=False) as client:
        client.register_plugin(_KillOnce(str(marker), nth=2), name="ramstream-kill-once")
        try:
            got = _merge(
                family, tmp_path / "dask" / "out", "ties", {"density": 0.3}, scheduler=cluster.scheduler_address
            )
        finally:
            client.unregister_worker_plugin("ramstream-kill-once")
        client.wait_for_workers(2, timeout=CLUSTER_TIMEOUT)  # the nanny restarted the killed one
    assert marker.exists(), "no worker was killed: the test did not test anything"
    assert got == expected


def test_status_while_a_cluster_merge_runs(
    family: Family, cluster: Any, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The driver is held after its second mark of the merge journal (its workers run on) while
    ``ramstream status`` reads the output directory; then the merge finishes with the local bytes."""
    expected = _merge(family, tmp_path / "local" / "out", "ram", {})
    out = tmp_path / "dask" / "out"
    marked, release = threading.Event(), threading.Event()
    original = Journal.mark

    def held_mark(journal: Journal, block: int) -> None:
        original(journal, block)
        if journal.where == out / ".ramstream" / "journal" and _journal_marks(out) == 2:
            marked.set()
            release.wait(CLUSTER_TIMEOUT)

    monkeypatch.setattr(Journal, "mark", held_mark)
    outcome: dict[str, Any] = {}

    def run() -> None:
        try:
            outcome["files"] = _merge(family, out, "ram", {}, scheduler=cluster.scheduler_address)
        except BaseException as exc:  # reported by the assertion below
            outcome["error"] = exc

    thread = threading.Thread(target=run)
    thread.start()
    try:
        assert marked.wait(CLUSTER_TIMEOUT), outcome
        status = CliRunner().invoke(main, ["status", str(out)])
    finally:
        release.set()
        thread.join(CLUSTER_TIMEOUT)
    assert status.exit_code == 0, status.output
    assert "merge  partial      2 / 30 batches" in status.output, status.output
    assert "error" not in outcome, outcome
    assert outcome["files"] == expected


def test_a_user_error_on_a_worker_is_one_line(tmp_path: Path) -> None:
    fam = build_family(tmp_path / "fam", seed=3)
    bad = with_raw_value(fam.agents[1], tmp_path / "bad", "model.layers.1.mlp.up_proj.weight", 37, 0x7FC0)  # NaN
    runner = CliRunner()
    members = [str(fam.base), str(fam.agents[0]), str(bad), str(fam.agents[2])]
    local = runner.invoke(main, ["merge", *members, "--out", str(tmp_path / "a"), "--quiet"])
    done = runner.invoke(main, ["merge", *members, "--out", str(tmp_path / "b"), "--quiet", "--dask-workers", "1"])
    assert local.exit_code == done.exit_code == 1
    assert done.output.strip() == local.output.strip().replace(str(tmp_path / "a"), str(tmp_path / "b"))
    assert "NaN" in done.output and len(done.output.strip().splitlines()) == 1, done.output
    assert "Traceback" not in done.output


def test_cluster_flags_on_the_cli_and_with_a_config(tmp_path: Path) -> None:
    fam = build_family(tmp_path / "fam", seed=4)
    members = [str(fam.base), *map(str, fam.agents)]
    runner = CliRunner()
    config = tmp_path / "ties.yml"
    models = "\n".join(f"  - model: {a}\n    parameters: {{density: 0.5, weight: 1.0}}" for a in fam.agents)
    config.write_text(f"merge_method: ties\nbase_model: {fam.base}\nmodels:\n{models}\n")
    local_config = runner.invoke(main, ["merge", "--config", str(config), "--out", str(tmp_path / "lc"), "--quiet"])
    assert local_config.exit_code == 0, local_config.output
    on_cluster = runner.invoke(
        main, ["merge", "--config", str(config), "--out", str(tmp_path / "dc"), "--quiet", "--dask-workers", "2"]
    )
    assert on_cluster.exit_code == 0, on_cluster.output
    assert _files(tmp_path / "dc") == _files(tmp_path / "lc")
    index = tmp_path / "index.zarr"
    probed = runner.invoke(main, ["probe", *members, "--index", str(index), "--quiet", "--dask-workers", "1"])
    assert probed.exit_code == 0, probed.output
    status = runner.invoke(main, ["status", str(index)])
    assert status.exit_code == 0 and "probe  done" in status.output, status.output


def test_cluster_flags_refuse_each_other_and_a_dead_scheduler(tmp_path: Path) -> None:
    fam = build_family(tmp_path / "fam", seed=4)
    members = [str(fam.base), *map(str, fam.agents)]
    runner = CliRunner()
    both = runner.invoke(
        main, ["probe", *members, "--scheduler", "tcp://127.0.0.1:1", "--dask-workers", "1", "--quiet"]
    )
    assert both.exit_code == 1 and "either --scheduler or --dask-workers" in both.output
    dead = runner.invoke(
        main, ["probe", *members, "--scheduler", "tcp://127.0.0.1:1", "--scheduler-timeout", "1", "--quiet"]
    )
    assert dead.exit_code == 1 and "cannot reach the Dask scheduler at tcp://127.0.0.1:1" in dead.output, dead.output
    assert len(dead.output.strip().splitlines()) == 1


def test_without_distributed_the_flags_say_how_to_install(tmp_path: Path) -> None:
    fam = build_family(tmp_path / "fam", seed=4)
    hide = "import sys; sys.modules['distributed'] = None; from ramstream.cli import main; main()"
    cmd = [sys.executable, "-c", hide, "probe", str(fam.base), *map(str, fam.agents), "--dask-workers", "1"]
    done = subprocess.run(cmd, capture_output=True, text=True, timeout=120)
    assert done.returncode == 1
    assert done.stderr.strip() == (
        "error: --scheduler and --dask-workers need Dask's distributed package: pip install 'ramstream[dask]'"
    )


def _cli(*args: str | Path) -> list[str]:
    return [sys.executable, "-m", "ramstream.cli", *map(str, args)]


def _journal_marks(out: Path) -> int:
    journal = out / ".ramstream" / "journal" / "merge"
    return sum(1 for p in journal.glob("c.*")) if journal.is_dir() else 0


def _kill_driver_after_marks(cmd: list[str], out: Path, marks: int) -> None:
    """Run ``cmd`` in its own process group; SIGKILL the driver once its journal holds ``marks``
    marks; then its workers must go away by themselves (the group is cleared either way)."""
    log = out.parent / "driver.log"
    with open(log, "w") as stderr:
        proc = subprocess.Popen(cmd, stdout=subprocess.DEVNULL, stderr=stderr, start_new_session=True)
    deadline = time.monotonic() + CLUSTER_TIMEOUT
    try:
        while _journal_marks(out) < marks and proc.poll() is None and time.monotonic() < deadline:
            time.sleep(0.005)
        assert proc.poll() is None, f"the run ended before its kill:\n{log.read_text()}"
        os.kill(proc.pid, signal.SIGKILL)
        assert proc.wait(timeout=CLUSTER_TIMEOUT) == KILLED
        orphans_gone = _group_gone(proc.pid, CLUSTER_TIMEOUT)
    finally:
        try:
            os.killpg(proc.pid, signal.SIGKILL)
        except ProcessLookupError:
            pass
        proc.wait()
    assert orphans_gone, "the workers of a killed driver kept running"


def _group_gone(pgid: int, timeout: float) -> bool:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        try:
            os.killpg(pgid, 0)
        except ProcessLookupError:
            return True
        time.sleep(0.1)
    return False


@pytest.fixture(scope="module")
def large(tmp_path_factory: pytest.TempPathFactory) -> tuple[list[str], dict[str, bytes], Path]:
    """A family with ~30 blocks per pass under --memory 16MiB, its index, and its local merge."""
    root = tmp_path_factory.mktemp("dask-large")
    fam = build_family(root / "family", shapes=LARGE, int_tensor=True, shards=2, seed=11)
    members = [str(fam.base), *map(str, fam.agents)]
    index = root / "index.zarr"
    subprocess.run(_cli("probe", *members, "--index", index, "--memory", "16MiB", "--quiet"), check=True, timeout=300)
    out = root / "local"
    cmd = _cli("merge", *members, "--out", out, "--index", index, "--memory", "16MiB", "--quiet")
    subprocess.run(cmd, check=True, timeout=300)
    return [*members, "--index", str(index)], _files(out), index


@pytest.mark.slow
@pytest.mark.parametrize(("first", "rerun"), [("cluster", "local"), ("cluster", "cluster"), ("local", "cluster")])
def test_a_driver_killed_mid_pass_resumes_to_the_same_bytes(
    large: tuple[list[str], dict[str, bytes], Path], tmp_path: Path, first: str, rerun: str
) -> None:
    """The journal is the one a local run keeps: a merge killed on a cluster finishes locally or
    on a cluster, and a local one on a cluster."""
    members, expected, _ = large
    out = tmp_path / "out"
    common = ("--memory", "16MiB", "--threads", "1", "--quiet")
    on = {"local": (), "cluster": ("--dask-workers", "2")}
    _kill_driver_after_marks(_cli("merge", *members, "--out", out, *common, *on[first]), out, marks=2)
    assert not (out / "config.json").exists(), "a killed merge looks finished"
    assert 0 < _journal_marks(out)
    rerun_cmd = _cli("merge", *members, "--out", out, *common, *on[rerun])
    done = subprocess.run(rerun_cmd, capture_output=True, text=True, timeout=300)
    assert done.returncode == 0, done.stderr
    assert _files(out) == expected


@pytest.mark.parametrize(("method", "given"), [("ram+", {}), ("ties", {"density": 0.3}), ("della", {"density": 0.5})])
def test_a_moe_family_on_the_cluster_writes_the_local_bytes(
    cluster: Any, tmp_path_factory: pytest.TempPathFactory, tmp_path: Path, method: str, given: dict[str, Any]
) -> None:
    """Batches of many expert tensors as tasks: the local bytes, whatever worker wrote them."""
    moe = build_family(tmp_path_factory.mktemp("dask-moe"), shapes=moe_shapes(2, 24), seed=4)
    expected = _merge(moe, tmp_path / "local" / "out", method, given)
    got = _merge(moe, tmp_path / "dask" / "out", method, given, scheduler=cluster.scheduler_address)
    assert got == expected
