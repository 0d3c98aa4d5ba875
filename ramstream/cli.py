"""The command line: thin click wrappers over ``ramstream.api``; errors become one line."""

from __future__ import annotations

import gc
import json
import os
import sys
from collections.abc import Callable
from functools import wraps
from pathlib import Path
from types import ModuleType
from typing import Any, TypeVar

import click

from ramstream.config import (
    DEFAULT_EPS,
    DEFAULT_HUB_TIMEOUT,
    DEFAULT_SCHEDULER_TIMEOUT,
    DEFAULT_SHARD_SIZE,
    RunOptions,
    default_cache_dir,
    parse_size,
)
from ramstream.errors import ConfigError, RamstreamError
from ramstream.version import __version__

F = TypeVar("F", bound=Callable[..., Any])

# The program's own environment (the library sets none; an API user sets these as they like):
# - ramstream never calls BLAS, but numpy's OpenBLAS (and scipy's, which numba imports when it is
#   installed) starts a thread per core that spins at start-up, taking CPU the kernels need;
# - Numba's OpenMP workers spin after each parallel call by default, taking a core from the
#   write-behind threads between kernels (on 2 cores that halved merge throughput); passive
#   waiting costs nothing measurable here.
# setdefault: a user's own setting wins.
os.environ.setdefault("OPENBLAS_NUM_THREADS", "1")
os.environ.setdefault("OMP_WAIT_POLICY", "PASSIVE")


def _load_api(backend: str) -> ModuleType:
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


class MethodName(click.ParamType):
    """A registered method; the registry is read only when a value or the help needs it (it
    imports the methods, which ``inspect`` and ``status`` never need)."""

    name = "method"

    def get_metavar(self, param: click.Parameter, ctx: click.Context | None = None) -> str:
        from ramstream.methods.registry import method_names

        return "[" + "|".join(method_names()) + "]"

    def convert(self, value: Any, param: click.Parameter | None, ctx: click.Context | None) -> str:
        from ramstream.methods.registry import method_names

        names = method_names()
        if value not in names:
            self.fail(f"{value!r} is not one of {', '.join(map(repr, names))}.", param, ctx)
        return str(value)


class FloatList(click.ParamType):
    """Comma-separated numbers: one per agent, or one for every agent."""

    name = "x[,x...]"

    def convert(self, value: Any, param: click.Parameter | None, ctx: click.Context | None) -> list[float]:
        if isinstance(value, list):
            return value
        try:
            return [float(x) for x in str(value).split(",")]
        except ValueError:
            self.fail(f"{value!r} is not a comma-separated list of numbers", param, ctx)


def _yaml_flow(text: str) -> Any:
    import yaml

    try:
        return yaml.safe_load(text)
    except yaml.YAMLError as exc:
        raise ValueError(" ".join(str(exc).split())) from None


class SettingValue(click.ParamType):
    """A number, or a gradient / filters in YAML flow syntax, as in a mergekit config:
    ``0.5``, ``[0, 0.5, 1]``, ``[{filter: self_attn, value: [0, 1]}, {value: 0.5}]``."""

    name = "value"

    def convert(self, value: Any, param: click.Parameter | None, ctx: click.Context | None) -> Any:
        if not isinstance(value, str):
            return value
        try:
            parsed = _yaml_flow(value)
        except ValueError as exc:
            self.fail(f"{value!r} is not a number, a gradient [a, b, ...] or filters in YAML flow ({exc})", param, ctx)
        if parsed is None or isinstance(parsed, bool) or not isinstance(parsed, (int, float, str, list, dict)):
            self.fail(f"{value!r} is not a number, a gradient [a, b, ...] or filters in YAML flow", param, ctx)
        return parsed


class SettingList(FloatList):
    """Comma-separated values, one per agent or one for every agent; each a number, or (where a
    method varies the parameter per tensor) a gradient or filters in YAML flow syntax."""

    def convert(self, value: Any, param: click.Parameter | None, ctx: click.Context | None) -> list[Any]:
        if isinstance(value, list) or not any(c in str(value) for c in "[{"):
            return super().convert(value, param, ctx)
        try:
            parsed = _yaml_flow(f"[{value}]")
        except ValueError as exc:
            self.fail(f"{value!r} is not a comma-separated list of values ({exc})", param, ctx)
        return list(parsed)


class Size(click.ParamType):
    name = "size"

    def convert(self, value: Any, param: click.Parameter | None, ctx: click.Context | None) -> int:
        if isinstance(value, int):
            return value
        try:
            return parse_size(value)
        except RamstreamError as exc:
            self.fail(str(exc), param, ctx)


def _friendly(func: F) -> F:
    """Turn ramstream's errors (and Ctrl-C) into one line on stderr and a non-zero exit."""

    @wraps(func)
    def wrapper(*args: Any, **kwargs: Any) -> Any:
        try:
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


def _run_options(f: F) -> F:
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


def _output_options(f: F) -> F:
    """What the commands that write merged models (merge, sweep) take about the output."""
    f = click.option("--shard-size", type=Size(), default=str(DEFAULT_SHARD_SIZE), show_default=True)(f)
    f = click.option(
        "--out-dtype",
        type=click.Choice(["auto", "bf16", "f16", "f32"]),
        default="auto",
        show_default=True,
        help="auto keeps each tensor's base dtype.",
    )(f)
    return click.option("--index", "index", type=click.Path(path_type=Path), default=None)(f)


def _checkpoint_options(f: F) -> F:
    """The run options of the commands that open checkpoints (probe, merge)."""
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
    return _run_options(f)


def _options(cache_dir: Path | None = None, **run: Any) -> RunOptions:
    """The run options of ``_run_options``' flags (as click passes them)."""
    return RunOptions(cache_dir=cache_dir or default_cache_dir(), **run)


# The parameter names ``_checkpoint_options`` adds: a command taking method settings as ``**values``
# separates them from the run options with ``_pop_run_options``.
_RUN_PARAMS = tuple(p.name for p in getattr(_checkpoint_options(lambda: None), "__click_params__", ()) if p.name)


def _pop_run_options(values: dict[str, Any]) -> dict[str, Any]:
    return {name: values.pop(name) for name in _RUN_PARAMS if name in values}


@click.group()
@click.version_option(__version__, prog_name="ramstream")
def main() -> None:
    """Merge fine-tuned checkpoints of one base out of core (RAM / RAM+), within a RAM budget."""


# Checkpoints are taken as written: a path (``./org/name`` stays a path) or a hub id (org/name[@rev]).
@main.command()
@click.argument("base", type=str)
@click.argument("agents", nargs=-1, required=True, type=str)
@click.option("--index", "index", type=click.Path(path_type=Path), default=None, help="Index path [default: cache].")
@click.option("--eps", type=float, default=DEFAULT_EPS, show_default=True, help="|tau| > eps marks an element active.")
@click.option(
    "--allow-nonfinite",
    is_flag=True,
    help="Let NaN/Inf weights through (a non-finite task-vector element counts as inactive) instead of refusing.",
)
@click.option(
    "--agreement",
    is_flag=True,
    help="Also gather how each pair of agents agrees (shared elements, signs, cosine; inspect --pairs): "
    "one more read of the checkpoints, added to an existing index too.",
)
@_checkpoint_options
@_friendly
def probe(
    base: str,
    agents: tuple[str, ...],
    index: Path | None,
    eps: float,
    allow_nonfinite: bool,
    agreement: bool,
    **run: Any,
) -> None:
    """Gather the statistics of AGENTS against BASE into the index (resumable)."""
    api = _load_api(run["backend"])
    store = api.probe(
        base,
        [str(a) for a in agents],
        index=index,
        eps=eps,
        allow_nonfinite=allow_nonfinite,
        agreement=agreement,
        options=_options(**run),
    )
    click.echo(f"index: {store.path}")


def _method_options(f: F) -> F:
    """The baselines' options; per-agent ones take comma-separated lists (one value for all)."""
    per_agent = "one value per agent, comma-separated, or one for all"
    options: list[tuple[tuple[str, ...], dict[str, Any]]] = [
        (("--weights",), {"type": SettingList(), "help": f"Agent weights w_t ({per_agent})."}),
        (
            ("--t",),
            {
                "type": SettingValue(),
                "help": "slerp: 0 gives the base, 1 the agent; nearswap: the distance up to which the agent is "
                "taken (a number, gradient or filters).",
            },
        ),
        (
            ("--no-base",),
            {"is_flag": True, "default": None, "help": "nuslerp/multislerp: BASE is a model like the agents."},
        ),
        (
            ("--normalize-weights/--no-normalize-weights",),
            {"default": None, "help": "multislerp: divide the weights by their sum [default: on]."},
        ),
        (("--nuslerp-row-wise",), {"type": bool, "help": "nuslerp: mergekit's nuslerp_row_wise."}),
        (("--nuslerp-flatten",), {"type": bool, "help": "nuslerp: whole tensors as vectors [default: true]."}),
        (("--max-iter",), {"type": click.IntRange(min=0), "help": "karcher: iterations at most [default: 10]."}),
        (("--tol",), {"type": float, "help": "karcher: convergence tolerance [default: 1e-5]."}),
        (("--base-weight",), {"type": float, "help": "linear: the base's own weight [default: 0, no part]."}),
        (
            ("--lambda", "lambda_"),
            {"type": SettingValue(), "help": "Multiplier of the merged task vector (a number, gradient or filters)."},
        ),
        (("--density",), {"type": SettingList(), "help": f"Fraction of each task vector kept ({per_agent})."}),
        (("--gamma",), {"type": SettingList(), "help": f"Breadcrumbs: largest fraction dropped ({per_agent})."}),
        (("--epsilon",), {"type": SettingList(), "help": f"DELLA: keep-probability spread ({per_agent})."}),
        (
            ("--select-topk",),
            {
                "type": SettingValue(),
                "help": "sce: share of the highest-variance elements kept (number, gradient or filters) [default: 1].",
            },
        ),
        (("--seed",), {"type": click.IntRange(min=0), "help": "Seed of the random methods (DARE, DELLA)."}),
        (
            ("--normalize/--no-normalize",),
            {"default": None, "help": "Divide the merged task vector by the summed weights."},
        ),
        (
            ("--trim-scope",),
            {"type": click.Choice(["tensor", "model"]), "help": "Rank magnitudes per tensor or over the model."},
        ),
        (
            ("--rescale",),
            {
                "type": click.Choice(["l1", "inverse", "none"]),
                "help": "Survivors rescaled to the tensor's L1 mass (mergekit), by 1/p (DARE, DELLA papers), or not.",
            },
        ),
    ]
    for decl, kwargs in reversed(options):
        f = click.option(*decl, **kwargs)(f)
    return f


# Settings are named as the methods parse them (see ramstream.mergekit_config.FLAGS); click's
# parameter names differ only where Python needs it.
_RENAMED = {"lambda_": "lambda"}

# --rescale as the methods read it: mergekit's boolean where it has one (l1 = true, none = false).
_RESCALE = {"l1": True, "none": False, "inverse": "inverse"}


def _given_settings(ctx: click.Context, values: dict[str, Any]) -> dict[str, Any]:
    """The settings the user gave on the command line (defaults are left to the method)."""
    source = click.core.ParameterSource.DEFAULT
    given = {_RENAMED.get(k, k): v for k, v in values.items() if ctx.get_parameter_source(k) != source}
    if "rescale" in given:
        given["rescale"] = _RESCALE[given["rescale"]]
    return given


@main.command()
@click.argument("base", type=str, required=False)
@click.argument("agents", nargs=-1, type=str)
@click.option("--out", type=click.Path(path_type=Path), required=True, help="Output model directory.")
@click.option(
    "--config",
    type=click.Path(path_type=Path, dir_okay=False),
    default=None,
    help="A mergekit YAML config (merge_method, base_model, models...) instead of BASE AGENT... (docs/methods.md).",
)
@click.option("--method", type=MethodName(), default="ram+", show_default=True)
@click.option(
    "--r",
    "r",
    type=SettingValue(),
    default=None,
    help="RAM+ rescale strength r, a number, gradient or filters [default: 0.1; 0 for ram].",
)
@click.option(
    "--alpha",
    type=SettingValue(),
    default=None,
    help="RAM+ cap on rho (paper rule), a number, gradient or filters [default: 2.0].",
)
@click.option(
    "--eps", type=float, default=DEFAULT_EPS, show_default=True, help="RAM: |tau| > eps marks an element active."
)
@click.option(
    "--rho-scope",
    type=click.Choice(["model", "tensor"]),
    default=None,
    help="rho over the whole model (paper, the default) or per tensor (mergekit's ramplus_tl).",
)
@click.option(
    "--lambda-rule",
    type=click.Choice(["paper", "script"]),
    default=None,
    help="paper (default): 1 + r*clip(rho,0,alpha); script: the authors' 1 + (R-1)*min(1,rho), R = 1 + r.",
)
@_method_options
@_output_options
@click.option("--force", is_flag=True, help="Replace what a previous merge left in --out.")
@click.option(
    "--allow-nonfinite",
    is_flag=True,
    help="Let NaN/Inf weights through (a non-finite task-vector element counts as inactive) instead of refusing.",
)
@_checkpoint_options
@click.pass_context
@_friendly
def merge(
    ctx: click.Context,
    base: str | Path | None,
    agents: tuple[str | Path, ...],
    out: Path,
    config: Path | None,
    index: Path | None,
    shard_size: int,
    force: bool,
    allow_nonfinite: bool,
    **values: Any,
) -> None:
    """Merge AGENTS into BASE (or what --config names) and write a Hugging Face model directory
    to --out (resumable). Options a method does not read are refused."""
    from ramstream import mergekit_config

    run = _pop_run_options(values)
    api = _load_api(run["backend"])

    settings = _given_settings(ctx, values)
    if config is not None:
        if base is not None or agents:
            raise click.UsageError("give either --config or BASE AGENT..., not both")
        loaded = mergekit_config.load(config)
        if isinstance(loaded, mergekit_config.ConfigStack):
            given = {"index": index, "allow_nonfinite": allow_nonfinite or None}
            flags = {**settings, **{k: v for k, v in given.items() if v is not None}}
            stacked = api.stack(
                **mergekit_config.stack_arguments(loaded, flags),
                out=out,
                shard_size=shard_size,
                force=force,
                options=_options(**run),
            )
            state = "already stacked" if stacked.resumed_finished else "stacked"
            click.echo(f"{state}: {stacked.out} (passthrough, {stacked.layers} layers from {stacked.slices} slices)")
            return
        base, agents, settings = loaded.base, loaded.agents, mergekit_config.combine(loaded, settings)
    if base is None or not agents:
        raise click.UsageError("give BASE and at least one AGENT (or --config FILE)")
    result = api.merge(
        base,
        [str(a) for a in agents],
        out=out,
        **mergekit_config.api_arguments(settings),
        index=index,
        shard_size=shard_size,
        force=force,
        allow_nonfinite=allow_nonfinite,
        options=_options(**run),
    )
    state = "already merged" if result.resumed_finished else "merged"
    click.echo(f"{state}: {result.out} ({_summary(result.method, result.per_agent)})")


def _summary(method: str, per_agent: dict[str, tuple[float, ...]]) -> str:
    parts = [method]
    for key, values in per_agent.items():
        fmt = "{:.4f}" if key == "lambda" else "{:.4g}"
        parts.append(f"{key} " + ", ".join(fmt.format(x) for x in values))
    return ", ".join(parts)


@main.command()
@click.argument("path", type=click.Path(path_type=Path))
@click.option("--json", "as_json", is_flag=True, help="Print one JSON object (schema: docs/inspect.md).")
@click.option(
    "--by",
    "by",
    type=click.Choice(["agent", "layer", "module", "tensor", "all"]),
    multiple=True,
    help="Tables to show besides the per-agent summary (repeatable; all = layer, module and tensor).",
)
@click.option("--top", type=click.IntRange(min=1), default=None, help="Each agent's K tensors ranked by --rank-by.")
@click.option(
    "--rank-by",
    type=click.Choice(["unique_share", "unique", "shared", "active", "density", "rho"]),
    default="unique_share",
    show_default=True,
    help="What --top ranks by (unique_share = unique / active).",
)
@click.option("--agent", default=None, help="With --top: only this agent.")
@click.option("--tensor", "tensor", default=None, help="One tensor's numbers (and, with --plot, its mask image).")
@click.option(
    "--pairs",
    is_flag=True,
    help="How each pair of agents agrees (shared elements, same sign, cosine, magnitude ratio), grouped by --by "
    "instead of the overlap tables; needs probe --agreement.",
)
@click.option("--r", "r", type=float, default=0.1, show_default=True, help="r used to show lambda.")
@click.option("--alpha", type=float, default=2.0, show_default=True, help="alpha used to show lambda.")
@click.option(
    "--lambda-rule",
    type=click.Choice(["paper", "script", "share"]),
    default="paper",
    show_default=True,
    help="paper: ram+; script: the authors' script; share: ram+s.",
)
@click.option(
    "--plot",
    type=click.Path(path_type=Path, dir_okay=False),
    default=None,
    help="Write a figure (*.png or *.svg; needs matplotlib: pip install 'ramstream[plot]').",
)
@_friendly
def inspect(
    path: Path,
    as_json: bool,
    by: tuple[str, ...],
    top: int | None,
    rank_by: str,
    agent: str | None,
    tensor: str | None,
    r: float,
    alpha: float,
    lambda_rule: str,
    plot: Path | None,
    pairs: bool,
) -> None:
    """Sparsity and overlap per agent, layer, module and tensor, from the index alone (no weights read)."""
    from ramstream.inspect import document, text
    from ramstream.inspect.view import open_index
    from ramstream.methods.ram import RamParams
    from ramstream.methods.report import format_table

    tables = ("layer", "module", "tensor") if "all" in by else tuple(b for b in by if b != "agent")
    request = document.InspectRequest(
        by=tables,  # type: ignore[arg-type]
        top=top,
        rank_by=rank_by,  # type: ignore[arg-type]
        agent=agent,
        tensor=tensor,
        params=RamParams(r=r, alpha=alpha, lambda_rule=lambda_rule),  # type: ignore[arg-type]
        pairs=pairs,
    )
    if plot is not None:
        from ramstream.inspect import plots

        if pairs and tensor is not None:
            raise ConfigError("--plot draws the pairs (--pairs) or one tensor (--tensor), not both; give one")
        plots.check_target(plot)
    view = open_index(path)
    doc, reports = document.build(view, request)
    if plot is not None:
        if pairs:
            figure = plots.pairs_figure(view.pairs.modules if tables[:1] == ("module",) else view.pairs.layers)
        elif tensor is not None:
            figure = plots.tensor_figure(view.mask_image(tensor))
        else:
            figure = plots.summary_figure(view.model, view.modules if tables[:1] == ("module",) else view.layers)
        plots.save(figure, plot)
    click.echo(json.dumps(doc, indent=1) if as_json else text.render(doc, format_table(reports)))
    if plot is not None and not as_json:
        click.echo(f"plot: {plot}")


@main.command()
@click.argument("base", type=str, required=False)
@click.argument("agents", nargs=-1, type=str)
@click.option(
    "--out",
    type=click.Path(path_type=Path),
    required=True,
    help="The sweep's directory: a model directory per candidate (DIR/<name>/) and sweep.json.",
)
@click.option(
    "--grid",
    "grids",
    multiple=True,
    metavar='"METHOD[:PARAM=V1,V2,...]"',
    help="Candidates: the cross product of the values, e.g. 'ram+:r=0.05,0.1' (repeatable; docs/sweep.md).",
)
@click.option(
    "--config",
    type=click.Path(path_type=Path, dir_okay=False),
    default=None,
    help="Candidates as mergekit configs: a list of them, or one with a sweep: key (docs/sweep.md); "
    "it names BASE and the AGENTS.",
)
@click.option("--eps", type=float, default=DEFAULT_EPS, show_default=True, help="|tau| > eps marks an element active.")
@_output_options
@click.option("--force", is_flag=True, help="Replace what earlier merges left in a candidate's directory.")
@click.option("--allow-nonfinite", is_flag=True, help="Let NaN/Inf weights through (see merge --help).")
@click.option(
    "--eval",
    "evaluate_with",
    metavar='"CMD {model}"',
    default=None,
    help="Score every candidate after the merges: the last line of CMD's stdout is a JSON object of metrics "
    "(or a number); a failure is recorded, not fatal.",
)
@click.option("--eval-inputs", is_flag=True, help="With --eval: score the base and the agents too.")
@click.option(
    "--select",
    metavar="METRIC[:max|min]",
    default=None,
    help="With --eval: the metric that ranks the candidates [default: the first one reported, max].",
)
@click.option(
    "--plot",
    type=click.Path(path_type=Path, dir_okay=False),
    default=None,
    help="With --eval: draw the selected metric per candidate (*.png or *.svg; pip install 'ramstream[plot]').",
)
@_checkpoint_options
@click.pass_context
@_friendly
def sweep(
    ctx: click.Context,
    base: str | None,
    agents: tuple[str, ...],
    out: Path,
    grids: tuple[str, ...],
    config: Path | None,
    eps: float,
    index: Path | None,
    out_dtype: Any,
    shard_size: int,
    force: bool,
    allow_nonfinite: bool,
    evaluate_with: str | None,
    eval_inputs: bool,
    select: str | None,
    plot: Path | None,
    **values: Any,
) -> None:
    """Merge AGENTS into BASE once per candidate of --grid (or --config), reading the inputs once,
    into --out/<name>/ (each what `ramstream merge` writes with those arguments); resumable."""
    base, agents, candidates, shared = _sweep_candidates(ctx, base, agents, grids, config)
    eps, out_dtype = shared.get("eps", eps), shared.get("out_dtype", out_dtype)
    api = _load_api(values["backend"])
    result = api.sweep(
        base,
        list(agents),
        out=out,
        candidates=candidates,
        eps=eps,
        index=index,
        out_dtype=out_dtype,
        shard_size=shard_size,
        force=force,
        allow_nonfinite=allow_nonfinite,
        evaluate_with=evaluate_with,
        eval_inputs=eval_inputs,
        select=select,
        plot=plot,
        options=_options(**values),
    )
    for c in result.candidates:
        click.echo(f"{c.status}: {c.out} ({_summary(c.method, c.per_agent)})")
    click.echo(f"sweep: {len(result.candidates)} candidates in {result.out} (sweep.json)")
    if result.evaluations:
        click.echo(_score_table(result))
    if plot is not None:
        click.echo(f"plot: {plot}")


def _sweep_candidates(
    ctx: click.Context, base: str | None, agents: tuple[str, ...], grids: tuple[str, ...], config: Path | None
) -> tuple[str, tuple[str, ...], list[Any], dict[str, Any]]:
    """The family, the candidates (the config's, then the grids') and the sweep-wide settings the
    config sets (eps, out_dtype), which a flag may repeat but not contradict."""
    from ramstream.sweep import config as sweep_config
    from ramstream.sweep.grid import check_unique, parse_grid, parse_grids

    if config is None:
        if base is None or not agents:
            raise click.UsageError("give BASE and at least one AGENT (or --config FILE)")
        return base, agents, parse_grids(grids), {}
    if base is not None or agents:
        raise click.UsageError("give either --config or BASE AGENT..., not both")
    loaded = sweep_config.load(config)
    candidates = [*loaded.candidates, *(c for g in grids for c in parse_grid(g))]
    check_unique(candidates)
    for key, value in loaded.shared.items():
        if ctx.get_parameter_source(key) != click.core.ParameterSource.DEFAULT and ctx.params[key] != value:
            flag = "--" + key.replace("_", "-")
            raise click.UsageError(f"{flag} is set by {config} too ({value!r}); set it in one place")
    return str(loaded.base), tuple(map(str, loaded.agents)), candidates, dict(loaded.shared)


def _score_table(result: Any) -> str:
    """The evaluations, the candidates best first by the selected metric, then the rest."""
    ranked = result.ranked
    rest = [e for e in result.evaluations if e not in ranked]
    metric = result.selection.metric if result.selection is not None else "-"
    best = f"{metric} ({result.selection.best})" if result.selection is not None else "no metric"
    width = max(len(e.model) for e in result.evaluations)
    lines = [f"{'model':<{width}}  {best}"]
    for e in [*ranked, *rest]:
        shown = f"{e.metrics[metric]:.6g}" if metric in e.metrics else (e.error or "no " + metric)
        lines.append(f"{e.model:<{width}}  {shown}{'  (recorded earlier)' if e.recorded else ''}")
    if result.selected is not None:
        lines.append(f"selected: {result.selected} ({metric} {ranked[0].metrics[metric]:.6g})")
    return "\n".join(lines)


@main.command()
@click.argument("path", type=click.Path(path_type=Path))
@click.option("--json", "as_json", is_flag=True, help="Print one JSON object (schema: docs/inspect.md).")
@click.option(
    "--index",
    "index",
    type=click.Path(path_type=Path),
    default=None,
    help="For an output directory: the index its merge used, if status cannot find it.",
)
@click.option(
    "--cache-dir",
    type=click.Path(path_type=Path),
    default=None,
    help="Where cached indexes are looked up [default: ~/.cache/ramstream].",
)
@_friendly
def status(path: Path, as_json: bool, index: Path | None, cache_dir: Path | None) -> None:
    """Which passes over an index or a merge's output directory are done, how far, and an ETA."""
    from ramstream.inspect.status import render
    from ramstream.inspect.status import status as get_status

    result = get_status(path, index=index, cache_dir=cache_dir or default_cache_dir())
    click.echo(json.dumps(result.to_dict(), indent=1) if as_json else render(result))


@main.command()
@click.option(
    "--dir",
    "directory",
    type=click.Path(path_type=Path),
    default=None,
    help="Where to write the index and the merge [default: a cache directory].",
)
@click.option(
    "--synthetic",
    is_flag=True,
    help="Use a synthetic family with the paper's densities instead of the shipped lab agents.",
)
@click.option("--method", default="ram+", show_default=True, help="The merge method.")
@click.option(
    "--sweep",
    is_flag=True,
    help="Sweep RAM+, task arithmetic, TIES and DARE-TIES settings on the lab agents, select on the validation "
    "prompts and compare with the defaults on the test prompts (needs torch; docs/agents_lab.md).",
)
@_run_options
@click.pass_context
@_friendly
def demo(ctx: click.Context, directory: Path | None, synthetic: bool, method: str, sweep: bool, **run: Any) -> None:
    """Merge the built-in agents (RAM+ by default) and show the overlap table.

    The built-in agents are a tiny transformer's base and three RL agents trained from it
    (docs/agents_lab.md), shipped with ramstream; with torch installed the demo also scores the
    base, the agents and the merge on each task. --synthetic writes a synthetic family instead;
    --sweep merges a grid of candidates and shows what selecting one on validation prompts gives."""
    if sweep:
        if synthetic or ctx.get_parameter_source("method") != click.core.ParameterSource.DEFAULT:
            raise click.UsageError("--sweep merges its own candidates of the lab agents: drop --synthetic and --method")
        from ramstream.demo.sweep import run_sweep_demo

        run_sweep_demo(directory, _options(**run), click.echo)
        return
    from ramstream.demo.run import run_demo

    run_demo(directory, _options(**run), click.echo, synthetic=synthetic, method=method)


if __name__ == "__main__":
    main()
