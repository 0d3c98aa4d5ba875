"""What runs on a Dask worker: a task of batches, computed and written there, never marked.

A task names its batches (index and block range: a pass may cut the plan's blocks its own way) and
carries a reference to the pass's ``TaskPayload`` (the remote work, the family with absolute paths,
the plan, the backend's name and threads), which the cluster ships to each worker once. The worker
opens the work (stores, partial shards) and a backend the first time a pass reaches it and keeps
both until the driver says the pass ended (``forget``); tasks of one pass run one at a time per
worker process (the backend parallelises inside a block), through the same block loop as a local
run. A user error (a NaN, a truncated file, a full disk) is returned, not raised, so the driver
reports it as one line and the scheduler does not retry it elsewhere. So are the failures of a
work's parts that fail on their own (a sweep's outputs, ``PartsFailAlone``): the worker's work
stops writing that part and the outcome reports it with the batches, for the driver to record.
"""

from __future__ import annotations

import threading
import time
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any

from ramstream.backends.base import Backend
from ramstream.backends.registry import make_backend
from ramstream.backends.settings import BackendSettings
from ramstream.blocks import BlockArrays
from ramstream.errors import RamstreamError
from ramstream.execution.local import LocalExecutor
from ramstream.execution.progress import Done, Progress
from ramstream.execution.work import BlockTasks, PartsFailAlone, RemoteWork
from ramstream.format.family import Family
from ramstream.plan import Batch, Plan


@dataclass(frozen=True, eq=False)
class TaskPayload:
    work: RemoteWork[Any]
    family: Family  # paths absolute: workers may run elsewhere
    plan: Plan
    backend: str
    settings: BackendSettings  # threads: the worker's share; device and budgets: the run's


@dataclass(frozen=True)
class TaskOutcome:
    batches: tuple[int, ...]  # written durably, in this order
    seconds: float
    error: RamstreamError | None = None
    failed: dict[int, RamstreamError] = field(default_factory=dict)  # parts stopped on their own, so far


class _Unmarked:
    """A worker's tasks seen as a pass for the local loop: ``persist`` writes, nobody marks here."""

    label = "worker"

    def __init__(self, tasks: BlockTasks[Any]) -> None:
        self.tasks = tasks

    def compute(self, batch: Batch, arrays: Sequence[BlockArrays], backend: Backend, slot: int) -> Any:
        return self.tasks.compute(batch, arrays, backend, slot)

    def write(self, batch: Batch, result: Any) -> None:
        self.tasks.write(batch, result)

    def mark(self, batch: Batch, done: Done) -> None:
        """The driver marks, once the whole task is reported durable."""

    def persist(self, batch: Batch, result: Any, done: Done) -> None:
        self.tasks.write(batch, result)

    def close(self) -> None:
        self.tasks.close()

    def failures(self) -> dict[int, RamstreamError]:
        return self.tasks.failures() if isinstance(self.tasks, PartsFailAlone) else {}

    def remote(self) -> RemoteWork[Any]:
        raise NotImplementedError("a worker's tasks are not sent further")


@dataclass
class _Opened:
    tasks: _Unmarked
    backend: Backend
    lock: threading.Lock


_OPENED: dict[str, _Opened] = {}
_OPENING = threading.Lock()


def _opened(payload: TaskPayload) -> _Opened:
    with _OPENING:
        entry = _OPENED.get(payload.work.key)
        if entry is None:
            s = payload.settings
            backend = make_backend(payload.backend, s.threads, s.device, s.gpu_memory, s.memory)
            try:
                tasks = _Unmarked(payload.work.open())
            except BaseException:
                backend.close()
                raise
            entry = _OPENED[payload.work.key] = _Opened(tasks, backend, threading.Lock())
        return entry


def run_task(payload: TaskPayload, batch_ids: list[tuple[int, int, int]]) -> TaskOutcome:
    """Compute and durably write the batches ``(index, first block, stop)`` (a Dask task)."""
    started = time.monotonic()
    batches = [Batch(*ids) for ids in batch_ids]
    try:
        entry = _opened(payload)
        with entry.lock:
            executor = LocalExecutor(entry.backend)
            executor.run(entry.tasks, payload.family, payload.plan, batches, Progress("worker", 0, enabled=False))
    except RamstreamError as exc:
        return TaskOutcome((), time.monotonic() - started, exc)
    return TaskOutcome(tuple(b.index for b in batches), time.monotonic() - started, None, entry.tasks.failures())


def forget(key: str) -> None:
    """The pass ``key`` ended: close what this worker opened for it."""
    with _OPENING:
        entry = _OPENED.pop(key, None)
    if entry is not None:
        with entry.lock:
            try:
                entry.tasks.close()
            finally:
                entry.backend.close()
