"""What every command does around the API: import it on first use, print a model's summary, and
turn ramstream's errors (and Ctrl-C, and SIGTERM) into one line on stderr and an exit code."""

from __future__ import annotations

import gc
import sys
from collections.abc import Callable
from functools import wraps
from types import ModuleType
from typing import Any, TypeVar

import click

from ramstream.errors import RamstreamError
from ramstream.io.signals import sigterm_raises

F = TypeVar("F", bound=Callable[..., Any])


def load_api(backend: str) -> ModuleType:
    """``ramstream.api`` and ``backend``'s code, imported on first use (``inspect`` and ``status``
    never need the kernels).

    A CLI run is one short process and the modules just imported live until it exits, so their
    objects are taken out of the cyclic collector's sight (``gc.freeze``): full collections that
    walked them (numba's above all) were about 7 % of a probe's CPU (perf).
    """
    from ramstream import api

    api.preload(backend)
    gc.freeze()
    return api


def friendly(func: F) -> F:
    """Turn ramstream's errors (and Ctrl-C or SIGTERM) into one line on stderr and a non-zero
    exit: 1 for an error, 130 for an interruption."""

    @wraps(func)
    def wrapper(*args: Any, **kwargs: Any) -> Any:
        try:
            # SIGTERM stops a command as Ctrl-C does: the passes stop where they are, what is
            # being written is finished or dropped, and the user is told how to resume
            with sigterm_raises(KeyboardInterrupt):
                return func(*args, **kwargs)
        except RamstreamError as exc:
            click.echo(f"error: {exc}", err=True)
            sys.exit(1)
        except OSError as exc:  # the system refused a path no check above foresaw (too long, a loop...)
            where = f"{exc.filename}: " if exc.filename is not None else ""
            click.echo(f"error: {where}{exc.strerror or exc}; check the path, permissions and free space", err=True)
            sys.exit(1)
        except KeyboardInterrupt:
            click.echo("interrupted: rerun the same command to resume where it stopped", err=True)
            sys.exit(130)

    return wrapper  # type: ignore[return-value]


def summary(method: str, per_agent: dict[str, tuple[float, ...]]) -> str:
    """A merged model's method and per-agent constants, as merge and sweep print them."""
    parts = [method]
    for key, values in per_agent.items():
        fmt = "{:.4f}" if key == "lambda" else "{:.4g}"
        parts.append(f"{key} " + ", ".join(fmt.format(x) for x in values))
    return ", ".join(parts)
