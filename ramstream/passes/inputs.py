"""The inputs of one block: the base and every agent, as file sources or kernel-ready arrays."""

from __future__ import annotations

from dataclasses import dataclass
from functools import cached_property
from pathlib import Path

import numpy as np

from ramstream.errors import CorruptFileError, NonFiniteWeightError
from ramstream.format.checkpoint import TensorRef
from ramstream.format.dtypes import FLOAT_CODES, ITEMSIZE, FloatCode
from ramstream.format.family import Family
from ramstream.io.reader import InputFiles
from ramstream.kernels.codecs import decode_array
from ramstream.plan import Block, Plan


@dataclass(frozen=True)
class BlockSources:
    """Where a block's inputs lie on disk, base first: for the kernels that read their own tiles
    (``ramstream/kernels/sources.py``). Nothing is mapped, so nothing needs releasing."""

    fds: np.ndarray  # int64 (N+1,): open descriptors
    offsets: np.ndarray  # int64 (N+1,): byte offset of the range's first element in each file
    codes: np.ndarray  # int64 (N+1,): format codes
    size: int  # elements
    files: tuple[Path, ...]
    tensor: str

    def check(self, failed: np.ndarray) -> None:
        """Raise for a kernel's ``failed`` row (-1 per worker when every read succeeded)."""
        bad = failed[failed >= 0]
        if bad.size:
            raise CorruptFileError(
                f"{self.files[int(bad.min())]}: could not read tensor {self.tensor!r}: the file is shorter "
                "than its header says, or changed during the run; restore it and run the command again"
            )


class BlockArrays:
    """One block's inputs (or a span of its tensor), in the form a kernel asks for: ``sources``
    for the kernels that read their own tiles, mapped views (``base``, ``agents``, their codes)
    for the others. Views are made on first use, so a block read through ``sources`` maps nothing.
    """

    def __init__(self, inputs: BlockInputs, block: Block, start: int, stop: int) -> None:
        self._inputs = inputs
        self._block = block
        self._start = start
        self._stop = stop

    @cached_property
    def sources(self) -> BlockSources:
        return self._inputs._sources(self._block, self._start, self._stop)

    @cached_property
    def _views(self) -> tuple[np.ndarray, int, tuple[np.ndarray, ...], np.ndarray]:
        return self._inputs._views(self._block, self._start, self._stop)

    @property
    def base(self) -> np.ndarray:
        return self._views[0]

    @property
    def base_code(self) -> int:
        return self._views[1]

    @property
    def agents(self) -> tuple[np.ndarray, ...]:
        return self._views[2]

    @property
    def agent_codes(self) -> np.ndarray:  # int64 (N,)
        return self._views[3]

    def span(self, start: int, stop: int) -> BlockArrays:
        """The same inputs over elements ``[start, stop)`` of the block's tensor, for statistics
        and mergers that must look past the block's edges (whole rows, preceding elements). Its
        pages are released with the block's."""
        numel = self._inputs.plan.tensors[self._block.tensor].numel
        if not 0 <= start <= stop <= numel:
            raise ValueError(f"span [{start}, {stop}) lies outside tensor {self._block.tensor} ({numel} elements)")
        return BlockArrays(self._inputs, self._block, start, stop)


class BlockInputs:
    """Opens the family's files and hands out (and releases) block inputs."""

    def __init__(self, family: Family, plan: Plan, files: InputFiles) -> None:
        self.family = family
        self.plan = plan
        self.files = files
        self._mapped: dict[int, list[tuple[int, int]]] = {}  # block index -> ranges mapped for it

    def _refs(self, block: Block) -> list[TensorRef]:
        name = self.plan.tensors[block.tensor].name
        return [m.tensors[name] for m in self.family.members]

    def arrays(self, block: Block) -> BlockArrays:
        return BlockArrays(self, block, block.start, block.stop)

    def _sources(self, block: Block, start: int, stop: int) -> BlockSources:
        refs = self._refs(block)
        codes = [int(FLOAT_CODES[r.entry.dtype]) for r in refs]
        offsets = [r.entry.offset + start * ITEMSIZE[r.entry.dtype] for r in refs]
        return BlockSources(
            np.array([self.files.descriptor(r.file) for r in refs], np.int64),
            np.array(offsets, np.int64),
            np.array(codes, np.int64),
            stop - start,
            tuple(r.file for r in refs),
            self.plan.tensors[block.tensor].name,
        )

    def _views(self, block: Block, start: int, stop: int) -> tuple[np.ndarray, int, tuple[np.ndarray, ...], np.ndarray]:
        refs = self._refs(block)
        self._mapped.setdefault(block.index, []).append((start, stop))
        views = [self.files.float_view(r, start, stop) for r in refs]
        codes = [int(FLOAT_CODES[r.entry.dtype]) for r in refs]
        agents, agent_codes = views[1:], codes[1:]
        if len({a.dtype for a in agents}) > 1:
            # Agents stored in different carriers (say f32 and bf16): decode all to float32.
            agents = [_as_readonly(decode_array(a, c)) for a, c in zip(agents, agent_codes, strict=True)]
            agent_codes = [int(FloatCode.F32)] * len(agents)
        return views[0], codes[0], tuple(agents), np.array(agent_codes, dtype=np.int64)

    def release(self, block: Block) -> None:
        """Drop the pages mapped for ``block`` (its views and spans); none if it used ``sources``."""
        ranges = self._mapped.pop(block.index, [])
        for ref in self._refs(block):
            for start, stop in ranges:
                self.files.release(ref, start, stop)

    def prefetch(self, block: Block) -> None:
        for ref in self._refs(block):
            self.files.prefetch(ref, block.start, block.stop)

    def nonfinite_error(self, block: Block, position: int) -> NonFiniteWeightError:
        """Name the first input holding a NaN/Inf at ``position`` of ``block``."""
        tensor = self.plan.tensors[block.tensor]
        element = block.start + position
        where = np.unravel_index(element, tensor.shape) if tensor.shape else ()
        self._mapped.setdefault(block.index, []).append((element, element + 1))
        for ref, member in zip(self._refs(block), self.family.members, strict=True):
            value = decode_array(self.files.float_view(ref, element, element + 1), FLOAT_CODES[ref.entry.dtype])[0]
            if not np.isfinite(value):
                return NonFiniteWeightError(
                    f"{ref.file}: tensor {tensor.name!r} of {member.name} holds {value} at index "
                    f"{list(map(int, where))}; fix the checkpoint (NaN/Inf weights cannot be merged)"
                )
        return NonFiniteWeightError(f"tensor {tensor.name!r}: non-finite value at element {element}")


def _as_readonly(array: np.ndarray) -> np.ndarray:
    array.setflags(write=False)
    return array
