"""The Numba backend: today's CPU kernels behind the ``Backend`` protocol.

The spine kernels (probe, RAM merge) ``pread`` their own tiles (``arrays.sources``) from
descriptors this backend opens (and keeps) per file; the others work on the block's mapped
views. Each call runs its kernel's parts on the backend's thread count (``workers.run_parts``);
Numba's own thread settings are neither used nor changed.
Per-thread partial rows are allocated and reduced here, so callers never see worker counts.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator, Sequence
from contextlib import contextmanager

import numba
import numpy as np

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
from ramstream.backends.exact_sum import BINS
from ramstream.backends.landing import Landing
from ramstream.backends.nonfinite import EXPONENT
from ramstream.backends.numba import (
    agreement,
    della,
    exact_stats,
    fusion,
    gta,
    linear,
    lora,
    magnitude,
    merge_ram,
    nearswap,
    nonfinite,
    probe,
    quantized,
    sce,
    vectors,
)
from ramstream.backends.numba.addresses import addresses_of
from ramstream.backends.numba.keep import (
    KEEP_ALL,
    KEEP_ARRAY,
    KEEP_CUTS,
    KEEP_RANDOM,
    NO_CUT_RANGE,
    NO_CUT_VALUE,
    NO_DENSITY,
    NO_KEEP,
    NO_KEYS,
)
from ramstream.backends.numba.sources import ITEMSIZES
from ramstream.backends.settings import BackendSettings
from ramstream.backends.vector_sums import DIGITS, VectorLayout
from ramstream.blocks import BlockArrays, BlockSources
from ramstream.blocks.quantized import ScaledCodes
from ramstream.errors import ConfigError
from ramstream.io.reader import InputFiles

SERIAL_BELOW = 1 << 16  # elements: smaller blocks run on the calling thread alone
CONSENSUS = {"none": gta.CONSENSUS_NONE, "sum": gta.CONSENSUS_SUM}


def available_threads() -> int:
    return int(numba.config.NUMBA_NUM_THREADS)  # type: ignore[attr-defined]


def prepare(method: str) -> Callable[[], None]:
    """Ahead of a merge with ``method``: compile the kernels it calls later in child processes
    (``prewarm``); returns what stops them."""
    from ramstream.backends.numba import prewarm

    return prewarm.start(method)


def make(settings: BackendSettings) -> NumbaBackend:
    """The registry's factory: the CPU kernels, which refuse a GPU setting rather than ignore it."""
    if settings.device not in (None, "cpu"):
        raise ConfigError(f"--backend numba computes on the CPU only; --device {settings.device} needs --backend torch")
    if settings.gpu_memory is not None:
        raise ConfigError("--backend numba uses no GPU; --gpu-memory needs --backend torch")
    return NumbaBackend(settings.threads)


class NumbaBackend:
    name = "numba"

    def __init__(self, threads: int | None = None) -> None:
        available = available_threads()
        self.threads = min(threads or available, available)
        self._files = InputFiles()  # descriptors for the kernels that read their own tiles

    @property
    def device(self) -> str:
        return "cpu"

    def _workers(self, size: int) -> int:
        """This backend's thread count, or one thread for a block of fewer than ``SERIAL_BELOW``
        elements (an MoE's expert tensors: handing them to threads cost ten times the work): the
        parts a kernel runs and the partial rows it fills. Partials are combined exactly, so the
        thread count never changes a result."""
        return 1 if size < SERIAL_BELOW else self.threads

    def _inputs(self, sources: BlockSources) -> tuple[np.ndarray, np.ndarray]:
        """``(fds, offsets)`` as the tile-reading kernels take them: an input held in memory (a
        LoRA agent's task vector) has no descriptor (-1) and its address for offset; the caller's
        ``sources`` keeps it alive through the call."""
        fds = np.empty(len(sources.files), np.int64)
        offsets = sources.offsets.copy()
        for k, path in enumerate(sources.files):
            held = sources.in_memory(k)
            if held is None:
                fds[k] = self._files.descriptor(path)
            elif held.flags.c_contiguous and held.size == sources.size:
                fds[k], offsets[k] = -1, held.ctypes.data
            else:
                raise ValueError("an input held in memory must be contiguous and of the block's size")
        return fds, offsets

    @staticmethod
    def _check_reads(sources: BlockSources, failed: np.ndarray) -> None:
        first = _first(failed)
        if first >= 0:
            raise sources.read_error(first)

    def probe(self, arrays: BlockArrays, eps: float, masks: np.ndarray) -> ProbeCounts:
        sources = arrays.sources
        n_agents = len(sources.files) - 1
        fds, offsets = self._inputs(sources)
        workers = self._workers(sources.size)
        overlap = np.zeros((workers, n_agents, n_agents), np.int64)
        coverage = np.zeros((workers, n_agents + 1), np.int64)
        bad = np.full(workers, -1, np.int64)
        failed = np.full(workers, -1, np.int64)
        probe.probe_block(fds, offsets, sources.codes, sources.size, eps, masks, overlap, coverage, bad, failed)
        self._check_reads(sources, failed)
        return ProbeCounts(overlap.sum(axis=0), coverage.sum(axis=0), _first(bad))

    def merge_ram(
        self, arrays: BlockArrays, eps: float, lambdas: np.ndarray, outs: Sequence[np.ndarray], out_code: int
    ) -> int:
        sources = arrays.sources
        fds, offsets = self._inputs(sources)
        addresses = _addresses(outs, sources.size * int(ITEMSIZES[out_code]))
        lams = np.ascontiguousarray(np.reshape(lambdas, (len(outs), -1)), np.float32)
        workers = self._workers(sources.size)
        failed = np.full(workers, -1, np.int64)
        bad = np.full(workers, -1, np.int64)
        merge_ram.merge_ram_block(
            fds, offsets, sources.codes, sources.size, eps, lams, addresses, out_code, failed, bad
        )
        self._check_reads(sources, failed)
        return _first(bad)

    @staticmethod
    def _keep_args(keep: Keep) -> tuple[int, np.ndarray, np.ndarray, np.ndarray, int]:
        """(mode, keep array, keys, density, start) as the statistics kernels take them."""
        if isinstance(keep, KeepRandom):
            return KEEP_RANDOM, NO_KEEP, keep.keys, keep.density, keep.start
        if isinstance(keep, KeepArray):
            return KEEP_ARRAY, keep.keep, NO_KEYS, NO_DENSITY, 0
        if isinstance(keep, KeepCuts | KeepMagprune):
            raise TypeError(f"{type(keep).__name__} is evaluated by merge_gta only; pass its mask as KeepArray")
        return KEEP_ALL, NO_KEEP, NO_KEYS, NO_DENSITY, 0

    def merge_gta(
        self, arrays: BlockArrays, params: GtaParams, keep: Keep, outs: Sequence[np.ndarray], out_code: int
    ) -> int:
        addresses = _addresses(outs, arrays.size * int(ITEMSIZES[out_code]))
        lams = np.ascontiguousarray(params.lams, np.float32)
        if isinstance(keep, KeepMagprune):
            return self._merge_della(arrays, params, keep.params, lams, addresses, out_code)
        cut_value, cut_range = NO_CUT_VALUE, NO_CUT_RANGE
        if isinstance(keep, KeepCuts):
            mode, keep_array, keys, density, start = KEEP_CUTS, NO_KEEP, NO_KEYS, NO_DENSITY, 0
            cut_value = np.ascontiguousarray(keep.cuts.value, np.uint32)
            cut_range = np.ascontiguousarray(keep.cuts.range, np.int64)
        else:
            mode, keep_array, keys, density, start = self._keep_args(keep)
        workers = self._workers(arrays.size)
        return int(
            gta.gta_merge_block(
                arrays.base,
                arrays.base_code,
                _agents(arrays),
                arrays.agent_codes,
                _writable_f32(params.weights),
                _writable_f32(params.scale),
                mode,
                keep_array,
                keys,
                density,
                start,
                cut_value,
                cut_range,
                CONSENSUS[params.consensus],
                params.normalize,
                lams,
                addresses,
                out_code,
                workers,
            )
        )

    def _merge_della(
        self,
        arrays: BlockArrays,
        params: GtaParams,
        prune: MagpruneParams,
        lams: np.ndarray,
        addresses: np.ndarray,
        out_code: int,
    ) -> int:
        workers = self._workers(arrays.size)
        return int(
            della.della_merge_block(
                arrays.base,
                arrays.base_code,
                _agents(arrays),
                arrays.agent_codes,
                prune.start,
                prune.slice_size,
                prune.rows,
                prune.keys,
                prune.mode,
                prune.lo,
                prune.width,
                prune.inverse,
                _writable_f32(params.weights),
                _writable_f32(params.scale),
                CONSENSUS[params.consensus],
                params.normalize,
                lams,
                addresses,
                out_code,
                workers,
            )
        )

    def has_nonfinite(self, out: np.ndarray, out_code: int) -> bool:
        carrier, mask = EXPONENT[out_code]
        values = out.view(carrier)
        workers = self._workers(values.size)
        return bool(nonfinite.count_exponent(values, carrier(mask), workers) > 0)

    def merge_linear(self, arrays: BlockArrays, params: LinearParams, out: np.ndarray, out_code: int) -> int:
        workers = self._workers(arrays.size)
        return int(
            linear.merge_linear_block(
                arrays.base,
                arrays.base_code,
                params.base_weight,
                _agents(arrays),
                arrays.agent_codes,
                params.weights,
                params.normalize,
                out,
                out_code,
                workers,
            )
        )

    def merge_nearswap(self, arrays: BlockArrays, t: np.float32, out: np.ndarray, out_code: int) -> int:
        workers = self._workers(arrays.size)
        return int(
            nearswap.merge_nearswap_block(
                arrays.base, arrays.base_code, _agents(arrays), arrays.agent_codes, t, out, out_code, workers
            )
        )

    def merge_fusion(
        self, arrays: BlockArrays, rows: RowScale, threshold: np.float32, out: np.ndarray, out_code: int
    ) -> int:
        scale = np.ascontiguousarray(rows.scale, np.float32)
        workers = self._workers(arrays.size)
        return int(
            fusion.merge_fusion_block(
                arrays.base,
                arrays.base_code,
                _agents(arrays),
                arrays.agent_codes,
                scale,
                rows.row_len,
                rows.offset,
                np.float32(threshold),
                out,
                out_code,
                workers,
            )
        )

    def importance_high_histogram(self, arrays: BlockArrays, rows: RowScale) -> np.ndarray:
        return self._importance_histograms(arrays, rows, None)[0]

    def importance_low_histogram(self, arrays: BlockArrays, rows: RowScale, targets: np.ndarray) -> np.ndarray:
        return self._importance_histograms(arrays, rows, np.ascontiguousarray(targets, np.int32))[1]

    def _importance_histograms(
        self, arrays: BlockArrays, rows: RowScale, targets: np.ndarray | None
    ) -> tuple[np.ndarray, np.ndarray]:
        """(high (HIGH_BINS,), low (C, LOW_BINS)): the high histogram without ``targets``, else the low one."""
        scale = np.ascontiguousarray(rows.scale, np.float32)
        aims = np.full(0, -1, np.int32) if targets is None else targets
        workers = self._workers(arrays.size)
        high = np.zeros((workers, HIGH_BINS if targets is None else 0), np.int32)
        low = np.zeros((workers, len(aims), LOW_BINS), np.int32)
        if targets is None or aims.max(initial=-1) >= 0:
            fusion.importance_histograms(
                arrays.base,
                arrays.base_code,
                arrays.agents[0],
                int(arrays.agent_codes[0]),
                scale,
                rows.row_len,
                rows.offset,
                aims,
                high,
                low,
            )
        return _reduce_counts(high), _reduce_counts(low)

    def merge_sce(self, arrays: BlockArrays, params: SceParams, out: np.ndarray, out_code: int) -> int:
        cut_value = np.ascontiguousarray(params.cuts.value[0], np.uint32)
        cut_range = np.ascontiguousarray(params.cuts.range[0], np.int64)
        weights = np.ascontiguousarray(params.weights, np.float32)
        workers = self._workers(arrays.size)
        return int(
            sce.merge_sce_block(
                arrays.base,
                arrays.base_code,
                _agents(arrays),
                arrays.agent_codes,
                weights,
                cut_value,
                cut_range,
                out,
                out_code,
                workers,
            )
        )

    def variance(self, arrays: BlockArrays) -> np.ndarray:
        out = np.empty(arrays.size, np.float32)
        workers = self._workers(arrays.size)
        sce.variance_block(arrays.base, arrays.base_code, _agents(arrays), arrays.agent_codes, out, workers)
        return out

    def abs_high_histogram(self, arrays: BlockArrays) -> np.ndarray:
        workers = self._workers(arrays.size)
        counts = np.zeros((workers, arrays.n_agents, HIGH_BINS), np.int32)
        magnitude.high_histogram(arrays.base, arrays.base_code, _agents(arrays), arrays.agent_codes, counts)
        return _reduce_counts(counts)

    def abs_low_histogram(self, arrays: BlockArrays, targets: np.ndarray) -> np.ndarray:
        targets = np.ascontiguousarray(targets, np.int32)
        workers = self._workers(arrays.size)
        counts = np.zeros((workers, *targets.shape, LOW_BINS), np.int32)
        if targets.max(initial=-1) >= 0:
            magnitude.low_histogram(arrays.base, arrays.base_code, _agents(arrays), arrays.agent_codes, targets, counts)
        return _reduce_counts(counts)

    def cut_keep(self, arrays: BlockArrays, cuts: Cuts) -> np.ndarray:
        keep = np.empty((arrays.n_agents, arrays.size), np.uint8)
        workers = self._workers(arrays.size)
        magnitude.cut_keep(
            arrays.base,
            arrays.base_code,
            _agents(arrays),
            arrays.agent_codes,
            cuts.value,
            cuts.range,
            keep,
            workers,
        )
        return keep

    def find_ties(self, arrays: BlockArrays, agents: np.ndarray, values: np.ndarray, needs: np.ndarray) -> np.ndarray:
        workers = self._workers(arrays.size)
        found = [
            magnitude.find_tie(
                arrays.base,
                arrays.base_code,
                arrays.agents[int(agent)],
                int(arrays.agent_codes[int(agent)]),
                int(value),
                0,
                int(need),
                workers,
            )[0]
            for agent, value, need in zip(agents, values, needs, strict=True)
        ]
        return np.array(found, np.int64)

    def abs_sums(self, arrays: BlockArrays, keep: Keep, squares: bool = False) -> ExactSums:
        mode, keep_array, keys, density, start = self._keep_args(keep)
        n_agents = arrays.n_agents
        workers = self._workers(arrays.size)
        acc = np.zeros((workers, n_agents, 2, BINS + 1), np.int64)
        bad = np.empty(workers, np.int64)
        exact_stats.abs_sums_block(
            arrays.base,
            arrays.base_code,
            _agents(arrays),
            arrays.agent_codes,
            mode,
            keys,
            density,
            start,
            keep_array,
            squares,
            acc,
            bad,
        )
        total = np.asarray(exact_stats.reduce_workers(acc)).reshape(n_agents, 2, BINS + 1)
        return ExactSums(total, _first(bad))

    def gram(self, arrays: BlockArrays, weights: bool = False) -> ExactSums:
        n_vectors = arrays.n_agents + (1 if weights else 0)
        n_pairs = n_vectors * (n_vectors + 1) // 2
        workers = self._workers(arrays.size)
        acc = np.zeros((workers, n_pairs, BINS + 1), np.int64)
        bad = np.empty(workers, np.int64)
        exact_stats.gram_block(arrays.base, arrays.base_code, _agents(arrays), arrays.agent_codes, weights, acc, bad)
        total = np.asarray(exact_stats.reduce_workers(acc))
        return ExactSums(total, _first(bad))

    def vector_gram(self, arrays: BlockArrays, layout: VectorLayout, weights: bool = False) -> ExactSums:
        n_vectors = arrays.n_agents + (1 if weights else 0)
        n_pairs = n_vectors * (n_vectors + 1) // 2
        workers = self._workers(arrays.size)
        acc = np.zeros((workers, layout.count, n_pairs, DIGITS), np.int64)
        bad = np.empty(workers, np.int64)
        vectors.vector_gram_block(
            arrays.base,
            arrays.base_code,
            _agents(arrays),
            arrays.agent_codes,
            weights,
            layout.start,
            layout.div,
            layout.mod,
            acc,
            bad,
        )
        total = np.asarray(vectors.reduce_normalised(acc))
        return ExactSums(total.reshape(layout.count, n_pairs, DIGITS), _first(bad))

    def agreement(self, arrays: BlockArrays, eps: float) -> AgreementSums:
        n_agents = arrays.n_agents
        n_pairs = len(agent_pairs(n_agents))
        workers = self._workers(arrays.size)
        counts = np.zeros((workers, n_pairs, 2), np.int64)
        acc = np.zeros((workers, sum_rows(n_agents), DIGITS), np.int64)
        agreement.agreement_block(arrays.base, arrays.base_code, _agents(arrays), arrays.agent_codes, eps, counts, acc)
        total = np.asarray(vectors.reduce_normalised(acc))
        return AgreementSums(counts.sum(axis=0), total.reshape(sum_rows(n_agents), DIGITS))

    def merge_vectors(
        self,
        arrays: BlockArrays,
        layout: VectorLayout,
        coefs: np.ndarray,
        weights: bool,
        out: np.ndarray,
        out_code: int,
    ) -> int:
        coefs = np.ascontiguousarray(coefs, np.float32)
        workers = self._workers(arrays.size)
        return int(
            vectors.merge_vectors_block(
                arrays.base,
                arrays.base_code,
                _agents(arrays),
                arrays.agent_codes,
                weights,
                layout.start,
                layout.div,
                layout.mod,
                coefs,
                out,
                out_code,
                workers,
            )
        )

    def magprune_keep(self, arrays: BlockArrays, params: MagpruneParams) -> np.ndarray:
        keep = np.empty((arrays.n_agents, arrays.size), np.float32)
        workers = self._workers(arrays.size)
        della.della_keep(
            arrays.base,
            arrays.base_code,
            _agents(arrays),
            arrays.agent_codes,
            params.start,
            params.slice_size,
            params.rows,
            params.keys,
            params.mode,
            params.lo,
            params.width,
            params.inverse,
            keep,
            workers,
        )
        return keep

    def host_memory(self, nbytes: int) -> np.ndarray:
        return np.empty(nbytes, np.uint8)

    def lora_product(self, left: np.ndarray, right: np.ndarray, scale: np.float32, out: np.ndarray) -> None:
        workers = self._workers(out.size)
        lora.lora_product(left, right, scale, out, workers)

    def fp8_dequantize(self, run: ScaledCodes, out: np.ndarray, code: int) -> None:
        bm, bn = run.block
        workers = self._workers(out.size)
        quantized.dequantize(run.codes, run.table, run.scales, run.offset, run.cols, bm, bn, out, code, workers)

    @property
    def defers(self) -> bool:
        return False

    def expect(self, upcoming: Sequence[BlockSources | None]) -> None:
        """Nothing to read ahead: the kernels read the mapped files, the OS reads ahead."""

    @contextmanager
    def deferred(self) -> Iterator[Landing]:
        """The kernels return when done: nothing is left to land."""
        yield Landing()

    def close(self) -> None:
        self._files.close()


def _reduce_counts(counts: np.ndarray) -> np.ndarray:
    return counts.sum(axis=0, dtype=np.int64).astype(np.int32)


def _agents(arrays: BlockArrays) -> np.ndarray:
    """The agents' raw blocks as the kernels take them: their addresses (``addresses``)."""
    return addresses_of(arrays.agents, arrays.size)


def _first(rows: np.ndarray) -> int:
    """The smallest of the per-thread rows that found something (>= 0), or -1."""
    found = rows[rows >= 0]
    return int(found.min()) if found.size else -1


def _addresses(outs: Sequence[np.ndarray], nbytes: int) -> np.ndarray:
    """The outputs' addresses, as the K-output kernels take them (the caller's ``outs`` keeps the
    arrays alive through the call); each must be contiguous and of the block's size."""
    if any(not o.flags.c_contiguous or o.nbytes != nbytes for o in outs):
        raise ValueError("a kernel writes contiguous outputs of the block's size")
    return np.array([o.ctypes.data for o in outs], np.int64)


def _writable_f32(values: np.ndarray) -> np.ndarray:
    """``values`` as a writable C-contiguous float32 array (a copy if it is a read-only view).
    Numba compiles a kernel once per argument type, and read-only is part of the type: the GTA
    methods' per-tensor weights are read-only views, model_stock's and the slerp family's fresh
    arrays, so without this a run of both compiled the GTA merge twice (about 10 s each)."""
    return np.require(values, np.float32, ["C", "W"])
