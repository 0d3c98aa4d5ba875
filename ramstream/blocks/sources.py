"""Where a block's inputs lie on disk: files, byte offsets and formats, base first.

Plain data (paths, not descriptors), so it can be handed to a backend in this process or sent
to another machine that sees the same files.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

import numpy as np

from ramstream.errors import CorruptFileError


@dataclass(frozen=True, eq=False)
class BlockSources:
    files: tuple[Path, ...]  # base first, then each agent
    offsets: np.ndarray  # int64 (N+1,): byte offset of the range's first element in each file
    codes: np.ndarray  # int64 (N+1,): format codes (``format.dtypes.FloatCode``)
    size: int  # elements
    tensor: str

    def read_error(self, input_index: int) -> CorruptFileError:
        """The error for an input whose bytes could not be read (the file is shorter than its
        header says, or changed during the run)."""
        return CorruptFileError(
            f"{self.files[input_index]}: could not read tensor {self.tensor!r}: the file is shorter "
            "than its header says, or changed during the run; restore it and run the command again"
        )
