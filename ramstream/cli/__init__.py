"""The command line: thin click wrappers over ``ramstream.api``, one module per command.

- ``types``: the values options take (sizes, per-agent lists, settings, method names);
- ``options``: the option groups several commands share (run, checkpoint and output options);
- ``command``: what every command does around the API (imported on first use, errors as one line);
- ``probe``, ``merge``, ``sweep``, ``inspect``, ``status``, ``demo``: one command each.
"""

from __future__ import annotations

import os

import click

from ramstream.cli.demo import demo
from ramstream.cli.inspect import inspect
from ramstream.cli.merge import merge
from ramstream.cli.probe import probe
from ramstream.cli.status import status
from ramstream.cli.sweep import sweep
from ramstream.version import __version__

__all__ = ["main"]

# The program's own environment (the library sets none; an API user sets these as they like):
# - ramstream never calls BLAS, but numpy's OpenBLAS (and scipy's, which numba imports when it is
#   installed) starts a thread per core that spins at start-up, taking CPU the kernels need;
# - Numba's OpenMP workers spin after each parallel call by default, taking a core from the
#   write-behind threads between kernels (on 2 cores that halved merge throughput); passive
#   waiting costs nothing measurable here.
# setdefault: a user's own setting wins. The command modules import numpy only when they run.
os.environ.setdefault("OPENBLAS_NUM_THREADS", "1")
os.environ.setdefault("OMP_WAIT_POLICY", "PASSIVE")


@click.group()
@click.version_option(__version__, prog_name="ramstream")
def main() -> None:
    """Merge fine-tuned checkpoints of one base out of core (RAM / RAM+), within a RAM budget."""


for _command in (probe, merge, inspect, sweep, status, demo):
    main.add_command(_command)
