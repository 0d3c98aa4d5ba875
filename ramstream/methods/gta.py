"""Block mergers over the backend's generalized task arithmetic (``Backend.merge_gta``).

``gta_prepared`` turns per-tensor constants into the ``Prepared`` (block merger, and fusion with
merges that differ only in lambda) of every method of the GTA family: task arithmetic, DARE,
TIES, breadcrumbs, DELLA, model stock.
Survivors are all elements, a counter-RNG draw (``drop``), or what a ``Selection`` describes per
block (magnitude cuts, MAGPRUNE): a record the backend evaluates inside its merge, so each input
is read once per block.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np

from ramstream.backends.base import Backend, Consensus, GtaParams, Keep, KeepAll, KeepRandom
from ramstream.blocks import BlockArrays
from ramstream.methods import tensor_settings as ts
from ramstream.methods.base import Fused, Prepared
from ramstream.plan import Block
from ramstream.statistics.magnitude import digest


@dataclass(frozen=True)
class Selection:
    """Which elements survive, per block: ``of(arrays, block, backend)`` returns the block's
    ``Keep`` record (``KeepCuts``, ``KeepMagprune``...); ``key`` identifies the selection, so
    merges with equal keys (a sweep's candidates that differ only in lambda) fuse."""

    key: str
    of: Callable[[BlockArrays, Block, Backend], Keep]


@dataclass(frozen=True)
class RandomDrop:
    """DARE's drop: agent t keeps element i of tensor T where uniform(keys[T, t], i) < density[T, t]."""

    keys: np.ndarray  # uint64 (tensors, N)
    density: np.ndarray  # float32 (tensors, N)


def parse_weighting(given: Mapping[str, Any], n_agents: int) -> tuple[tuple[ts.Setting, ...], ts.Setting]:
    """The family's ``weights`` (one per agent, default 1) and ``lambda`` (default 1): numbers, or
    gradients and filters that give each tensor its own value, as mergekit reads them."""
    weights = ts.per_agent("weights", given.get("weights", 1.0), n_agents)
    return weights, ts.parse("lambda", given.get("lambda", 1.0))


def weighting_json(weights: Sequence[ts.Setting], lam: ts.Setting) -> dict[str, Any]:
    return {"weights": [ts.to_json(w) for w in weights], "lambda": ts.to_json(lam)}


def weight_report(weights: Sequence[ts.Setting]) -> dict[str, tuple[float, ...]]:
    """The weights to report per agent: none when they vary per tensor."""
    return uniform_report("weight", weights)


def uniform_report(name: str, settings: Sequence[ts.Setting]) -> dict[str, tuple[float, ...]]:
    """A per-agent parameter to report: none when it varies per tensor (the record and the card
    hold the setting itself)."""
    values = ts.uniform(settings)
    return {} if values is None else {name: values}


def check_weighting(weights: Sequence[ts.Setting], lam: ts.Setting, names: Sequence[str]) -> None:
    ts.check([*weights, lam], names)


def gta_prepared(
    per_agent: dict[str, tuple[float, ...]],
    weights: np.ndarray,
    scale: np.ndarray,
    lam: np.ndarray,
    *,
    consensus: Consensus = "none",
    normalize: bool = False,
    drop: RandomDrop | None = None,
    select: Selection | None = None,
) -> Prepared:
    """A GTA method ready to merge: float32 ``weights`` (N,) or (tensors, N), ``scale`` (tensors,
    N) and ``lam`` (tensors,), and ``per_agent`` to report.

    Elements are all kept, dropped at random (``drop``), or chosen by ``select`` (magnitude
    trimming, DELLA). Merges that differ only in ``lam`` (task arithmetic, DARE, TIES... for several
    lambdas) fuse: one kernel call per block writes all of them (``Fused``).
    """
    if drop is not None and select is not None:
        raise ValueError("give drop or select, not both")
    scale = np.ascontiguousarray(scale, np.float32)
    weights = np.ascontiguousarray(np.broadcast_to(np.asarray(weights, np.float32), scale.shape))
    lam = np.ascontiguousarray(lam, np.float32)

    def merge_many(
        arrays: BlockArrays,
        block: Block,
        owns: Sequence[np.ndarray],
        outs: Sequence[np.ndarray],
        out_code: int,
        backend: Backend,
    ) -> int:
        survivors: Keep
        if drop is not None:
            survivors = KeepRandom(drop.keys[block.tensor], drop.density[block.tensor], block.start)
        elif select is not None:
            survivors = select.of(arrays, block, backend)
        else:
            survivors = KeepAll()
        lams = np.array([own[block.tensor] for own in owns], np.float32)
        params = GtaParams(weights[block.tensor], scale[block.tensor], consensus, normalize, lams)
        return backend.merge_gta(arrays, params, survivors, outs, out_code)

    def merge_block(arrays: BlockArrays, block: Block, out: np.ndarray, out_code: int, backend: Backend) -> int:
        return merge_many(arrays, block, [lam], [out], out_code, backend)

    drawn = () if drop is None else (drop.keys, drop.density)
    chosen = () if select is None else (select.key,)
    fused = Fused(("gta", digest(weights, scale, consensus, str(normalize), *drawn, *chosen)), lam, merge_many)
    return Prepared(merge_block, per_agent, fused)
