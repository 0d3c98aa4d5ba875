"""A stack of layers (mergekit's ``passthrough``: frankenmerges, or one model scaled) from its
slices to its finished directory.

The slices' models are opened (each once), the output planned and checked (``stack_plan``), then
written through the machinery merges use: ``output_dir.prepare`` checks ``--out`` against the run
record (the same stack finished: left as it is; cut short: started over; anything else there:
``--force``), the shards are laid out up front and filled at their offsets under
``<out>/.ramstream/``, and ``output_dir.finalize`` moves them into place, writes the copied files,
the card, ``config.json`` and the record last: nothing in ``--out`` looks finished before that.

Tensors are copied a piece at a time, pieces batched up to a size ``--memory`` allows (one data
sync per batch): their bytes as they are, or, when a tensor is scaled or changes dtype, decoded to
float32, rounded to ``dtype`` (mergekit holds the tensor there), multiplied by the scale in
float32, rounded to that dtype again and encoded to the output's. No tensor is ever held whole.
"""

from __future__ import annotations

from collections.abc import Iterator, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np

from ramstream.config import RunOptions
from ramstream.errors import ConfigError
from ramstream.execution.progress import Progress
from ramstream.format.checkpoint import Checkpoint, open_checkpoint
from ramstream.format.codecs import decode, encode
from ramstream.format.dtypes import FLOAT_CODES, ITEMSIZE, OUT_DTYPES, RAW_CARRIER
from ramstream.format.fingerprint import checkpoint_fingerprint, content_key
from ramstream.format.hub import HubAccess
from ramstream.format.names import CONFIG_FILE
from ramstream.io.direct import ALIGN
from ramstream.io.reader import InputFiles
from ramstream.io.writer import Run, ShardLayout, ShardWriter
from ramstream.mergekit_config import StackSlice
from ramstream.output import directory as output_dir
from ramstream.output.base_files import base_files
from ramstream.output.disk_space import check_free_space, output_need
from ramstream.output.hf_config import read_config, stacked_config
from ramstream.output.model_card import stack_card
from ramstream.output.shards import plan_shards
from ramstream.plan import block_elems_for
from ramstream.runs.output import warn_missing
from ramstream.runs.stack_plan import StackPlan, StackTensor, plan_stack
from ramstream.version import __version__

# Bytes held per element of a batch: the staged output (<= 8), the mapped input (<= 8), and one
# piece's float32 values and the temporaries of rounding and encoding.
BYTES_PER_ELEMENT = 32


@dataclass(frozen=True)
class StackResult:
    out: Path
    layers: int  # in the output
    slices: int
    resumed_finished: bool  # the same stack was already finished there


def run_stack(
    slices: Sequence[StackSlice],
    *,
    out: Path,
    base: str | Path | None,
    dtype: str | None,
    out_dtype: str,
    shard_size: int,
    force: bool,
    options: RunOptions,
) -> StackResult:
    """Stack ``slices`` into ``out`` (``base``: the model whose config.json and tokenizer files the
    output takes; None: the first slice's)."""
    if not slices:
        raise ConfigError("a stack needs at least one slice")
    if dtype is not None and dtype not in OUT_DTYPES:
        raise ConfigError(f"dtype must be one of {', '.join(OUT_DTYPES)}, got {dtype!r}")
    if out_dtype != "auto" and out_dtype not in OUT_DTYPES:
        raise ConfigError(f"--out-dtype must be one of auto, {', '.join(OUT_DTYPES)}; got {out_dtype!r}")
    opened = _Opened(HubAccess(options.hf_cache, options.hub_timeout))
    models = [opened.get(s.model) for s in slices]
    base_ckpt = models[0] if base is None else opened.get(base)
    configs = {id(c): _config_of(c) for c in opened.members}
    plan = plan_stack(slices, models, [configs[id(m)] for m in models], dtype, out_dtype)
    stacked_config(base_files(base_ckpt).config, plan.layers, _elements(plan))  # a broken config.json: refused now
    record_slices = [
        {"model": str(s.model), "layers": list(r), "output_start": sum(b - a for a, b in plan.ranges[:k]), "scale": sc}
        for k, (s, r, sc) in enumerate(zip(slices, plan.ranges, plan.scales, strict=True))
    ]
    params = {"dtype": dtype, "out_dtype": out_dtype}
    fingerprints = [checkpoint_fingerprint(c) for c in opened.members]
    key = content_key(fingerprints, {})
    run = {
        "method": "passthrough",
        "inputs": key,
        "slices": record_slices,
        "base": None if base is None else str(base),
        **params,
        "shard_size": shard_size,
        "output_layout": 2,
        "ramstream_version": __version__,
    }
    output_dir.check_output_path(out, [c.path for c in opened.members])
    output_dir.check_work_paths(out, None, options.cache_dir)
    result = StackResult(out, len(plan.layers), len(slices), False)
    with output_dir.lock(out):
        if output_dir.prepare(out, run, force):
            warn_missing(out, output_dir.finished_record(out) or {})
            return StackResult(out, result.layers, result.slices, True)
        work = output_dir.work_dir(out)
        output_dir.record_start(work, fingerprints, None, key)  # a refused rerun names a changed model
        layout = plan_shards(
            [(t.name, t.dtype, t.source.entry.shape, t.source.entry.numel * ITEMSIZE[t.dtype]) for t in plan.tensors],
            shard_size,
        )
        files = base_files(base_ckpt)
        check_free_space([output_need(out, work, layout, files.copied)], "the stacked model")
        _write(plan, layout, work, options)
        files = base_files(base_ckpt)  # again: what the output holds is what is there now
        record = {
            "run": run,
            "method": "passthrough",
            "slices": record_slices,
            "params": params,
            "inputs": fingerprints,
            "missing": list(files.missing),
            **({"missing_because": files.why(base_ckpt)} if files.missing else {}),
            "ramstream_version": __version__,
        }
        output_dir.finalize(
            out,
            layout,
            {n: work / f"{n}.partial" for n in layout.names},
            files.copied,
            stacked_config(files.config, plan.layers, _elements(plan)),
            stack_card(opened.members, record),
            record,
        )
    warn_missing(out, record)
    return result


class _Opened:
    """Checkpoints opened once each, however often the slices name them."""

    def __init__(self, hub: HubAccess) -> None:
        self.hub = hub
        self.by_name: dict[str, Checkpoint] = {}
        self.by_path: dict[Path, Checkpoint] = {}

    def get(self, model: str | Path) -> Checkpoint:
        key = str(model)
        if key not in self.by_name:
            checkpoint = open_checkpoint(model, self.hub)
            self.by_name[key] = self.by_path.setdefault(checkpoint.path, checkpoint)
        return self.by_name[key]

    @property
    def members(self) -> list[Checkpoint]:
        return list(self.by_path.values())


def _config_of(checkpoint: Checkpoint) -> dict[str, Any] | None:
    """The model's config.json (its layer count and per-layer lists), None when it has none."""
    if checkpoint.directory is None or not (checkpoint.directory / CONFIG_FILE).is_file():
        return None
    return read_config(checkpoint.directory / CONFIG_FILE)


def _elements(plan: StackPlan) -> dict[str, int]:
    elements: dict[str, int] = {}
    for t in plan.tensors:
        elements[t.dtype] = elements.get(t.dtype, 0) + t.source.entry.numel
    return elements


def _write(plan: StackPlan, layout: ShardLayout, work: Path, options: RunOptions) -> None:
    """Every tensor of ``plan`` into the partial shards in ``work``, a batch at a time."""
    budget = options.block_elems or block_elems_for(options.memory, BYTES_PER_ELEMENT)
    total = sum(t.source.entry.nbytes for t in plan.tensors)
    progress = Progress.for_terminal("stack", total, options.quiet)
    writer = ShardWriter(layout, work)
    try:
        with InputFiles() as inputs:
            for batch in _batches(plan.tensors, budget):
                runs = [_run(writer, t, lo, hi) for t, lo, hi in batch]
                staged = writer.staging_runs(0, runs)
                for (t, lo, hi), view in zip(batch, staged, strict=True):
                    _fill(view, inputs, t, lo, hi)
                writer.write_runs(list(zip(runs, staged, strict=True)))
                for t, lo, hi in batch:
                    inputs.release(t.source, lo, hi)
                    progress.advance((hi - lo) * ITEMSIZE[t.source.entry.dtype])
    finally:
        writer.close()
        progress.close()


def _run(writer: ShardWriter, t: StackTensor, lo: int, hi: int) -> Run:
    size = ITEMSIZE[t.dtype]
    return writer.run_of(t.name, lo * size, (hi - lo) * size, size)


def _batches(tensors: Sequence[StackTensor], budget: int) -> Iterator[list[tuple[StackTensor, int, int]]]:
    """Pieces ``(tensor, first element, end)`` of at most ``budget`` elements, grouped in batches
    that hold at most ``budget`` elements' bytes, counting each piece's alignment in the staging
    buffer (a batch of thousands of small tensors, an MoE's experts, would otherwise outgrow it)."""
    limit = budget * BYTES_PER_ELEMENT
    batch: list[tuple[StackTensor, int, int]] = []
    held = 0
    for t in tensors:
        numel = t.source.entry.numel
        for lo in range(0, numel, budget):
            hi = min(lo + budget, numel)
            cost = (hi - lo) * BYTES_PER_ELEMENT + ALIGN
            if batch and held + cost > limit:
                yield batch
                batch, held = [], 0
            batch.append((t, lo, hi))
            held += cost
    if batch:
        yield batch


def _fill(view: np.ndarray, inputs: InputFiles, t: StackTensor, lo: int, hi: int) -> None:
    """Elements ``[lo, hi)`` of ``t`` as written, into the staged bytes ``view``."""
    src = t.source.entry.dtype
    if t.copied:
        size = ITEMSIZE[src]
        view[:] = np.frombuffer(inputs.byte_range(t.source, lo * size, hi * size), np.uint8)
        return
    values = decode(inputs.float_view(t.source, lo, hi), FLOAT_CODES[src])
    held = t.work or src  # the dtype mergekit holds the tensor in, and scales it in
    if held != src:
        values = _rounded(values, held)
    if t.scale is not None:
        values = values * np.float32(t.scale)
        if held != t.dtype:  # else the encoding below is that rounding
            values = _rounded(values, held)
    out = FLOAT_CODES[t.dtype]
    view.view(RAW_CARRIER[out])[:] = encode(values, out)


def _rounded(values: np.ndarray, dtype: str) -> np.ndarray:
    """float32 ``values`` rounded to ``dtype`` (to nearest, ties to even), as float32."""
    if dtype in ("BF16", "F16"):
        code = FLOAT_CODES[dtype]
        return decode(encode(values, code), code)
    return values
