"""One merge output from its settings to its finished directory, shared by ``merge`` and ``sweep``.

An output is a method, its validated parameters, the output dtypes and the run record that says
which merge the directory holds (``.ramstream/run.json`` while it runs, ``run`` in
``ramstream_merge.json`` after): built by ``plan_output``, checked against ``--out`` by
``output_dir.prepare``, and finished by ``finish_output`` (record, card, config, copied files).
A sweep's candidate runs exactly these steps, so its directory holds the bytes ``ramstream
merge`` writes with the same arguments.
"""

from __future__ import annotations

import math
import sys
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Literal

import numpy as np

from ramstream.config import RunOptions, show_size
from ramstream.errors import ConfigError, RamstreamError
from ramstream.execution.executor import Executor
from ramstream.execution.local import RESULT_SLOTS
from ramstream.format.dtypes import FP8_FLOATS, ITEMSIZE, OUT_DTYPES
from ramstream.format.family import Family
from ramstream.format.names import CONFIG_FILE
from ramstream.index import resolve
from ramstream.io.writer import ShardLayout
from ramstream.merge import fp8_out
from ramstream.merge.merge_pass import OUTPUT_FAILURES, MergeJob, run_merges, stored_block_elems
from ramstream.methods.base import MethodSpec, Prepared
from ramstream.methods.registry import get_method
from ramstream.methods.report import agent_reports
from ramstream.output import directory as output_dir
from ramstream.output.base_files import base_files
from ramstream.output.disk_space import check_free_space, output_need
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
from ramstream.statistics.base import BlockStatistic
from ramstream.statistics.context import StatsContext
from ramstream.version import __version__

OutDtype = Literal["auto", "bf16", "f16", "f32", "fp8"]
QUANTIZED_OUT_DTYPE = "BF16"  # what a quantized base tensor is written as by default
FP8_OUT_METHODS = ("fp8", "compressed-tensors")  # the schemes --out-dtype fp8 writes back


@dataclass(frozen=True)
class OutputPlan:
    """One output to merge: where, with which method and parameters, and the run record."""

    out: Path
    spec: MethodSpec
    params: Any
    dtypes: tuple[str, ...]  # per tensor, the dtype written
    run: dict[str, Any]

    @property
    def out_itemsize(self) -> int:
        """Bytes per element of its staging buffers (a tensor written in FP8 is merged into a
        float32 buffer first, then quantized into them: 4 more)."""
        fp8 = 4 if any(d in FP8_FLOATS for d in self.dtypes) else 0
        return max((ITEMSIZE[d] for d in self.dtypes), default=2) + fp8


def parse_method(
    method: str, settings: Mapping[str, Any], n_agents: int, allow_nonfinite: bool
) -> tuple[MethodSpec, Any]:
    """The method's spec and validated parameters (``ConfigError`` naming the option otherwise)."""
    spec = get_method(method)
    params = spec.parse({k: v for k, v in settings.items() if v is not None}, n_agents)
    if allow_nonfinite and not spec.accepts_nonfinite:
        raise ConfigError(
            f"--allow-nonfinite is not supported by --method {method} (its magnitude ranks would treat "
            "NaN/Inf as the largest updates); fix the checkpoint or use another method"
        )
    return spec, params


def plan_output(
    out: Path,
    family: Family,
    spec: MethodSpec,
    params: Any,
    *,
    eps: float,
    out_dtype: OutDtype,
    shard_size: int,
    allow_nonfinite: bool,
) -> OutputPlan:
    """The output's dtypes and run record; a broken base config.json or tokenizer file is refused
    now, not after the merge pass."""
    if spec.check is not None:
        spec.check(params, list(family.base.tensors))
    dtypes = out_dtypes(family, out_dtype)
    merged_config(base_files(family.base).config, family, dtypes)
    run = {
        "inputs": resolve.family_key(family, eps),
        "method": spec.name,
        "params": params.to_dict(),
        "eps": eps,
        "out_dtype": out_dtype,
        "shard_size": shard_size,
        "output_layout": 2,  # one shard is model.safetensors: an older unfinished merge named it otherwise
        "ramstream_version": __version__,
        **({"allow_nonfinite": True} if allow_nonfinite else {}),
        **({"quantized_base_as": family.quantized_base_as} if family.base.quantized else {}),
    }
    return OutputPlan(out, spec, params, dtypes, run)


def shard_layout(output: OutputPlan, plan: Plan, family: Family) -> ShardLayout:
    """The output's tensors in the shards; a tensor written in FP8 is followed by its scales (the
    base's scale tensor: its name, dtype and shape), and an output in FP8 ends with the base's
    static activation scales."""
    entries: list[tuple[str, str, tuple[int, ...], int]] = []
    for dtype, t in zip(output.dtypes, plan.tensors, strict=True):
        entries.append((t.name, dtype, t.shape, t.numel * ITEMSIZE[dtype]))
        if dtype in FP8_FLOATS:
            fp8 = fp8_out.Fp8Tensor.like(family.base.quantized[t.name])
            entries.append((fp8.scale_name, fp8.scale_dtype, fp8.scale_shape, fp8.scale_nbytes))
    if any(d in FP8_FLOATS for d in output.dtypes):  # the scheme's static activation scales, as the base has them
        for name, ref in family.base.activation_scales.items():
            entries.append((name, ref.entry.dtype, ref.entry.shape, ref.entry.nbytes))
    return plan_shards(entries, int(output.run["shard_size"]))


def fp8_bands(outputs: Sequence[OutputPlan], family: Family) -> dict[str, int]:
    """Per tensor some output writes in FP8, the rows of a band of its scales (a block holds whole bands)."""
    names = list(family.base.tensors)
    return {
        names[t]: family.base.quantized[names[t]].block[0]
        for o in outputs
        for t, d in enumerate(o.dtypes)
        if d in FP8_FLOATS
    }


def merge_job(
    output: OutputPlan, plan: Plan, layout: ShardLayout, prepared: Prepared, ctx: StatsContext, allow_nonfinite: bool
) -> MergeJob:
    """What the merge pass computes and writes for this output."""
    index_path = ctx.store.path if ctx.used_index else None
    return MergeJob(
        ctx.family,
        plan,
        prepared.merge_block,
        output.dtypes,
        layout,
        index=index_path,
        check_nonfinite=not allow_nonfinite and not ctx.checked_nonfinite,
        task_vectors=output.spec.task_vectors,
        fused=prepared.fused,
    )


def already_merged(out: Path) -> dict[str, tuple[float, ...]]:
    """An output finished by an earlier run: its per-agent values (what it lacks is said again)."""
    record = output_dir.finished_record(out) or {}
    warn_missing(out, record)
    values = {k: tuple(v) for k, v in record.get("per_agent", {}).items()}
    order = record.get("per_agent_order")  # the record's JSON sorts its keys: the method's order, as merged said
    if isinstance(order, list) and sorted(map(str, order)) == sorted(values):
        return {k: values[k] for k in order}
    return values


# What stops one output of several (a sweep's candidate) and not the others: its method's refusal
# of the values, in ``prepare`` or in the merge pass.
CANDIDATE_FAILURES: tuple[type[RamstreamError], ...] = (ConfigError, *OUTPUT_FAILURES)


def merge_outputs(
    outputs: Sequence[OutputPlan],
    journal_dir: Path,
    family: Family,
    index: Path | None,
    allow_nonfinite: bool,
    options: RunOptions,
    executor: Executor,
    names: Sequence[str] | None = None,
) -> list[tuple[Prepared, MergeJob] | RamstreamError]:
    """Merge and finish ``outputs`` (prepared in their directories) from one read of the inputs:
    each method prepares on a statistics context of its own, as a merge of it alone would (whether
    it used the index decides its card and its input checks; the statistics themselves are shared
    through the index, and those known ahead are computed in one pass), then one merge pass writes
    them all, its journal in ``journal_dir`` (``names``: the outputs it marks for, a sweep's; None
    for a plain merge). Of a sweep's outputs, one whose method refuses the values (in ``prepare``:
    a ``ConfigError``; in the pass: ``OUTPUT_FAILURES``) is that output's failure, returned in its
    place (its directory left unfinished); the others are merged and finished."""
    eps = float(outputs[0].run["eps"])
    record_start(outputs, journal_dir, family, eps, index, options.cache_dir)
    contexts = [
        StatsContext(family, eps, index, options, budget_block_elems(family, options), executor, allow_nonfinite)
        for _ in outputs
    ]
    # K outputs' staging buffers share the budget, RESULT_SLOTS of each (a batch staged while
    # earlier ones are still being written): a sweep of 6 holds 18 where a merge holds 3.
    itemsize = RESULT_SLOTS * sum(o.out_itemsize for o in outputs)
    block_elems = merge_block_elems(journal_dir, family, options, itemsize)
    bands = fp8_bands(outputs, family)
    plan = make_plan(family, block_elems, row_aligned=any(o.spec.row_aligned for o in outputs), bands=bands)
    for o in outputs:
        check_rows_fit(plan, o.spec, family, options, itemsize)  # before any pass: della's blocks hold rows
    check_bands_fit(plan, bands, family, options, itemsize)
    layouts = [shard_layout(o, plan, family) for o in outputs]
    works = [output_dir.work_dir(o.out) for o in outputs]
    copied = base_files(family.base).copied
    check_free_space(
        [output_need(o.out, w, lay, copied) for o, w, lay in zip(outputs, works, layouts, strict=True)],
        "the merged model" if names is None else f"{len(outputs)} candidates",
    )
    if len(outputs) > 1:
        compute_ahead(outputs, contexts)
    isolate = names is not None  # a sweep: even one candidate left fails as a candidate
    results: list[tuple[Prepared, MergeJob] | RamstreamError] = []
    for o, ctx, lay in zip(outputs, contexts, layouts, strict=True):
        try:
            prepared = o.spec.prepare(o.params, ctx)
        except CANDIDATE_FAILURES as exc:
            if not isolate:
                raise
            results.append(exc)
            continue
        results.append((prepared, merge_job(o, plan, lay, prepared, ctx, allow_nonfinite)))
    alive = [(k, r[1]) for k, r in enumerate(results) if not isinstance(r, RamstreamError)]
    if alive:
        jobs, at = [job for _, job in alive], [k for k, _ in alive]
        alive_names = [names[k] for k in at] if names is not None else None
        failed = run_merges(jobs, [works[k] for k in at], journal_dir, executor, options.quiet, alive_names)
        for i, reason in failed.items():
            results[at[i]] = reason
    for o, result, ctx, work in zip(outputs, results, contexts, works, strict=True):
        if not isinstance(result, RamstreamError):
            finish_output(o, result[1], result[0], ctx, work)
    return results


def record_start(
    outputs: Sequence[OutputPlan], journal_dir: Path, family: Family, eps: float, index: Path | None, cache_dir: Path
) -> None:
    """Say, in the journal's work area and each output's, where the index the passes read is (the
    probe fills it first) and what the inputs are: ``ramstream status`` finds the index before
    the merge pass has begun, and a refused rerun names the input that changed."""
    where = resolve.index_path(family, eps, index, cache_dir)
    key = resolve.family_key(family, eps)
    for work in dict.fromkeys([journal_dir, *(output_dir.work_dir(o.out) for o in outputs)]):
        output_dir.record_start(work, family.fingerprints(), where, key)


def compute_ahead(outputs: Sequence[OutputPlan], contexts: Sequence[StatsContext]) -> None:
    """The statistics the outputs' methods will ask for that are known before they prepare (TIES'
    and breadcrumbs' low histograms, then their tie boundaries, one per density), computed in one
    pass per stage, each under its own key: each method then reads its own back, as its merge
    alone would have computed it. A stage's statistics name the next stage's, so the methods are
    asked again until they name nothing new."""
    asked: set[str] = set()
    while True:
        wanted: dict[str, BlockStatistic] = {}
        first: StatsContext | None = None
        for output, ctx in zip(outputs, contexts, strict=True):
            ahead = output.spec.statistics_ahead
            stats = ahead(output.params, ctx) if ahead is not None else ()
            if stats and first is None:
                first = ctx  # a context that uses the index anyway: asking did not change its card
            wanted.update((s.key, s) for s in stats if s.key not in wanted)
        if first is None or set(wanted) <= asked:
            return
        asked |= set(wanted)
        first.compute(*wanted.values())
        for ctx in contexts:  # the next stage's questions read what this one stored
            if ctx is not first:
                ctx.refresh()


def finish_output(output: OutputPlan, job: MergeJob, prepared: Prepared, ctx: StatsContext, work: Path) -> None:
    """Write the finished directory from the merged partial shards in ``work``: the record, the
    card, the config and the base's copied files, then say what it lacks."""
    family = ctx.family
    files = base_files(family.base)  # again: what the output holds is what is there now
    record = {
        "run": output.run,
        "method": output.spec.name,
        "params": output.params.to_dict(),
        "per_agent": {k: list(v) for k, v in prepared.per_agent.items()},
        "per_agent_order": list(prepared.per_agent),
        "agents": list(family.agent_names),
        "eps": output.run["eps"],
        "inputs": family.fingerprints(),
        "missing": list(files.missing),
        **({"missing_because": files.why(family.base)} if files.missing else {}),
        "ramstream_version": __version__,
    }
    # The card reports the agents' overlap when the method itself read it: a card that depended on
    # whether some earlier run had probed the cached index would make equal arguments write other bytes.
    reports = agent_reports(ctx.store, ctx.overlap()) if ctx.asked_overlap else []
    output_dir.finalize(
        output.out,
        job.layout,
        {n: work / f"{n}.partial" for n in job.layout.names},
        files.copied,
        merged_config(files.config, family, output.dtypes),
        model_card(family, record, reports),
        record,
    )
    warn_missing(output.out, record)


def warn_missing(out: Path, record: Mapping[str, Any]) -> None:
    """Say on stderr when a finished output has no config.json (it is then no model transformers
    loads), with anything else it lacks; the card and the record say it too. Tokenizer files
    alone are not warned about: many checkpoints are saved without them and load as models."""
    missing = record.get("missing") or []
    if CONFIG_FILE in missing:
        print(
            f"warning: {out} has no {' and no '.join(missing)} ({record.get('missing_because')}); add "
            f"{'them' if len(missing) > 1 else 'one'} before loading it with transformers",
            file=sys.stderr,
            flush=True,  # the last line of the run: written now, not whenever the stream is flushed
        )


def merge_block_elems(work: Path, family: Family, options: RunOptions, out_itemsize: int) -> int:
    """The merge's block size: what the budget allows, or an unfinished merge's own when it is no
    larger (its journal marks blocks of that size). A larger one would break the budget (the
    rerun after an out-of-memory kill, with a smaller --memory): its blocks start over, saying so."""
    budget = budget_block_elems(family, options, out_itemsize)
    stored = stored_block_elems(work)
    if stored is None or stored <= budget:
        return stored or budget
    print(
        f"note: the unfinished merge in {work.parent} used blocks of {stored} elements, more than --memory "
        f"allows now ({budget}); its blocks start over at the smaller size",
        file=sys.stderr,
    )
    return budget


def check_rows_fit(plan: Plan, spec: MethodSpec, family: Family, options: RunOptions, out_itemsize: int) -> None:
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
                f"elements need more than --memory {show_size(options.memory)}; pass --memory "
                f"{_mib(memory_for(row_elements(t), per_element))} or more"
            )


def check_bands_fit(plan: Plan, bands: dict[str, int], family: Family, options: RunOptions, out_itemsize: int) -> None:
    """A tensor written in FP8 holds a band of its scales' rows per block (a per-tensor scale: the
    whole tensor): refuse a band the budget cannot hold, naming the tensor and the --memory that
    would do."""
    if not bands or options.block_elems is not None:
        return
    per_element = bytes_per_element(family, out_itemsize)
    fits = elements_within(options.memory, per_element)
    for t in plan.tensors:
        rows = min(bands.get(t.name, 0), t.shape[0] if t.shape else 1)
        band = row_elements(t) * rows
        if band > fits:
            one_scale = math.prod(family.base.quantized[t.name].scale.entry.shape) == 1
            what = (
                f"one scale for the whole tensor, so a block holds all its {band} elements, which need"
                if one_scale
                else f"a scale per {bands[t.name]} rows, and a band of {band} elements needs"
            )
            raise ConfigError(
                f"tensor {t.name!r}: --out-dtype fp8 writes {what} more than --memory "
                f"{show_size(options.memory)}; pass --memory {_mib(memory_for(band, per_element))} or more"
            )


def _mib(nbytes: int) -> str:
    """``nbytes`` rounded up to whole MiB (a budget to suggest)."""
    return f"{-(-nbytes // (1 << 20))}MiB"


def out_dtypes(family: Family, out_dtype: OutDtype) -> tuple[str, ...]:
    if out_dtype not in ("auto", "fp8") and out_dtype not in OUT_DTYPES:
        raise ConfigError(f"--out-dtype must be one of auto, {', '.join(OUT_DTYPES)}, fp8; got {out_dtype!r}")
    if out_dtype == "fp8":
        return _fp8_dtypes(family)
    chosen = OUT_DTYPES.get(out_dtype)
    result = []
    for name, ref in family.base.tensors.items():
        dtype = ref.entry.dtype
        if name in family.base.quantized:  # written dequantized: bf16 unless told otherwise (docs/quantized.md)
            result.append(chosen or QUANTIZED_OUT_DTYPE)
        else:
            result.append(chosen if chosen and dtype in ("BF16", "F16", "F32", "F64") else dtype)
    return tuple(result)


def _fp8_dtypes(family: Family) -> tuple[str, ...]:
    """``--out-dtype fp8``: the tensors the base stores in FP8 written in its scheme, the others as
    the base stores them; for a base of the fp8 scheme (block scales, ``_scale_inv``) or of
    compressed-tensors' FP8 (``_scale`` per tensor, channel or block)."""
    base = family.base
    if base.scheme is None or base.scheme.method not in FP8_OUT_METHODS:
        stored = "is not stored quantized" if base.scheme is None else f"is stored in {base.scheme.summary}"
        raise ConfigError(
            f"--out-dtype fp8 writes the merge in the base's own FP8 scheme (quant_method fp8, or "
            f"compressed-tensors float-quantized), but the base {base.path} {stored}; use --out-dtype bf16"
        )
    return tuple(
        base.quantized[name].weight.entry.dtype if name in base.quantized else ref.entry.dtype
        for name, ref in base.tensors.items()
    )


def budget_block_elems(family: Family, options: RunOptions, out_itemsize: int = 0) -> int:
    """The block size ``--memory`` allows (or ``options.block_elems`` when set)."""
    if options.block_elems is not None:
        return options.block_elems
    return block_elems_for(options.memory, bytes_per_element(family, out_itemsize))


def checked_eps(eps: float) -> float:
    if not np.isfinite(eps) or eps < 0:
        raise ConfigError(f"--eps must be a finite number >= 0, got {eps}")
    return float(eps)
