"""Where a block's inputs lie on disk: files, byte offsets and formats, base first.

Plain data (paths, not descriptors), so it can be handed to a backend in this process or sent
to another machine that sees the same files. A LoRA agent's input is no file range but its task
vector over the block, computed from its factors (``blocks.lora``) and ``held`` here in memory
(float32, code ``TAU32``); its ``files`` entry names the adapter file, for messages.
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
    held: tuple[np.ndarray | None, ...] = ()  # per input: its values in memory, or None (read from files); () none

    def in_memory(self, input_index: int) -> np.ndarray | None:
        """Input ``input_index``'s values when they are held in memory (a LoRA agent), else None."""
        return self.held[input_index] if self.held else None

    def read_error(self, input_index: int) -> CorruptFileError:
        """The error for an input whose bytes could not be read (the file is shorter than its
        header says, or changed during the run)."""
        return CorruptFileError(
            f"{self.files[input_index]}: could not read tensor {self.tensor!r}: the file is shorter "
            "than its header says, or changed during the run; restore it and run the command again"
        )
