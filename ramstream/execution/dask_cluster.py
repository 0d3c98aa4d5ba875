"""Reaching a Dask cluster: a running scheduler by address, or a ``LocalCluster`` started here.

``distributed`` is an optional extra: without it the cluster options fail with one line that
says how to install it. A local cluster listens on loopback only, has no dashboard, and its
worker processes run one task at a time (a block already uses the backend's threads); it is
closed, with its workers, when the run ends.
"""

from __future__ import annotations

import logging
import os
from dataclasses import dataclass
from typing import Any

from ramstream.errors import ClusterError, MissingDependencyError

INSTALL = "pip install 'ramstream[dask]'"
CONNECT_TIMEOUT = "10s"
WORKERS_TIMEOUT = 60.0  # seconds to wait for the first worker of a running scheduler


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


def connect(address: str, threads: int | None) -> Cluster:
    """A client of the running scheduler at ``address``, once it has at least one worker."""
    distributed = import_distributed()
    try:
        client = distributed.Client(address, timeout=CONNECT_TIMEOUT, set_as_default=False)
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
