"""The output directory: its work area, how a finished merge is recognised, and finalisation.

While a merge runs, everything lives in ``<out>/.ramstream/`` (``run.json``, the journal, the
``*.safetensors.partial`` shards). Finalisation fsyncs the shards, renames them into ``<out>``,
writes the shard index, the model card, the copied tokenizer files and ``ramstream_merge.json``,
and writes ``config.json`` last; then the work area is removed. A directory counts as a finished
merge only when ``ramstream_merge.json`` exists and the work area does not.
"""

from __future__ import annotations

import json
import shutil
from pathlib import Path
from typing import Any

from ramstream.errors import OutputError
from ramstream.io.atomic import atomic_write_text, fsync_directory
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


def work_dir(out: Path) -> Path:
    return out / WORK_DIR


def finished_record(out: Path) -> dict[str, Any] | None:
    """The record of a finished merge in ``out``, or None."""
    record = out / RECORD_FILE
    if record.is_file() and not work_dir(out).exists():
        try:
            return dict(json.loads(record.read_text()))
        except (OSError, ValueError):
            return None
    return None


def prepare(out: Path, run: dict[str, Any], force: bool) -> bool:
    """Make ``out`` ready for ``run``; True when it already holds this very merge, finished."""
    record = finished_record(out)
    if record is not None and record.get("run") == run and not force:
        return True
    work = work_dir(out)
    run_file = work / RUN_FILE
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
    if out.exists() and any(out.iterdir()) and not force:
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
    """Move the finished shards into place and write the metadata files, ``config.json`` last."""
    try:
        for name in layout.names:
            source = partial[name]
            if source.exists():
                source.replace(out / name)
        total = sum(layout.sizes) - sum(len(h) for h in layout.headers)
        index = {"metadata": {"total_size": total}, "weight_map": layout.weight_map()}
        atomic_write_text(out / SHARD_INDEX, json.dumps(index, indent=2, sort_keys=True))
        if base_dir is not None:
            for name in COPIED_FILES:
                if (base_dir / name).is_file():
                    shutil.copyfile(base_dir / name, out / name)
        atomic_write_text(out / "README.md", card)
        atomic_write_text(out / RECORD_FILE, json.dumps(record, indent=1, sort_keys=True))
        if config is not None:
            atomic_write_text(out / "config.json", json.dumps(config, indent=2))
        fsync_directory(out)
        shutil.rmtree(work_dir(out))
    except OSError as exc:
        raise OutputError(
            f"{out}: finishing the output failed ({exc.strerror}); free space and rerun to finish"
        ) from exc
