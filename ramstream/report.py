"""Per-agent numbers from an index alone: density, overlap histogram, rho and lambda."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from ramstream.index.store import IndexStore
from ramstream.methods.ram import RamParams, lambdas
from ramstream.stats import OverlapCounts, model_total, per_tensor


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


def agent_reports(store: IndexStore, tensors: OverlapCounts | None = None, params: RamParams | None = None) -> list[AgentReport]:
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


def format_table(reports: list[AgentReport]) -> str:
    n = len(reports)
    hist_head = " ".join(["uniq"] + [f"+{k}" for k in range(1, n)])
    head = f"{'agent':<16} {'params':>12} {'active':>12} {'density':>8} {'shared':>12} {'unique':>12} {'rho':>8} {'lambda':>8}  overlap[{hist_head}]"
    rows = [head]
    for r in reports:
        rho = "inf" if r.rho == float("inf") else f"{r.rho:.4g}"
        hist = " ".join(str(x) for x in r.overlap)
        rows.append(
            f"{r.name:<16} {r.params:>12} {r.active:>12} {r.density:>8.4f} {r.shared:>12} {r.unique:>12} {rho:>8} {r.lam:>8.5f}  [{hist}]"
        )
    return "\n".join(rows)
