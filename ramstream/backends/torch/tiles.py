"""The torch backend's tile machinery: what every operation shares.

A call cuts its block into tiles (a multiple of 64 elements, or of whole slices for DELLA) sized
to the staging slots and, on CUDA, to the GPU memory budget; each tile's inputs are read from the
files with ``preadv`` (copied from memory where the block holds them decoded: a LoRA agent, a
quantized tensor, agents of mixed formats) into a slot of the input ring (pieces in parallel on
the backend's thread pool), uploaded on the copy stream while the previous tile computes, and
its per-element results come back through the output ring into the caller's buffers. Counts,
histograms and exact sums accumulate on the device and are read once per call. The operations
themselves are in ``merging.py`` (merges) and ``counting.py`` (the probe and the statistics);
``backend.py`` puts them together.
"""

from __future__ import annotations

import os
from collections.abc import Callable, Iterator, Sequence
from concurrent.futures import ThreadPoolExecutor, wait
from contextlib import contextmanager
from itertools import pairwise
from typing import TypeVar

import numpy as np
import torch

from ramstream.backends.base import MagpruneParams
from ramstream.backends.landing import Landing
from ramstream.backends.settings import BackendSettings
from ramstream.backends.torch import (
    codecs,
    device,
    fused,
    magnitude,
    probe,
)
from ramstream.backends.torch.staging import (
    InputRing,
    OutputRing,
    Part,
    Sink,
    Staging,
    array_part,
    file_part,
    file_ranges,
    read_inline,
)
from ramstream.backends.torch.streams import CpuStreams, CudaStreams, Streams
from ramstream.blocks import BlockArrays, BlockSources
from ramstream.blocks.lora import numpy_product
from ramstream.blocks.quantized import ScaledCodes, numpy_dequantize
from ramstream.config import show_size
from ramstream.errors import ConfigError, DeviceError
from ramstream.io.reader import InputFiles

CPU_TILE = 1 << 16  # elements per tile on the CPU: a tile's float32 temporaries stay in cache
DEPTH = 3  # slots per ring: one being filled, one uploading or computing, one landing
MIN_SLOT, MAX_SLOT = 1 << 20, 64 << 20  # bytes of a CUDA staging slot
GROUP = 64  # tiles start at multiples of 64 elements: the exact sums' groups
WORK_BYTES = 48  # device bytes per element of a tile's temporaries, per input (a generous bound)
TILE_CAP: int | None = None  # streamed tiles of at most this many elements (tests: tiny tiles)

T = TypeVar("T")
# tile(worker, first element, elements, the parts on the device, the worker's output ring)
TileFn = Callable[[int, int, int, list[torch.Tensor], OutputRing], None]


class TileBackend:
    """The state and plumbing of a torch backend: device, threads, rings, tiles, the loop."""

    def __init__(self, settings: BackendSettings, streams: Streams | None = None) -> None:
        """``streams``: where copies and compute are queued (None: CUDA streams on a CUDA device,
        else the CPU's); the tests pass a simulated device to run the streamed path on the CPU."""
        self._device = device.resolve(settings.device)
        cores = len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else os.cpu_count() or 1
        self.threads = min(settings.threads or cores, cores)
        if streams is None:
            streams = CudaStreams(self._device) if self._device.type == "cuda" else CpuStreams()
        if settings.gpu_memory is not None and not streams.separate:
            raise ConfigError(f"--gpu-memory needs a CUDA device; the torch backend computes on {self._device}")
        self._streams = streams
        self._streamed = streams.separate  # one host thread streams tiles through device memory
        if self._streamed:
            self._gpu_budget = streams.budget(settings.gpu_memory)
            host = settings.memory or 1 << 30
            self._slot = max(MIN_SLOT, min(MAX_SLOT, _power_of_two_below(host // 32), self._gpu_budget // 16))
            self._pool: ThreadPoolExecutor | None = ThreadPoolExecutor(
                self.threads, thread_name_prefix="ramstream-read"
            )
            self.workers = 1
        else:
            self._gpu_budget, self._slot, self._pool = 0, 0, None
            self.workers = self.threads  # CPU: one range of tiles per thread
        try:
            with self._device_errors():  # the rings' device buffers are allocated now
                self._rings = [
                    (
                        InputRing(streams, DEPTH, self._slot, self._pool, self.threads),
                        OutputRing(streams, DEPTH, self._slot // 2, self._pool),
                    )
                    for _ in range(self.workers)
                ]
        except BaseException:
            if self._pool is not None:
                self._pool.shutdown()
            raise
        self._workers_pool: ThreadPoolExecutor | None = None
        self._files = InputFiles()
        self._use_fused = fused.available(self._device, self.workers)
        # output buffer -> whether it holds NaN/Inf, as the last fused merge found (``fused.key``)
        self._flags: dict[tuple[int, int, int], bool] = {}
        self._landing: Landing | None = None  # inside ``deferred``, on the streamed path
        # (a block's file ranges, its elements) -> the parts and elements of the block expected next
        self._expected: dict[tuple[object, int], tuple[list[Part], int]] = {}
        # the block of the last call that read one whole, and how its first call cut its tiles
        self._opened: tuple[object, tuple[int, int, int]] = (None, (0, GROUP, 0))

    @property
    def defers(self) -> bool:
        return self._streamed

    def expect(self, upcoming: Sequence[BlockSources | None]) -> None:
        """The blocks the next calls read, in order (None: one read from memory). On the
        streamed path a call on one of them begins reading the next one's first tile while its
        own last tile is queued, so the reads go on across blocks and batches, not only between
        the tiles of one block."""
        if not self._streamed:
            return
        self._expected = {}
        parts = [None if s is None or s.held else self._source_parts(s) for s in upcoming]  # each block's once
        for (now, now_parts), (then, then_parts) in pairwise(zip(upcoming, parts, strict=True)):
            if now is None or then is None or now_parts is None or then_parts is None or read_inline(_nbytes(then)):
                continue  # a small block's tile is read on the calling thread: nothing to gain
            self._expected[(file_ranges(now_parts), now.size)] = (then_parts, then.size)

    @contextmanager
    def deferred(self) -> Iterator[Landing]:
        """Merges and probes called inside return once their tiles are queued (streamed path; on
        the CPU the results are there when they return): their results, flags and counts come with
        the landing's ``wait``. If one fails, the others' results are waited for before the error
        leaves: nothing lands in the caller's buffers after it."""
        landing = Landing()
        self._landing = landing if self._streamed else None
        try:
            yield landing
        except BaseException:  # a call failed: what the others queued must land before the caller goes on
            try:
                landing.wait()
            except BaseException:  # the first error is the one to report
                pass
            raise
        finally:
            self._landing = None

    @property
    def device(self) -> str:
        return str(self._device)

    # -- plumbing ---------------------------------------------------------------------------------
    @contextmanager
    def _scoped(self) -> Iterator[None]:
        """Run with this backend's torch thread count, the caller's restored after: on the CPU
        one per op, the backend's threads each taking a range of tiles (intra-op threads over
        cache-sized tiles cost more in synchronisation than they gain: 2-7x slower, measured)."""
        before = torch.get_num_threads()
        torch.set_num_threads(self.threads if self._streamed else 1)
        try:
            with self._device_errors(), torch.inference_mode():
                yield
        finally:
            torch.set_num_threads(before)

    @contextmanager
    def _device_errors(self) -> Iterator[None]:
        """CUDA's out-of-memory and other errors as one line that says what to do."""
        try:
            yield
        except torch.cuda.OutOfMemoryError as error:
            raise DeviceError(
                f"{self.device} ran out of memory ({_first_line(error)}); other processes may hold GPU memory, or "
                f"--gpu-memory ({show_size(self._gpu_budget)}) is more than the GPU can give: give a smaller "
                "--gpu-memory, or free the GPU"
            ) from error
        except RuntimeError as error:
            if "CUDA" not in str(error):
                raise
            raise DeviceError(
                f"{self.device} failed: {_first_line(error)}; run again (the merge resumes), with a smaller "
                "--gpu-memory or --device cpu if it fails again"
            ) from error

    def _tile_elems(self, parts: Sequence[Part], inputs: int, align: int, fixed: int = 0) -> int:
        """Elements per tile: a multiple of ``align`` (at least one), within the staging slot and,
        on CUDA, the GPU budget (the rings' device buffers and the call's ``fixed`` bytes, then
        the temporaries)."""
        if not self._streamed:
            elems = CPU_TILE
        else:
            per_element = max(sum(p.itemsize for p in parts), 1)  # slot_bytes pads each part to ALIGN
            room = max(self._gpu_budget - DEPTH * self._slot, self._gpu_budget // 2) - fixed
            room = room * 3 // 4  # the rest: the caching allocator's rounding and split blocks
            fits = room // (WORK_BYTES * (inputs + 2))
            if align > max(fits, GROUP):
                self._refuse_whole_slices(align, inputs, fixed)
            # the slot's bytes, not less the padding between its parts (the ring makes room for
            # that): a slot of 2^k bytes then holds 2^j elements, and a block of 2^i elements is
            # whole tiles, not whole tiles and a 64-element tail
            elems = min(self._slot // per_element, fits)
            if TILE_CAP is not None:
                elems = min(elems, TILE_CAP)
        return max(align, elems // align * align)

    def _refuse_whole_slices(self, align: int, inputs: int, fixed: int) -> None:
        """A tile of whole dim-0 slices (DELLA ranks |tau| within them) that the GPU budget cannot
        hold: one line naming the budget that would, rather than a tile beyond it."""
        need = 2 * (-(-align * WORK_BYTES * (inputs + 2) * 4 // 3) + fixed)
        raise ConfigError(
            f"--gpu-memory {show_size(self._gpu_budget)} cannot hold one dim-0 slice of {align} elements on the "
            f"device (the method ranks |tau| within whole slices); give --gpu-memory {-(-need // 2**20)}MiB or more"
        )

    def _fixed(self, nbytes: int, what: str) -> int:
        """Device bytes a call holds whatever its tiles (accumulators, per-tile results of a fixed
        size): refused in one line where they would leave less than half the budget to the tiles."""
        if self._streamed and nbytes > self._gpu_budget // 2:
            need = 2 * nbytes + DEPTH * self._slot
            raise ConfigError(
                f"--gpu-memory {show_size(self._gpu_budget)} cannot hold {what} ({nbytes / 2**20:.0f} MiB on "
                f"the device) beside the tiles; give --gpu-memory {-(-need // 2**20)}MiB or more"
            )
        return nbytes

    def _run(
        self,
        parts: Sequence[Part],
        n: int,
        tile: TileFn,
        align: int = GROUP,
        inputs: int = 0,
        fixed: int = 0,
        later: bool = False,
    ) -> None:
        """Call ``tile(worker, lo, m, staged, outputs)`` for every tile of ``n`` elements; every
        result put into ``outputs`` is delivered before this returns, or with ``later`` (a merge)
        inside ``deferred``, waited for by the landing. Streamed (CUDA), one host thread drives
        the streams while the pool reads; on the CPU each of the ``workers`` threads takes one
        balanced range of tiles with its own rings (torch ops release the GIL), and its own
        partial results."""
        self._flags = {}  # a later operation may write into the buffers a fused merge flagged
        step = even_step(n, self._tile_elems(parts, inputs or len(parts), align, fixed), align)
        starts = list(range(0, n, step))
        if self.workers == 1:
            hold = later and self._landing is not None
            then = self._read_next(parts, n, inputs or len(parts), align, fixed)
            waits = self._loop(0, self._rings[0], parts, starts, n, step, tile, hold, then)
            if self._landing is not None:
                self._landing.also_wait(waits)
            return
        jobs = []
        for w in range(self.workers):
            mine = starts[len(starts) * w // self.workers : len(starts) * (w + 1) // self.workers]
            jobs.append(self._cpu_pool().submit(self._loop, w, self._rings[w], parts, mine, n, step, tile))
        wait(jobs)  # every worker, even after one failed: none may write into the caller's buffers later
        for job in jobs:
            job.result()

    @staticmethod
    def _loop(
        w: int,
        rings: tuple[InputRing, OutputRing],
        parts: Sequence[Part],
        starts: Sequence[int],
        n: int,
        step: int,
        tile: TileFn,
        hold: bool = False,
        then: Callable[[InputRing], None] | None = None,
    ) -> list[Callable[[], object]]:
        """The tiles of one worker; their results delivered before it returns, or (``hold``) the
        waits for them returned. The first tile may have been read ahead by the call before;
        ``then`` reads the next call's first tile ahead while the last tile's compute is queued."""
        inputs, outputs = rings
        tiles = [(lo, min(step, n - lo)) for lo in starts]
        begun: list[Staging] = []  # the tile whose reads run on the pool, at most one
        ahead = inputs.pool is not None  # on the CPU a tile is computed while its inputs are in cache
        try:
            with torch.inference_mode():
                for k, (lo, m) in enumerate(tiles):
                    read = begun.pop() if begun else inputs.take(parts, lo, m) if ahead and k == 0 else None
                    staged = inputs.finish(read or inputs.begin(parts, lo, m))
                    if ahead and k + 1 < len(tiles):  # the next tile is read while this one's compute is queued
                        begun.append(inputs.begin(parts, *tiles[k + 1]))
                    elif ahead and then is not None:  # and after the last, the next call's first
                        then(inputs)
                    tile(w, lo, m, staged, outputs)
                    inputs.consumed()
        except BaseException as first:  # a failed read or tile: nothing more may land in the caller's buffers
            try:
                for staging in begun:
                    wait(staging.reads)  # nor in the ring's, which the next call reuses
                outputs.discard()
            except Exception:  # a failing GPU fails again here: the first error is the one to report
                pass
            raise first
        if hold:
            return outputs.detach()
        outputs.flush()
        return []

    def _read_next(
        self, parts: Sequence[Part], n: int, inputs: int, align: int, fixed: int
    ) -> Callable[[InputRing], None] | None:
        """Where this call reads an expected block whole: reading the block expected after it
        ahead, cut as the first call on this block cut it (that operation is the likeliest to
        open the next block too; the calls after it on this block leave the tile read ahead)."""
        keys = file_ranges(parts) if self._expected else None
        after = self._expected.get((keys, n)) if keys is not None else None
        if after is None:
            return None
        if self._opened[0] != (keys, n):  # the first call on this block
            self._opened = ((keys, n), (inputs, align, fixed))
        following, size = after
        cut = self._opened[1]

        def read_ahead(ring: InputRing) -> None:
            step = even_step(size, self._tile_elems(following, *cut), cut[1])
            ring.ahead(following, 0, min(step, size))

        return read_ahead

    def _cpu_pool(self) -> ThreadPoolExecutor:
        if self._workers_pool is None:
            self._workers_pool = ThreadPoolExecutor(self.workers, thread_name_prefix="ramstream-torch")
        return self._workers_pool

    def _source_parts(self, sources: BlockSources) -> list[Part]:
        """Each input read from its file, or copied from memory where it is held (a LoRA agent)."""
        parts = []
        for k, path in enumerate(sources.files):
            held = sources.in_memory(k)
            if held is not None:
                parts.append(array_part(held))
                continue
            itemsize = codecs.ITEMSIZE[int(sources.codes[k])]
            parts.append(
                file_part(self._files.descriptor(path), int(sources.offsets[k]), itemsize, _read_error(sources, k))
            )
        return parts

    def _array_parts(self, arrays: BlockArrays, base: bool = True) -> list[Part]:
        """Each input of ``arrays`` (without the base: ``base=False``), in the formats ``_codes``
        gives: read from its file with ``preadv`` into the slot, as the probe and RAM read, where
        the files hold those formats; copied from the block's views where the views decoded them
        (agents stored in different formats, handed out as float32)."""
        sources = arrays.sources
        if [int(c) for c in sources.codes] == self._codes(arrays):
            parts = self._source_parts(sources)
        else:
            parts = [array_part(arrays.base), *(array_part(a) for a in arrays.agents)]
        return parts if base else parts[1:]

    def _codes(self, arrays: BlockArrays) -> list[int]:
        return [int(arrays.base_code), *map(int, arrays.agent_codes)]

    def _f32(self, values: np.ndarray | np.floating | float) -> torch.Tensor:
        """float32 constants on the device."""
        return self._constant(np.asarray(values, np.float32))

    def _constant(self, values: np.ndarray | Sequence[int]) -> torch.Tensor:
        """A small host array on the device, uploaded without a host wait."""
        return self._streams.constant(np.asarray(values))

    def _keys(self, keys: np.ndarray) -> torch.Tensor:
        """The counter RNG's uint64 stream keys on the device, as the fused kernels take them: their
        bits as int64."""
        return self._constant(np.ascontiguousarray(keys, np.uint64).view(np.int64))

    def _magprune_constants(self, prune: MagpruneParams) -> tuple[torch.Tensor, ...]:
        """DELLA's per-agent constants on the device, as ``fused.della.magprune_keep`` takes them:
        the random keys, the modes, lo and width."""
        return (
            self._keys(prune.keys),
            self._constant(np.asarray(prune.mode, np.int64)),
            self._f32(prune.lo),
            self._f32(prune.width),
        )

    def _host(self, result: torch.Tensor) -> np.ndarray:
        """A small device result on the host, waited for by an event (not a stream sync)."""
        return self._streams.readback(result)

    def _zeros(self, *shape: int) -> torch.Tensor:
        return torch.zeros(shape, dtype=torch.int64, device=self._device)

    def _positions(self, first: int, m: int) -> torch.Tensor:
        return torch.arange(first, first + m, dtype=torch.int64, device=self._device)

    @staticmethod
    def _sink(out: np.ndarray, lo: int, hi: int) -> Sink:
        """A result's place: ``out[..., lo:hi]`` (1-D or rows), which gets its raw bytes."""
        return Sink(out[..., lo:hi])

    def host_memory(self, nbytes: int) -> np.ndarray:
        """Registered with CUDA where the streams can (``host_memory.py``): a merge's results are
        then downloaded straight into the caller's buffers."""
        return self._streams.host_memory(nbytes)

    def _fused(self, codes: Sequence[int]) -> bool:
        """Whether an operation over inputs of ``codes`` (the base first) runs as fused kernels."""
        return self._use_fused and fused.uniform_agents(codes)

    def _state(self, width: int) -> torch.Tensor:
        """Per worker, a fused kernel's side results: [0] the first non-finite position
        (``probe.NOWHERE``: none), then ``width - 1`` flags or counts from 0."""
        state = torch.zeros((self.workers, width), dtype=torch.int64, device=self._device)
        state[:, 0] = probe.NOWHERE
        return state

    def _first(self) -> torch.Tensor:
        """Per worker, the first non-finite position found (``probe.NOWHERE``: none)."""
        return torch.full((self.workers,), probe.NOWHERE, dtype=torch.int64, device=self._device)

    def _found(self, first: torch.Tensor, later: bool = False) -> int:
        """The first non-finite position of ``first`` (per worker), -1 for none; for a merge
        (``later``) inside ``deferred`` on the streamed path, a token for it (``backends.landing``)."""
        return self._settle(first.min().reshape(1, 1), lambda found: self._flagged(found, []), later)

    def _settle(self, state: torch.Tensor, post: Callable[[np.ndarray], T], later: bool = False) -> T | int:
        """``post`` of ``state`` on the host: now, or for a merge or a probe (``later``) inside
        ``deferred`` on the streamed path once it has landed (the value returned is then the
        landing's token for it)."""
        if not later or self._landing is None:
            return post(self._host(state))
        return self._landing.later(self._streams.readback_later(state), post)

    def _statistic(
        self,
        result: torch.Tensor,
        post: Callable[[np.ndarray], np.ndarray],
        shape: tuple[int, ...],
        dtype: type,
        later: bool = True,
    ) -> np.ndarray:
        """``post`` of a statistic's device ``result`` on the host (``shape``, ``dtype``): now, or
        for a statistic a pass computes later (``later``) inside ``deferred`` on the streamed path
        written into the array returned once the landing waits (it holds -1 until then: nothing
        may read it before)."""
        if not later or self._landing is None:
            return np.asarray(post(self._host(result)), dtype).reshape(shape)
        read = self._streams.readback_later(result)
        return self._after_landing(lambda: np.asarray(post(read()), dtype).reshape(shape), np.full(shape, -1, dtype))

    def _after_landing(self, post: Callable[[], np.ndarray], out: np.ndarray) -> np.ndarray:
        """``post()`` now, or inside ``deferred`` on the streamed path written into ``out`` once
        the landing has waited for what the call queued before it (``out`` holds its fill until
        then: nothing may read it before)."""
        if self._landing is None:
            return post()

        def land() -> None:
            out[...] = post()

        self._landing.also_wait([land])
        return out

    def _flagged(self, found: np.ndarray, outs: Sequence[tuple[int, int, int]]) -> int:
        """From a fused merge's state (per worker: the first non-finite position, then each
        output's NaN/Inf flag): the flags, which answer ``has_nonfinite`` for ``outs``, and the
        first non-finite position (-1: none)."""
        self._flags.update({key: bool(found[:, 1 + k].max() > 0) for k, key in enumerate(outs)})
        first = int(found[:, 0].min())
        return first if first < probe.NOWHERE else -1

    # -- shared decoding -------------------------------------------------------------------------
    @staticmethod
    def _taus(values: list[torch.Tensor], codes: list[int]) -> list[torch.Tensor]:
        """The agents' tau from the decoded inputs, the base first."""
        return [v - codecs.minus(values[0], c) for v, c in zip(values[1:], codes[1:], strict=True)]

    @staticmethod
    def _abs_bits(raw: list[torch.Tensor], codes: list[int], agents: Sequence[int]) -> list[torch.Tensor]:
        base = codecs.decode(raw[0], codes[0])
        return [
            magnitude.abs_bits(codecs.decode(raw[1 + t], codes[1 + t]), codecs.minus(base, codes[1 + t]))
            for t in agents
        ]

    def lora_product(self, left: np.ndarray, right: np.ndarray, scale: np.float32, out: np.ndarray) -> None:
        """On the host, with numpy (the block is assembled there before it is staged)."""
        numpy_product(left, right, scale, out)

    def fp8_dequantize(self, run: ScaledCodes, out: np.ndarray, code: int) -> None:
        """On the host, with numpy, as ``lora_product``."""
        numpy_dequantize(run, out, code)

    def close(self) -> None:
        for pool in (self._pool, self._workers_pool):
            if pool is not None:
                pool.shutdown()
        self._files.close()


def _first_line(error: BaseException) -> str:
    return (str(error).strip().splitlines() or [type(error).__name__])[0]


def _read_error(sources: BlockSources, k: int) -> Callable[[], Exception]:
    return lambda: sources.read_error(k)


def _nbytes(sources: BlockSources) -> int:
    """Bytes of a block's inputs."""
    return sources.size * sum(codecs.ITEMSIZE[int(c)] for c in sources.codes)


def even_step(n: int, most: int, align: int) -> int:
    """The tile length (a multiple of ``align``, at most ``most``, itself one) that cuts ``n``
    elements into as few tiles as ``most`` allows, of one length but the last: a block a little
    longer than a whole number of tiles is not whole tiles and a short tail to stage, launch and
    wait for on its own."""
    if n <= most:
        return most
    count = -(-n // most)
    longest = -(-n // count)
    return -(-longest // align) * align


def _power_of_two_below(n: int) -> int:
    return 1 << max(n, 1).bit_length() - 1


def _torch_dtype(dtype: np.dtype) -> torch.dtype:
    """The torch dtype of a keep array (a uint8 mask or float32 multipliers)."""
    return torch.uint8 if dtype == np.uint8 else torch.float32
