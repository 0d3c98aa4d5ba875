"""A block's inputs as a backend asks for them: ``sources`` (files and offsets, for backends that
read their own tiles) or read-only mapped views of the raw carriers (``base``, ``agents``).

A LoRA agent's input is its float32 task vector over the block (code ``TAU32``), computed once
per block (or span) from its factors (``blocks.lora``) and handed out both ways; a quantized
tensor's (``format.quantized``) is its dequantized values (``blocks.quantized``: code ``F32``, or
``BF16``/``F16`` for a base read as that dtype), the same way. Both are computed by what the
reader is given (the backend's ``lora_product`` and ``fp8_dequantize``, for their speed).

Views are made on first use, so a block read through ``sources`` maps nothing; the pages mapped
for a batch's blocks are released with the batch (``BlockReader.release``). Read-ahead hints and
releases go per run of adjacent bytes in a file, not per block: a batch of a thousand expert
tensors lying side by side in their files costs a few system calls, not thousands.
"""

from __future__ import annotations

from functools import cached_property
from pathlib import Path
from typing import cast

import numpy as np

from ramstream.blocks.lora import Product, delta_block, numpy_product
from ramstream.blocks.quantized import Dequantize, carrier_code, dequantized_block, numpy_dequantize
from ramstream.blocks.sources import BlockSources
from ramstream.errors import InputError, NonFiniteWeightError, TaskVectorOverflowError
from ramstream.format import codecs
from ramstream.format.checkpoint import DeltaRef, QuantRef, TensorRef
from ramstream.format.dtypes import FLOAT_CODES, ITEMSIZE, TAU32, FloatCode
from ramstream.format.family import Family
from ramstream.io.reader import InputFiles
from ramstream.plan import Batch, Block, Plan

Views = tuple[np.ndarray, int, tuple[np.ndarray, ...], np.ndarray]
# How a member holds a tensor: in a file, as a LoRA task vector, or quantized (with its scales)
Ref = TensorRef | DeltaRef | QuantRef


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
        return self._reader._sources(self.block, self.start, self.stop, self._held)

    @cached_property
    def _views(self) -> Views:
        return self._reader._views(self.block, self.start, self.stop, self._held)

    @cached_property
    def _held(self) -> tuple[np.ndarray | None, ...]:
        """Per member, its task vector over this span when it is a LoRA agent's, else None."""
        return self._reader._held(self.block, self.start, self.stop)

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

    def holds_memory(self) -> bool:
        """Whether these arrays hold inputs decoded into memory so far (a LoRA agent's update, a
        quantized tensor's values, agents of mixed formats decoded to float32), not only views of
        the mapped files: what keeping them alive past their batch would cost."""
        held = self.__dict__.get("_held")
        if held and any(h is not None for h in held):
            return True
        views = self.__dict__.get("_views")
        return views is not None and any(_owned(v) for v in (views[0], *views[2]))

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
                    values = codecs.decode(agent[lo:hi], int(code))
                    bad |= ~np.isfinite(values if code == TAU32 else values - base)
            if bad.any():
                return lo + int(np.argmax(bad))
        return -1

    def nonfinite_error(self, position: int) -> InputError:
        """Name the first input holding a NaN/Inf at ``position`` (of this span), or the agent
        whose task vector overflows float32 there."""
        return self._reader.nonfinite_error(self.block, self.start - self.block.start + position)


class BlockReader:
    """Hands out (and releases) the inputs of the family's blocks over open files."""

    def __init__(
        self,
        family: Family,
        plan: Plan,
        files: InputFiles,
        product: Product = numpy_product,
        dequantize: Dequantize = numpy_dequantize,
    ) -> None:
        self.family = family
        self.plan = plan
        self.files = files
        self.product = product  # computes LoRA agents' updates (the backend's, for its speed)
        self.dequantize = dequantize  # decodes FP8 inputs (the backend's, for its speed)
        self._mapped: dict[int, list[tuple[int, int]]] = {}  # block index -> ranges mapped for it

    def _refs(self, block: Block) -> list[Ref]:
        name = self.plan.tensors[block.tensor].name
        return [
            m.deltas[name] if name in m.deltas else m.quantized[name] if name in m.quantized else m.tensors[name]
            for m in self.family.members
        ]

    def _file_refs(self, block: Block) -> list[TensorRef]:
        """The tensors read for a block in proportion to its size (a quantized one's weight)."""
        refs = self._refs(block)
        quantized = [r.weight for r in refs if isinstance(r, QuantRef) and r.layout == "scaled"]  # 1 byte an element
        return [r for r in refs if isinstance(r, TensorRef)] + quantized

    def arrays(self, block: Block) -> BlockArrays:
        return BlockArrays(self, block, block.start, block.stop)

    def file_sources(self, block: Block) -> BlockSources | None:
        """``block``'s sources where every input is a range of a file (None where one is
        computed: a LoRA agent, a quantized tensor), without reading anything."""
        if not all(isinstance(r, TensorRef) for r in self._refs(block)):
            return None
        return self._sources(block, block.start, block.stop, ())

    def _held(self, block: Block, start: int, stop: int) -> tuple[np.ndarray | None, ...]:
        computed = (self._computed(r, start, stop, k == 0) for k, r in enumerate(self._refs(block)))
        return tuple(None if v is None else _readonly(v) for v in computed)

    def _computed(self, ref: Ref, start: int, stop: int, is_base: bool) -> np.ndarray | None:
        """An input's values over [start, stop) when they are computed, not read: a LoRA agent's
        task vector, a quantized tensor's values (float32, or the base's bf16/f16 carrier as
        ``quantized_base_as`` says); None for a tensor read from its file."""
        if isinstance(ref, DeltaRef):
            return delta_block(ref, self.files, start, stop, self.product)
        if isinstance(ref, QuantRef):
            return dequantized_block(ref, self.files, start, stop, self._as_dtype(is_base), self.dequantize)
        return None

    def _as_dtype(self, is_base: bool) -> str:
        """What a quantized member's values are rounded to: the base's setting, an agent's f32."""
        return self.family.quantized_base_as if is_base else "f32"

    def _code(self, ref: Ref, is_base: bool) -> int:
        """An input's format code (a quantized one's: the carrier it is decoded into)."""
        if isinstance(ref, QuantRef):
            return int(carrier_code(self._as_dtype(is_base)))
        return _code(ref)

    def _sources(self, block: Block, start: int, stop: int, held: tuple[np.ndarray | None, ...]) -> BlockSources:
        refs = self._refs(block)
        return BlockSources(
            tuple(_file(r, m.files[0]) for r, m in zip(refs, self.family.members, strict=True)),
            np.array([_offset(r, start) for r in refs], np.int64),
            np.array([self._code(r, k == 0) for k, r in enumerate(refs)], np.int64),
            stop - start,
            self.plan.tensors[block.tensor].name,
            held if any(h is not None for h in held) else (),
        )

    def _views(self, block: Block, start: int, stop: int, held: tuple[np.ndarray | None, ...]) -> Views:
        refs = self._refs(block)
        self._mapped.setdefault(block.index, []).append((start, stop))
        views = [
            self.files.float_view(cast(TensorRef, r), start, stop) if h is None else h
            for r, h in zip(refs, held, strict=True)
        ]
        codes = [self._code(r, k == 0) for k, r in enumerate(refs)]
        agents, agent_codes = views[1:], codes[1:]
        if len({a.dtype for a in agents}) > 1:
            agents = [_readonly(codecs.decode(a, c)) for a, c in zip(agents, agent_codes, strict=True)]
            agent_codes = [c if c == TAU32 else int(FloatCode.F32) for c in agent_codes]
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
        for ref in self._file_refs(block):  # a LoRA agent's factors are released as they are read
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
        values: list[float | None] = []  # None: a LoRA agent's task vector, finite, which cannot overflow
        for k, (ref, member) in enumerate(zip(self._refs(block), self.family.members, strict=True)):
            if isinstance(ref, QuantRef):
                as_dtype = self._as_dtype(k == 0)
                code = carrier_code(as_dtype)
                value = codecs.decode(dequantized_block(ref, self.files, element, element + 1, as_dtype), code)[0]
                if not np.isfinite(value):
                    beyond = ", or a value beyond f16's range (--quantized-base-as f16)" if as_dtype == "f16" else ""
                    return NonFiniteWeightError(
                        f"{ref.weight.file}: tensor {tensor.name!r} of {member.name} holds {value} at index {where} "
                        f"(a NaN in the FP8 weight or its scale, or a scale too large{beyond}); fix the checkpoint"
                    )
                values.append(value)
                continue
            if isinstance(ref, DeltaRef):
                delta = delta_block(ref, self.files, element, element + 1)[0]
                if not np.isfinite(delta):
                    return NonFiniteWeightError(
                        f"{member.files[0]}: the LoRA update of tensor {tensor.name!r} of {member.name} is {delta} at "
                        f"index {where} (a NaN/Inf in lora_A/lora_B, or factors too large for float32); fix the adapter"
                    )
                values.append(None)
                continue
            raw = self.files.float_view(ref, element, element + 1)
            value = codecs.decode(raw, FLOAT_CODES[ref.entry.dtype])[0]
            if not np.isfinite(value):
                return NonFiniteWeightError(
                    f"{ref.file}: tensor {tensor.name!r} of {member.name} holds {value} at index "
                    f"{where}; fix the checkpoint"
                )
            values.append(value)
        refs, members = self._refs(block), self.family.members
        for ref, member, value in zip(refs[1:], members[1:], values[1:], strict=True):
            if value is None or isinstance(ref, DeltaRef):
                continue
            with np.errstate(over="ignore"):
                tau = np.float32(value) - np.float32(values[0])
            if not np.isfinite(tau):
                return TaskVectorOverflowError(
                    f"{_file(ref, member.files[0])}: tensor {tensor.name!r} of {member.name} at index {where}: its "
                    f"task vector overflows float32 ({value:.7g} minus the base's {values[0]:.7g}): both weights are "
                    "finite, but too far apart to merge; fix the checkpoint (a weight near float32's limit, 3.4e38, is "
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


def _offset(ref: Ref, start: int) -> int:
    return ref.entry.offset + start * ITEMSIZE[ref.entry.dtype] if isinstance(ref, TensorRef) else 0


def _code(ref: Ref) -> int:
    if isinstance(ref, DeltaRef):
        return TAU32
    if isinstance(ref, QuantRef):
        return int(FloatCode.F32)  # an agent's values, dequantized (``BlockReader._code``: the base's)
    return int(FLOAT_CODES[ref.entry.dtype])


def _file(ref: Ref, fallback: Path) -> Path:
    """The file an input is read from (a quantized tensor's weight's), or ``fallback`` (a LoRA
    agent's first file, for messages)."""
    if isinstance(ref, TensorRef):
        return ref.file
    return ref.weight.file if isinstance(ref, QuantRef) else fallback


def _readonly(array: np.ndarray) -> np.ndarray:
    array.setflags(write=False)
    return array


def _owned(array: np.ndarray) -> bool:
    """Whether ``array``'s memory is an array's own (decoded), not a file's mapping."""
    while isinstance(array.base, np.ndarray):
        array = array.base
    return array.base is None
