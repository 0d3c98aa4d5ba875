"""The one registry of executors, filled by the explicit list in ``_builtin_executors``."""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

from ramstream.backends.base import Backend
from ramstream.execution.executor import Executor
from ramstream.registry import Registry


@dataclass(frozen=True)
class ExecutorSpec:
    name: str
    summary: str
    make: Callable[[Backend], Executor]  # make(backend) -> an executor computing with it


def _local(backend: Backend) -> Executor:
    from ramstream.execution.local import LocalExecutor

    return LocalExecutor(backend)


def _builtin_executors() -> list[ExecutorSpec]:
    return [ExecutorSpec("local", "one block loop in this process, with write-behind threads", _local)]


_REGISTRY: Registry[ExecutorSpec] = Registry("executor", _builtin_executors)


def executor_names() -> list[str]:
    return _REGISTRY.names()


def make_executor(name: str, backend: Backend) -> Executor:
    return _REGISTRY.get(name).make(backend)
