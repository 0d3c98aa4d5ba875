"""The Python API: the verbs of the CLI (probe, merge, sweep, inspect) over plain arguments."""

from __future__ import annotations

from collections.abc import Callable, Iterator, Mapping, Sequence
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Literal

from ramstream.backends.registry import backend_for, load_backend, prepare_backend, warm_backend
from ramstream.config import DEFAULT_EPS, DEFAULT_SHARD_SIZE, RunOptions
from ramstream.errors import NonFiniteWeightError, RamstreamError
from ramstream.execution.executor import Executor
from ramstream.execution.registry import make_executor
from ramstream.format.family import Family, open_family
from ramstream.format.quantized import QuantizedBaseAs
from ramstream.index.store import IndexStore
from ramstream.inspect.view import IndexView
from ramstream.inspect.view import open_index as open_index_view
from ramstream.mergekit_config import StackSlice
from ramstream.methods.ram import RhoScope
from ramstream.output import directory as output_dir
from ramstream.runs.output import (
    OutDtype,
    OutputPlan,
    already_merged,
    budget_block_elems,
    checked_eps,
    merge_outputs,
    parse_method,
    plan_output,
)
from ramstream.runs.stack import StackResult, run_stack
from ramstream.statistics.agreement import Agreement
from ramstream.statistics.context import StatsContext
from ramstream.sweep.run import SweepResult, sweep

__all__ = [
    "MergeResult",
    "OutDtype",
    "StackResult",
    "StackSlice",
    "SweepResult",
    "merge",
    "open_index",
    "preload",
    "probe",
    "stack",
    "sweep",
]


@dataclass(frozen=True)
class MergeResult:
    out: Path
    index: Path | None  # None for methods that need no statistics
    method: str
    params: dict[str, Any]
    per_agent: dict[str, tuple[float, ...]]
    resumed_finished: bool

    @property
    def lambdas(self) -> tuple[float, ...]:
        """RAM's lambda per agent (empty for methods without one)."""
        return self.per_agent.get("lambda", ())


def preload(backend: str = "numba") -> None:
    """Import everything a probe or merge on ``backend`` runs (for a program that wants its
    imports done up front, like the CLI before it freezes them out of the garbage collector)."""
    load_backend(backend)


def prepare(method: str, backend: str = "numba") -> Callable[[], None]:
    """Ahead of a merge with ``method`` on ``backend``, start what can run beside it: the Numba
    backend compiles the kernels the merge calls after its first in child processes while the
    merge compiles its first (only a first run after installing compiles). Returns what stops
    them; call it when the merge has ended. The CLI does this."""
    return prepare_backend(backend, method)


def probe(
    base: str | Path,
    agents: list[str] | tuple[str, ...],
    *,
    index: str | Path | None = None,
    eps: float = DEFAULT_EPS,
    allow_nonfinite: bool = False,
    agreement: bool = False,
    quantized_base_as: QuantizedBaseAs = "auto",
    options: RunOptions | None = None,
) -> IndexStore:
    """Run (or finish) the probe pass; return the complete index.

    NaN/Inf in any weight is refused unless ``allow_nonfinite`` (a non-finite task vector
    element then counts as inactive). With ``agreement``, also gather the pairwise agreement
    statistics (``IndexView.pairs``; one more read of the inputs, once). ``quantized_base_as``
    says what a quantized base's values are (docs/quantized.md): f32, its dequantized values;
    bf16 or f16, those rounded to that dtype; auto, the agents' dtype when they all share bf16
    or f16, else f32.
    """
    options = options or RunOptions()
    warm_backend(options)  # the device initialises while the family is opened
    family = open_family(
        base,
        list(agents),
        hf_cache=options.hf_cache,
        hub_timeout=options.hub_timeout,
        quantized_base_as=quantized_base_as,
    )
    backend = backend_for(options)
    executor = make_executor(backend, options)
    try:
        ctx = StatsContext(
            family,
            checked_eps(eps),
            Path(index) if index else None,
            options,
            budget_block_elems(family, options),
            executor,
            allow_nonfinite,
        )
        with _nonfinite_hint("the probe", True, allow_nonfinite):
            ctx.overlap()
            if agreement:
                ctx.compute(Agreement(ctx.store.header.eps))
        return ctx.store
    finally:
        executor.close()
        backend.close()


def merge(
    base: str | Path,
    agents: list[str] | tuple[str, ...],
    *,
    out: str | Path,
    method: str = "ram+",
    r: float | None = None,
    alpha: float | None = None,
    rho_scope: RhoScope | None = None,
    lambda_rule: Literal["paper", "script"] | None = None,
    method_options: Mapping[str, Any] | None = None,
    eps: float = DEFAULT_EPS,
    index: str | Path | None = None,
    out_dtype: OutDtype = "auto",
    shard_size: int = DEFAULT_SHARD_SIZE,
    force: bool = False,
    allow_nonfinite: bool = False,
    quantized_base_as: QuantizedBaseAs = "auto",
    options: RunOptions | None = None,
) -> MergeResult:
    """Merge ``agents`` into ``base`` with ``method``; rerunning the same call resumes it.

    ``r``, ``alpha``, ``rho_scope`` and ``lambda_rule`` are RAM's parameters; other methods take
    theirs in ``method_options`` (e.g. ``{"density": [0.2], "lambda": 1.0}``). Options a method
    would ignore are refused. ``quantized_base_as`` is ``probe``'s.
    """
    options = options or RunOptions()
    given = {"r": r, "alpha": alpha, "rho_scope": rho_scope, "lambda_rule": lambda_rule, **(method_options or {})}
    spec, params = parse_method(method, given, len(agents), allow_nonfinite)
    eps = checked_eps(eps)
    warm_backend(options)  # the device initialises while the family is opened and the output planned
    family = open_family(
        base,
        list(agents),
        min_agents=spec.min_agents,
        hf_cache=options.hf_cache,
        hub_timeout=options.hub_timeout,
        quantized_base_as=quantized_base_as,
    )
    output = plan_output(
        Path(out),
        family,
        spec,
        params,
        eps=eps,
        out_dtype=out_dtype,
        shard_size=shard_size,
        allow_nonfinite=allow_nonfinite,
    )
    output_dir.check_output_path(output.out, [m.path for m in family.members])
    output_dir.check_work_paths(output.out, Path(index) if index else None, options.cache_dir)
    backend = backend_for(options)
    executor = make_executor(backend, options)  # a cluster is reached only when a pass runs
    try:
        with output_dir.lock(output.out), _nonfinite_hint(spec.name, spec.accepts_nonfinite, allow_nonfinite):
            return _merge_into(output, family, index, force, allow_nonfinite, options, executor)
    finally:
        executor.close()
        backend.close()


@contextmanager
def _nonfinite_hint(what: str, accepts: bool, allowed: bool) -> Iterator[None]:
    """A NaN/Inf weight refused: say whether ``--allow-nonfinite`` would merge it (and how), or
    that this method cannot, so the fix is not only "repair the checkpoint"."""
    try:
        yield
    except NonFiniteWeightError as exc:
        if allowed:
            raise
        hint = (
            ", or pass --allow-nonfinite to merge it anyway (a NaN/Inf task-vector element then counts as inactive)"
            if accepts
            else f" ({what} cannot merge NaN/Inf weights, even with --allow-nonfinite)"
        )
        raise NonFiniteWeightError(f"{exc}{hint}") from exc


def _merge_into(
    output: OutputPlan,
    family: Family,
    index: str | Path | None,
    force: bool,
    allow_nonfinite: bool,
    options: RunOptions,
    executor: Executor,
) -> MergeResult:
    """The merge proper, with the output directory locked: the passes on ``executor``, then the
    finished directory."""
    spec, params, out_path = output.spec, output.params, output.out
    if output_dir.prepare(out_path, output.run, force):
        return MergeResult(out_path, None, spec.name, params.to_dict(), already_merged(out_path), True)
    work = output_dir.work_dir(out_path)
    index_path = Path(index) if index else None
    (merged,) = merge_outputs([output], work, family, index_path, allow_nonfinite, options, executor)
    if isinstance(merged, RamstreamError):  # a single merge's refusal is raised, never returned
        raise merged
    prepared, job = merged
    return MergeResult(out_path, job.index, spec.name, params.to_dict(), prepared.per_agent, False)


def stack(
    slices: Sequence[StackSlice],
    *,
    out: str | Path,
    base: str | Path | None = None,
    dtype: Literal["bf16", "f16", "f32"] | None = None,
    out_dtype: OutDtype = "auto",
    shard_size: int = DEFAULT_SHARD_SIZE,
    force: bool = False,
    options: RunOptions | None = None,
) -> StackResult:
    """Stack layer ranges of models into one model (mergekit's ``passthrough``: frankenmerges, or
    one model scaled): output layer j is layer ``start + offset`` of its slice's model, the tensors
    before the layers come from the first slice's model and those after from the last's.

    ``base`` gives the output's config.json and tokenizer files (default: the first slice's
    model); ``dtype`` is the dtype mergekit holds the tensors in (they are rounded to it, and
    scaled there), and the output's unless ``out_dtype`` says otherwise ("auto": each tensor's
    own). Rerunning a stack that was cut short starts it over; a finished one is left as it is.
    """
    return run_stack(
        slices,
        out=Path(out),
        base=base,
        dtype=dtype,
        out_dtype=out_dtype,
        shard_size=shard_size,
        force=force,
        options=options or RunOptions(),
    )


def open_index(path: str | Path) -> IndexView:
    """Open a finished index for inspection (``ramstream.open_index``); no checkpoint is read.
    The raw store stays available as ``.store``."""
    return open_index_view(path)
