"""The one registry of executors, filled by the explicit list in ``_builtin_executors``."""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

from ramstream.backends.base import Backend
from ramstream.config import RunOptions
from ramstream.execution.executor import Executor
from ramstream.registry import Registry


@dataclass(frozen=True)
class ExecutorSpec:
    name: str
    summary: str
    make: Callable[[Backend, RunOptions], Executor]  # an executor computing with this backend (or its name)


def _local(backend: Backend, options: RunOptions) -> Executor:
    from ramstream.execution.local import LocalExecutor

    return LocalExecutor(backend)


def _dask(backend: Backend, options: RunOptions) -> Executor:
    from ramstream.execution.dask_executor import DaskExecutor

    return DaskExecutor(backend, options)


def _builtin_executors() -> list[ExecutorSpec]:
    return [
        ExecutorSpec("local", "one block loop in this process, with write-behind threads", _local),
        ExecutorSpec("dask", "tasks of blocks on a Dask distributed cluster (--scheduler, --dask-workers)", _dask),
    ]


_REGISTRY: Registry[ExecutorSpec] = Registry("executor", _builtin_executors)


def executor_names() -> list[str]:
    return _REGISTRY.names()


def make_executor(backend: Backend, options: RunOptions) -> Executor:
    """The executor ``options.executor`` names, computing with ``backend``."""
    return _REGISTRY.get(options.executor).make(backend, options)
