"""The JSON document of ``ramstream inspect --json`` (schema in ``docs/inspect.md``).

Schema 1 is the per-agent summary (``agents``, ``params``, ``r``, ``alpha``, ...); the sections
``layers``, ``modules``, ``tensors``, ``top`` and ``tensor`` were added to it without changing
any earlier key, and appear only when asked for. Schema 2 adds ``pairs`` (with ``pairs``: the
agreement of every pair of agents, grouped as ``by`` says instead of the overlap sections).
Infinite rho and magnitude ratios are written as the string "inf".
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

import numpy as np

from ramstream.errors import ConfigError
from ramstream.inspect.grouping import Role, role_of
from ramstream.inspect.pairs import PairTable
from ramstream.inspect.tables import By, RankBy, Table
from ramstream.inspect.view import IndexView
from ramstream.methods.ram import RamParams, lambdas
from ramstream.methods.report import AgentReport, agent_reports
from ramstream.version import __version__

INSPECT_SCHEMA = 2
SECTIONS: dict[By, str] = {"layer": "layers", "module": "modules", "tensor": "tensors"}


@dataclass(frozen=True)
class InspectRequest:
    """What ``inspect`` shows besides the per-agent summary."""

    by: tuple[By, ...] = ()
    top: int | None = None
    rank_by: RankBy = "unique_share"
    agent: str | None = None
    tensor: str | None = None
    params: RamParams = field(default_factory=RamParams)
    pairs: bool = False  # the agreement of every pair of agents, grouped by ``by`` (and the model)

    def __post_init__(self) -> None:
        if self.top is not None and self.top < 1:
            raise ConfigError(f"--top must be at least 1, got {self.top}")
        if self.agent is not None and self.top is None:
            raise ConfigError("--agent picks whose top tensors to show; give --top K with it")


def number(x: float) -> float | str:
    """A float for JSON: "inf" for infinity (JSON has no infinity)."""
    return "inf" if x == float("inf") else float(x)


def agent_entries(view: IndexView, params: RamParams) -> tuple[list[AgentReport], list[dict[str, Any]]]:
    reports = agent_reports(view.store, view.counts, params)
    share = view.model.unique_share[0]
    entries = []
    for t, report in enumerate(reports):
        entry = report.to_dict()
        entry["unique_share"] = float(share[t])
        entries.append(entry)
    return reports, entries


def row_entry(table: Table, i: int, role: Role | None = None, lam: np.ndarray | None = None) -> dict[str, Any]:
    """One row of a table: its totals and, per agent, its numbers."""
    entry: dict[str, Any] = {"key": table.keys[i]}
    if table.by == "layer":
        entry["layer"] = int(table.keys[i]) if table.keys[i].isdigit() else None
    if role is not None:
        entry.update({"layer": role.layer, "module": role.module, "kind": role.kind})
    entry.update(
        {
            "tensors": int(table.n_tensors[i]),
            "params": int(table.params[i]),
            "coverage": [int(x) for x in table.coverage[i]],
            "collide": float(table.collide[i]),
            "agents": [],
        }
    )
    density, share, rho = table.density[i], table.unique_share[i], table.rho[i]
    for t, name in enumerate(table.agents):
        agent: dict[str, Any] = {
            "name": name,
            "active": int(table.active[i, t]),
            "density": float(density[t]),
            "shared": int(table.shared[i, t]),
            "unique": int(table.unique[i, t]),
            "unique_share": float(share[t]),
            "overlap_histogram": [int(x) for x in table.overlap[i, t]],
            "rho": number(rho[t]),
        }
        if lam is not None:
            agent["lambda"] = float(lam[t])
        entry["agents"].append(agent)
    return entry


def tensor_entries(view: IndexView, rows: list[int], params: RamParams) -> list[dict[str, Any]]:
    """Tensor rows with shape, dtypes, role and the tensor-scope lambda (``--rho-scope tensor``)."""
    table = view.tensors
    lam = lambdas(table.counts, params)
    out = []
    for i in rows:
        _, plan = view.tensor_info(table.keys[i])
        entry = row_entry(table, i, view.roles[i], lam[i])
        entry = {"key": entry.pop("key"), "shape": list(plan.shape), "dtypes": list(plan.dtypes), **entry}
        out.append(entry)
    return out


def top_section(view: IndexView, request: InspectRequest) -> dict[str, Any]:
    assert request.top is not None
    table = view.tensors
    agents = [table.agent(request.agent)] if request.agent is not None else range(len(table.agents))
    out: dict[str, Any] = {"k": request.top, "rank_by": request.rank_by, "agents": []}
    for t in agents:
        best = table.top(t, request.top, request.rank_by)
        value = best.metric(request.rank_by)[:, t]
        rows = []
        for i, key in enumerate(best.keys):
            role = role_of(key)
            rows.append(
                {
                    "key": key,
                    "layer": role.layer,
                    "module": role.module,
                    "value": number(value[i]),
                    "params": int(best.params[i]),
                    "active": int(best.active[i, t]),
                    "density": float(best.density[i, t]),
                    "shared": int(best.shared[i, t]),
                    "unique": int(best.unique[i, t]),
                    "unique_share": float(best.unique_share[i, t]),
                    "rho": number(best.rho[i, t]),
                }
            )
        out["agents"].append({"name": table.agents[t], "tensors": rows})
    return out


def pair_entry(table: PairTable, r: int) -> dict[str, Any]:
    """One row of a pair table: per pair its numbers, per agent its unique energy share."""
    entry: dict[str, Any] = {"key": table.keys[r]}
    if table.by == "layer":
        entry["layer"] = int(table.keys[r]) if table.keys[r].isdigit() else None
    share_i, share_j = table.both_share
    sq_i, sq_j = table.sum_squares
    entry["pairs"] = [
        {
            "agents": [table.agents[i], table.agents[j]],
            "both": int(table.both[r, p]),
            "both_share": [float(share_i[r, p]), float(share_j[r, p])],
            "same_sign": int(table.same_sign[r, p]),
            "sign_agreement": float(table.sign_agreement[r, p]),
            "cosine": float(table.cosine[r, p]),
            "magnitude_ratio": number(table.magnitude_ratio[r, p]),
            "sum_products": float(table.sum_products[r, p]),
            "sum_squares": [float(sq_i[r, p]), float(sq_j[r, p])],
        }
        for p, (i, j) in enumerate(table.pairs)
    ]
    entry["agents"] = [
        {
            "name": name,
            "unique_energy": float(table.unique_energy[r, t]),
            "shared_energy": float(table.shared_energy[r, t]),
            "unique_energy_share": float(table.unique_energy_share[r, t]),
        }
        for t, name in enumerate(table.agents)
    ]
    return entry


def pairs_section(view: IndexView, by: tuple[By, ...]) -> dict[str, Any]:
    """``pairs``: the model's row, and the rows of each grouping asked for."""
    section: dict[str, Any] = {"model": pair_entry(view.pairs.model, 0)}
    for b in by:
        table = view.pairs.table(b)
        section[SECTIONS[b]] = [pair_entry(table, r) for r in range(len(table))]
    return section


def build(view: IndexView, request: InspectRequest) -> tuple[dict[str, Any], list[AgentReport]]:
    """The whole document for ``request``, and the per-agent reports (for the text table)."""
    params = request.params
    reports, agents = agent_entries(view, params)
    model = view.model
    doc: dict[str, Any] = {
        "schema": INSPECT_SCHEMA,
        "index": str(view.path),
        "eps": view.eps,
        "base": view.base,
        "params": int(model.params[0]) if len(model) else 0,
        "r": params.r,
        "alpha": params.alpha,
        "agents": agents,
        "lambda_rule": params.lambda_rule,
        "block_elems": view.header.block_elems,
        "tensor_count": len(view.tensors),
        "coverage": [int(x) for x in model.coverage[0]],
        "collide": float(model.collide[0]),
        "ramstream_version": __version__,
    }
    if request.pairs:
        doc["pairs"] = pairs_section(view, request.by)
    for by in () if request.pairs else request.by:
        if by == "tensor":
            doc["tensors"] = tensor_entries(view, list(range(len(view.tensors))), params)
        elif by in SECTIONS:
            table = view.table(by)
            doc[SECTIONS[by]] = [row_entry(table, i) for i in range(len(table))]
    if request.top is not None:
        doc["top"] = top_section(view, request)
    if request.tensor is not None:
        view.tensor_info(request.tensor)
        (entry,) = tensor_entries(view, [view.tensors.row(request.tensor)], params)
        index, _ = view.tensor_info(request.tensor)
        entry["blocks"] = len(view.store.plan.blocks_of(index))
        doc["tensor"] = entry
    return doc, reports
