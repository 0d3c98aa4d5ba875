"""The Dask executor: a pass's batches of blocks as tasks on a ``distributed`` cluster.

The driver (this process) groups consecutive batches into tasks of about ``task_bytes`` of input,
ships the pass's work once (``TaskPayload``), and submits the tasks in order. Workers open the
inputs by path (every machine sees the same paths), compute with their own backend and write
the batches' data where a local run would (partial shards at precomputed offsets, index chunks),
durably, then report. Only then does the driver mark the task's batches in the journal, which
therefore stays the one a local run keeps: a pass started on a cluster resumes locally and the
other way round. A worker that dies mid-task has its task rerun elsewhere by the scheduler (the
writes are idempotent); a driver that dies leaves the journal to the rerun. A part of the work
that failed on its own on a worker (a sweep's output) comes back with the task's outcome and is
recorded in the driver's work before the task's batches are marked.
"""

from __future__ import annotations

import time
import uuid
from collections.abc import Sequence
from typing import Any

from ramstream.backends.base import Backend
from ramstream.backends.settings import BackendSettings
from ramstream.config import RunOptions
from ramstream.errors import ClusterError
from ramstream.execution import dask_worker
from ramstream.execution.dask_cluster import Cluster, connect, import_distributed, start_local
from ramstream.execution.progress import Progress
from ramstream.execution.work import BlockWork, PartsFailAlone
from ramstream.format.family import Family, with_absolute_paths
from ramstream.plan import Batch, Plan

TASKS_PER_WORKER = 8  # enough to balance the load and bound what a dead worker loses
MAX_TASK_BYTES = 2 * 1024**3  # of input per task
SETTLE_TIMEOUT = 600.0  # seconds to wait, after an error, for tasks that already started


def group_batches(batches: Sequence[Batch], plan: Plan, target_bytes: int) -> list[list[Batch]]:
    """Consecutive batches in groups of about ``target_bytes`` of input (at least one each)."""
    groups: list[list[Batch]] = []
    size = 0
    for batch in batches:
        if not groups or size >= target_bytes:
            groups.append([])
            size = 0
        groups[-1].append(batch)
        size += plan.batch_bytes(batch)
    return groups


def task_bytes(total: int, n_workers: int) -> int:
    """About ``TASKS_PER_WORKER`` tasks per worker, none above ``MAX_TASK_BYTES``: a task is at
    least one batch, and a batch (sized by --memory) already dwarfs the ~2 ms a task costs."""
    return max(1, min(MAX_TASK_BYTES, total // max(1, n_workers * TASKS_PER_WORKER)))


class DaskExecutor:
    def __init__(self, backend: Backend, options: RunOptions) -> None:
        self.options = options
        self._cluster: Cluster | None = None

    def cluster(self) -> Cluster:
        """The cluster, reached (or started) on first use and kept for the run's later passes."""
        if self._cluster is None:
            if self.options.scheduler is not None:
                self._cluster = connect(self.options.scheduler, self.options.threads, self.options.scheduler_timeout)
            else:
                self._cluster = start_local(self.options.dask_workers or 1, self.options.threads)
        return self._cluster

    def run(
        self, work: BlockWork[Any], family: Family, plan: Plan, batches: Sequence[Batch], progress: Progress
    ) -> None:
        if not batches:
            return
        cluster = self.cluster()
        remote = work.remote()
        options = self.options
        settings = BackendSettings(cluster.worker_threads, options.device, options.gpu_memory, options.memory)
        payload = dask_worker.TaskPayload(remote, with_absolute_paths(family), plan, options.backend, settings)
        total = sum(plan.batch_bytes(b) for b in batches)
        n_workers = cluster.n_workers()
        groups = group_batches(batches, plan, task_bytes(total, n_workers))
        device = f" on {options.device}" if options.device else ""
        progress.where = f"{options.backend}{device}, {n_workers} Dask worker{'s' if n_workers != 1 else ''}"
        client = cluster.client
        run_id = uuid.uuid4().hex[:12]
        name = work.label.split()[0]  # tasks named ramstream-<pass>-<run>-<k> on the dashboard
        # A task, not scattered data: if every worker holding it dies, the scheduler recomputes it.
        shipped = client.submit(_payload, payload, key=f"ramstream-payload-{run_id}", pure=False)
        futures = [
            client.submit(
                dask_worker.run_task,
                shipped,
                [(b.index, b.first, b.stop) for b in group],
                key=f"ramstream-{name}-{run_id}-{k}",
                pure=False,
            )
            for k, group in enumerate(groups)
        ]
        try:
            self._collect(client, futures, work, plan, batches, progress)
        except BaseException:
            # Nothing may write after the pass raised: cancel what waits, let what runs finish.
            client.cancel(futures)
            _wait_until_idle(client, {f.key for f in futures})
            raise
        finally:
            client.cancel([*futures, shipped])
            _forget_everywhere(client, remote.key)

    def _collect(
        self,
        client: Any,
        futures: list[Any],
        work: BlockWork[Any],
        plan: Plan,
        batches: Sequence[Batch],
        progress: Progress,
    ) -> None:
        """Mark each task's batches as its worker reports them durable; raise the first error."""
        by_index = {b.index: b for b in batches}
        distributed = import_distributed()
        reported = 0
        for future in distributed.as_completed(futures, loop=client.loop):
            try:
                outcome = future.result()
            except distributed.client.FutureCancelledError as exc:
                raise ClusterError(
                    f"the Dask cluster cancelled a task of this pass ({exc}); rerun the same command to resume"
                ) from None
            except distributed.KilledWorker as exc:
                raise ClusterError(
                    f"Dask workers kept dying while running blocks of this pass ({exc}); check their logs "
                    "(memory, disk), then rerun the same command to resume"
                ) from None
            if outcome.error is not None:
                raise outcome.error
            if outcome.failed and isinstance(work, PartsFailAlone):  # recorded before the marks
                work.failed_elsewhere(outcome.failed)
            for index in outcome.batches:
                batch = by_index[index]
                progress.advance(plan.batch_bytes(batch))
                work.mark(batch, progress.snapshot())
            reported += len(outcome.batches)
        if reported != len(batches):  # never finish a pass on batches nobody reported
            raise ClusterError(f"the Dask cluster reported {reported} of {len(batches)} batches; rerun to resume")

    def close(self) -> None:
        if self._cluster is not None:
            cluster, self._cluster = self._cluster, None
            cluster.close()


def _payload(payload: dask_worker.TaskPayload) -> dask_worker.TaskPayload:
    """The pass's payload as a task result, so the cluster can rebuild it (see ``run``)."""
    return payload


def _wait_until_idle(client: Any, keys: set[str], timeout: float = SETTLE_TIMEOUT) -> None:
    """Wait (bounded) until no worker is running one of ``keys``; a cancelled task that already
    started runs to its end (its writes are idempotent, but must not outlive the pass)."""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        try:
            running = client.processing()
        except Exception:  # the scheduler is gone: so are its tasks' results, nothing to wait for
            return
        if not any(key in keys for tasks in running.values() for key in tasks):
            return
        time.sleep(0.05)


def _forget_everywhere(client: Any, key: str) -> None:
    """Have every worker close what it opened for the pass (best effort: a worker may be gone)."""
    try:
        client.run(dask_worker.forget, key)
    except Exception:  # a dead or unreachable worker has nothing left to close
        pass
