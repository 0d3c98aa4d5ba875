"""Block mergers over the backend's generalized task arithmetic (``Backend.merge_gta``).

``gta_merger`` turns per-tensor constants into the ``BlockMerger`` a ``Prepared`` holds, for
every method of the GTA family: task arithmetic, DARE, TIES, breadcrumbs, DELLA, model stock.
Survivors are all elements, a counter-RNG draw (``drop``), or what a keep function returns.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

import numpy as np

from ramstream.backends.base import Backend, Consensus, GtaParams, Keep, KeepAll, KeepArray, KeepRandom
from ramstream.blocks import BlockArrays
from ramstream.methods.base import BlockMerger
from ramstream.plan import Block

# keep(arrays, block, backend) -> the block's (N, n) keep multipliers (0 drops an element)
KeepFunction = Callable[[BlockArrays, Block, Backend], np.ndarray]


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
    consensus: Consensus = "none",
    normalize: bool = False,
    drop: RandomDrop | None = None,
    keep: KeepFunction | None = None,
) -> BlockMerger:
    """A block merger with float32 ``weights`` (N,), ``scale`` (tensors, N) and ``lam`` (tensors,).

    Elements are all kept, dropped at random (``drop``), or kept by ``keep(arrays, block,
    backend)``, which returns the block's (N, n) keep multipliers (magnitude trimming, DELLA).
    """
    if drop is not None and keep is not None:
        raise ValueError("give drop or keep, not both")
    weights = np.ascontiguousarray(weights, np.float32)
    scale = np.ascontiguousarray(scale, np.float32)
    lam = np.ascontiguousarray(lam, np.float32)

    def merge_block(arrays: BlockArrays, block: Block, out: np.ndarray, out_code: int, backend: Backend) -> None:
        survivors: Keep
        if drop is not None:
            survivors = KeepRandom(drop.keys[block.tensor], drop.density, block.start)
        elif keep is not None:
            survivors = KeepArray(keep(arrays, block, backend))
        else:
            survivors = KeepAll()
        params = GtaParams(weights, scale[block.tensor], consensus, normalize, lam[block.tensor])
        backend.merge_gta(arrays, params, survivors, out, out_code)

    return merge_block
