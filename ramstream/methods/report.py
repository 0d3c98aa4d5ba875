"""Per-agent numbers from an index alone: density, overlap histogram, rho and lambda."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from ramstream.index.store import IndexStore
from ramstream.methods.ram import RamParams, lambdas
from ramstream.statistics.overlap import OverlapCounts, model_total, per_tensor


@dataclass(frozen=True)
class AgentReport:
    name: str
    params: int  # elements of the merged (float) tensors
    active: int
    shared: int
    unique: int
    overlap: tuple[int, ...]  # [unique, shared with 1 other, with 2 others, ...]
    rho: float
    lam: float

    @property
    def density(self) -> float:
        return self.active / self.params if self.params else 0.0

    def to_dict(self) -> dict[str, Any]:
        return {
            "name": self.name,
            "params": self.params,
            "active": self.active,
            "density": self.density,
            "shared": self.shared,
            "unique": self.unique,
            "overlap_histogram": list(self.overlap),
            "rho": self.rho if self.rho != float("inf") else "inf",
            "lambda": self.lam,
        }


def agent_reports(
    store: IndexStore, tensors: OverlapCounts | None = None, params: RamParams | None = None
) -> list[AgentReport]:
    if tensors is None:
        tensors = per_tensor(store.plan, *store.block_stats())
    model = model_total(tensors)
    params = params or RamParams()
    lam = lambdas(model, params)
    rho = model.rho()
    total = int(model.elements)
    return [
        AgentReport(
            name,
            total,
            int(model.active[t]),
            int(model.shared[t]),
            int(model.unique[t]),
            tuple(int(x) for x in model.overlap[t]),
            float(rho[t]),
            float(lam[t]),
        )
        for t, name in enumerate(store.header.agents)
    ]


_COLUMNS = (
    ("agent", "<16"),
    ("params", ">12"),
    ("active", ">12"),
    ("density", ">8"),
    ("shared", ">12"),
    ("unique", ">12"),
    ("rho", ">8"),
    ("lambda", ">9"),
)


def format_table(reports: list[AgentReport]) -> str:
    """The per-agent table printed by ``inspect`` and ``demo``."""
    hist_head = " ".join(["uniq"] + [f"+{k}" for k in range(1, len(reports))])
    rows = [" ".join(f"{title:{fmt}}" for title, fmt in _COLUMNS) + f"  overlap[{hist_head}]"]
    for r in reports:
        rho = "inf" if r.rho == float("inf") else f"{r.rho:.4g}"
        cells = (r.name, r.params, r.active, f"{r.density:.4f}", r.shared, r.unique, rho, f"{r.lam:.5f}")
        hist = " ".join(str(x) for x in r.overlap)
        rows.append(" ".join(f"{c:{fmt}}" for c, (_, fmt) in zip(cells, _COLUMNS, strict=True)) + f"  [{hist}]")
    return "\n".join(rows)
