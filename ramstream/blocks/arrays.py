"""A block's inputs as a backend asks for them: ``sources`` (files and offsets, for backends that
read their own tiles) or read-only mapped views of the raw carriers (``base``, ``agents``).

Views are made on first use, so a block read through ``sources`` maps nothing; the pages mapped
for a batch's blocks are released with the batch (``BlockReader.release``). Read-ahead hints and
releases go per run of adjacent bytes in a file, not per block: a batch of a thousand expert
tensors lying side by side in their files costs a few system calls, not thousands.
"""

from __future__ import annotations

from functools import cached_property
from pathlib import Path

import numpy as np

from ramstream.blocks.sources import BlockSources
from ramstream.errors import InputError, NonFiniteWeightError, TaskVectorOverflowError
from ramstream.format import codecs
from ramstream.format.checkpoint import TensorRef
from ramstream.format.dtypes import FLOAT_CODES, ITEMSIZE, FloatCode
from ramstream.format.family import Family
from ramstream.io.reader import InputFiles
from ramstream.plan import Batch, Block, Plan

Views = tuple[np.ndarray, int, tuple[np.ndarray, ...], np.ndarray]


class BlockArrays:
    """One block's inputs (or a span of its tensor). ``agents`` share one carrier: agents stored
    in different ones (say f32 and bf16) are all decoded to float32."""

    def __init__(self, reader: BlockReader, block: Block, start: int, stop: int) -> None:
        self._reader = reader
        self.block = block
        self.start = start
        self.stop = stop

    @property
    def size(self) -> int:
        return self.stop - self.start

    @cached_property
    def sources(self) -> BlockSources:
        return self._reader._sources(self.block, self.start, self.stop)

    @cached_property
    def _views(self) -> Views:
        return self._reader._views(self.block, self.start, self.stop)

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

    @property
    def n_agents(self) -> int:
        return len(self._reader.family.agents)

    def span(self, start: int, stop: int) -> BlockArrays:
        """The same inputs over elements ``[start, stop)`` of the block's tensor, for statistics
        and mergers that must look past the block's edges (whole rows, preceding elements). Its
        pages are released with the block's."""
        numel = self._reader.plan.tensors[self.block.tensor].numel
        if not 0 <= start <= stop <= numel:
            raise ValueError(f"span [{start}, {stop}) lies outside tensor {self.block.tensor} ({numel} elements)")
        return BlockArrays(self._reader, self.block, start, stop)

    def first_nonfinite_tau(self, chunk: int = 1 << 20) -> int:
        """The first position where some agent's task vector (agent minus base, in float32) is
        NaN or Inf, or -1: a NaN/Inf weight, or finite weights too far apart. For error paths:
        decoded with numpy, a chunk at a time."""
        for lo in range(0, self.size, chunk):
            hi = min(lo + chunk, self.size)
            base = codecs.decode(self.base[lo:hi], self.base_code)
            bad = np.zeros(hi - lo, bool)
            for agent, code in zip(self.agents, self.agent_codes, strict=True):
                with np.errstate(over="ignore", invalid="ignore"):
                    bad |= ~np.isfinite(codecs.decode(agent[lo:hi], int(code)) - base)
            if bad.any():
                return lo + int(np.argmax(bad))
        return -1

    def nonfinite_error(self, position: int) -> InputError:
        """Name the first input holding a NaN/Inf at ``position`` (of this span), or the agent
        whose task vector overflows float32 there."""
        return self._reader.nonfinite_error(self.block, self.start - self.block.start + position)


class BlockReader:
    """Hands out (and releases) the inputs of the family's blocks over open files."""

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
        return BlockSources(
            tuple(r.file for r in refs),
            np.array([r.entry.offset + start * ITEMSIZE[r.entry.dtype] for r in refs], np.int64),
            np.array([int(FLOAT_CODES[r.entry.dtype]) for r in refs], np.int64),
            stop - start,
            self.plan.tensors[block.tensor].name,
        )

    def _views(self, block: Block, start: int, stop: int) -> Views:
        refs = self._refs(block)
        self._mapped.setdefault(block.index, []).append((start, stop))
        views = [self.files.float_view(r, start, stop) for r in refs]
        codes = [int(FLOAT_CODES[r.entry.dtype]) for r in refs]
        agents, agent_codes = views[1:], codes[1:]
        if len({a.dtype for a in agents}) > 1:
            agents = [_readonly(codecs.decode(a, c)) for a, c in zip(agents, agent_codes, strict=True)]
            agent_codes = [int(FloatCode.F32)] * len(agents)
        return views[0], codes[0], tuple(agents), np.array(agent_codes, dtype=np.int64)

    def release(self, batch: Batch) -> None:
        """Drop the pages mapped for ``batch``'s blocks (their views and spans); none for blocks
        read through ``sources``."""
        ranges: list[tuple[Path, int, int]] = []
        for b in batch.blocks:
            spans = self._mapped.pop(b, None)
            if spans:
                ranges += self._byte_ranges(self.plan.blocks[b], spans)
        for path, lo, hi in coalesce(ranges):
            self.files.release_bytes(path, lo, hi)

    def prefetch(self, batch: Batch) -> None:
        """Ask the OS to read ``batch``'s inputs ahead, a run of adjacent bytes at a time."""
        ranges: list[tuple[Path, int, int]] = []
        for b in batch.blocks:
            block = self.plan.blocks[b]
            ranges += self._byte_ranges(block, [(block.start, block.stop)])
        for path, lo, hi in coalesce(ranges):
            self.files.prefetch_bytes(path, lo, hi)

    def _byte_ranges(self, block: Block, spans: list[tuple[int, int]]) -> list[tuple[Path, int, int]]:
        out = []
        for ref in self._refs(block):
            size, offset = ITEMSIZE[ref.entry.dtype], ref.entry.offset
            out += [(ref.file, offset + start * size, offset + stop * size) for start, stop in spans]
        return out

    def nonfinite_error(self, block: Block, position: int) -> InputError:
        """Name the first input holding a NaN/Inf at ``position`` of ``block``, or, where they are
        all finite, the agent whose task vector (agent minus base, in float32) overflows there."""
        tensor = self.plan.tensors[block.tensor]
        element = block.start + position
        where = list(map(int, np.unravel_index(element, tensor.shape))) if tensor.shape else []
        self._mapped.setdefault(block.index, []).append((element, element + 1))
        values = []
        for ref, member in zip(self._refs(block), self.family.members, strict=True):
            raw = self.files.float_view(ref, element, element + 1)
            value = codecs.decode(raw, FLOAT_CODES[ref.entry.dtype])[0]
            if not np.isfinite(value):
                return NonFiniteWeightError(
                    f"{ref.file}: tensor {tensor.name!r} of {member.name} holds {value} at index "
                    f"{where}; fix the checkpoint (NaN/Inf weights cannot be merged)"
                )
            values.append(value)
        refs, members = self._refs(block), self.family.members
        for ref, member, value in zip(refs[1:], members[1:], values[1:], strict=True):
            with np.errstate(over="ignore"):
                tau = np.float32(value) - np.float32(values[0])
            if not np.isfinite(tau):
                return TaskVectorOverflowError(
                    f"{ref.file}: tensor {tensor.name!r} of {member.name} at index {where}: its task vector "
                    f"overflows float32 ({value:.7g} minus the base's {values[0]:.7g}): both weights are finite, but "
                    "too far apart to merge; fix the checkpoint (a weight near float32's limit, 3.4e38, is "
                    "seldom a trained one)"
                )
        return NonFiniteWeightError(f"tensor {tensor.name!r}: non-finite value at element {element}")


def coalesce(ranges: list[tuple[Path, int, int]]) -> list[tuple[Path, int, int]]:
    """Byte ranges ``(file, lo, hi)`` merged where they touch or overlap, per file."""
    out: list[tuple[Path, int, int]] = []
    for path, lo, hi in sorted(ranges):
        if out and out[-1][0] == path and lo <= out[-1][2]:
            out[-1] = (path, out[-1][1], max(out[-1][2], hi))
        else:
            out.append((path, lo, hi))
    return out


def _readonly(array: np.ndarray) -> np.ndarray:
    array.setflags(write=False)
    return array
