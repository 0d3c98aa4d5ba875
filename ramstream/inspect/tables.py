"""Tables of overlap numbers: one row per tensor, layer, module (or the whole model), per agent.

A table holds the integer counts (``overlap (rows, N, N)``, ``coverage (rows, N+1)``, as in
``ramstream.statistics.overlap``) and derives every ratio from them, so each number can be checked against a
dense reference:

    params        elements of the row (its merged tensors)
    active_t      elements where |tau_t| > eps
    unique_t      active_t elements no other agent changed;   shared_t = active_t - unique_t
    density_t     active_t / params
    unique_share_t  unique_t / active_t (0 when the agent changed nothing there)
    rho_t         shared_t / unique_t (inf when unique_t = 0 < shared_t, 0 when both are 0)
    collide       elements that two or more agents changed, over params
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from functools import cached_property
from typing import Any, Literal

import numpy as np

from ramstream.errors import ConfigError
from ramstream.statistics.overlap import OverlapCounts

By = Literal["model", "tensor", "layer", "module"]
RankBy = Literal["unique_share", "unique", "shared", "active", "density", "rho"]
RANK_BY: tuple[RankBy, ...] = ("unique_share", "unique", "shared", "active", "density", "rho")


def _ratio(num: np.ndarray, den: np.ndarray) -> np.ndarray:
    num = num.astype(np.float64)
    den = np.broadcast_to(den, num.shape).astype(np.float64)
    out = np.zeros(num.shape, np.float64)
    np.divide(num, den, out=out, where=den > 0)
    return out


@dataclass(frozen=True)
class Table:
    """Rows of counts; the derived arrays are computed once, on first use."""

    by: By
    keys: tuple[str, ...]
    agents: tuple[str, ...]
    counts: OverlapCounts  # overlap (rows, N, N), coverage (rows, N+1)
    n_tensors: np.ndarray  # (rows,) how many merged tensors each row sums

    def __len__(self) -> int:
        return len(self.keys)

    @property
    def overlap(self) -> np.ndarray:
        return self.counts.overlap

    @property
    def coverage(self) -> np.ndarray:
        return self.counts.coverage

    @cached_property
    def params(self) -> np.ndarray:
        return self.counts.elements

    @cached_property
    def active(self) -> np.ndarray:
        return self.counts.active

    @cached_property
    def unique(self) -> np.ndarray:
        return self.counts.unique

    @cached_property
    def shared(self) -> np.ndarray:
        return self.counts.shared

    @cached_property
    def density(self) -> np.ndarray:
        return _ratio(self.active, self.params[:, None])

    @cached_property
    def unique_share(self) -> np.ndarray:
        return _ratio(self.unique, self.active)

    @cached_property
    def rho(self) -> np.ndarray:
        return self.counts.rho()

    @cached_property
    def collide(self) -> np.ndarray:
        return _ratio(self.coverage[:, 2:].sum(axis=1), self.params)

    def row(self, key: str) -> int:
        try:
            return self.keys.index(key)
        except ValueError:
            raise ConfigError(f"no {self.by} {key!r} in this index") from None

    def agent(self, name: str) -> int:
        if name in self.agents:
            return self.agents.index(name)
        raise ConfigError(f"no agent {name!r} in this index; agents: {', '.join(self.agents)}")

    def metric(self, name: RankBy) -> np.ndarray:
        if name not in RANK_BY:
            raise ConfigError(f"cannot rank by {name!r}; choose one of {', '.join(RANK_BY)}")
        return np.asarray(getattr(self, name))

    def select(self, rows: Sequence[int] | np.ndarray) -> Table:
        index = np.asarray(rows, dtype=np.int64)
        return Table(
            self.by,
            tuple(self.keys[i] for i in index),
            self.agents,
            OverlapCounts(self.overlap[index], self.coverage[index]),
            self.n_tensors[index],
        )

    def top(self, agent: int, k: int, rank_by: RankBy = "unique_share") -> Table:
        """The ``k`` rows where ``agent`` ranks highest by ``rank_by`` (ties: more unique
        elements first, then row order); rows the agent did not touch never rank."""
        value = self.metric(rank_by)[:, agent]
        candidates = np.flatnonzero(self.active[:, agent] > 0)
        order = np.lexsort((candidates, -self.unique[candidates, agent], -value[candidates]))
        return self.select(candidates[order][: max(k, 0)])

    def group(self, by: By, keys: Sequence[str], rows: Sequence[int]) -> Table:
        """Sum this table's rows into ``keys``; ``rows[i]`` is the new row of row ``i``."""
        owner = np.asarray(rows, dtype=np.int64)
        n = len(self.agents)
        counts = OverlapCounts.zeros(n, (len(keys),))
        np.add.at(counts.overlap, owner, self.overlap)
        np.add.at(counts.coverage, owner, self.coverage)
        n_tensors = np.zeros(len(keys), np.int64)
        np.add.at(n_tensors, owner, self.n_tensors)
        return Table(by, tuple(keys), self.agents, counts, n_tensors)

    def records(self) -> list[dict[str, Any]]:
        """One flat record per (row, agent): the long format behind ``to_pandas``."""
        params, active, unique, shared = self.params, self.active, self.unique, self.shared
        density, unique_share, rho, collide = self.density, self.unique_share, self.rho, self.collide
        out = []
        for i, key in enumerate(self.keys):
            for t, agent in enumerate(self.agents):
                out.append(
                    {
                        self.by: key,
                        "agent": agent,
                        "params": int(params[i]),
                        "active": int(active[i, t]),
                        "shared": int(shared[i, t]),
                        "unique": int(unique[i, t]),
                        "density": float(density[i, t]),
                        "unique_share": float(unique_share[i, t]),
                        "rho": float(rho[i, t]),
                        "collide": float(collide[i]),
                    }
                )
        return out

    def to_pandas(self) -> Any:
        """A long ``pandas.DataFrame``: one row per (row, agent) (needs pandas)."""
        from ramstream.inspect.extras import require

        pd = require("pandas", "notebook")
        return pd.DataFrame.from_records(self.records())
