"""Answers from the index alone: the JSON document and rows behind ``ramstream inspect``."""

from __future__ import annotations

from pathlib import Path
from typing import Any

from ramstream.errors import IndexMismatchError
from ramstream.index.store import open_index_store
from ramstream.methods.ram import RamParams
from ramstream.report import AgentReport, agent_reports

INSPECT_SCHEMA = 1


def summary(path: Path, params: RamParams) -> tuple[dict[str, Any], list[AgentReport]]:
    store = open_index_store(Path(path), read_only=True)
    if not store.probe_complete():
        raise IndexMismatchError(f"{path}: the probe pass has not finished; rerun probe (or merge) to complete it")
    reports = agent_reports(store, params=params)
    doc = {
        "schema": INSPECT_SCHEMA,
        "index": str(path),
        "eps": store.header.eps,
        "base": store.header.base,
        "params": reports[0].params if reports else 0,
        "r": params.r,
        "alpha": params.alpha,
        "agents": [r.to_dict() for r in reports],
    }
    return doc, reports
