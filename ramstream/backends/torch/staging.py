"""Tiles of a block on their way to the device and back: a ring of host buffers (pinned on CUDA,
allocated once and reused) that the inputs are read into, and a ring that results land in.

``InputRing.stage``: wait until the slot's previous upload fired (only then is its host buffer
refilled), read every part of the tile into it (cut into pieces read in parallel on the ring's
thread pool, so that every core copies from the page cache), and queue the upload, which itself
waits until the compute that last read the slot's device buffer is done; the compute of the tile
waits for the upload. ``OutputRing.put``: queue a result's download into the next slot, once the
slot's previous result was handed to its sink (after its event fired; on the streamed path the
sinks run on the pool, beside the reads of the next tile). With ``depth`` slots, tile k+1 is read
and copied while tile k computes, and tile k's result is written while k+1 is in flight.
"""

from __future__ import annotations

import os
from collections.abc import Callable, Sequence
from concurrent.futures import Executor, Future, wait
from dataclasses import dataclass
from functools import partial

import numpy as np
import torch

from ramstream.backends.torch.streams import Event, Streams

ALIGN = 64  # bytes between the parts of a slot: every dtype view of a part is aligned
MIN_PIECE = 256 << 10  # bytes: a part is cut into pieces for the readers no smaller than this
INLINE_TILE = 2 * MIN_PIECE  # bytes: a tile smaller than this is read on the calling thread


@dataclass(frozen=True)
class Part:
    """One input of a tile: ``itemsize`` bytes per element, and how to read elements
    ``[lo, lo + m)`` into a uint8 host array of ``m * itemsize`` bytes (raising on failure)."""

    itemsize: int
    read: Callable[[np.ndarray, int, int], None]
    key: tuple[int, int, int] | None = None  # (descriptor, offset, itemsize) of a file's range; None: in memory


def file_part(fd: int, offset: int, itemsize: int, fail: Callable[[], Exception]) -> Part:
    """A part read from a file with ``preadv`` (no copy through Python objects)."""

    def read(dst: np.ndarray, lo: int, m: int) -> None:
        view, at, got = memoryview(dst.data), offset + lo * itemsize, 0
        while got < len(view):
            n = os.preadv(fd, [view[got:]], at + got)
            if n <= 0:  # the file ended before its header said it would
                raise fail()
            got += n

    return Part(itemsize, read, (fd, offset, itemsize))


def array_part(array: np.ndarray) -> Part:
    """A part copied from an array (a mapped view of a file, or a keep mask in memory)."""
    raw = np.ascontiguousarray(array)

    def read(dst: np.ndarray, lo: int, m: int) -> None:
        np.copyto(dst, raw[lo : lo + m].view(np.uint8))

    return Part(raw.dtype.itemsize, read)


def read_inline(nbytes: int) -> bool:
    """Whether a tile of ``nbytes`` is read on the calling thread: handing a small tile's parts
    to the pool costs more than reading them (measured on a MoE's small tensors)."""
    return nbytes < INLINE_TILE


def _aligned(nbytes: int) -> int:
    return -(-nbytes // ALIGN) * ALIGN


def slot_bytes(parts: Sequence[Part], m: int) -> int:
    """Bytes of a slot that holds ``m`` elements of every part."""
    return sum(_aligned(p.itemsize * m) for p in parts)


@dataclass
class _InputSlot:
    host: torch.Tensor
    device: torch.Tensor
    uploaded: Event | None = None  # fired: the host buffer may be refilled
    consumed: Event | None = None  # fired: the device buffer may be overwritten


Read = tuple[Callable[[np.ndarray, int, int], None], np.ndarray, int, int]  # read(dst, lo, m)


def pieces(
    parts: Sequence[Part], spans: Sequence[tuple[int, int]], host: np.ndarray, lo: int, m: int, readers: int
) -> list[Read]:
    """The reads that fill a slot: each part cut into about its share of ``readers`` pieces of
    whole elements (none smaller than ``MIN_PIECE`` bytes), each piece into its own bytes."""
    total = max(sum(n for _, n in spans), 1)
    jobs: list[Read] = []
    for part, (at, nbytes) in zip(parts, spans, strict=True):
        count = max(1, min(-(-readers * nbytes // total), nbytes // MIN_PIECE))
        step = -(-m // count)
        for first in range(0, m, step):
            k = min(step, m - first)
            begin = at + first * part.itemsize
            jobs.append((part.read, host[begin : begin + k * part.itemsize], lo + first, k))
    return jobs


@dataclass
class Staging:
    """A tile being read into a slot: the reads still running on the pool (none when read inline)."""

    slot: _InputSlot
    total: int
    spans: list[tuple[int, int]]
    reads: list[Future[None]]

    def wait(self) -> None:
        """Every read done; the first failure raised once none still writes into the slot."""
        wait(self.reads)
        for read in self.reads:
            read.result()


class InputRing:
    def __init__(
        self, streams: Streams, depth: int, capacity: int, pool: Executor | None = None, readers: int = 1
    ) -> None:
        self.streams = streams
        self.depth = depth
        self.pool, self.readers = pool, readers if pool is not None else 1
        self.capacity = 0
        self._slots: list[_InputSlot] = []
        self._next = 0
        self._current: _InputSlot | None = None
        self._ahead: tuple[object, Staging] | None = None  # a tile read for a later call (``ahead``)
        self.reserve(capacity)

    def reserve(self, capacity: int) -> None:
        """Make every slot hold at least ``capacity`` bytes (a wider tile than ever before)."""
        if capacity <= self.capacity:
            return
        self.drop_ahead()
        self.streams.synchronize()  # nothing may still read or write the old buffers
        self.capacity = _aligned(capacity)
        hosts = [self.streams.host_buffer(self.capacity) for _ in range(self.depth)]
        self._slots = [_InputSlot(h, self.streams.device_buffer(h)) for h in hosts]

    def begin(self, parts: Sequence[Part], lo: int, m: int) -> Staging:
        """Start reading a tile into the next slot (on the pool: the caller goes on, typically to
        queue the previous tile's compute, while the pieces are read)."""
        spans, total = [], 0  # each part's bytes in the slot; total: slot_bytes(parts, m)
        for part in parts:
            spans.append((total, part.itemsize * m))
            total += _aligned(part.itemsize * m)
        self.reserve(total)
        slot = self._free_slot()
        if slot.uploaded is not None:
            slot.uploaded.synchronize()
        host = slot.host[:total].numpy()
        jobs = pieces(parts, spans, host, lo, m, self.readers)
        if self.pool is None or len(jobs) == 1 or read_inline(total):
            for read, dst, first, count in jobs:
                read(dst, first, count)
            return Staging(slot, total, spans, [])
        return Staging(
            slot, total, spans, [self.pool.submit(read, dst, first, count) for read, dst, first, count in jobs]
        )

    def _free_slot(self) -> _InputSlot:
        """The next slot in turn, past the one set aside for a tile read ahead."""
        aside = self._ahead[1].slot if self._ahead is not None else None
        while True:
            slot = self._slots[self._next % self.depth]
            self._next += 1
            if slot is not aside:
                return slot

    def ahead(self, parts: Sequence[Part], lo: int, m: int) -> None:
        """Begin reading a tile that a later call is expected to stage first (across a block's
        or a batch's boundary, while this call's last tile computes); its slot is set aside
        until ``take`` asks for the same tile, or another is read ahead. Parts read from memory
        are not read ahead."""
        key = _tile_key(parts, lo, m)
        if key is None or self.depth < 2 or (self._ahead is not None and self._ahead[0] == key):
            return  # (one slot: none to set aside)
        self.drop_ahead()
        staging = self.begin(parts, lo, m)
        self._ahead = (key, staging)

    def take(self, parts: Sequence[Part], lo: int, m: int) -> Staging | None:
        """The tile read ahead, if it is this one (the same file ranges, elements and length)."""
        key = _tile_key(parts, lo, m)
        if key is None or self._ahead is None or self._ahead[0] != key:
            return None
        staging, self._ahead = self._ahead[1], None
        return staging

    def drop_ahead(self) -> None:
        """Forget the tile read ahead once its reads are done (their failures with it: no call
        asked for those bytes)."""
        if self._ahead is not None:
            staging, self._ahead = self._ahead[1], None
            wait(staging.reads)

    def finish(self, staging: Staging) -> list[torch.Tensor]:
        """The tile's parts on the device (uint8, ``m * itemsize`` bytes each) once its reads are
        done: the upload is queued and the compute queued next waits for it."""
        staging.wait()
        slot, total = staging.slot, staging.total
        slot.uploaded = self.streams.upload(slot.device[:total], slot.host[:total], slot.consumed)
        self.streams.compute_waits(slot.uploaded)
        self._current = slot
        return [slot.device[a : a + n] for a, n in staging.spans]

    def stage(self, parts: Sequence[Part], lo: int, m: int) -> list[torch.Tensor]:
        """``begin`` then ``finish``: one tile, read and uploaded."""
        return self.finish(self.begin(parts, lo, m))

    def consumed(self) -> None:
        """The compute reading the last staged tile is queued: its device buffer is reusable after it."""
        if self._current is not None:
            self._current.consumed = self.streams.computed()


def file_ranges(parts: Sequence[Part]) -> tuple[tuple[int, int, int], ...] | None:
    """The file ranges that ``parts`` read (None where one is read from memory)."""
    keys = tuple(p.key for p in parts)
    return None if any(k is None for k in keys) else keys  # type: ignore[return-value]


def _tile_key(parts: Sequence[Part], lo: int, m: int) -> object | None:
    """What identifies a tile of file ranges: reading it twice reads the same bytes."""
    keys = file_ranges(parts)
    return None if keys is None else (keys, lo, m)


Deliver = Callable[[np.ndarray], None]  # gets a landed result's bytes


@dataclass(frozen=True)
class Sink:
    """Where a result goes: ``target``, a view of the caller's buffer (1-D, or rows), gets its bytes."""

    target: np.ndarray

    def __call__(self, data: np.ndarray) -> None:
        np.copyto(self.target, data.view(self.target.dtype).reshape(self.target.shape))


@dataclass
class _OutputSlot:
    host: torch.Tensor
    landed: torch.Tensor | None = None
    event: Event | None = None
    sink: Deliver | None = None
    # with a pool, the sink running there instead (the slot is busy until it is done)
    written: Future[None] | None = None


class OutputRing:
    """With a pool (the streamed path) each result's sink runs there as soon as its download
    landed, off the driving thread, and a slot is refilled only once its sink is done; without
    one, a result is handed to its sink when its slot is needed again, or at ``flush``. A result
    whose target the streams can download into (``Streams.straight``: the caller's buffer is
    registered host memory) goes there directly, without a slot, a sink or a copy on the host."""

    def __init__(self, streams: Streams, depth: int, capacity: int, pool: Executor | None = None) -> None:
        self.streams = streams
        self.depth = depth
        self.pool = pool
        self.capacity = 0
        self._slots: list[_OutputSlot] = []
        self._next = 0
        self._straight: list[Event] = []  # downloads straight into their targets, not yet waited for
        self.straight = 0  # results downloaded straight into their targets so far
        self.reserve(capacity)

    def reserve(self, capacity: int) -> None:
        if capacity <= self.capacity:
            return
        self.flush()
        self.capacity = _aligned(capacity)
        self._slots = [_OutputSlot(self.streams.host_buffer(self.capacity)) for _ in range(self.depth)]

    def put(self, result: torch.Tensor, sink: Deliver) -> None:
        """Queue ``result``'s bytes (a device tensor) for ``sink``, which gets them as a uint8 array."""
        data = result.reshape(-1).view(torch.uint8)
        if isinstance(sink, Sink) and self._goes_straight(sink.target, data.shape[0]):
            _, event = self.streams.download(torch.from_numpy(sink.target.reshape(-1).view(np.uint8)), data)
            self._straight.append(event)
            self.straight += 1
            return
        self.reserve(data.shape[0])
        slot = self._slots[self._next % self.depth]
        self._next += 1
        self._drain(slot)
        landed, event = self.streams.download(slot.host[: data.shape[0]], data)
        if self.pool is not None:
            slot.written = self.pool.submit(_deliver, event, landed, sink)
        else:
            slot.landed, slot.event, slot.sink = landed, event, sink

    def detach(self) -> list[Callable[[], object]]:
        """The waits of the results queued so far, for a caller that collects them later instead
        of ``flush`` (a deferred merge): each slot stays busy until its result is handed over, as
        after any ``put``."""
        waits: list[Callable[[], object]] = [event.synchronize for event in self._straight]
        self._straight.clear()
        for slot in self._slots:
            if slot.written is not None:
                waits.append(slot.written.result)
            elif slot.sink is not None:
                waits.append(partial(self._drain, slot))
        return waits

    def _goes_straight(self, target: np.ndarray, nbytes: int) -> bool:
        return target.flags.c_contiguous and target.nbytes == nbytes and self.streams.straight(target)

    def flush(self) -> None:
        """Hand every queued result to its sink, in the order they were put; the first failed
        sink's error is raised once every sink is done."""
        errors = []
        while self._straight:
            self._straight.pop(0).synchronize()
        for k in range(self._next - len(self._slots), self._next):
            if k >= 0:
                try:
                    self._drain(self._slots[k % len(self._slots)])
                except Exception as error:  # raised below, once no sink runs
                    errors.append(error)
        if errors:
            raise errors[0]

    def discard(self) -> None:
        """Drop every queued result (its call failed: its buffers belong to the caller again,
        and no sink still running may write into them after this returns)."""
        self.streams.synchronize()
        self._straight.clear()
        for slot in self._slots:
            if slot.written is not None:
                wait([slot.written])
            slot.sink = slot.landed = slot.event = slot.written = None

    @staticmethod
    def _drain(slot: _OutputSlot) -> None:
        if slot.written is not None:
            written, slot.written = slot.written, None
            written.result()
            return
        if slot.sink is None or slot.event is None or slot.landed is None:
            return
        event, landed, sink = slot.event, slot.landed, slot.sink
        slot.sink = slot.landed = slot.event = None
        _deliver(event, landed, sink)


def _deliver(event: Event, landed: torch.Tensor, sink: Deliver) -> None:
    event.synchronize()
    sink(landed.numpy())
