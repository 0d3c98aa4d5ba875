"""Block mergers over the generalized task arithmetic kernel (``ramstream.kernels.gta``).

``gta_merger`` turns per-tensor constants into the ``BlockMerger`` a ``Prepared`` holds, for the
methods whose survivors are all elements or a counter-RNG draw (task arithmetic, DARE, model
stock). Methods that build keep arrays themselves call ``kernels.gta.gta_merge_block`` directly.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

import numpy as np

from ramstream.kernels import gta
from ramstream.kernels.keep import KEEP_ALL, KEEP_ARRAY, KEEP_RANDOM, NO_DENSITY, NO_KEEP, NO_KEYS
from ramstream.methods.base import BlockMerger
from ramstream.passes.inputs import BlockArrays
from ramstream.plan import Block

CONSENSUS = {"none": gta.CONSENSUS_NONE, "sum": gta.CONSENSUS_SUM, "count": gta.CONSENSUS_COUNT}


# keep(arrays, block, workers) -> the block's (N, n) keep multipliers (0 drops an element)
KeepFunction = Callable[[BlockArrays, Block, int], np.ndarray]


@dataclass(frozen=True)
class RandomDrop:
    """DARE's drop: agent t keeps element i of tensor T where uniform(keys[T, t], i) < density[t]."""

    keys: np.ndarray  # uint64 (tensors, N)
    density: np.ndarray  # float32 (N,)


def gta_merger(
    weights: np.ndarray,
    scale: np.ndarray,
    lam: np.ndarray,
    *,
    consensus: str = "none",
    normalize: bool = False,
    drop: RandomDrop | None = None,
    keep: KeepFunction | None = None,
) -> BlockMerger:
    """A block merger with float32 ``weights`` (N,), ``scale`` (tensors, N) and ``lam`` (tensors,).

    Elements are all kept, dropped at random (``drop``), or kept by ``keep(arrays, block,
    workers)``, which returns the block's (N, n) keep multipliers (magnitude trimming, DELLA).
    """
    if drop is not None and keep is not None:
        raise ValueError("give drop or keep, not both")
    weights = np.ascontiguousarray(weights, np.float32)
    scale = np.ascontiguousarray(scale, np.float32)
    lam = np.ascontiguousarray(lam, np.float32)
    mode = KEEP_RANDOM if drop is not None else KEEP_ARRAY if keep is not None else KEEP_ALL
    density = drop.density if drop is not None else NO_DENSITY
    code = CONSENSUS[consensus]

    def merge_block(arrays: BlockArrays, block: Block, out: np.ndarray, out_code: int, workers: int) -> None:
        keys = drop.keys[block.tensor] if drop is not None else NO_KEYS
        gta.gta_merge_block(
            arrays.base,
            arrays.base_code,
            arrays.agents,
            arrays.agent_codes,
            weights,
            scale[block.tensor],
            mode,
            keep(arrays, block, workers) if keep is not None else NO_KEEP,
            keys,
            density,
            block.start,
            code,
            normalize,
            lam[block.tensor],
            out,
            out_code,
            workers,
        )

    return merge_block
