"""Which blocks of a pass are done: one byte per block, each in its own Zarr chunk.

A block is marked only after its data has been written (zarr's local store writes each chunk
to a temporary file and renames it into place), so a kill loses at most the blocks in flight.
"""

from __future__ import annotations

import numpy as np
import zarr


class Journal:
    def __init__(self, array: zarr.Array) -> None:
        self._array = array

    @classmethod
    def create(cls, group: zarr.Group, name: str, n_blocks: int) -> Journal:
        array = group.create_array(
            name, shape=(max(n_blocks, 1),), chunks=(1,), dtype="uint8", fill_value=0, compressors=None
        )
        return cls(array)

    @classmethod
    def open(cls, group: zarr.Group, name: str) -> Journal:
        array = group[name]
        assert isinstance(array, zarr.Array)
        return cls(array)

    @property
    def size(self) -> int:
        return int(self._array.shape[0])

    def done(self, n_blocks: int) -> np.ndarray:
        """A boolean per block."""
        if n_blocks == 0:
            return np.zeros(0, dtype=bool)
        return np.asarray(self._array[:n_blocks]) != 0

    def mark(self, block: int) -> None:
        self._array[block] = 1
