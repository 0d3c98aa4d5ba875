"""The raw inputs of one block: the base and every agent, as kernel-ready arrays."""

from __future__ import annotations

from dataclasses import dataclass

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


class BlockInputs:
    """Maps the family's files and hands out (and releases) block views."""

    def __init__(self, family: Family, plan: Plan, files: MappedFiles) -> None:
        self.family = family
        self.plan = plan
        self.files = files

    def _refs(self, block: Block):  # type: ignore[no-untyped-def]
        name = self.plan.tensors[block.tensor].name
        return [m.tensors[name] for m in self.family.members]

    def arrays(self, block: Block) -> BlockArrays:
        refs = self._refs(block)
        views = [self.files.float_view(r, block.start, block.stop) for r in refs]
        codes = [int(FLOAT_CODES[r.entry.dtype]) for r in refs]
        agents, agent_codes = views[1:], codes[1:]
        if len({a.dtype for a in agents}) > 1:
            # Agents stored in different carriers (say f32 and bf16): decode all to float32.
            agents = [_as_readonly(decode_array(a, c)) for a, c in zip(agents, agent_codes, strict=True)]
            agent_codes = [int(FloatCode.F32)] * len(agents)
        return BlockArrays(views[0], codes[0], tuple(agents), np.array(agent_codes, dtype=np.int64))

    def release(self, block: Block) -> None:
        for ref in self._refs(block):
            self.files.release(ref, block.start, block.stop)

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
