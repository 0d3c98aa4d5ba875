"""How each pair of agents' updates relate, per tensor, layer, module or the whole model.

From the index's agreement statistics (``statistics.agreement``, added by ``ramstream probe
--agreement``). For agents i < j over a scope, with m_t = eps < |tau_t| < Inf:

    both              #(m_i and m_j)
    both_share_i      both / active_i (how much of what i changed j changed too); likewise j
    same_sign         #(m_i and m_j and sign(tau_i) = sign(tau_j));  sign_agreement = same_sign / both
    cosine            sum tau_i tau_j / sqrt(sum tau_i^2 * sum tau_j^2), over the elements of both
    magnitude_ratio   sqrt(sum tau_i^2 / sum tau_j^2), over the elements of both
    per agent t: unique_energy_share = sum tau_t^2 over its unique elements / over its active ones

Ratios with a zero denominator are 0 (a magnitude ratio with sum tau_j^2 = 0 < sum tau_i^2 is
inf); the cosine is clipped to [-1, 1] (the sums are exact, their float64 roundings may exceed
Cauchy-Schwarz by an ulp). Same update learned twice: cosine near 1, ratio near 1 (average it);
independent updates: little overlap or cosine near 0 (sum them); conflicts: sign agreement
below one half, negative cosine.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass
from functools import cached_property
from typing import Any

import numpy as np

from ramstream.backends.agreement import agent_pairs
from ramstream.errors import IndexMismatchError
from ramstream.index.store import IndexStore
from ramstream.inspect.tables import By, Table
from ramstream.statistics.agreement import Agreement, agreement_totals, missing_message


def _ratio(num: np.ndarray, den: np.ndarray) -> np.ndarray:
    out = np.zeros(np.broadcast_shapes(num.shape, den.shape), np.float64)
    np.divide(num, den, out=out, where=den > 0)
    return out


@dataclass(frozen=True)
class PairTable:
    """Rows (tensors or groups) of pair counts and exact sums; derived arrays on first use.
    Pair arrays are ``(rows, P)`` in ``pairs`` order, agent arrays ``(rows, N)``."""

    by: By
    keys: tuple[str, ...]
    agents: tuple[str, ...]
    active: np.ndarray  # int64 (rows, N), from the probe's counts
    counts: np.ndarray  # int64 (rows, P, 2): both, same sign
    sums: np.ndarray  # float64 (rows, 3 P + 2 N): backends.agreement's layout, rounded once

    def __len__(self) -> int:
        return len(self.keys)

    @property
    def pairs(self) -> list[tuple[int, int]]:
        return agent_pairs(len(self.agents))

    @property
    def pair_names(self) -> list[str]:
        return [f"{self.agents[i]} ~ {self.agents[j]}" for i, j in self.pairs]

    @property
    def both(self) -> np.ndarray:
        return self.counts[..., 0]

    @property
    def same_sign(self) -> np.ndarray:
        return self.counts[..., 1]

    @property
    def sum_products(self) -> np.ndarray:
        return self.sums[:, 0 : 3 * len(self.pairs) : 3]

    @property
    def sum_squares(self) -> tuple[np.ndarray, np.ndarray]:
        """sum tau_i^2 and sum tau_j^2 over the elements both changed, ``(rows, P)`` each."""
        n = 3 * len(self.pairs)
        return self.sums[:, 1:n:3], self.sums[:, 2:n:3]

    @cached_property
    def both_share(self) -> tuple[np.ndarray, np.ndarray]:
        """both / active_i and both / active_j."""
        first = np.array([i for i, _ in self.pairs], np.int64)
        second = np.array([j for _, j in self.pairs], np.int64)
        both = self.both.astype(np.float64)
        return _ratio(both, self.active[:, first].astype(np.float64)), _ratio(
            both, self.active[:, second].astype(np.float64)
        )

    @cached_property
    def sign_agreement(self) -> np.ndarray:
        return _ratio(self.same_sign.astype(np.float64), self.both.astype(np.float64))

    @cached_property
    def cosine(self) -> np.ndarray:
        sq_i, sq_j = self.sum_squares
        return np.clip(_ratio(self.sum_products, np.sqrt(sq_i) * np.sqrt(sq_j)), -1.0, 1.0)

    @cached_property
    def magnitude_ratio(self) -> np.ndarray:
        sq_i, sq_j = self.sum_squares
        ratio = np.sqrt(_ratio(sq_i, sq_j))
        ratio[(sq_j == 0) & (sq_i > 0)] = np.inf
        return ratio

    @property
    def unique_energy(self) -> np.ndarray:
        return self.sums[:, 3 * len(self.pairs) :: 2]

    @property
    def shared_energy(self) -> np.ndarray:
        return self.sums[:, 3 * len(self.pairs) + 1 :: 2]

    @cached_property
    def unique_energy_share(self) -> np.ndarray:
        return _ratio(self.unique_energy, self.unique_energy + self.shared_energy)

    def records(self) -> list[dict[str, Any]]:
        """One flat record per (row, pair): the long format behind ``to_pandas``."""
        share_i, share_j = self.both_share
        out = []
        for r, key in enumerate(self.keys):
            for p, (i, j) in enumerate(self.pairs):
                out.append(
                    {
                        self.by: key,
                        "agent_i": self.agents[i],
                        "agent_j": self.agents[j],
                        "both": int(self.both[r, p]),
                        "both_share_i": float(share_i[r, p]),
                        "both_share_j": float(share_j[r, p]),
                        "sign_agreement": float(self.sign_agreement[r, p]),
                        "cosine": float(self.cosine[r, p]),
                        "magnitude_ratio": float(self.magnitude_ratio[r, p]),
                    }
                )
        return out

    def to_pandas(self) -> Any:
        """A long ``pandas.DataFrame``: one row per (row, pair) (needs pandas)."""
        from ramstream.inspect.extras import require

        pd = require("pandas", "notebook")
        return pd.DataFrame.from_records(self.records())


class Pairs:
    """The agreement of every pair of agents, at every grouping of the tensors (``IndexView.pairs``).

        >>> view.pairs.model.cosine            # (1, P)
        >>> view.pairs.tensors.sign_agreement  # (tensors, P), rows as view.tensors
        >>> view.pairs.table("layer").both_share

    Each table is one read of the index's partials, exact at its own grouping."""

    def __init__(
        self,
        store: IndexStore,
        merged: Sequence[int],
        grouping: Callable[[By], tuple[Sequence[str], Sequence[int]]],
        counts: Callable[[By], Table],
    ) -> None:
        if not store.statistic_complete(Agreement(store.header.eps).key):
            raise IndexMismatchError(missing_message(store))
        self._store = store
        self._merged = np.asarray(merged, np.int64)
        self._grouping = grouping
        self._counts = counts
        self._tables: dict[By, PairTable] = {}

    @property
    def agents(self) -> tuple[str, ...]:
        return self._store.header.agents

    def table(self, by: By) -> PairTable:
        if by not in self._tables:
            keys, rows = self._grouping(by)
            owner = np.full(len(self._store.plan.tensors), -1, np.int64)
            owner[self._merged] = np.asarray(rows, np.int64)
            totals = agreement_totals(self._store, owner, len(keys))
            active = self._counts(by).active
            self._tables[by] = PairTable(by, tuple(keys), self.agents, active, totals.counts, totals.sums)
        return self._tables[by]

    @property
    def model(self) -> PairTable:
        return self.table("model")

    @property
    def tensors(self) -> PairTable:
        return self.table("tensor")

    @property
    def layers(self) -> PairTable:
        return self.table("layer")

    @property
    def modules(self) -> PairTable:
        return self.table("module")
