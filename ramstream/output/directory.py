"""The output directory: its work area, how a finished merge is recognised, and finalisation.

While a merge runs, everything lives in ``<out>/.ramstream/`` (``run.json``, the journal, the
``*.safetensors.partial`` shards). Finalisation fsyncs the shards, renames them into ``<out>``,
writes the shard index, the model card, the copied tokenizer files, then ``config.json`` and
``ramstream_merge.json`` last, once everything they describe is in place; then the work area is
renamed away in one step (the commit) and deleted. A directory counts as a finished merge only
when ``ramstream_merge.json`` exists and the work area does not.
"""

from __future__ import annotations

import json
import shutil
import uuid
from contextlib import AbstractContextManager
from pathlib import Path
from typing import Any

from ramstream.errors import OutputError
from ramstream.io.atomic import atomic_write_bytes, atomic_write_text, fsync_directory
from ramstream.io.lock import hold
from ramstream.io.writer import ShardLayout

WORK_DIR = ".ramstream"
RUN_FILE = "run.json"
RECORD_FILE = "ramstream_merge.json"
SHARD_INDEX = "model.safetensors.index.json"
COPIED_FILES = (
    "tokenizer.json",
    "tokenizer_config.json",
    "special_tokens_map.json",
    "tokenizer.model",
    "vocab.json",
    "merges.txt",
    "added_tokens.json",
    "chat_template.jinja",
    "chat_template.json",
    "generation_config.json",
)
ALWAYS_WRITTEN = (SHARD_INDEX, "config.json", "README.md", RECORD_FILE)
TRASH_PREFIX = ".ramstream-done-"
LOCK_FILE = ".ramstream.lock"


def work_dir(out: Path) -> Path:
    return out / WORK_DIR


def lock(out: Path) -> AbstractContextManager[None]:
    """The output's lock: a second merge into the same directory is refused while one runs."""
    return hold(out / LOCK_FILE, f"the output directory {out}", wait=False)


def _is_ours(entry: Path) -> bool:
    """The work area and the trash of an earlier finalisation (see ``finalize``)."""
    return entry.name in (WORK_DIR, LOCK_FILE) or entry.name.startswith(TRASH_PREFIX)


def finished_record(out: Path) -> dict[str, Any] | None:
    """The record of a finished merge in ``out``, or None."""
    record = out / RECORD_FILE
    if record.is_file() and not work_dir(out).exists():
        try:
            return dict(json.loads(record.read_text()))
        except (OSError, ValueError):
            return None
    return None


def check_output_path(out: Path, inputs: list[Path]) -> None:
    """Refuse an ``--out`` that is a file, or that is (or holds, or lies in) an input checkpoint."""
    if out.exists() and not out.is_dir():
        raise OutputError(f"{out}: is a file; --out must be a directory (new or holding an earlier merge)")
    target = out.resolve()
    for path in inputs:
        source = path.resolve()
        folder = source if source.is_dir() else source.parent
        if target == folder or target in folder.parents or folder in target.parents:
            raise OutputError(f"{out}: overlaps the input checkpoint {path}; choose an --out outside every input")


def prepare(out: Path, run: dict[str, Any], force: bool) -> bool:
    """Make ``out`` ready for ``run``; True when it already holds this very merge, finished."""
    _remove_trash(out)
    record = finished_record(out)
    if record is not None and record.get("run") == run and not force:
        return True
    work = work_dir(out)
    run_file = work / RUN_FILE
    if work.exists() and not run_file.is_file():
        shutil.rmtree(work)  # killed before it recorded which run it belongs to: nothing to keep
    if run_file.is_file() and not force:
        try:
            previous = json.loads(run_file.read_text())
        except (OSError, ValueError):
            previous = None
        if previous == run:
            return False
        raise OutputError(
            f"{out}: holds an unfinished merge of other inputs or parameters; rerun that command to finish "
            "it, choose another --out, or pass --force to start over"
        )
    if out.exists() and any(not _is_ours(e) for e in out.iterdir()) and not force:
        what = "another merge" if record is not None else "files"
        raise OutputError(f"{out}: already holds {what}; choose another --out or pass --force to replace them")
    if force:
        _clear(out)
    try:
        work.mkdir(parents=True, exist_ok=True)
        atomic_write_text(run_file, json.dumps(run, sort_keys=True, indent=1))
    except OSError as exc:
        raise OutputError(f"{out}: cannot create the output directory ({exc.strerror})") from exc
    return False


def _remove_trash(out: Path) -> None:
    if out.is_dir():
        for entry in out.iterdir():
            if entry.name.startswith(TRASH_PREFIX) and entry.is_dir():
                shutil.rmtree(entry)


def _clear(out: Path) -> None:
    """Remove what a merge writes (never unrelated files)."""
    if work_dir(out).exists():
        shutil.rmtree(work_dir(out))
    for path in list(out.glob("model-*-of-*.safetensors")) + [out / n for n in ALWAYS_WRITTEN + COPIED_FILES]:
        if path.is_file():
            path.unlink()


def finalize(
    out: Path,
    layout: ShardLayout,
    partial: dict[str, Path],
    base_dir: Path | None,
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
    try:
        for name in layout.names:
            source = partial[name]
            if source.exists():
                source.replace(out / name)
        total = sum(layout.sizes) - sum(len(h) for h in layout.headers)
        index = {"metadata": {"total_size": total}, "weight_map": layout.weight_map()}
        atomic_write_text(out / SHARD_INDEX, json.dumps(index, indent=2, sort_keys=True), tmp_dir=work)
        if base_dir is not None:
            for name in COPIED_FILES:
                if (base_dir / name).is_file():
                    atomic_write_bytes(out / name, (base_dir / name).read_bytes(), tmp_dir=work)
        atomic_write_text(out / "README.md", card, tmp_dir=work)
        if config is not None:
            atomic_write_text(out / "config.json", json.dumps(config, indent=2), tmp_dir=work)
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
