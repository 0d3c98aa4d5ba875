"""The block contract: a block's sources on disk and its arrays, the one thing methods,
statistics, backends and executors share (``Block`` itself is in ``ramstream.plan``)."""

from ramstream.blocks.arrays import BlockArrays, BlockReader
from ramstream.blocks.sources import BlockSources

__all__ = ["BlockArrays", "BlockReader", "BlockSources"]
