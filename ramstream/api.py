"""The Python API: the verbs of the CLI (probe, merge, inspect) over plain arguments."""

from __future__ import annotations

import sys
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Literal

import numpy as np

from ramstream.backends.base import Backend
from ramstream.backends.registry import load_backend, make_backend
from ramstream.config import DEFAULT_EPS, DEFAULT_SHARD_SIZE, RunOptions
from ramstream.errors import ConfigError
from ramstream.execution.executor import Executor
from ramstream.execution.registry import make_executor
from ramstream.format.dtypes import ITEMSIZE, OUT_DTYPES
from ramstream.format.family import Family, open_family
from ramstream.index import resolve
from ramstream.index.store import IndexStore
from ramstream.inspect.view import IndexView
from ramstream.inspect.view import open_index as open_index_view
from ramstream.merge.merge_pass import MergeJob, run_merge, stored_block_elems
from ramstream.methods.base import MethodSpec
from ramstream.methods.ram import RhoScope
from ramstream.methods.registry import get_method
from ramstream.methods.report import agent_reports
from ramstream.output import directory as output_dir
from ramstream.output.hf_config import merged_config
from ramstream.output.model_card import model_card
from ramstream.output.shards import plan_shards
from ramstream.plan import (
    Plan,
    block_elems_for,
    bytes_per_element,
    elements_within,
    make_plan,
    memory_for,
    row_elements,
)
from ramstream.statistics.context import StatsContext
from ramstream.version import __version__

OutDtype = Literal["auto", "bf16", "f16", "f32"]


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


def _backend(options: RunOptions) -> Backend:
    """The run's compute backend, with its thread count (scoped to its own calls) and device."""
    return make_backend(options.backend, options.threads, options.device, options.gpu_memory, options.memory)


def preload(backend: str = "numba") -> None:
    """Import everything a probe or merge on ``backend`` runs (for a program that wants its
    imports done up front, like the CLI before it freezes them out of the garbage collector)."""
    load_backend(backend)


def _block_elems(family: Family, options: RunOptions, out_itemsize: int = 0) -> int:
    if options.block_elems is not None:
        return options.block_elems
    return block_elems_for(options.memory, bytes_per_element(family, out_itemsize))


def _eps(eps: float) -> float:
    if not np.isfinite(eps) or eps < 0:
        raise ConfigError(f"--eps must be a finite number >= 0, got {eps}")
    return float(eps)


def probe(
    base: str | Path,
    agents: list[str] | tuple[str, ...],
    *,
    index: str | Path | None = None,
    eps: float = DEFAULT_EPS,
    allow_nonfinite: bool = False,
    options: RunOptions | None = None,
) -> IndexStore:
    """Run (or finish) the probe pass; return the complete index.

    NaN/Inf in any weight is refused unless ``allow_nonfinite`` (a non-finite task vector
    element then counts as inactive).
    """
    options = options or RunOptions()
    family = open_family(base, list(agents), hf_cache=options.hf_cache, hub_timeout=options.hub_timeout)
    backend = _backend(options)
    executor = make_executor(backend, options)
    try:
        ctx = StatsContext(
            family,
            _eps(eps),
            Path(index) if index else None,
            options,
            _block_elems(family, options),
            executor,
            allow_nonfinite,
        )
        ctx.overlap()
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
    options: RunOptions | None = None,
) -> MergeResult:
    """Merge ``agents`` into ``base`` with ``method``; rerunning the same call resumes it.

    ``r``, ``alpha``, ``rho_scope`` and ``lambda_rule`` are RAM's parameters; other methods take
    theirs in ``method_options`` (e.g. ``{"density": [0.2], "lambda": 1.0}``). Options a method
    would ignore are refused.
    """
    options = options or RunOptions()
    spec = get_method(method)
    given = {"r": r, "alpha": alpha, "rho_scope": rho_scope, "lambda_rule": lambda_rule, **(method_options or {})}
    params = spec.parse({k: v for k, v in given.items() if v is not None}, len(agents))
    if allow_nonfinite and not spec.accepts_nonfinite:
        raise ConfigError(
            f"--allow-nonfinite is not supported by --method {method} (its magnitude ranks would treat "
            "NaN/Inf as the largest updates); fix the checkpoint or use another method"
        )
    eps = _eps(eps)
    family = open_family(
        base, list(agents), min_agents=spec.min_agents, hf_cache=options.hf_cache, hub_timeout=options.hub_timeout
    )
    out_path = Path(out)
    dtypes = _out_dtypes(family, out_dtype)
    merged_config(family, dtypes)  # a broken base config.json is refused now, not after the merge pass
    run = {
        "inputs": resolve.family_key(family, eps),
        "method": method,
        "params": params.to_dict(),
        "eps": eps,
        "out_dtype": out_dtype,
        "shard_size": shard_size,
        "output_layout": 2,  # one shard is model.safetensors: an older unfinished merge named it otherwise
        "ramstream_version": __version__,
        **({"allow_nonfinite": True} if allow_nonfinite else {}),
    }
    output_dir.check_output_path(out_path, [m.path for m in family.members])
    backend = _backend(options)
    executor = make_executor(backend, options)  # a cluster is reached only when a pass runs
    try:
        with output_dir.lock(out_path):
            return _merge_into(
                out_path,
                spec,
                params,
                family,
                run,
                dtypes,
                eps,
                index,
                shard_size,
                force,
                allow_nonfinite,
                options,
                executor,
            )
    finally:
        executor.close()
        backend.close()


def _merge_into(
    out_path: Path,
    spec: MethodSpec,
    params: Any,
    family: Family,
    run: dict[str, Any],
    dtypes: tuple[str, ...],
    eps: float,
    index: str | Path | None,
    shard_size: int,
    force: bool,
    allow_nonfinite: bool,
    options: RunOptions,
    executor: Executor,
) -> MergeResult:
    """The merge proper, with the output directory locked: the passes on ``executor``, then the
    finished directory."""
    method = spec.name
    if output_dir.prepare(out_path, run, force):
        record = output_dir.finished_record(out_path) or {}
        per_agent = {k: tuple(v) for k, v in record.get("per_agent", {}).items()}
        return MergeResult(out_path, None, method, params.to_dict(), per_agent, True)
    ctx = StatsContext(
        family, eps, Path(index) if index else None, options, _block_elems(family, options), executor, allow_nonfinite
    )
    work = output_dir.work_dir(out_path)
    out_itemsize = max((ITEMSIZE[d] for d in dtypes), default=2)
    block_elems = _merge_block_elems(work, family, options, out_itemsize)
    plan = make_plan(family, block_elems, row_aligned=spec.row_aligned)
    _check_rows_fit(plan, spec, family, options, out_itemsize)  # before any pass: della's blocks hold whole rows
    prepared = spec.prepare(params, ctx)
    layout = plan_shards(
        [(t.name, dtypes[i], t.shape, t.numel * ITEMSIZE[dtypes[i]]) for i, t in enumerate(plan.tensors)],
        shard_size,
    )
    index_path = ctx.store.path if ctx.used_index else None
    check = not allow_nonfinite and not ctx.checked_nonfinite
    job = MergeJob(family, plan, prepared.merge_block, dtypes, layout, index=index_path, check_nonfinite=check)
    run_merge(job, work, executor, options.quiet)
    record = {
        "run": run,
        "method": method,
        "params": params.to_dict(),
        "per_agent": {k: list(v) for k, v in prepared.per_agent.items()},
        "agents": list(family.agent_names),
        "eps": eps,
        "inputs": family.fingerprints(),
        "ramstream_version": __version__,
    }
    reports = agent_reports(ctx.store, ctx.overlap()) if ctx.used_index and ctx.store.probe_complete() else []
    output_dir.finalize(
        out_path,
        layout,
        {n: work / f"{n}.partial" for n in layout.names},
        family.base.directory,
        merged_config(family, dtypes),
        model_card(family, record, reports),
        record,
    )
    return MergeResult(out_path, index_path, method, params.to_dict(), prepared.per_agent, False)


def _merge_block_elems(work: Path, family: Family, options: RunOptions, out_itemsize: int) -> int:
    """The merge's block size: what the budget allows, or an unfinished merge's own when it is no
    larger (its journal marks blocks of that size). A larger one would break the budget (the
    rerun after an out-of-memory kill, with a smaller --memory): its blocks start over, saying so."""
    budget = _block_elems(family, options, out_itemsize)
    stored = stored_block_elems(work)
    if stored is None or stored <= budget:
        return stored or budget
    print(
        f"note: the unfinished merge in {work.parent} used blocks of {stored} elements, more than --memory "
        f"allows now ({budget}); its blocks start over at the smaller size",
        file=sys.stderr,
    )
    return budget


def _check_rows_fit(plan: Plan, spec: MethodSpec, family: Family, options: RunOptions, out_itemsize: int) -> None:
    """A method that ranks whole rows (della) holds a row per block: refuse a row the budget
    cannot hold, naming the tensor and the --memory that would do."""
    if not spec.row_aligned or options.block_elems is not None:
        return
    per_element = bytes_per_element(family, out_itemsize)
    fits = elements_within(options.memory, per_element)
    for t in plan.tensors:
        if t.merged and row_elements(t) > fits:
            raise ConfigError(
                f"tensor {t.name!r}: --method {spec.name} ranks whole rows, and its rows of {row_elements(t)} "
                f"elements need more than --memory {_mib(options.memory)}; pass --memory "
                f"{_mib(memory_for(row_elements(t), per_element))} or more"
            )


def _mib(nbytes: int) -> str:
    return f"{-(-nbytes // (1 << 20))}MiB"


def _out_dtypes(family: Family, out_dtype: OutDtype) -> tuple[str, ...]:
    if out_dtype != "auto" and out_dtype not in OUT_DTYPES:
        raise ConfigError(f"--out-dtype must be one of auto, {', '.join(OUT_DTYPES)}; got {out_dtype!r}")
    chosen = OUT_DTYPES.get(out_dtype)
    result = []
    for ref in family.base.tensors.values():
        dtype = ref.entry.dtype
        result.append(chosen if chosen and dtype in ("BF16", "F16", "F32", "F64") else dtype)
    return tuple(result)


def open_index(path: str | Path) -> IndexView:
    """Open a finished index for inspection (``ramstream.open_index``); no checkpoint is read.
    The raw store stays available as ``.store``."""
    return open_index_view(path)
