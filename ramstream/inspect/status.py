"""``ramstream status``: how far the passes over an index or an output directory have got.

Read from what the passes persist, never from the checkpoints: the probe's journal
(``progress/probe`` in the index, and its ``probe`` attribute), each statistics pass's
(``progress/<key>``: TIES's histograms, the agreement, ...; ``stats/<key>`` in the report), the merge's journal
(``<out>/.ramstream/journal``: array ``merge``, attributes ``block_elems`` and ``index``),
``run.json`` and ``started.json`` (where the index is, written as the passes begin: a merge or a
sweep stopped in its probe is found there); a finished merge from ``ramstream_merge.json``. Both
journals keep the throughput of their last run (attribute ``rate``), which gives the ETA. Bytes
are input bytes (base plus every agent), as in the progress line of the passes.
"""

from __future__ import annotations

import json
import math
import time
from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Literal, TypeGuard

import numpy as np
import zarr

from ramstream.config import BLOCK_QUANTUM
from ramstream.errors import IndexMismatchError, OutputError, RamstreamError
from ramstream.format.dtypes import ITEMSIZE
from ramstream.index.guard import store_io
from ramstream.index.header import MAX_BLOCK_ELEMS, DamagedRecord, read_inputs
from ramstream.index.journal import Journal
from ramstream.index.store import IndexStore, open_index_store
from ramstream.output import directory as output_dir
from ramstream.plan import Batch, Plan, plan_from_tensors

STATUS_SCHEMA = 1
OWN_RUN = "last run of this pass"  # where a statistics pass's rate comes from
State = Literal["done", "partial", "not started"]


@dataclass(frozen=True)
class PassStatus:
    name: str  # "probe", "merge", or a statistic's array: "stats/<key>"
    state: State
    blocks_done: int | None
    blocks_total: int | None
    bytes_done: int | None
    bytes_total: int | None
    rate: float | None = None  # input bytes per second of the last run
    rate_from: str | None = None  # which run the rate comes from
    recorded_at: float | None = None  # when that rate was last recorded (Unix time)
    computed_on: str | None = None  # the backend and device of that run ("torch on cuda:0"), if recorded

    @property
    def eta_seconds(self) -> float | None:
        if self.state == "done":
            return 0.0
        if self.rate is None or self.rate <= 0 or self.bytes_total is None or self.bytes_done is None:
            return None
        return (self.bytes_total - self.bytes_done) / self.rate

    def to_dict(self) -> dict[str, Any]:
        return {
            "state": self.state,
            "blocks_done": self.blocks_done,
            "blocks_total": self.blocks_total,
            "bytes_done": self.bytes_done,
            "bytes_total": self.bytes_total,
            "rate_bytes_per_s": self.rate,
            "rate_from": self.rate_from,
            "rate_recorded_at": self.recorded_at,
            "computed_on": self.computed_on,
            "eta_seconds": self.eta_seconds,
        }


@dataclass(frozen=True)
class Status:
    path: Path
    kind: Literal["index", "output", "sweep"]
    index: Path | None
    passes: tuple[PassStatus, ...]
    inputs: tuple[dict[str, Any], ...]
    details: dict[str, Any] = field(default_factory=dict)
    notes: tuple[str, ...] = ()

    def to_dict(self) -> dict[str, Any]:
        return {
            "schema": STATUS_SCHEMA,
            "path": str(self.path),
            "kind": self.kind,
            "index": str(self.index) if self.index is not None else None,
            "passes": {p.name: p.to_dict() for p in self.passes},
            "inputs": [_input_entry(fp) for fp in self.inputs],
            **self.details,
            "notes": list(self.notes),
        }


def _input_entry(fp: dict[str, Any]) -> dict[str, Any]:
    files = fp.get("files", [])
    return {
        "name": fp.get("name"),
        "path": fp.get("path"),
        "files": len(files),
        "bytes": int(sum(int(f.get("size", 0)) for f in files)),
    }


# -- bytes per work item --------------------------------------------------------------------
def probe_batch_bytes(plan: Plan, batches: Sequence[Batch] | None = None) -> np.ndarray:
    """Input bytes of each batch of blocks (base plus agents), as the probe pass counts them:
    the plan's batches, or ``batches`` (a statistic's units)."""
    batches = plan.batches if batches is None else batches
    if not len(plan.blocks) or not len(batches):
        return np.zeros(0, np.int64)
    per_elem = np.array([sum(ITEMSIZE[d] for d in t.dtypes) for t in plan.tensors], np.int64)
    tensor = np.fromiter((b.tensor for b in plan.blocks), np.int64, len(plan.blocks))
    size = np.fromiter((b.size for b in plan.blocks), np.int64, len(plan.blocks))
    firsts = np.fromiter((b.first for b in batches), np.int64, len(batches))
    return np.add.reduceat(per_elem[tensor] * size, firsts)


def merge_item_bytes(plan: Plan) -> np.ndarray:
    """Bytes of each merge work item: every batch, then each copied (non-float) tensor."""
    copies = [t.numel * ITEMSIZE[t.dtypes[0]] for t in plan.tensors if not t.merged]
    return np.concatenate([probe_batch_bytes(plan), np.array(copies, np.int64)])


def _number(value: object) -> float | None:
    """A finite JSON number, or None for anything else (a throughput record is advisory: a
    damaged one means "no ETA", not a failed status)."""
    if isinstance(value, bool) or not isinstance(value, int | float) or not math.isfinite(value):
        return None
    return float(value)


def _rate(record: dict[str, Any] | None, source: str) -> tuple[float | None, str | None, float | None, str | None]:
    if not record:
        return None, None, None, None
    seconds, nbytes = _number(record.get("seconds")), _number(record.get("bytes"))
    if seconds is None or nbytes is None or seconds <= 0 or nbytes <= 0:
        return None, None, None, None
    where = record.get("where")
    return (
        nbytes / seconds,
        source,
        _number(record.get("recorded_at", record.get("finished_at"))),
        (where if isinstance(where, str) and where else None),
    )


# -- an index -------------------------------------------------------------------------------
def probe_status(store: IndexStore) -> PassStatus:
    plan = store.plan
    sizes = probe_batch_bytes(plan)
    complete = store.probe_complete()
    done = store.done()  # a finished probe's journal is read too: one that lost a mark is damage
    rate = _rate(store.journal.rate(), "last probe run")
    if rate[0] is None:
        record = store.group.attrs.get("probe")
        rate = _rate(record if isinstance(record, dict) else None, "last probe run")
    state: State = "done" if complete else ("partial" if done.any() else "not started")
    return PassStatus(
        "probe", state, int(done.sum()), len(plan.batches), int(sizes[done].sum()), int(sizes.sum()), *rate
    )


def statistics_status(store: IndexStore) -> tuple[PassStatus, ...]:
    """Every statistics pass the index holds (TIES's histograms, the agreement, ...), done or how far."""
    passes = []
    for key in store.statistic_keys():
        units, done, journal = store.statistic_progress(key)
        sizes = probe_batch_bytes(store.plan, units)
        state: State = "done" if store.statistic_complete(key) else ("partial" if done.any() else "not started")
        rate = _rate(journal.rate(), OWN_RUN)
        passes.append(
            PassStatus(
                f"stats/{key}", state, int(done.sum()), len(units), int(sizes[done].sum()), int(sizes.sum()), *rate
            )
        )
    return tuple(passes)


def index_status(path: Path) -> Status:
    store = open_index_store(path, read_only=True)
    header = store.header
    details = {
        "eps": header.eps,
        "block_elems": header.block_elems,
        "base": header.base,
        "agents": list(header.agents),
        "tensors": len(header.tensors),
        "ramstream_version": header.ramstream_version,
        "quantized_base_as": header.quantized_base_as,
    }
    passes = (probe_status(store), *statistics_status(store))
    return Status(path, "index", path, passes, header.inputs, {"index_info": details})


# -- an output directory --------------------------------------------------------------------
def _journal_group(out: Path) -> zarr.Group | None:
    path = output_dir.work_dir(out) / "journal"
    if not (path / "zarr.json").is_file():
        return None
    with store_io(path, "reading the merge's journal"):
        return zarr.open_group(str(path), mode="r", zarr_format=3)


def _find_index(
    key: str | None, explicit: Path | None, journal: zarr.Group | None, cache_dir: Path | None, work: Path
) -> Path | None:
    """The index of the merge whose work area is ``work``: ``--index``, the one its merge journal
    names, the one it recorded as its passes began (``started.json``: before the merge pass, while
    its probe runs), or the cached index of its content key."""
    candidates: list[Path] = []
    if explicit is not None:
        candidates.append(explicit)
    recorded = journal.attrs.get("index") if journal is not None else None
    started = output_dir.started_record(work).get("index")
    for where in (recorded, started):
        if isinstance(where, str) and where:
            candidates.append(Path(where))
    if cache_dir is not None and isinstance(key, str) and key.isalnum():  # a content key, never a path
        from ramstream.index.resolve import cache_path

        candidates.append(cache_path(cache_dir, key))
    for candidate in candidates:
        if (candidate / "zarr.json").is_file():
            return candidate
    return None


def _merge_pass(journal: zarr.Group | None, store: IndexStore | None, probe: PassStatus | None) -> PassStatus:
    bytes_total = int(merge_item_bytes(store.plan).sum()) if store is not None else None
    fallback = (
        (probe.rate, "last probe run", probe.recorded_at, probe.computed_on)
        if probe and probe.rate
        else (None, None, None, None)
    )
    if journal is None:
        return PassStatus("merge", "not started", 0, None, 0, bytes_total, *fallback)
    array = Journal.open(journal, "merge")
    block_elems = journal.attrs.get("block_elems")
    sizes = None
    if store is not None and _is_block_size(block_elems):
        sizes = merge_item_bytes(plan_from_tensors(store.header.tensors, block_elems))
        if max(len(sizes), 1) != array.size:
            sizes = None  # a journal of another plan: counts are still right, bytes are not known
    n_items = len(sizes) if sizes is not None else array.size
    done = array.done(n_items)
    rate = _rate(array.rate(), "last merge run")
    state: State = "partial" if done.any() else "not started"
    return PassStatus(
        "merge",
        state,
        int(done.sum()),
        n_items,
        int(sizes[done].sum()) if sizes is not None else None,
        int(sizes.sum()) if sizes is not None else bytes_total,
        *(rate if rate[0] is not None else fallback),
    )


def _finished_status(out: Path, record: dict[str, Any]) -> Status:
    """A finished merge, from its record alone; a record whose fields have the wrong types or
    counts is refused in one line rather than shown wrong."""
    try:
        agents = _names(record)
        inputs = read_inputs(record, len(agents) + 1) if "inputs" in record else ()
        per_agent = _per_agent(record, agents)
    except DamagedRecord as exc:
        raise OutputError(
            f"{out / output_dir.RECORD_FILE}: the merge record is damaged ({exc}); merge again with --force to "
            "rewrite the output"
        ) from None
    summary = {k: record.get(k) for k in ("method", "params", "eps")}
    details = {"merge": {**summary, "per_agent": per_agent, "lambdas": per_agent.get("lambda")}}
    passes = tuple(PassStatus(name, "done", None, None, None, None) for name in ("probe", "merge"))
    return Status(out, "output", None, passes, inputs, details)


def _names(record: dict[str, Any]) -> list[str]:
    agents = record.get("agents")
    if not isinstance(agents, list) or not agents or not all(isinstance(a, str) for a in agents):
        raise DamagedRecord("agents", f"{agents!r:.40}, not a list of agent names")
    return agents


def _per_agent(record: dict[str, Any], agents: list[str]) -> dict[str, dict[str, Any]]:
    values = record.get("per_agent", {})
    if not isinstance(values, dict):
        raise DamagedRecord("per_agent", f"a {type(values).__name__}, not a mapping")
    table = {}
    for key, column in values.items():
        if not isinstance(column, list) or len(column) != len(agents):
            raise DamagedRecord(f"per_agent.{key}", f"{column!r:.40}, not a list of {len(agents)} values")
        if not all(v is None or isinstance(v, str | int | float) for v in column):
            raise DamagedRecord(f"per_agent.{key}", f"{column!r:.40}, not a list of numbers")
        table[key] = dict(zip(agents, column, strict=True))
    return table


def _run_record(out: Path) -> dict[str, Any]:
    run_file = output_dir.work_dir(out) / output_dir.RUN_FILE
    try:
        run = json.loads(run_file.read_text())
    except (OSError, ValueError) as exc:
        raise RamstreamError(f"{out}: cannot read {run_file.name} of the unfinished merge ({exc})") from exc
    if not isinstance(run, dict):
        raise OutputError(
            f"{run_file}: the unfinished merge's record is damaged (a {type(run).__name__}, not a mapping); "
            "rerun the merge with --force to start it over"
        )
    return run


def _is_block_size(value: object) -> TypeGuard[int]:
    return isinstance(value, int) and not isinstance(value, bool) and BLOCK_QUANTUM <= value <= MAX_BLOCK_ELEMS


def output_status(out: Path, index: Path | None = None, cache_dir: Path | None = None) -> Status:
    record = output_dir.finished_record(out)
    if record is not None:
        return _finished_status(out, record)
    if (out / output_dir.RECORD_FILE).is_file() and not output_dir.work_dir(out).exists():
        raise OutputError(
            f"{out / output_dir.RECORD_FILE}: the merge record is damaged (not a JSON mapping); merge again with "
            "--force to rewrite the output"
        )
    run = _run_record(out)
    journal = _journal_group(out)
    key = run.get("inputs")
    store, found, notes = _index_of(key if isinstance(key, str) else None, index, journal, cache_dir, out)
    passes = _passes(journal, store)
    details = {"merge": {k: run.get(k) for k in ("method", "params", "eps", "out_dtype")}}
    inputs = store.header.inputs if store is not None else ()
    return Status(out, "output", found, passes, tuple(inputs), details, tuple(notes))


def _index_of(
    key: str | None, index: Path | None, journal: zarr.Group | None, cache_dir: Path | None, path: Path
) -> tuple[IndexStore | None, Path | None, list[str]]:
    """The index of the merge (or sweep) in ``path``, opened, where it is, and notes on why none
    was used; one built from other inputs than ``key`` is not used."""
    found = _find_index(key, index, journal, cache_dir, output_dir.work_dir(path))
    store, notes = None, []
    if found is not None:
        store = open_index_store(found, read_only=True)
        if store.header.content_key != key:
            notes.append(f"{found} was built from other inputs than this merge; not used")
            store, found = None, None
    if store is None and index is None:
        notes.append("the merge's index was not found: pass --index PATH for bytes, inputs and the probe's state")
    elif store is None and index is not None and not (index / "zarr.json").is_file():
        notes.append(f"{index}, given as --index, is not an index (it has no zarr.json)")
    return store, found, notes


def _passes(journal: zarr.Group | None, store: IndexStore | None) -> tuple[PassStatus, ...]:
    """The probe and the statistics passes the index holds, when it was found, then the merge."""
    if store is None:
        return (_merge_pass(journal, None, None),)
    probe = probe_status(store)
    return (probe, *statistics_status(store), _merge_pass(journal, store, probe))


# -- a sweep ----------------------------------------------------------------------------------
SWEEP_FILE = "sweep.json"


def _sweep_names(path: Path, journal: zarr.Group | None) -> list[str]:
    """The candidates of a sweep: those ``sweep.json`` lists, then those its journal merges."""
    names: list[str] = []
    try:
        doc = json.loads((path / SWEEP_FILE).read_text()) if (path / SWEEP_FILE).is_file() else {}
    except (OSError, ValueError) as exc:
        raise OutputError(f"{path / SWEEP_FILE}: cannot be read ({exc}); rerun the sweep to rewrite it") from exc
    listed = doc.get("candidates", []) if isinstance(doc, dict) else None
    if not isinstance(listed, list) or not all(isinstance(c, dict) and isinstance(c.get("name"), str) for c in listed):
        raise OutputError(f"{path / SWEEP_FILE}: the sweep record is damaged; rerun the sweep to rewrite it")
    names += [c["name"] for c in listed]
    pending = journal.attrs.get("outputs") if journal is not None else None
    if isinstance(pending, list):
        names += [n for n in pending if isinstance(n, str) and n not in names]
    return [n for n in names if n and Path(n).name == n]


def sweep_status(path: Path, index: Path | None = None, cache_dir: Path | None = None) -> Status:
    """A sweep's candidates (finished, started or not) and, while it is unfinished, its passes:
    the probe and statistics passes of its index (``--index``, or the one it recorded as its
    passes began) and its merge pass over the unfinished candidates."""
    journal = _journal_group(path)
    candidates = []
    for name in _sweep_names(path, journal):
        out = path / name
        if output_dir.finished_record(out) is not None:
            state = "done"
        else:
            state = "partial" if output_dir.work_dir(out).is_dir() else "not started"
        candidates.append({"name": name, "state": state})
    details: dict[str, Any] = {"sweep": {"candidates": candidates}}
    work = output_dir.work_dir(path)
    if not work.is_dir():  # finished, or not begun: no passes to tell
        return Status(path, "sweep", None, (), (), details)
    key = output_dir.started_record(work).get("key")
    store, found, notes = _index_of(key if isinstance(key, str) else None, index, journal, cache_dir, path)
    if store is None and journal is None:
        return Status(path, "sweep", found, (), (), details, tuple(notes))
    inputs = store.header.inputs if store is not None else ()
    return Status(path, "sweep", found, _passes(journal, store), tuple(inputs), details, tuple(notes))


def status(path: str | Path, index: str | Path | None = None, cache_dir: Path | None = None) -> Status:
    """The status of an index, of a merge's output directory or of a sweep's."""
    path = Path(path)
    given = Path(index) if index is not None else None
    if (path / SWEEP_FILE).is_file() or "outputs" in getattr(_journal_group(path), "attrs", {}):
        return sweep_status(path, given, cache_dir)
    if (path / "zarr.json").is_file():
        return index_status(path)
    if (path / output_dir.RECORD_FILE).is_file() or (output_dir.work_dir(path) / output_dir.RUN_FILE).is_file():
        return output_status(path, given, cache_dir)
    if path.is_dir() and (path / ".ramstream").is_dir():
        raise IndexMismatchError(f"{path}: a merge was prepared here but recorded nothing yet; rerun it")
    raise IndexMismatchError(f"{path}: neither a ramstream index nor a merge output directory; check the path")


# -- text -----------------------------------------------------------------------------------
def _size(n: float | None) -> str:
    if n is None:
        return "?"
    for unit in ("B", "KB", "MB", "GB", "TB"):
        if n < 1000 or unit == "TB":
            return f"{n:.1f} {unit}" if unit != "B" else f"{int(n)} B"
        n /= 1000
    return f"{n:.1f} TB"


def _duration(seconds: float) -> str:
    s = round(seconds)
    return f"{s // 3600}h{s % 3600 // 60:02d}m{s % 60:02d}s" if s >= 3600 else f"{s // 60}m{s % 60:02d}s"


def _pass_line(p: PassStatus, now: float, width: int = 6) -> str:
    """One pass, its name padded to ``width`` (the longest of the listing: columns line up)."""
    if p.blocks_total is None and p.state == "done":
        return f"{p.name:<{width}} done"
    blocks = f"{p.blocks_done if p.blocks_done is not None else '?'} / {p.blocks_total or '?'} batches"
    line = f"{p.name:<{width}} {p.state:<12} {blocks:<22} {_size(p.bytes_done)} / {_size(p.bytes_total)}"
    if p.bytes_total and p.bytes_done is not None and p.state != "done":
        line += f" ({100 * p.bytes_done / p.bytes_total:.1f} %)"
    if p.rate is not None:
        eta = p.eta_seconds
        if p.state != "done" and eta is not None:
            line += f", ETA {_duration(eta)} at {_size(p.rate)}/s ({p.rate_from})"
        else:
            line += f", {_size(p.rate)}/s ({p.rate_from})"
        if p.computed_on:
            line += f", {p.computed_on}"
        if p.state == "partial" and p.recorded_at is not None and p.rate_from in (f"last {p.name} run", OWN_RUN):
            line += f", last recorded {_duration(max(now - p.recorded_at, 0))} ago"
    elif p.state == "partial":
        line += ", ETA unknown (no throughput recorded yet)"
    return line


def render(status: Status) -> str:
    doc = status.to_dict()
    lines = [f"{status.kind} {status.path}"]
    if status.kind in ("output", "sweep") and status.index is not None:
        lines.append(f"index  {status.index}")
    if "index_info" in doc:
        info = doc["index_info"]
        read_as = info.get("quantized_base_as", "f32")
        lines.append(
            f"  eps {info['eps']}, {len(info['agents'])} agents, {info['tensors']} tensors, "
            f"blocks of {info['block_elems']} elements, made by ramstream {info['ramstream_version']}"
            + ("" if read_as == "f32" else f", quantized base read as {read_as}")
        )
    if "merge" in doc and isinstance(doc["merge"], dict):
        m = doc["merge"]
        lines.append(f"  method {m.get('method')}, params {json.dumps(m.get('params'))}, eps {m.get('eps')}")
    if doc["inputs"]:
        lines.append("inputs")
        for k, fp in enumerate(doc["inputs"]):
            role = "base" if k == 0 else "agent"
            files = f"{fp['files']} file{'s' if fp['files'] != 1 else ''}"
            lines.append(f"  {role:<6} {fp['name']!s:<16} {_size(fp['bytes']):>10}  {files:<8} {fp['path']}")
    if "sweep" in doc:
        lines += [f"  {c['state']:<12} {c['name']}" for c in doc["sweep"]["candidates"]]
    now = time.time()
    width = max([6, *(len(p.name) for p in status.passes)])
    lines += [_pass_line(p, now, width) for p in status.passes]
    if any(p.state == "partial" for p in status.passes):
        lines.append("a partial pass is running, or was stopped: rerun the same command to resume it")
    lines += [f"note: {n}" for n in status.notes]
    return "\n".join(lines)
