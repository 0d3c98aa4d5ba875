"""Do two agents' updates agree, add up or conflict where they overlap? Per pair, from the weights.

With tau = f32(agent) - f32(base) and the active mask m = |tau| > eps (eps = 1e-5, ramstream's):

- ``both``: #(m_i & m_j), the elements both agents changed (and ``share_i``/``share_j``: that
  count over each agent's active count);
- ``sign_agreement``: on ``both``, the share of elements where tau_i and tau_j have one sign;
- ``cosine``: on ``both``, sum(tau_i tau_j) / sqrt(sum tau_i^2 * sum tau_j^2);

and per agent, ``unique_energy``: sum of tau^2 where no other agent of the family is active, over
sum of tau^2 where it is active. Sums are exact enough in float64 for these shares. Plain numpy
over float32 arrays, written from the definitions: a check on (and a stand-in for) what an index
would answer without the weights.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import asdict, dataclass
from itertools import combinations
from pathlib import Path
from typing import Any

import numpy as np

from ramstream.config import DEFAULT_EPS

Weights = Mapping[str, np.ndarray]


@dataclass(frozen=True)
class PairStats:
    i: int
    j: int
    both: int
    share_i: float
    share_j: float
    sign_agreement: float
    cosine: float

    def to_dict(self) -> dict[str, Any]:
        return asdict(self)


@dataclass(frozen=True)
class Agreement:
    active: tuple[int, ...]
    unique_energy: tuple[float, ...]
    pairs: tuple[PairStats, ...]

    def to_dict(self) -> dict[str, Any]:
        return {
            "active": list(self.active),
            "unique_energy": list(self.unique_energy),
            "pairs": [p.to_dict() for p in self.pairs],
        }


def _ratio(num: float, den: float) -> float:
    return num / den if den > 0 else float("nan")


def agreement(base: Weights, agents: Sequence[Weights], eps: float = DEFAULT_EPS) -> Agreement:
    """The statistics above for every agent and pair of ``agents`` (tensor name -> float32 array)."""
    n = len(agents)
    active = np.zeros(n, np.int64)
    energy = np.zeros(n, np.float64)
    unique = np.zeros(n, np.float64)
    both = np.zeros((n, n), np.int64)
    agree = np.zeros((n, n), np.int64)
    dot = np.zeros((n, n), np.float64)
    sq = np.zeros((n, n), np.float64)  # sq[i, j]: sum of tau_i^2 where both i and j are active
    for name, ref in base.items():
        taus = [np.asarray(a[name], np.float64).ravel() - np.asarray(ref, np.float64).ravel() for a in agents]
        masks = [np.abs(t) > eps for t in taus]
        count = np.sum(masks, axis=0)
        for i, (t, m) in enumerate(zip(taus, masks, strict=True)):
            active[i] += int(m.sum())
            energy[i] += float(np.sum(t[m] ** 2))
            unique[i] += float(np.sum(t[m & (count == 1)] ** 2))
        for i, j in combinations(range(n), 2):
            m = masks[i] & masks[j]
            ti, tj = taus[i][m], taus[j][m]
            both[i, j] += int(m.sum())
            agree[i, j] += int(np.sum(np.sign(ti) == np.sign(tj)))
            dot[i, j] += float(np.sum(ti * tj))
            sq[i, j] += float(np.sum(ti**2))
            sq[j, i] += float(np.sum(tj**2))
    pairs = tuple(
        PairStats(
            i,
            j,
            int(both[i, j]),
            _ratio(both[i, j], active[i]),
            _ratio(both[i, j], active[j]),
            _ratio(agree[i, j], both[i, j]),
            _ratio(dot[i, j], float(np.sqrt(sq[i, j] * sq[j, i]))),
        )
        for i, j in combinations(range(n), 2)
    )
    return Agreement(
        tuple(int(a) for a in active), tuple(_ratio(u, e) for u, e in zip(unique, energy, strict=True)), pairs
    )


def read_f32(directory: Path) -> dict[str, np.ndarray]:
    """A checkpoint's tensors as float32 numpy arrays (bf16 values are exact in float32)."""
    import torch

    from ramstream.lab.checkpoint import read_tensors

    return {k: v.to(torch.float32).numpy() for k, v in read_tensors(directory).items()}


def family_agreement(base: Path, agents: Sequence[Path], eps: float = DEFAULT_EPS) -> Agreement:
    return agreement(read_f32(base), [read_f32(a) for a in agents], eps)
