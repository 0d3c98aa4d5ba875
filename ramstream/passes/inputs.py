"""The raw inputs of one block: the base and every agent, as kernel-ready arrays."""

from __future__ import annotations

import functools
from collections.abc import Callable
from dataclasses import dataclass, field

import numpy as np

from ramstream.errors import NonFiniteWeightError
from ramstream.format.dtypes import FLOAT_CODES, FloatCode
from ramstream.format.family import Family
from ramstream.io.reader import MappedFiles
from ramstream.kernels.codecs import decode_array
from ramstream.plan import Block, Plan


@dataclass(frozen=True)
class BlockArrays:
    base: np.ndarray
    base_code: int
    agents: tuple[np.ndarray, ...]
    agent_codes: np.ndarray  # int64 (N,)
    # span(start, stop): the same inputs over elements [start, stop) of the block's tensor, for
    # statistics and mergers that must look past the block's edges (whole rows, preceding
    # elements). Its pages are released with the block's.
    span: Callable[[int, int], BlockArrays] | None = field(default=None, compare=False, repr=False)


class BlockInputs:
    """Maps the family's files and hands out (and releases) block views."""

    def __init__(self, family: Family, plan: Plan, files: MappedFiles) -> None:
        self.family = family
        self.plan = plan
        self.files = files
        self._spans: dict[int, list[tuple[int, int]]] = {}  # block index -> extra ranges handed out

    def _refs(self, block: Block):  # type: ignore[no-untyped-def]
        name = self.plan.tensors[block.tensor].name
        return [m.tensors[name] for m in self.family.members]

    def arrays(self, block: Block) -> BlockArrays:
        return self._views(block, block.start, block.stop)

    def _span(self, block: Block, start: int, stop: int) -> BlockArrays:
        numel = self.plan.tensors[block.tensor].numel
        if not 0 <= start <= stop <= numel:
            raise ValueError(f"span [{start}, {stop}) lies outside tensor {block.tensor} ({numel} elements)")
        self._spans.setdefault(block.index, []).append((start, stop))
        return self._views(block, start, stop)

    def _views(self, block: Block, start: int, stop: int) -> BlockArrays:
        refs = self._refs(block)
        views = [self.files.float_view(r, start, stop) for r in refs]
        codes = [int(FLOAT_CODES[r.entry.dtype]) for r in refs]
        agents, agent_codes = views[1:], codes[1:]
        if len({a.dtype for a in agents}) > 1:
            # Agents stored in different carriers (say f32 and bf16): decode all to float32.
            agents = [_as_readonly(decode_array(a, c)) for a, c in zip(agents, agent_codes, strict=True)]
            agent_codes = [int(FloatCode.F32)] * len(agents)
        span = functools.partial(self._span, block)
        return BlockArrays(views[0], codes[0], tuple(agents), np.array(agent_codes, dtype=np.int64), span)

    def release(self, block: Block) -> None:
        ranges = [(block.start, block.stop), *self._spans.pop(block.index, [])]
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
