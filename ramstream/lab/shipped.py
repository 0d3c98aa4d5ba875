"""The lab checkpoints shipped inside the package: ``ramstream/data/agents_lab/``.

A bf16 base and three RL agents (``inc``, ``rev``, ``srt``), each a Hugging Face style directory
(``model.safetensors`` + ``config.json``), and ``lab.json``: how they were made, their measured
densities and test accuracies. Built by ``python -m tools.agents_lab rebuild --ship``.
ramstream only reads them (a merge never writes its inputs), so they are used in place.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

from ramstream.errors import InputError

DATA = Path(__file__).resolve().parent.parent / "data" / "agents_lab"
MEMBERS = ("base", "inc", "rev", "srt")
RECORD = "lab.json"


def shipped_family(directory: Path = DATA) -> tuple[Path, list[Path]]:
    """The base and the agents, checked to be present."""
    missing = [m for m in MEMBERS if not (directory / m / "model.safetensors").is_file()]
    if missing:
        raise InputError(
            f"{directory}: the shipped lab checkpoints {', '.join(missing)} are missing; reinstall ramstream "
            "or rebuild them with `python -m tools.agents_lab rebuild --ship`"
        )
    return directory / "base", [directory / m for m in MEMBERS[1:]]


def shipped_record(directory: Path = DATA) -> dict[str, Any]:
    """``lab.json``: recipe, densities and accuracies recorded when the checkpoints were built."""
    return dict(json.loads((directory / RECORD).read_text()))
