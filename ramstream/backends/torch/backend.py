"""The torch backend: every ``Backend`` operation as tiles streamed through torch, on a CUDA GPU
or on the CPU, with the Numba backend's bytes.

A call cuts its block into tiles (a multiple of 64 elements, or of whole slices for DELLA) sized
to the staging slots and, on CUDA, to the GPU memory budget; each tile's inputs are read from the
files (``sources``: ``preadv``) or copied from the mapped views (``arrays``) into a slot of the
input ring (pieces in parallel on the backend's thread pool), uploaded on the copy stream while the previous tile
computes, and its per-element results come back through the output ring into the caller's
buffers. Counts, histograms and exact sums accumulate on the device and are read once per call.
"""

from __future__ import annotations

import os
from collections.abc import Callable, Iterator, Sequence
from concurrent.futures import ThreadPoolExecutor, wait
from contextlib import contextmanager

import numpy as np
import torch

from ramstream.backends import nonfinite
from ramstream.backends.agreement import agent_pairs, sum_rows
from ramstream.backends.base import (
    HIGH_BINS,
    LOW_BINS,
    AgreementSums,
    Cuts,
    ExactSums,
    GtaParams,
    Keep,
    KeepArray,
    KeepCuts,
    KeepMagprune,
    KeepRandom,
    LinearParams,
    MagpruneParams,
    ProbeCounts,
    RowScale,
    SceParams,
)
from ramstream.backends.exact_sum import BINS, renormalised
from ramstream.backends.settings import BackendSettings
from ramstream.backends.torch import (
    agreement,
    codecs,
    della,
    device,
    exact_sums,
    fusion,
    magnitude,
    merges,
    probe,
    sce,
    vectors,
)
from ramstream.backends.torch.rng import uniform
from ramstream.backends.torch.staging import ALIGN, InputRing, OutputRing, Part, Staging, array_part, file_part
from ramstream.backends.torch.streams import CpuStreams, CudaStreams, Streams
from ramstream.backends.vector_sums import DIGITS, VectorLayout, normalise
from ramstream.blocks import BlockArrays, BlockSources
from ramstream.blocks.lora import numpy_product
from ramstream.config import show_size
from ramstream.errors import ConfigError, DeviceError
from ramstream.format.dtypes import TAU32
from ramstream.io.reader import InputFiles

CPU_TILE = 1 << 16  # elements per tile on the CPU: a tile's float32 temporaries stay in cache
DEPTH = 3  # slots per ring: one being filled, one uploading or computing, one landing
MIN_SLOT, MAX_SLOT = 1 << 20, 64 << 20  # bytes of a CUDA staging slot
GROUP = 64  # tiles start at multiples of 64 elements: the exact sums' groups
WORK_BYTES = 48  # device bytes per element of a tile's temporaries, per input (a generous bound)
TILE_CAP: int | None = None  # streamed tiles of at most this many elements (tests: tiny tiles)

# tile(worker, first element, elements, the parts on the device, the worker's output ring)
TileFn = Callable[[int, int, int, list[torch.Tensor], OutputRing], None]


def make(settings: BackendSettings) -> TorchBackend:
    """The registry's factory."""
    return TorchBackend(settings)


class TorchBackend:
    name = "torch"

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
            elems = min((self._slot - ALIGN * len(parts)) // per_element, fits)
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
        self, parts: Sequence[Part], n: int, tile: TileFn, align: int = GROUP, inputs: int = 0, fixed: int = 0
    ) -> None:
        """Call ``tile(worker, lo, m, staged, outputs)`` for every tile of ``n`` elements; every
        result put into ``outputs`` is delivered before this returns. Streamed (CUDA), one host
        thread drives the streams while the pool reads; on the CPU each of the ``workers``
        threads takes one balanced range of tiles with its own rings (torch ops release the
        GIL), and its own partial results."""
        step = self._tile_elems(parts, inputs or len(parts), align, fixed)
        starts = list(range(0, n, step))
        if self.workers == 1:
            self._loop(0, self._rings[0], parts, starts, n, step, tile)
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
    ) -> None:
        inputs, outputs = rings
        tiles = [(lo, min(step, n - lo)) for lo in starts]
        begun: list[Staging] = []  # the tile whose reads run on the pool, at most one
        ahead = inputs.pool is not None  # on the CPU a tile is computed while its inputs are in cache
        try:
            with torch.inference_mode():
                for k, (lo, m) in enumerate(tiles):
                    staged = inputs.finish(begun.pop() if begun else inputs.begin(parts, lo, m))
                    if ahead and k + 1 < len(tiles):  # the next tile is read while this one's compute is queued
                        begun.append(inputs.begin(parts, *tiles[k + 1]))
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
        outputs.flush()

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

    @staticmethod
    def _array_parts(arrays: BlockArrays, base: bool = True) -> list[Part]:
        return ([array_part(arrays.base)] if base else []) + [array_part(a) for a in arrays.agents]

    def _codes(self, arrays: BlockArrays) -> list[int]:
        return [int(arrays.base_code), *map(int, arrays.agent_codes)]

    def _f32(self, values: np.ndarray | np.floating | float) -> torch.Tensor:
        """float32 constants on the device (a list through Python floats: exact, and no
        read-only-array warning)."""
        array = np.asarray(values, np.float32)
        return torch.tensor(array.tolist(), dtype=torch.float32, device=self._device)

    def _zeros(self, *shape: int) -> torch.Tensor:
        return torch.zeros(shape, dtype=torch.int64, device=self._device)

    def _positions(self, first: int, m: int) -> torch.Tensor:
        return torch.arange(first, first + m, dtype=torch.int64, device=self._device)

    @staticmethod
    def _sink(out: np.ndarray, lo: int, hi: int) -> Callable[[np.ndarray], None]:
        """Write a landed result (raw bytes) into ``out[..., lo:hi]`` (1-D or rows)."""

        def sink(data: np.ndarray) -> None:
            target = out[..., lo:hi]
            np.copyto(target, data.view(out.dtype).reshape(target.shape))

        return sink

    def _first(self) -> torch.Tensor:
        """Per worker, the first non-finite position found (``probe.NOWHERE``: none)."""
        return torch.full((self.workers,), probe.NOWHERE, dtype=torch.int64, device=self._device)

    @staticmethod
    def _found(first: torch.Tensor) -> int:
        found = int(first.min())
        return found if found < probe.NOWHERE else -1

    # -- the spine --------------------------------------------------------------------------------
    def probe(self, arrays: BlockArrays, eps: float, masks: np.ndarray) -> ProbeCounts:
        sources = arrays.sources
        n_agents = len(sources.files) - 1
        codes = [int(c) for c in sources.codes]
        with self._scoped():
            eps32 = self._f32(eps)
            overlap, coverage = self._zeros(self.workers, n_agents, n_agents), self._zeros(self.workers, n_agents + 1)
            first = self._first()

            def tile(w: int, lo: int, m: int, raw: list[torch.Tensor], outputs: OutputRing) -> None:
                values = [codecs.decode(r, c) for r, c in zip(raw, codes, strict=True)]
                on = probe.actives(codecs.unders(values, codes), values[1:], eps32)
                packed = probe.pack(on)
                outputs.put(packed, self._sink(masks, lo // 8, lo // 8 + packed.shape[1]))
                tile_overlap, tile_coverage = probe.counts(on)
                overlap[w] += tile_overlap
                coverage[w] += tile_coverage
                first[w] = torch.minimum(first[w], probe.first_nonfinite(values) + lo)

            self._run(self._source_parts(sources), sources.size, tile)
            return ProbeCounts(overlap.sum(0).cpu().numpy(), coverage.sum(0).cpu().numpy(), self._found(first))

    def merge_ram(
        self, arrays: BlockArrays, eps: float, lambdas: np.ndarray, outs: Sequence[np.ndarray], out_code: int
    ) -> int:
        sources = arrays.sources
        codes = [int(c) for c in sources.codes]
        raw_outs = [out.view(np.uint8) for out in outs]
        size = int(outs[0].dtype.itemsize) if outs else 1
        with self._scoped():
            eps32 = self._f32(eps)
            lams = [self._f32(row) for row in np.reshape(lambdas, (len(outs), -1))]
            first = self._first()

            def tile(w: int, lo: int, m: int, raw: list[torch.Tensor], outputs: OutputRing) -> None:
                values = [codecs.decode(r, c) for r, c in zip(raw, codes, strict=True)]
                first[w] = torch.minimum(first[w], probe.first_nonfinite(values) + lo)
                unders = codecs.unders(values, codes)
                counts = merges.ram_counts(values[0], values[1:], unders, eps32)
                for lam, raw_out in zip(lams, raw_outs, strict=True):  # one output at a time on the device
                    merged = merges.merge_ram(values[0], values[1:], unders, eps32, lam, counts)
                    outputs.put(codecs.encode(merged, out_code), self._sink(raw_out, lo * size, (lo + m) * size))

            self._run(self._source_parts(sources), sources.size, tile)
            return self._found(first)

    # -- the GTA family ---------------------------------------------------------------------------
    def merge_gta(
        self, arrays: BlockArrays, params: GtaParams, keep: Keep, outs: Sequence[np.ndarray], out_code: int
    ) -> int:
        n_agents = len(arrays.agents)
        parts = self._array_parts(arrays)
        if isinstance(keep, KeepArray):
            parts += [array_part(np.ascontiguousarray(keep.keep[t])) for t in range(n_agents)]
        codes = self._codes(arrays)
        raw_outs = [out.view(np.uint8) for out in outs]
        size = int(outs[0].dtype.itemsize) if outs else 1
        total_weight = np.float32(0.0)
        for weight in np.asarray(params.weights, np.float32):
            total_weight = np.float32(total_weight + weight)
        if abs(total_weight) < np.float32(1e-8):
            total_weight = np.float32(1.0)
        keep_dtype = _torch_dtype(keep.keep.dtype) if isinstance(keep, KeepArray) else torch.uint8
        align = keep.params.slice_size if isinstance(keep, KeepMagprune) else GROUP
        with self._scoped():
            weights, scale = self._f32(params.weights), self._f32(params.scale)
            lams, divisor = [self._f32(x) for x in np.asarray(params.lams)], self._f32(total_weight)
            first = self._first()
            select = self._selection(keep, n_agents)

            def tile(w: int, lo: int, m: int, raw: list[torch.Tensor], outputs: OutputRing) -> None:
                values = [codecs.decode(r, c) for r, c in zip(raw[: n_agents + 1], codes, strict=True)]
                first[w] = torch.minimum(first[w], probe.first_nonfinite(values) + lo)
                base = values[0]
                deltas = []
                for t in range(n_agents):
                    agent, under = values[1 + t], codecs.minus(base, codes[1 + t])
                    keep_t = raw[1 + n_agents + t].view(keep_dtype) if isinstance(keep, KeepArray) else None
                    if isinstance(keep, KeepMagprune):
                        keep_t = select(t, lo, m, agent, under)
                    delta, alive = merges.weighted_deltas(agent, under, weights[t], scale[t], keep_t)
                    if isinstance(keep, KeepRandom | KeepCuts):
                        alive = select(t, lo, m, agent, under)
                    deltas.append((delta, alive))
                mixed = merges.mix_gta(base, deltas, weights, params.consensus, params.normalize, divisor)
                for lam, raw_out in zip(lams, raw_outs, strict=True):  # one output at a time on the device
                    merged = base + lam * mixed
                    outputs.put(codecs.encode(merged, out_code), self._sink(raw_out, lo * size, (lo + m) * size))

            self._run(parts, arrays.size, tile, align=align, inputs=2 * n_agents + 4)
            return self._found(first)

    def _selection(
        self, keep: Keep, n_agents: int
    ) -> Callable[[int, int, int, torch.Tensor, torch.Tensor], torch.Tensor]:
        """``select(t, lo, m, agent, under)``: agent t's survival flags (``KeepRandom``,
        ``KeepCuts``) or keep multipliers (``KeepMagprune``) over block positions [lo, lo + m),
        computed on the device from the tile itself."""
        if isinstance(keep, KeepRandom):
            density = self._f32(keep.density)
            return lambda t, lo, m, agent, under: (
                uniform(int(keep.keys[t]), self._positions(keep.start + lo, m)) < density[t]
            )
        if isinstance(keep, KeepCuts):
            values, ranges = keep.cuts.value.tolist(), keep.cuts.range.tolist()

            return lambda t, lo, m, agent, under: magnitude.kept_by_cuts(
                magnitude.abs_bits(agent, under), self._positions(lo, m), values[t], ranges[t]
            )
        if isinstance(keep, KeepMagprune):
            prune = keep.params
            lo_p, width = self._f32(prune.lo), self._f32(prune.width)

            def magprune(t: int, lo: int, m: int, agent: torch.Tensor, under: torch.Tensor) -> torch.Tensor:
                return della.keep_values(
                    magnitude.abs_bits(agent, under),
                    self._positions(prune.start + lo, m),
                    prune.slice_size,
                    prune.rows,
                    int(prune.keys[t]),
                    int(prune.mode[t]),
                    lo_p[t],
                    width[t],
                    prune.inverse,
                )

            return magprune
        return lambda t, lo, m, agent, under: torch.ones(m, dtype=torch.bool, device=self._device)

    def has_nonfinite(self, out: np.ndarray, out_code: int) -> bool:
        return nonfinite.has_nonfinite(out, out_code)  # the block is in host memory already

    def merge_linear(self, arrays: BlockArrays, params: LinearParams, out: np.ndarray, out_code: int) -> int:
        uses_base = np.float32(params.base_weight) != np.float32(0.0)
        parts = self._array_parts(arrays)  # the base too: it is checked for NaN/Inf, as every input
        codes = self._codes(arrays)
        raw_out, size = out.view(np.uint8), out.dtype.itemsize
        divisor = np.float32(0.0) + np.float32(params.base_weight)
        for weight in np.asarray(params.weights, np.float32):
            divisor = np.float32(divisor + weight)
        with self._scoped():
            weights, base_weight = self._f32(params.weights), self._f32(params.base_weight)
            div = self._f32(divisor) if params.normalize else None
            first = self._first()

            def tile(w: int, lo: int, m: int, raw: list[torch.Tensor], outputs: OutputRing) -> None:
                values = [codecs.decode(r, c) for r, c in zip(raw, codes, strict=True)]
                first[w] = torch.minimum(first[w], probe.first_nonfinite(values) + lo)
                # an agent given as its task vector (TAU32) weighs in as its weights, base + tau in float32
                agents = [values[0] + v if c == TAU32 else v for v, c in zip(values[1:], codes[1:], strict=True)]
                merged = merges.merge_linear(values[0] if uses_base else None, base_weight, agents, weights, div)
                outputs.put(codecs.encode(merged, out_code), self._sink(raw_out, lo * size, (lo + m) * size))

            self._run(parts, arrays.size, tile)
            return self._found(first)

    def merge_nearswap(self, arrays: BlockArrays, t: np.float32, out: np.ndarray, out_code: int) -> int:
        parts = self._array_parts(arrays)
        codes = self._codes(arrays)
        raw_out, size = out.view(np.uint8), out.dtype.itemsize
        with self._scoped():
            t32 = self._f32(t)
            first = self._first()

            def tile(w: int, lo: int, m: int, raw: list[torch.Tensor], outputs: OutputRing) -> None:
                base, agent = (codecs.decode(r, c) for r, c in zip(raw, codes, strict=True))
                first[w] = torch.minimum(first[w], probe.first_nonfinite([base, agent]) + lo)
                if codes[1] == TAU32:  # an agent given as its task vector: its weights, base + tau in float32
                    agent = base + agent
                merged = merges.merge_nearswap(base, agent, t32)
                outputs.put(codecs.encode(merged, out_code), self._sink(raw_out, lo * size, (lo + m) * size))

            self._run(parts, arrays.size, tile)
            return self._found(first)

    # -- SCE --------------------------------------------------------------------------------------
    @staticmethod
    def _taus(values: list[torch.Tensor], codes: list[int]) -> list[torch.Tensor]:
        """The agents' tau from the decoded inputs, the base first."""
        return [v - codecs.minus(values[0], c) for v, c in zip(values[1:], codes[1:], strict=True)]

    def merge_sce(self, arrays: BlockArrays, params: SceParams, out: np.ndarray, out_code: int) -> int:
        parts = self._array_parts(arrays)
        codes = self._codes(arrays)
        raw_out, size = out.view(np.uint8), out.dtype.itemsize
        values, ranges = params.cuts.value[0].tolist(), params.cuts.range[0].tolist()
        with self._scoped():
            weights = self._f32(params.weights)
            first = self._first()

            def tile(w: int, lo: int, m: int, raw: list[torch.Tensor], outputs: OutputRing) -> None:
                decoded = [codecs.decode(r, c) for r, c in zip(raw, codes, strict=True)]
                first[w] = torch.minimum(first[w], probe.first_nonfinite(decoded) + lo)
                taus = self._taus(decoded, codes)
                merged = sce.merge_sce(decoded[0], taus, self._positions(lo, m), values, ranges, weights)
                outputs.put(codecs.encode(merged, out_code), self._sink(raw_out, lo * size, (lo + m) * size))

            self._run(parts, arrays.size, tile, inputs=2 * len(parts) + 4)
            return self._found(first)

    def variance(self, arrays: BlockArrays) -> np.ndarray:
        out = np.empty(arrays.size, np.float32)
        codes = self._codes(arrays)
        parts = self._array_parts(arrays)
        with self._scoped():

            def tile(w: int, lo: int, m: int, raw: list[torch.Tensor], outputs: OutputRing) -> None:
                decoded = [codecs.decode(r, c) for r, c in zip(raw, codes, strict=True)]
                outputs.put(sce.variance(self._taus(decoded, codes)), self._sink(out, lo, lo + m))

            self._run(parts, arrays.size, tile, inputs=len(parts) + 4)
        return out

    # -- arcee_fusion -----------------------------------------------------------------------------
    def merge_fusion(
        self, arrays: BlockArrays, rows: RowScale, threshold: np.float32, out: np.ndarray, out_code: int
    ) -> int:
        raw_out, size = out.view(np.uint8), out.dtype.itemsize
        with self._scoped():
            importance, limit, first = (
                fusion.Importance(rows, self._codes(arrays), self._device),
                self._f32(threshold),
                self._first(),
            )

            def tile(w: int, lo: int, m: int, raw: list[torch.Tensor], outputs: OutputRing) -> None:
                values = [codecs.decode(r, c) for r, c in zip(raw, importance.codes, strict=True)]
                first[w] = torch.minimum(first[w], probe.first_nonfinite(values) + lo)
                merged = fusion.merge(*importance(raw, lo, m), limit)
                outputs.put(codecs.encode(merged, out_code), self._sink(raw_out, lo * size, (lo + m) * size))

            self._run(self._array_parts(arrays), arrays.size, tile, inputs=6)
            return self._found(first)

    def importance_high_histogram(self, arrays: BlockArrays, rows: RowScale) -> np.ndarray:
        fixed = self._fixed(self.workers * (HIGH_BINS + magnitude.SPREAD) * 8, "the importance histogram")
        with self._scoped():
            importance, counts = (
                fusion.Importance(rows, self._codes(arrays), self._device),
                self._zeros(self.workers, HIGH_BINS + magnitude.SPREAD),
            )

            def tile(w: int, lo: int, m: int, raw: list[torch.Tensor], outputs: OutputRing) -> None:
                magnitude.add_high_counts(counts[w], fusion.bits(importance(raw, lo, m)[2]))

            self._run(self._array_parts(arrays), arrays.size, tile, inputs=8, fixed=fixed)
            return counts.sum(0)[:HIGH_BINS].cpu().numpy().astype(np.int32)

    def importance_low_histogram(self, arrays: BlockArrays, rows: RowScale, targets: np.ndarray) -> np.ndarray:
        n_cuts = len(targets)
        if np.max(targets, initial=-1) < 0:
            return np.zeros((n_cuts, LOW_BINS), np.int32)
        size = n_cuts * LOW_BINS + magnitude.SPREAD
        fixed = self._fixed(self.workers * size * 8, "the fine importance histograms")
        with self._scoped():
            importance, counts = (
                fusion.Importance(rows, self._codes(arrays), self._device),
                self._zeros(self.workers, size),
            )
            agent = torch.zeros(1, dtype=torch.int64, device=self._device)
            aims = torch.tensor([np.asarray(targets, np.int32).tolist()], dtype=torch.int32, device=self._device)

            def tile(w: int, lo: int, m: int, raw: list[torch.Tensor], outputs: OutputRing) -> None:
                magnitude.add_low_counts(counts[w], fusion.bits(importance(raw, lo, m)[2]), agent, aims)

            self._run(self._array_parts(arrays), arrays.size, tile, inputs=4 * n_cuts + 8, fixed=fixed)
            return counts.sum(0)[: n_cuts * LOW_BINS].view(n_cuts, LOW_BINS).cpu().numpy().astype(np.int32)

    # -- magnitudes -------------------------------------------------------------------------------
    @staticmethod
    def _abs_bits(raw: list[torch.Tensor], codes: list[int], agents: Sequence[int]) -> list[torch.Tensor]:
        base = codecs.decode(raw[0], codes[0])
        return [
            magnitude.abs_bits(codecs.decode(raw[1 + t], codes[1 + t]), codecs.minus(base, codes[1 + t]))
            for t in agents
        ]

    def abs_high_histogram(self, arrays: BlockArrays) -> np.ndarray:
        n_agents = len(arrays.agents)
        codes = self._codes(arrays)
        size = n_agents * HIGH_BINS + magnitude.SPREAD
        fixed = self._fixed(self.workers * size * 8, f"the magnitude histograms of {n_agents} agents")
        with self._scoped():
            counts = self._zeros(self.workers, size)

            def tile(w: int, lo: int, m: int, raw: list[torch.Tensor], outputs: OutputRing) -> None:
                magnitude.add_high_counts(counts[w], torch.stack(self._abs_bits(raw, codes, range(n_agents))))

            self._run(self._array_parts(arrays), arrays.size, tile, inputs=2 * n_agents + 6, fixed=fixed)
            total = counts.sum(0)[: n_agents * HIGH_BINS].view(n_agents, HIGH_BINS)
            return total.cpu().numpy().astype(np.int32)

    def abs_low_histogram(self, arrays: BlockArrays, targets: np.ndarray) -> np.ndarray:
        targets = np.ascontiguousarray(targets, np.int32)
        n_agents, n_cuts = targets.shape
        wanted = [t for t in range(n_agents) if targets[t].max(initial=-1) >= 0]
        if not wanted:
            return np.zeros((n_agents, n_cuts, LOW_BINS), np.int32)
        codes = self._codes(arrays)
        size = n_agents * n_cuts * LOW_BINS + magnitude.SPREAD
        fixed = self._fixed(self.workers * size * 8, f"the fine magnitude histograms of {n_agents} agents")
        with self._scoped():
            counts = self._zeros(self.workers, size)
            agents = torch.tensor(wanted, dtype=torch.int64, device=self._device)
            aims = torch.tensor(targets[wanted].tolist(), dtype=torch.int32, device=self._device)

            def tile(w: int, lo: int, m: int, raw: list[torch.Tensor], outputs: OutputRing) -> None:
                bits = torch.stack(self._abs_bits(raw, codes, wanted))
                magnitude.add_low_counts(counts[w], bits, agents, aims)

            inputs = 2 * n_agents + 4 * len(wanted) * n_cuts + 4  # the (K, C, m) index and masks
            self._run(self._array_parts(arrays), arrays.size, tile, inputs=inputs, fixed=fixed)
            total = counts.sum(0)[: n_agents * n_cuts * LOW_BINS].view(n_agents, n_cuts, LOW_BINS)
            return total.cpu().numpy().astype(np.int32)

    def cut_keep(self, arrays: BlockArrays, cuts: Cuts) -> np.ndarray:
        n_agents = len(arrays.agents)
        keep = np.empty((n_agents, arrays.size), np.uint8)
        codes = self._codes(arrays)
        values, ranges = cuts.value.tolist(), cuts.range.tolist()
        with self._scoped():

            def tile(w: int, lo: int, m: int, raw: list[torch.Tensor], outputs: OutputRing) -> None:
                position = self._positions(lo, m)
                bits = self._abs_bits(raw, codes, range(n_agents))
                rows = [magnitude.kept_by_cuts(bits[t], position, values[t], ranges[t]) for t in range(n_agents)]
                outputs.put(torch.stack(rows).to(torch.uint8), self._sink(keep, lo, lo + m))

            self._run(self._array_parts(arrays), arrays.size, tile)
        return keep

    def find_tie(self, arrays: BlockArrays, agent: int, value: int, begin: int, need: int) -> tuple[int, int]:
        """Each worker counts the ties in its tiles (positions too, in order); the ``need``-th is
        then found serially, so the answer never depends on the workers."""
        parts = [array_part(arrays.base), array_part(arrays.agents[agent])]
        codes = [int(arrays.base_code), int(arrays.agent_codes[agent])]
        found: dict[int, torch.Tensor] = {}  # tile start -> positions of its ties
        with self._scoped():

            def tile(w: int, lo: int, m: int, raw: list[torch.Tensor], outputs: OutputRing) -> None:
                if lo + m > begin:
                    (bits,) = self._abs_bits(raw, codes, [0])
                    equal = (bits.to(torch.int64) == value) & (self._positions(lo, m) >= begin)
                    found[lo] = torch.nonzero(equal)[:, 0].cpu() + lo

            self._run(parts, arrays.size, tile)
        positions = [found[lo] for lo in sorted(found)]
        total = sum(int(p.shape[0]) for p in positions)
        if not 1 <= need <= total:
            return -1, total
        return int(torch.cat(positions)[need - 1]), total

    # -- exact sums -------------------------------------------------------------------------------
    def abs_sums(self, arrays: BlockArrays, keep: Keep, squares: bool = False) -> ExactSums:
        n_agents = len(arrays.agents)
        parts = self._array_parts(arrays)
        if isinstance(keep, KeepArray):
            parts += [array_part(np.ascontiguousarray(keep.keep[t])) for t in range(n_agents)]
        codes = self._codes(arrays)
        with self._scoped():
            zero = torch.zeros((), dtype=torch.float32, device=self._device)
            acc = self._zeros(self.workers, 2 * n_agents, BINS + 1)
            first = self._first()
            density = self._f32(keep.density) if isinstance(keep, KeepRandom) else None

            def tile(w: int, lo: int, m: int, raw: list[torch.Tensor], outputs: OutputRing) -> None:
                base = codecs.decode(raw[0], codes[0])
                rows = []
                for t in range(n_agents):
                    size = (codecs.decode(raw[1 + t], codes[1 + t]) - codecs.minus(base, codes[1 + t])).abs()
                    first[w] = torch.minimum(first[w], probe.first_nonfinite([size]) + lo)
                    size = torch.where(torch.isfinite(size), size, zero)
                    if isinstance(keep, KeepRandom) and density is not None:
                        kept = uniform(int(keep.keys[t]), self._positions(keep.start + lo, m)) < density[t]
                        rows += [size, torch.where(kept, size, zero)]
                    elif isinstance(keep, KeepArray):
                        mask = raw[1 + n_agents + t].view(_torch_dtype(keep.keep.dtype))
                        rows += [size, torch.where(mask != 0, size, zero)]
                    else:
                        rows += [size, size]
                stacked = torch.stack(rows)
                sums = exact_sums.product_group_sums(stacked, stacked) if squares else exact_sums.group_sums(stacked)
                exact_sums.accumulate(acc[w], sums)

            self._run(parts, arrays.size, tile, inputs=2 * n_agents + 2)
            total = acc.sum(0).cpu().numpy()
            sums = renormalised(total).reshape(n_agents, 2, BINS + 1)
            return ExactSums(sums, self._found(first))

    def gram(self, arrays: BlockArrays, weights: bool = False) -> ExactSums:
        n_agents = len(arrays.agents)
        n_vectors = n_agents + (1 if weights else 0)
        pairs = [(a, b) for a in range(n_vectors) for b in range(a, n_vectors)]
        codes = self._codes(arrays)
        with self._scoped():
            zero = torch.zeros((), dtype=torch.float32, device=self._device)
            acc = self._zeros(self.workers, len(pairs), BINS + 1)
            first = self._first()
            left = torch.tensor([a for a, _ in pairs], device=self._device)
            right = torch.tensor([b for _, b in pairs], device=self._device)

            def tile(w: int, lo: int, m: int, raw: list[torch.Tensor], outputs: OutputRing) -> None:
                base = codecs.decode(raw[0], codes[0])
                values = [base] if weights else []
                for t in range(n_agents):
                    agent = codecs.decode(raw[1 + t], codes[1 + t])
                    if not weights:
                        values.append(agent - codecs.minus(base, codes[1 + t]))
                    else:  # a task vector (TAU32) weighs in as f32(base) + tau
                        values.append(base + agent if codes[1 + t] == TAU32 else agent)
                rows = []
                for value in values:
                    first[w] = torch.minimum(first[w], probe.first_nonfinite([value]) + lo)
                    rows.append(torch.where(torch.isfinite(value), value, zero))
                stacked = torch.stack(rows)
                exact_sums.accumulate(acc[w], exact_sums.product_group_sums(stacked[left], stacked[right]))

            self._run(self._array_parts(arrays), arrays.size, tile, inputs=2 * len(pairs) + n_vectors + 1)
            return ExactSums(renormalised(acc.sum(0).cpu().numpy()), self._found(first))

    # -- DELLA ------------------------------------------------------------------------------------
    def vector_gram(self, arrays: BlockArrays, layout: VectorLayout, weights: bool = False) -> ExactSums:
        n_agents = len(arrays.agents)
        n_vectors = n_agents + (1 if weights else 0)
        pairs = [(a, b) for a in range(n_vectors) for b in range(a, n_vectors)]
        codes = self._codes(arrays)
        size = layout.count * len(pairs) * DIGITS
        with self._scoped():
            zero = torch.zeros((), dtype=torch.float32, device=self._device)
            acc = self._zeros(self.workers, self._fixed(size * 8, "the per-vector sums") // 8)
            first = self._first()

            def tile(w: int, lo: int, m: int, raw: list[torch.Tensor], outputs: OutputRing) -> None:
                base = codecs.decode(raw[0], codes[0])
                values = [base] if weights else []
                for t in range(n_agents):
                    agent = codecs.decode(raw[1 + t], codes[1 + t])
                    if not weights:
                        values.append(agent - codecs.minus(base, codes[1 + t]))
                    else:  # a task vector (TAU32) weighs in as f32(base) + tau
                        values.append(base + agent if codes[1 + t] == TAU32 else agent)
                rows = []
                for value in values:
                    first[w] = torch.minimum(first[w], probe.first_nonfinite([value]) + lo)
                    rows.append(torch.where(torch.isfinite(value), value, zero))
                which = vectors.block_vectors(
                    self._positions(layout.start + lo, m), layout.div, layout.mod, layout.start
                )
                for k, (a, b) in enumerate(pairs):
                    vectors.add_products(acc[w], rows[a], rows[b], which * len(pairs) + k)

            self._run(self._array_parts(arrays), arrays.size, tile, inputs=2 * len(pairs) + n_vectors + 4)
            total = normalise(acc.sum(0).cpu().numpy().reshape(layout.count, len(pairs), DIGITS))
            return ExactSums(total, self._found(first))

    def agreement(self, arrays: BlockArrays, eps: float) -> AgreementSums:
        n_agents = len(arrays.agents)
        pairs = agent_pairs(n_agents)
        codes = self._codes(arrays)
        with self._scoped():
            eps32 = self._f32(eps)
            acc = self._zeros(self.workers, sum_rows(n_agents) * DIGITS)
            counts = self._zeros(self.workers, len(pairs), 2)

            def tile(w: int, lo: int, m: int, raw: list[torch.Tensor], outputs: OutputRing) -> None:
                base = codecs.decode(raw[0], codes[0])
                taus = [
                    codecs.decode(raw[1 + t], codes[1 + t]) - codecs.minus(base, codes[1 + t]) for t in range(n_agents)
                ]
                agreement.accumulate(acc[w], counts[w], torch.stack(taus), eps32, pairs)

            self._run(self._array_parts(arrays), arrays.size, tile, inputs=2 * n_agents + 8)
            total = normalise(acc.sum(0).cpu().numpy().reshape(sum_rows(n_agents), DIGITS))
            return AgreementSums(counts.sum(0).cpu().numpy(), total)

    def merge_vectors(
        self,
        arrays: BlockArrays,
        layout: VectorLayout,
        coefs: np.ndarray,
        weights: bool,
        out: np.ndarray,
        out_code: int,
    ) -> int:
        parts = self._array_parts(arrays)
        codes = self._codes(arrays)
        raw_out, size = out.view(np.uint8), out.dtype.itemsize
        table = np.ascontiguousarray(coefs, np.float32)
        with self._scoped():
            self._fixed(table.nbytes, "the per-vector coefficients")
            on_device = torch.from_numpy(table.copy()).to(self._device)
            first = self._first()

            def tile(w: int, lo: int, m: int, raw: list[torch.Tensor], outputs: OutputRing) -> None:
                values = [codecs.decode(r, c) for r, c in zip(raw, codes, strict=True)]
                first[w] = torch.minimum(first[w], probe.first_nonfinite(values) + lo)
                base = values[0]
                if weights:  # an agent given as its task vector (TAU32) weighs in as base + tau
                    agents = [base + v if c == TAU32 else v for v, c in zip(values[1:], codes[1:], strict=True)]
                else:
                    agents = values[1:]
                unders = [codecs.minus(base, c) for c in codes[1:]]
                which = vectors.block_vectors(
                    self._positions(layout.start + lo, m), layout.div, layout.mod, layout.start
                )
                merged = vectors.merge_vectors(base, agents, unders, on_device, which, weights)
                outputs.put(codecs.encode(merged, out_code), self._sink(raw_out, lo * size, (lo + m) * size))

            self._run(parts, arrays.size, tile, inputs=len(parts) + 3)
            return self._found(first)

    def magprune_keep(self, arrays: BlockArrays, params: MagpruneParams) -> np.ndarray:
        n_agents = len(arrays.agents)
        keep = np.empty((n_agents, arrays.size), np.float32)
        codes = self._codes(arrays)
        parts = self._array_parts(arrays)
        with self._scoped():
            lo_p, width = self._f32(params.lo), self._f32(params.width)

            def tile(w: int, lo: int, m: int, raw: list[torch.Tensor], outputs: OutputRing) -> None:
                position = self._positions(params.start + lo, m)
                bits = self._abs_bits(raw, codes, range(n_agents))
                rows = [
                    della.keep_values(
                        bits[t],
                        position,
                        params.slice_size,
                        params.rows,
                        int(params.keys[t]),
                        int(params.mode[t]),
                        lo_p[t],
                        width[t],
                        params.inverse,
                    )
                    for t in range(n_agents)
                ]
                outputs.put(torch.stack(rows), self._sink(keep, lo, lo + m))

            self._run(parts, arrays.size, tile, align=params.slice_size, inputs=len(parts) + 4)
        return keep

    def lora_product(self, left: np.ndarray, right: np.ndarray, scale: np.float32, out: np.ndarray) -> None:
        """On the host, with numpy (the block is assembled there before it is staged)."""
        numpy_product(left, right, scale, out)

    def close(self) -> None:
        for pool in (self._pool, self._workers_pool):
            if pool is not None:
                pool.shutdown()
        self._files.close()


def _first_line(error: BaseException) -> str:
    return (str(error).strip().splitlines() or [type(error).__name__])[0]


def _read_error(sources: BlockSources, k: int) -> Callable[[], Exception]:
    return lambda: sources.read_error(k)


def _torch_dtype(dtype: np.dtype) -> torch.dtype:
    """The torch dtype of a keep array (a uint8 mask or float32 multipliers)."""
    return torch.uint8 if dtype == np.uint8 else torch.float32


def _power_of_two_below(n: int) -> int:
    return 1 << max(n, 1).bit_length() - 1
