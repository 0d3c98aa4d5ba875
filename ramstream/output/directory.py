"""The output directory: its work area, how a finished merge is recognised, and finalisation.

While a merge runs, everything lives in ``<out>/.ramstream/`` (``run.json``, ``started.json``,
the journal, the ``*.safetensors.partial`` shards). ``run.json`` says which merge this is (a rerun
resumes it only when its own is equal); ``started.json``, written as its passes begin, says where
its index is and what its inputs were then: for ``ramstream status`` before the merge pass has
recorded anything, and to say which input changed when a rerun is refused. Finalisation fsyncs
the shards, renames them into ``<out>``, writes the shard index (when there are several shards),
the model card, the copied tokenizer files, then ``config.json`` and ``ramstream_merge.json``
last, once everything they describe is in place; then the work area is renamed away in one step
(the commit) and deleted. A directory counts as a finished merge only when
``ramstream_merge.json`` exists and the work area does not. The record keeps what identifies the
bytes of every file it lists (``written``: sizes and digests, sampled for the shards); a rerun
finds a merge whose files changed since (an evaluator that rewrote its weights) unfinished, and
merges it again.
"""

from __future__ import annotations

import json
import shutil
import sys
import uuid
from contextlib import AbstractContextManager
from pathlib import Path
from typing import Any

from ramstream.errors import OutputError, RamstreamError, shown
from ramstream.format.fingerprint import written_fingerprint
from ramstream.format.names import COPIED_FILES, SHARD_INDEX
from ramstream.io.atomic import atomic_write_bytes, atomic_write_text, fsync_directory
from ramstream.io.lock import hold
from ramstream.io.writer import ShardLayout
from ramstream.output.base_files import read_copied
from ramstream.output.run_difference import run_difference

WORK_DIR = ".ramstream"
RUN_FILE = "run.json"
STARTED_FILE = "started.json"
FILES_FILE = "files.json"
RECORD_FILE = "ramstream_merge.json"
ALWAYS_WRITTEN = ("config.json", "README.md", RECORD_FILE)  # and SHARD_INDEX when there are several shards
TRASH_PREFIX = ".ramstream-done-"
LOCK_FILE = ".ramstream.lock"


def work_dir(out: Path) -> Path:
    return out / WORK_DIR


def lock(out: Path) -> AbstractContextManager[None]:
    """The output's lock: a second merge into the same directory is refused while one runs."""
    return hold(out / LOCK_FILE, f"the output directory {out}", wait=False)


def _is_ours(entry: Path) -> bool:
    """The work area, the lock and the trash of an earlier finalisation (see ``finalize``); a
    user's file that happens to be named ``.ramstream`` is not ours."""
    if entry.name == WORK_DIR:
        return entry.is_dir() and not entry.is_symlink()
    return entry.name == LOCK_FILE or entry.name.startswith(TRASH_PREFIX)


def finished_record(out: Path) -> dict[str, Any] | None:
    """The record of a finished merge in ``out``, or None."""
    record = out / RECORD_FILE
    if record.is_file() and not work_dir(out).exists():
        try:
            doc = json.loads(record.read_text())
        except (OSError, ValueError):
            return None
        return doc if isinstance(doc, dict) else None
    return None


def check_output_path(out: Path, inputs: list[Path]) -> None:
    """Refuse an ``--out`` that is a file, or that is (or holds, or lies in) an input checkpoint."""
    try:
        out.stat()
    except FileNotFoundError:
        pass
    except OSError as exc:  # a symlink loop, a name too long for the file system...
        raise OutputError(f"{out}: cannot be used as --out ({exc.strerror}); choose another directory") from exc
    if out.exists() and not out.is_dir():
        raise OutputError(f"{out}: is a file; --out must be a directory (new or holding an earlier merge)")
    target = out.resolve()
    for path in inputs:
        source = path.resolve()
        folder = source if source.is_dir() else source.parent
        if target == folder or target in folder.parents or folder in target.parents:
            raise OutputError(f"{out}: overlaps the input checkpoint {path}; choose an --out outside every input")


def check_work_paths(out: Path, index: Path | None, cache_dir: Path) -> None:
    """Refuse an ``--index`` inside ``--out`` (or holding it), and an ``--out`` that is or holds the
    cache directory, or lies among its indexes: an output directory holds the model alone
    (``--force`` clears what a merge wrote there), and the cached indexes are the tool's to fill
    and prune. An ``--out`` beside them in the cache directory (a demo's scratch folder) is fine."""
    target = out.resolve()
    if index is not None and _nested(target, index.resolve()):
        raise OutputError(
            f"{out}: --index {index} lies inside --out (or holds it); keep the index outside the output directory"
        )
    cache = cache_dir.resolve()
    if target == cache or target in cache.parents or _nested(target, cache / "index"):
        raise OutputError(
            f"{out}: overlaps the cache directory {cache_dir} (--cache-dir); choose an --out outside the cache"
        )


def _nested(a: Path, b: Path) -> bool:
    """``a`` and ``b`` are the same directory, or one lies inside the other."""
    return a == b or a in b.parents or b in a.parents


def holds_finished(out: Path, run: dict[str, Any]) -> bool:
    """``out`` holds the finished merge ``run`` describes, its files as that merge wrote them."""
    record = finished_record(out)
    return record is not None and record.get("run") == run and not changed_files(out, record)


def changed_files(out: Path, record: dict[str, Any]) -> list[str]:
    """The files of a finished merge whose bytes are no longer those it recorded (``written``:
    ``format.fingerprint.written_fingerprint`` of each; a record without it compares nothing)."""
    written = record.get("written")
    if not isinstance(written, dict):
        return []
    changed = []
    for name, expected in sorted(written.items()):
        if not isinstance(name, str) or Path(name).name != name or name.startswith("."):
            continue  # never a path outside out, whatever a damaged record says
        try:
            now: dict[str, object] | None = written_fingerprint(out / name)
        except (OSError, RamstreamError):
            now = None
        if now != expected:
            changed.append(name)
    return changed


def prepare(out: Path, run: dict[str, Any], force: bool) -> bool:
    """Make ``out`` ready for ``run``; True when it already holds this very merge, finished. One
    whose files changed since (an evaluator that rewrote its weights) is said so and merged again."""
    _remove_trash(out)
    record = finished_record(out)
    changed = changed_files(out, record) if record is not None and record.get("run") == run else []
    if record is not None and record.get("run") == run and not force:
        if not changed:
            return True
        print(
            f"note: {out}: {shown(changed[0])}{f' and {len(changed) - 1} more' if len(changed) > 1 else ''} "
            "changed since it was merged; merging it again",
            file=sys.stderr,
        )
    work = work_dir(out)
    run_file = work / RUN_FILE
    if (work.exists() or work.is_symlink()) and not _is_ours(work):
        raise OutputError(
            f"{work}: is not ramstream's work directory (a file or link of that name); move it away or "
            "choose another --out"
        )
    if work.exists() and not run_file.is_file():
        shutil.rmtree(work)  # killed before it recorded which run it belongs to: nothing to keep
    if run_file.is_file() and not force:
        try:
            previous = json.loads(run_file.read_text())
        except (OSError, ValueError):
            previous = None
        if previous == run:
            return False
        raise OutputError(run_difference(previous, run, started_record(work).get("inputs")).message(out))
    if out.exists():
        _clear_for(out, record, force or bool(changed))
    try:
        work.mkdir(parents=True, exist_ok=True)
        atomic_write_text(run_file, json.dumps(run, sort_keys=True, indent=1))
    except OSError as exc:
        raise OutputError(f"{out}: cannot create the output directory ({exc.strerror})") from exc
    return False


def record_start(work: Path, inputs: list[dict[str, object]], index: Path | None, key: str | None) -> None:
    """Write ``started.json`` in the work area ``work`` as the passes begin: the index the merge
    reads (the one its probe is filling), the inputs' content key and their fingerprints. Beside
    ``run.json``, not in it: the same merge may be resumed with its index elsewhere. Advisory
    (``status`` and a refused rerun say less without it): a merge is not stopped when it cannot
    be written; a full disk stops it at its next write, which says where."""
    doc = {"index": str(index.resolve()) if index is not None else None, "key": key, "inputs": inputs}
    try:
        atomic_write_text(work / STARTED_FILE, json.dumps(doc, sort_keys=True))
    except OSError:
        pass


def started_record(work: Path) -> dict[str, Any]:
    """What ``record_start`` wrote in ``work``; empty when it wrote nothing (a merge of an older
    version, or one stopped before its passes began) or when that cannot be read."""
    try:
        doc = json.loads((work / STARTED_FILE).read_text())
    except (OSError, ValueError):
        return {}
    return doc if isinstance(doc, dict) else {}


def _remove_trash(out: Path) -> None:
    if out.is_dir():
        for entry in out.iterdir():
            if entry.name.startswith(TRASH_PREFIX) and entry.is_dir():
                shutil.rmtree(entry)


def _clear_for(out: Path, record: dict[str, Any] | None, force: bool) -> None:
    """Make way for a new merge: refuse a directory holding anything but an earlier merge's
    output, and with ``force`` remove that output (exactly the files it recorded, nothing else)."""
    written = _written_by_earlier_merge(out, record)
    others = sorted(e.name for e in out.iterdir() if not _is_ours(e) and e.name not in written)
    if others:
        shown = ", ".join(others[:4]) + (", ..." if len(others) > 4 else "")
        raise OutputError(
            f"{out}: holds files that no ramstream merge wrote ({shown}); --force replaces only an earlier "
            "merge's output: choose another (or an empty) --out"
        )
    present = [out / name for name in sorted(written) if (out / name).is_file()]
    if not force and (record is not None or present):
        what = "another merge" if record is not None else "part of an earlier merge"
        raise OutputError(f"{out}: already holds {what}; choose another --out or pass --force to replace it")
    if work_dir(out).exists():
        shutil.rmtree(work_dir(out))
    for path in present:
        path.unlink()


def _legacy_files(out: Path) -> list[str]:
    """What a merge recorded before records listed their files: its shards and fixed names."""
    try:
        shards = list(json.loads((out / SHARD_INDEX).read_text())["weight_map"].values())
    except (OSError, ValueError, KeyError, TypeError, AttributeError):
        shards = []
    return [SHARD_INDEX, *ALWAYS_WRITTEN, *COPIED_FILES, *(s for s in shards if isinstance(s, str))]


def _written_by_earlier_merge(out: Path, record: dict[str, Any] | None) -> set[str]:
    """The names a merge in ``out`` wrote: the finished record's list, or the list an unfinished
    finalisation left in the work area (``FILES_FILE``, written before it moves anything)."""
    lists = [record.get("files", _legacy_files(out))] if record is not None else []
    listing = work_dir(out) / FILES_FILE
    if listing.is_file():
        try:
            lists.append(json.loads(listing.read_text()))
        except (OSError, ValueError):
            pass
    names = {n for names in lists if isinstance(names, list) for n in names if isinstance(n, str)}
    return {n for n in names if n and Path(n).name == n and not n.startswith(".")}


def finalize(
    out: Path,
    layout: ShardLayout,
    partial: dict[str, Path],
    copied: tuple[Path, ...],
    config: dict[str, Any] | None,
    card: str,
    record: dict[str, Any],
) -> None:
    """Move the finished shards into place, write the metadata files, ``config.json`` and the record last.

    Every step is idempotent, so a finalisation killed anywhere is redone by the rerun. The commit
    point is one atomic rename of the work area out of the way: until then the journal is intact
    and the rerun resumes; after it, ``out`` holds a finished merge and the trash is deleted.
    """
    work = work_dir(out)
    sharded = len(layout.names) > 1
    written = {*layout.names, *(p.name for p in copied), *ALWAYS_WRITTEN, *([SHARD_INDEX] if sharded else [])}
    files = sorted(written - (set() if config is not None else {"config.json"}))
    record = {**record, "files": files}
    try:
        atomic_write_text(work / FILES_FILE, json.dumps(files))  # what --force may remove if this is cut short
        for name in layout.names:
            source = partial[name]
            if source.exists():
                source.replace(out / name)
        if sharded:
            total = sum(layout.sizes) - sum(len(h) for h in layout.headers)
            index = {"metadata": {"total_size": total}, "weight_map": layout.weight_map()}
            atomic_write_text(out / SHARD_INDEX, json.dumps(index, indent=2, sort_keys=True), tmp_dir=work)
        for source in copied:  # one that broke since it was checked stops here, as an InputError
            atomic_write_bytes(out / source.name, read_copied(source), tmp_dir=work)
        atomic_write_text(out / "README.md", card, tmp_dir=work)
        if config is not None:
            atomic_write_text(out / "config.json", json.dumps(config, indent=2), tmp_dir=work)
        record["written"] = {name: written_fingerprint(out / name) for name in files if name != RECORD_FILE}
        atomic_write_text(out / RECORD_FILE, json.dumps(record, indent=1, sort_keys=True), tmp_dir=work)
        fsync_directory(out)
        trash = out / f"{TRASH_PREFIX}{uuid.uuid4().hex}"
        work.rename(trash)
        fsync_directory(out)
        shutil.rmtree(trash)
    except OSError as exc:
        raise OutputError(
            f"{out}: finishing the output failed ({exc.strerror}); free space and rerun to finish"
        ) from exc
