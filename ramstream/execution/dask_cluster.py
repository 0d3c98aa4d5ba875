"""Reaching a Dask cluster: a running scheduler by address, or a ``LocalCluster`` started here.

``distributed`` is an optional extra: without it the cluster options fail with one line that
says how to install it. A local cluster listens on loopback only, has no dashboard, and its
worker processes run one task at a time (a block already uses the backend's threads); it is
closed, with its workers, when the run ends.

A scheduler's address is tried before a ``Client`` is made of it: ``distributed`` bounds the TCP
connection but not the handshake after it, so a port that accepts and never answers (or an HTTP
server) would hang the client for good, and a client whose construction fails (an address that
is not one, ``tls://`` without certificates) prints a traceback from its finaliser at exit. The
trial connects and asks the scheduler who it is, all within ``--scheduler-timeout``, on a loop of
its own; only an address that answered as a Dask scheduler becomes a ``Client``.
"""

from __future__ import annotations

import asyncio
import logging
import os
import threading
from dataclasses import dataclass
from typing import Any

from ramstream.errors import ClusterError, MissingDependencyError

INSTALL = "pip install 'ramstream[dask]'"
WORKERS_TIMEOUT = 60.0  # seconds to wait for the first worker of a running scheduler
HANDSHAKE_SLACK = 0.25  # seconds past --scheduler-timeout before a connected peer's silence counts


def import_distributed() -> Any:
    try:
        import distributed
    except ImportError as exc:
        raise MissingDependencyError(
            f"--scheduler and --dask-workers need Dask's distributed package: {INSTALL}"
        ) from exc
    return distributed


@dataclass
class Cluster:
    client: Any  # distributed.Client
    local: Any | None  # the LocalCluster started here, if any
    address: str
    worker_threads: int | None  # the backend threads of each worker (None: all of its cores)

    def n_workers(self) -> int:
        return len(self.client.scheduler_info().get("workers", {}))

    def close(self) -> None:
        try:
            self.client.close()
        finally:
            if self.local is not None:
                self.local.close()


def start_local(n_workers: int, threads: int | None) -> Cluster:
    """A LocalCluster of ``n_workers`` processes on loopback; ``threads`` per worker (default:
    this machine's cores shared out)."""
    distributed = import_distributed()
    local = distributed.LocalCluster(
        n_workers=n_workers,
        threads_per_worker=1,
        processes=True,
        host="127.0.0.1",
        dashboard_address=None,
        scheduler_kwargs={"dashboard_address": "127.0.0.1:0"},  # its HTTP routes: loopback, any port
        memory_limit=0,  # --memory bounds each process; the nanny must not kill on its own rule
        silence_logs=logging.CRITICAL,  # user errors come back as one line, not worker logs
    )
    try:
        client = distributed.Client(local, set_as_default=False)
    except BaseException:
        local.close()
        raise
    share = threads or max(1, (os.cpu_count() or 1) // n_workers)
    return Cluster(client, local, local.scheduler_address, share)


def connect(address: str, threads: int | None, timeout: float) -> Cluster:
    """A client of the running scheduler at ``address``, once it has at least one worker; an
    address where no Dask scheduler answers within ``timeout`` seconds is one ``ClusterError``."""
    distributed = import_distributed()
    security = distributed.Security()
    check_scheduler(distributed, address, timeout, security.get_connection_args("client"))
    try:
        client = distributed.Client(address, timeout=timeout, security=security, set_as_default=False)
    except (OSError, TimeoutError, ValueError) as exc:
        raise ClusterError(
            f"cannot reach the Dask scheduler at {address} ({exc}); check --scheduler and that it is running"
        ) from exc
    try:
        client.wait_for_workers(1, timeout=WORKERS_TIMEOUT)
    except (OSError, TimeoutError) as exc:
        client.close()
        raise ClusterError(
            f"the Dask scheduler at {address} has no workers after {WORKERS_TIMEOUT:.0f} s; start some "
            f"(dask worker {address}) and rerun"
        ) from exc
    return Cluster(client, None, address, threads)


def check_scheduler(distributed: Any, address: str, timeout: float, connection_args: dict[str, Any]) -> None:
    """Raise a ``ClusterError`` unless a Dask scheduler answers at ``address`` within ``timeout``
    seconds: connected, the handshake done and its identity read back."""
    try:
        scheme, location = distributed.comm.parse_address(address)
        distributed.comm.registry.get_backend(scheme).get_address_host_port(location)
    except ValueError as exc:
        raise ClusterError(
            f"--scheduler {address!r} is not a Dask scheduler address ({exc}); give one like tcp://host:8786"
        ) from None
    except NotImplementedError:  # a backend without hosts and ports (inproc, ucx): the trial will say
        pass
    else:
        if scheme in ("tls", "wss") and connection_args.get("ssl_context") is None:
            raise ClusterError(
                f"--scheduler {address}: a {scheme}:// scheduler needs Dask's TLS settings (distributed.comm.tls: "
                "ca-file, and the client's cert and key, in the Dask configuration); set them, or give the "
                "scheduler's tcp:// address"
            )
    outcome: list[BaseException | dict[str, Any]] = []
    trial = threading.Thread(
        target=lambda: outcome.append(_run_trial(distributed, address, timeout, connection_args)),
        name="ramstream-scheduler-trial",
        daemon=True,  # bounded by the trial's own timeout; a daemon never holds the exit up
    )
    trial.start()
    trial.join(timeout + 5)
    answer = outcome[0] if outcome else TimeoutError()
    if isinstance(answer, BaseException):
        raise ClusterError(f"cannot reach the Dask scheduler at {address} ({_reason(answer, timeout)}); {_HINT}")
    if answer.get("type") in ("Worker", "Nanny"):
        raise ClusterError(f"{address} is a Dask {answer['type'].lower()}, not the scheduler; {_HINT}")


_HINT = "check --scheduler (the scheduler's address, e.g. tcp://host:8786, not its dashboard) and that it is running"


def _run_trial(
    distributed: Any, address: str, timeout: float, connection_args: dict[str, Any]
) -> BaseException | dict[str, Any]:
    """The scheduler's identity, or what went wrong, on an event loop of this thread's own."""
    try:
        # distributed gives up connecting after ``timeout`` (with its own message); the handshake,
        # which it leaves unbounded, ends a moment later
        answer = _identity(distributed, address, timeout, connection_args)
        return asyncio.run(asyncio.wait_for(answer, timeout + HANDSHAKE_SLACK))
    except Exception as exc:  # whatever the address made distributed raise: reported as one line
        return exc


async def _identity(distributed: Any, address: str, timeout: float, connection_args: dict[str, Any]) -> dict[str, Any]:
    comm = await distributed.comm.connect(address, timeout=timeout, **connection_args)
    try:
        await comm.write({"op": "identity", "reply": True})
        answer = await comm.read()
    finally:
        comm.abort()
    if not isinstance(answer, dict):
        raise ValueError(f"it answered {type(answer).__name__}, not a Dask scheduler's identity")
    return answer


def _reason(exc: BaseException, timeout: float) -> str:
    if isinstance(exc, TimeoutError) and not str(exc):
        return f"nothing answered as a Dask scheduler within {timeout:g} s (--scheduler-timeout)"
    text = str(exc).strip().splitlines()
    return text[0] if text else type(exc).__name__
