"""The option groups several commands share, and the ``RunOptions`` they make.

- run options (every command that reads blocks: probe, merge, sweep, demo): memory, threads,
  cache, backend and device, the Dask executor, progress;
- checkpoint options (the commands that open checkpoints: probe, merge, sweep): the run options
  and the Hugging Face hub's cache and timeout;
- output options (the commands that write merged models: merge, sweep): index, dtype, shards.
"""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path
from typing import Any, TypeVar

import click

from ramstream.cli.types import Size
from ramstream.config import (
    DEFAULT_EPS,
    DEFAULT_HUB_TIMEOUT,
    DEFAULT_SCHEDULER_TIMEOUT,
    DEFAULT_SHARD_SIZE,
    RunOptions,
    default_cache_dir,
)

F = TypeVar("F", bound=Callable[..., Any])

# --eps as probe and sweep take it (merge says that only RAM reads it).
eps_option = click.option(
    "--eps", type=float, default=DEFAULT_EPS, show_default=True, help="|tau| > eps marks an element active."
)

# --quantized-base-as as probe, merge and sweep take it (docs/quantized.md).
quantized_base_option = click.option(
    "--quantized-base-as",
    type=click.Choice(["auto", "f32", "bf16", "f16"]),
    default="auto",
    show_default=True,
    help="What a base stored quantized (FP8, MXFP4) stands for: f32, its dequantized values; bf16 or f16, those "
    "rounded to that dtype (the conversion agents are trained from); auto: the agents' dtype when all share bf16 "
    "or f16, else f32.",
)


def run_options(f: F) -> F:
    f = click.option("--quiet", is_flag=True, help="No progress on stderr.")(f)
    f = click.option(
        "--dask-workers",
        type=click.IntRange(min=1),
        default=None,
        help="Run the blocks on a Dask LocalCluster of N worker processes on this machine (extra 'ramstream[dask]').",
    )(f)
    f = click.option(
        "--scheduler-timeout",
        type=float,
        metavar="SECONDS",
        default=DEFAULT_SCHEDULER_TIMEOUT,
        show_default=True,
        help="How long --scheduler's address may take to answer as a Dask scheduler before the run stops.",
    )(f)
    f = click.option(
        "--scheduler",
        metavar="ADDRESS",
        default=None,
        help="Run the blocks on a running Dask scheduler, e.g. tcp://host:8786; every worker must see the same "
        "paths (extra 'ramstream[dask]').",
    )(f)
    f = click.option(
        "--gpu-memory",
        type=Size(),
        default=None,
        help="GPU memory budget of --backend torch on CUDA, e.g. 6GiB [default: half of the free memory].",
    )(f)
    f = click.option(
        "--device",
        default=None,
        metavar="cpu|cuda|cuda:N",
        help="Where --backend torch computes [default: cuda when torch sees a GPU, else cpu].",
    )(f)
    f = click.option(
        "--backend",
        default="numba",
        show_default=True,
        help="Where blocks are computed (numba: the CPU kernels; torch: a CUDA GPU or the CPU, extra "
        "'ramstream[torch]'); every backend writes the same bytes.",
    )(f)
    f = click.option(
        "--cache-dir",
        type=click.Path(path_type=Path),
        default=None,
        help="Where indexes are cached when no --index is given [default: ~/.cache/ramstream].",
    )(f)
    f = click.option(
        "--threads", type=click.IntRange(min=1), default=None, help="Compute threads [default: all cores]."
    )(f)
    f = click.option("--memory", type=Size(), default="1GiB", show_default=True, help="RAM budget, e.g. 64MiB, 8GiB.")(
        f
    )
    return f


def output_options(f: F) -> F:
    """What the commands that write merged models (merge, sweep) take about the output."""
    f = click.option(
        "--shard-size",
        type=Size(),
        default=f"{DEFAULT_SHARD_SIZE // 1000**3}GB",
        show_default=True,
        help="Largest output shard file, e.g. 2GB, 10GiB (5GB: the Hugging Face default).",
    )(f)
    f = click.option(
        "--out-dtype",
        type=click.Choice(["auto", "bf16", "f16", "f32", "fp8"]),
        default="auto",
        show_default=True,
        help="auto keeps each tensor's base dtype (bf16 for a tensor the base stores quantized); fp8 writes "
        "those in the base's FP8 scheme.",
    )(f)
    return click.option(
        "--index",
        "index",
        type=click.Path(path_type=Path),
        default=None,
        help="Where the index (the agents' masks and statistics, about N x parameters / 8 bytes for N agents) "
        "is kept and reused: later merges of these inputs skip the probe [default: cached under --cache-dir].",
    )(f)


def checkpoint_options(f: F) -> F:
    """The run options of the commands that open checkpoints (probe, merge, sweep)."""
    f = click.option(
        "--hub-timeout",
        type=float,
        metavar="SECONDS",
        default=DEFAULT_HUB_TIMEOUT,
        show_default=True,
        help="How long the Hugging Face hub may take to answer a request; then the cache is used, or the run stops.",
    )(f)
    f = click.option(
        "--hf-cache",
        type=click.Path(path_type=Path, file_okay=False),
        default=None,
        help="The Hugging Face cache where hub ids (org/name[@revision]) are found or downloaded "
        "[default: huggingface_hub's: HF_HUB_CACHE, or HF_HOME/hub].",
    )(f)
    return run_options(f)


def run_options_of(cache_dir: Path | None = None, **run: Any) -> RunOptions:
    """The ``RunOptions`` of ``run_options``' and ``checkpoint_options``' flags (as click passes them)."""
    return RunOptions(cache_dir=cache_dir or default_cache_dir(), **run)


# The parameter names ``checkpoint_options`` adds: a command taking method settings as ``**values``
# separates them from the run options with ``pop_run_options``.
_RUN_PARAMS = tuple(p.name for p in getattr(checkpoint_options(lambda: None), "__click_params__", ()) if p.name)


def pop_run_options(values: dict[str, Any]) -> dict[str, Any]:
    """Take the run options' flags out of ``values`` (a command's ``**values``) and return them."""
    return {name: values.pop(name) for name in _RUN_PARAMS if name in values}
