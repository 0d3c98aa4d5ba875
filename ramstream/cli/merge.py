"""``ramstream merge``: merge the agents into the base (or what a mergekit config names) and
write a Hugging Face model directory; the methods' settings as options."""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path
from typing import Any, TypeVar

import click

from ramstream.cli.command import friendly, load_api, summary
from ramstream.cli.options import (
    checkpoint_options,
    output_options,
    pop_run_options,
    quantized_base_option,
    run_options_of,
)
from ramstream.cli.types import MethodName, SettingList, SettingValue
from ramstream.config import DEFAULT_EPS

F = TypeVar("F", bound=Callable[..., Any])


def method_options(f: F) -> F:
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


def given_settings(ctx: click.Context, values: dict[str, Any]) -> dict[str, Any]:
    """The settings the user gave on the command line (defaults are left to the method)."""
    source = click.core.ParameterSource.DEFAULT
    given = {_RENAMED.get(k, k): v for k, v in values.items() if ctx.get_parameter_source(k) != source}
    if "rescale" in given:
        given["rescale"] = _RESCALE[given["rescale"]]
    return given


@click.command()
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
@quantized_base_option
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
@method_options
@output_options
@click.option("--force", is_flag=True, help="Replace what a previous merge left in --out.")
@click.option(
    "--allow-nonfinite",
    is_flag=True,
    help="Let NaN/Inf weights through (a non-finite task-vector element counts as inactive) instead of refusing.",
)
@checkpoint_options
@click.pass_context
@friendly
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
    quantized_base_as: Any,
    **values: Any,
) -> None:
    """Merge AGENTS into BASE (or what --config names) and write a Hugging Face model directory
    to --out (resumable). Options a method does not read are refused."""
    from ramstream import mergekit_config

    run = pop_run_options(values)
    api = load_api(run["backend"])

    settings = given_settings(ctx, values)
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
                options=run_options_of(**run),
            )
            state = "already stacked" if stacked.resumed_finished else "stacked"
            click.echo(f"{state}: {stacked.out} (passthrough, {stacked.layers} layers from {stacked.slices} slices)")
            return
        flags, settings = settings, mergekit_config.combine(loaded, settings)
        base, agents = loaded.base, loaded.agents
        from ramstream.runs.config_values import check_config_values

        check_config_values(loaded, flags, settings)
    if base is None or not agents:
        raise click.UsageError("give BASE and at least one AGENT (or --config FILE)")
    arguments = mergekit_config.api_arguments(settings)
    stop = api.prepare(arguments.get("method", "ram+"), run["backend"])
    try:
        result = api.merge(
            base,
            [str(a) for a in agents],
            out=out,
            **arguments,
            index=index,
            shard_size=shard_size,
            force=force,
            allow_nonfinite=allow_nonfinite,
            quantized_base_as=quantized_base_as,
            options=run_options_of(**run),
        )
    finally:
        stop()
    state = "already merged" if result.resumed_finished else "merged"
    click.echo(f"{state}: {result.out} ({summary(result.method, result.per_agent)})")
    if result.index is not None and result.method in ("ram", "ram+") and not result.resumed_finished:
        _note_idle_agents(api.open_index(result.index))


def _note_idle_agents(view: Any) -> None:
    """An agent that differs from the base nowhere above ε adds nothing: the merge is what the
    others make it, and the likely cause (the base given again as an agent, or an ε too large)
    is a mistake a user wants to hear of, not to find in an evaluation."""
    import numpy as np

    active = np.asarray(view.counts.active).reshape(-1, len(view.agents)).sum(axis=0)
    for name, count in zip(view.agents, active, strict=True):
        if count == 0:
            click.echo(
                f"note: agent {name} differs from the base nowhere above --eps {view.eps:g}: it adds nothing to "
                "the merge (is it a copy of the base, or is --eps too large?)",
                err=True,
            )
