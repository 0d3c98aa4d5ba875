"""What makes an unfinished merge in ``--out`` another merge than the one asked for, in one phrase.

``output_dir.prepare`` resumes an unfinished merge only when the rerun's run record equals the one
in ``.ramstream/run.json``; otherwise it refuses, and says why from these records: an input
checkpoint whose files changed since the merge started (checked against the fingerprints recorded
then, ``started.json``: the run record keeps only their digest), the method, one of its
parameters, another setting, other input checkpoints, or another ramstream version. It also says
whether rerunning the command that started the merge would finish it: not when an input changed.
"""

from __future__ import annotations

import json
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from ramstream.format.fingerprint import file_change

# Settings of the run record and how the command gives them, in the order they are compared
# (a stack's ``slices``, ``base`` and ``dtype`` come from its mergekit config).
SETTINGS = (
    ("eps", "--eps"),
    ("quantized_base_as", "--quantized-base-as"),
    ("out_dtype", "--out-dtype"),
    ("shard_size", "--shard-size"),
    ("slices", "slices"),
    ("base", "base"),
    ("dtype", "dtype"),
)
UNSET = "unset"


@dataclass(frozen=True)
class Difference:
    what: str  # completes "holds an unfinished merge ..."
    command_differs: bool  # rerunning the command that started it would finish it

    def message(self, out: Path) -> str:
        advice = "pass --force to start over, or choose another --out"
        if self.command_differs:
            advice = f"rerun the command that started it to finish it, {advice}"
        return f"{out}: holds an unfinished merge {self.what}; {advice}"


def run_difference(previous: object, run: Mapping[str, Any], recorded_inputs: object) -> Difference:
    """How the unfinished merge's run record ``previous`` differs from ``run``; ``recorded_inputs``:
    the inputs' fingerprints when it started (None when it recorded none, as older merges)."""
    if not isinstance(previous, dict):
        return Difference("whose run record cannot be read", False)
    changed = changed_input(recorded_inputs)
    if changed is not None:
        return Difference(changed, False)
    if previous.get("method") != run.get("method"):
        old, new = _shown(previous.get("method")), _shown(run.get("method"))
        return Difference(f"started with --method {old}, not {new}", True)
    setting = _setting(previous, run)
    if setting is not None:
        return Difference(setting, True)
    if previous.get("ramstream_version") != run.get("ramstream_version"):
        old, new = _shown(previous.get("ramstream_version")), _shown(run.get("ramstream_version"))
        return Difference(f"started by ramstream {old} (this is {new}, which does not resume it)", False)
    if previous.get("inputs") != run.get("inputs"):
        return Difference(_other_inputs(recorded_inputs), True)
    key = next((k for k in sorted({*previous, *run}) if previous.get(k, UNSET) != run.get(k, UNSET)), None)
    if key is None:
        return Difference("of other inputs or parameters", True)
    return Difference(f"started with {key} {_shown(previous.get(key, UNSET))}, not {_shown(run.get(key, UNSET))}", True)


def _setting(previous: Mapping[str, Any], run: Mapping[str, Any]) -> str | None:
    """The first parameter of the method, then other setting, that differs, said as it was given."""
    old_params, new_params = previous.get("params"), run.get("params")
    if isinstance(old_params, dict) and isinstance(new_params, dict):
        for name in [*new_params, *(n for n in old_params if n not in new_params)]:
            if old_params.get(name, UNSET) != new_params.get(name, UNSET):
                old, new = _shown(old_params.get(name, UNSET)), _shown(new_params.get(name, UNSET))
                return f"started with {name}={old}, not {name}={new} (a parameter of {_shown(run.get('method'))})"
    elif old_params != new_params:
        return f"started with the parameters {_shown(old_params)}, not {_shown(new_params)}"
    for key, given_as in SETTINGS:
        if previous.get(key, UNSET) != run.get(key, UNSET):
            return f"started with {given_as} {_shown(previous.get(key, UNSET))}, not {_shown(run.get(key, UNSET))}"
    if bool(previous.get("allow_nonfinite")) != bool(run.get("allow_nonfinite")):
        return f"started {'with' if previous.get('allow_nonfinite') else 'without'} --allow-nonfinite"
    return None


def _other_inputs(recorded: object) -> str:
    """Other checkpoints (or the same in another order), named as the merge recorded them."""
    fingerprints = recorded if isinstance(recorded, list) else []
    paths = [fp["path"] for fp in fingerprints if isinstance(fp, dict) and isinstance(fp.get("path"), str)]
    if not paths or len(paths) != len(fingerprints):
        return "of other input checkpoints (or of the same ones, changed since)"
    shown = ", ".join(paths[:4]) + (", ..." if len(paths) > 4 else "")
    return f"of other input checkpoints (it was started on {shown}, in that order)"


def changed_input(recorded: object) -> str | None:
    """The first input checkpoint whose files are no longer those fingerprinted when the merge
    started (``format.fingerprint``: size, modification time and identity of a weights file, the
    digest of a small one read whole), said with the file and how; None when none changed."""
    if not isinstance(recorded, list):
        return None
    for fingerprint in recorded:
        if not isinstance(fingerprint, dict) or not isinstance(fingerprint.get("path"), str):
            continue
        files = fingerprint.get("files")
        for entry in files if isinstance(files, list) else []:
            how = file_change(Path(fingerprint["path"]), entry) if isinstance(entry, dict) else None
            if how is not None:
                return f"whose input {fingerprint['path']} changed since it started ({how})"
    return None


def _shown(value: object) -> str:
    """A recorded value as the user wrote it, short: a string bare, anything else as JSON."""
    text = value if isinstance(value, str) else json.dumps(value, sort_keys=True)
    return text if len(text) <= 60 else text[:57] + "..."
