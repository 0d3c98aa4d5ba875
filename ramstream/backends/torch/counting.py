"""The torch backend's counting operations: the probe's masks and overlap counts, histograms,
tie searches, exact sums, per-vector and pairwise statistics, MAGPRUNE's keep values, with the
Numba kernels' numbers."""

from __future__ import annotations

from collections.abc import Callable

import numpy as np
import torch

from ramstream.backends.agreement import agent_pairs, sum_rows
from ramstream.backends.base import (
    HIGH_BINS,
    LOW_BINS,
    AgreementSums,
    Cuts,
    ExactSums,
    Keep,
    KeepAll,
    KeepArray,
    KeepRandom,
    MagpruneParams,
    ProbeCounts,
    RowScale,
    nth_set,
)
from ramstream.backends.exact_sum import BINS, renormalised
from ramstream.backends.torch import (
    agreement,
    codecs,
    della,
    exact_sums,
    fusion,
    magnitude,
    probe,
    vectors,
)
from ramstream.backends.torch.rng import uniform
from ramstream.backends.torch.staging import OutputRing, Part, array_part
from ramstream.backends.torch.tiles import TileBackend, _torch_dtype
from ramstream.backends.vector_sums import DIGITS, VectorLayout, normalise
from ramstream.blocks import BlockArrays
from ramstream.format.dtypes import TAU32


class CountOps(TileBackend):
    """The probe and the statistics a method asks for."""

    # -- the probe --------------------------------------------------------------------------------
    def probe(self, arrays: BlockArrays, eps: float, masks: np.ndarray) -> ProbeCounts:
        sources = arrays.sources
        n_agents = len(sources.files) - 1
        codes = [int(c) for c in sources.codes]
        if self._fused(codes):
            return self._probe_fused(arrays, eps, masks)
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

            self._run(self._source_parts(sources), sources.size, tile, later=True)
            # one row as the fused kernel's state: the first non-finite position, overlap, coverage
            state = torch.cat([first.min().reshape(1), overlap.sum(0).reshape(-1), coverage.sum(0)])
            return self._probe_counts(state.reshape(1, -1), n_agents)

    def _probe_fused(self, arrays: BlockArrays, eps: float, masks: np.ndarray) -> ProbeCounts:
        """``probe`` in one fused kernel per tile (``fused/probe.py``); the counts and the first
        non-finite position in one accumulator per worker, read back once."""
        from ramstream.backends.torch.fused.probe import probe_tile_launch

        sources = arrays.sources
        n_agents = len(sources.files) - 1
        codes = (int(sources.codes[0]), int(sources.codes[1]))
        with self._scoped():
            eps32 = float(np.float32(eps))
            state = self._state(1 + n_agents * n_agents + n_agents + 1)  # first, overlap, coverage

            def tile(w: int, lo: int, m: int, raw: list[torch.Tensor], outputs: OutputRing) -> None:
                packed = torch.empty((n_agents, -(-m // 8)), dtype=torch.uint8, device=self._device)
                row = state[w]
                overlap, coverage = row[1 : 1 + n_agents * n_agents], row[1 + n_agents * n_agents :]
                probe_tile_launch(raw, m, lo, eps32, packed, overlap, coverage, row, codes)
                outputs.put(packed, self._sink(masks, lo // 8, lo // 8 + packed.shape[1]))

            self._run(self._source_parts(sources), sources.size, tile, later=True)
            return self._probe_counts(state, n_agents)

    def _probe_counts(self, state: torch.Tensor, n_agents: int) -> ProbeCounts:
        """The counts from the per-worker ``state`` rows (the first non-finite position, overlap,
        coverage); inside ``deferred`` on the streamed path, counts whose ``first_nonfinite`` is
        the landing's token for the real ones (``backends.landing``)."""

        def counted(total: np.ndarray) -> ProbeCounts:
            first = int(total[:, 0].min())
            counts = total[:, 1:].sum(0)
            overlap = counts[: n_agents * n_agents].reshape(n_agents, n_agents)
            return ProbeCounts(overlap, counts[n_agents * n_agents :], first if first < probe.NOWHERE else -1)

        found = self._settle(state, counted, later=True)
        if isinstance(found, ProbeCounts):
            return found
        return ProbeCounts(np.zeros((n_agents, n_agents), np.int64), np.zeros(n_agents + 1, np.int64), found)

    # -- arcee_fusion's importance ---------------------------------------------------------------
    def importance_high_histogram(self, arrays: BlockArrays, rows: RowScale) -> np.ndarray:
        codes = self._codes(arrays)
        if self._fused(codes):
            return self._abs_high_fused(arrays, codes, rows)[0]
        fixed = self._fixed(self.workers * (HIGH_BINS + magnitude.SPREAD) * 8, "the importance histogram")
        with self._scoped():
            importance, counts = (
                fusion.Importance(rows, self._f32(rows.scale), self._codes(arrays), self._device),
                self._zeros(self.workers, HIGH_BINS + magnitude.SPREAD),
            )

            def tile(w: int, lo: int, m: int, raw: list[torch.Tensor], outputs: OutputRing) -> None:
                magnitude.add_high_counts(counts[w], fusion.bits(importance(raw, lo, m)[2]))

            self._run(self._array_parts(arrays), arrays.size, tile, inputs=8, fixed=fixed)
            return self._host(counts.sum(0)[:HIGH_BINS]).astype(np.int32)

    def importance_low_histogram(self, arrays: BlockArrays, rows: RowScale, targets: np.ndarray) -> np.ndarray:
        n_cuts = len(targets)
        if np.max(targets, initial=-1) < 0:
            return np.zeros((n_cuts, LOW_BINS), np.int32)
        codes = self._codes(arrays)
        if self._fused(codes):
            return self._abs_low_fused(arrays, codes, np.asarray(targets, np.int32)[None], rows)[0]
        size = n_cuts * LOW_BINS + magnitude.SPREAD
        fixed = self._fixed(self.workers * size * 8, "the fine importance histograms")
        with self._scoped():
            importance, counts = (
                fusion.Importance(rows, self._f32(rows.scale), self._codes(arrays), self._device),
                self._zeros(self.workers, size),
            )
            agent = torch.zeros(1, dtype=torch.int64, device=self._device)
            aims = self._constant(np.asarray(targets, np.int32)[None])

            def tile(w: int, lo: int, m: int, raw: list[torch.Tensor], outputs: OutputRing) -> None:
                magnitude.add_low_counts(counts[w], fusion.bits(importance(raw, lo, m)[2]), agent, aims)

            self._run(self._array_parts(arrays), arrays.size, tile, inputs=4 * n_cuts + 8, fixed=fixed)
            return self._host(counts.sum(0)[: n_cuts * LOW_BINS].view(n_cuts, LOW_BINS)).astype(np.int32)

    # -- magnitudes -------------------------------------------------------------------------------
    def abs_high_histogram(self, arrays: BlockArrays) -> np.ndarray:
        n_agents = len(arrays.agents)
        codes = self._codes(arrays)
        if self._fused(codes):
            return self._abs_high_fused(arrays, codes, later=True)
        size = n_agents * HIGH_BINS + magnitude.SPREAD
        fixed = self._fixed(self.workers * size * 8, f"the magnitude histograms of {n_agents} agents")
        with self._scoped():
            counts = self._zeros(self.workers, size)

            def tile(w: int, lo: int, m: int, raw: list[torch.Tensor], outputs: OutputRing) -> None:
                magnitude.add_high_counts(counts[w], torch.stack(self._abs_bits(raw, codes, range(n_agents))))

            self._run(self._array_parts(arrays), arrays.size, tile, inputs=2 * n_agents + 6, fixed=fixed, later=True)
            total = counts.sum(0)[: n_agents * HIGH_BINS].view(n_agents, HIGH_BINS)
            return self._statistic(total, np.asarray, (n_agents, HIGH_BINS), np.int32)

    def abs_low_histogram(self, arrays: BlockArrays, targets: np.ndarray) -> np.ndarray:
        targets = np.ascontiguousarray(targets, np.int32)
        n_agents, n_cuts = targets.shape
        wanted = [t for t in range(n_agents) if targets[t].max(initial=-1) >= 0]
        if not wanted:
            return np.zeros((n_agents, n_cuts, LOW_BINS), np.int32)
        codes = self._codes(arrays)
        if self._fused(codes):
            return self._abs_low_fused(arrays, codes, targets, later=True)
        size = n_agents * n_cuts * LOW_BINS + magnitude.SPREAD
        fixed = self._fixed(self.workers * size * 8, f"the fine magnitude histograms of {n_agents} agents")
        with self._scoped():
            counts = self._zeros(self.workers, size)
            agents = self._constant(np.array(wanted, np.int64))
            aims = self._constant(targets[wanted])

            def tile(w: int, lo: int, m: int, raw: list[torch.Tensor], outputs: OutputRing) -> None:
                bits = torch.stack(self._abs_bits(raw, codes, wanted))
                magnitude.add_low_counts(counts[w], bits, agents, aims)

            inputs = 2 * n_agents + 4 * len(wanted) * n_cuts + 4  # the (K, C, m) index and masks
            self._run(self._array_parts(arrays), arrays.size, tile, inputs=inputs, fixed=fixed, later=True)
            total = counts.sum(0)[: n_agents * n_cuts * LOW_BINS].view(n_agents, n_cuts, LOW_BINS)
            return self._statistic(total, np.asarray, (n_agents, n_cuts, LOW_BINS), np.int32)

    def _abs_high_fused(
        self, arrays: BlockArrays, codes: list[int], rows: RowScale | None = None, later: bool = False
    ) -> np.ndarray:
        """``abs_high_histogram`` (with ``rows``: ``importance_high_histogram``, one agent) in one
        fused kernel per tile (``fused/magnitude.py``): the counts in one int32 accumulator per
        worker (the Numba kernels' type), read back once (``later``: by a deferred scope's landing)."""
        from ramstream.backends.torch.fused.magnitude import high_launch

        n_agents = len(arrays.agents)
        fixed = self._fixed(self.workers * n_agents * HIGH_BINS * 4, f"the magnitude histograms of {n_agents} agents")
        with self._scoped():
            counts = torch.zeros((self.workers, n_agents, HIGH_BINS), dtype=torch.int32, device=self._device)
            rows_at = self._rows_at(rows)

            def tile(w: int, lo: int, m: int, raw: list[torch.Tensor], outputs: OutputRing) -> None:
                high_launch(raw, m, counts[w], (codes[0], codes[1]), rows_at(lo))

            self._run(self._array_parts(arrays), arrays.size, tile, fixed=fixed, later=later)
            return self._statistic(counts.sum(0), np.asarray, (n_agents, HIGH_BINS), np.int32, later)

    def _abs_low_fused(
        self,
        arrays: BlockArrays,
        codes: list[int],
        targets: np.ndarray,
        rows: RowScale | None = None,
        later: bool = False,
    ) -> np.ndarray:
        """``abs_low_histogram`` (with ``rows``: ``importance_low_histogram``) in one fused kernel
        per tile, as ``_abs_high_fused``."""
        from ramstream.backends.torch.fused.magnitude import low_launch

        n_agents, n_cuts = targets.shape
        size = n_agents * n_cuts * LOW_BINS
        fixed = self._fixed(self.workers * size * 4, f"the fine magnitude histograms of {n_agents} agents")
        with self._scoped():
            counts = torch.zeros((self.workers, n_agents, n_cuts, LOW_BINS), dtype=torch.int32, device=self._device)
            aims = self._constant(targets)
            rows_at = self._rows_at(rows)

            def tile(w: int, lo: int, m: int, raw: list[torch.Tensor], outputs: OutputRing) -> None:
                low_launch(raw, m, aims, counts[w], (codes[0], codes[1]), rows_at(lo))

            self._run(self._array_parts(arrays), arrays.size, tile, fixed=fixed, later=later)
            return self._statistic(counts.sum(0), np.asarray, (n_agents, n_cuts, LOW_BINS), np.int32, later)

    def _rows_at(self, rows: RowScale | None) -> Callable[[int], tuple[int, torch.Tensor, int, int] | None]:
        """The histogram kernels' rows for a tile at block position ``lo`` (``magnitude.Rows``:
        arcee_fusion's importance; None: |tau|), the factors uploaded once, inside the caller's
        scope."""
        if rows is None:
            return lambda lo: None
        scale = self._f32(rows.scale)
        return lambda lo: (lo, scale, rows.row_len, rows.offset)

    def cut_keep(self, arrays: BlockArrays, cuts: Cuts) -> np.ndarray:
        n_agents = len(arrays.agents)
        keep = np.empty((n_agents, arrays.size), np.uint8)
        codes = self._codes(arrays)
        values, ranges = cuts.value.tolist(), cuts.range.tolist()
        fused = self._fused(codes)  # one launch per tile (``fused/magnitude.py``)
        with self._scoped():
            cut_value = self._constant(np.asarray(cuts.value, np.int64))
            cut_range = self._constant(np.asarray(cuts.range, np.int64))

            def tile(w: int, lo: int, m: int, raw: list[torch.Tensor], outputs: OutputRing) -> None:
                if fused:
                    from ramstream.backends.torch.fused.magnitude import cut_keep_launch

                    kept = torch.empty((n_agents, m), dtype=torch.uint8, device=self._device)
                    cut_keep_launch(raw, m, lo, cut_value, cut_range, kept, (codes[0], codes[1]))
                    outputs.put(kept, self._sink(keep, lo, lo + m))
                    return
                position = self._positions(lo, m)
                bits = self._abs_bits(raw, codes, range(n_agents))
                rows = [magnitude.kept_by_cuts(bits[t], position, values[t], ranges[t]) for t in range(n_agents)]
                outputs.put(torch.stack(rows).to(torch.uint8), self._sink(keep, lo, lo + m))

            self._run(self._array_parts(arrays), arrays.size, tile)
        return keep

    def find_ties(self, arrays: BlockArrays, agents: np.ndarray, values: np.ndarray, needs: np.ndarray) -> np.ndarray:
        """The base and each agent asked about read once; each tile's ties come back as a bit mask
        per query (through the output ring, with no host wait); the ``need``-th is then found on
        the host, so the answer never depends on the workers. Inside ``deferred`` on the streamed
        path that happens when the landing waits: the block's search costs no drain."""
        looked = sorted({int(a) for a in agents})
        rows = np.array([looked.index(int(a)) for a in agents], np.int32)
        parts = [array_part(arrays.base), *(array_part(arrays.agents[a]) for a in looked)]
        codes = [int(arrays.base_code), *(int(arrays.agent_codes[a]) for a in looked)]
        n, queries = arrays.size, len(rows)
        ties = np.zeros((queries, -(-n // 8)), np.uint8)  # bit i % 8 of byte i // 8: position i
        fused = self._fused(codes)  # one launch per tile (``fused/magnitude.py``)
        with self._scoped():
            on_device = (self._constant(rows), self._constant(np.asarray(values, np.int64)))

            def tile(w: int, lo: int, m: int, raw: list[torch.Tensor], outputs: OutputRing) -> None:
                packed = torch.empty((queries, -(-m // 8)), dtype=torch.uint8, device=self._device)
                if fused:
                    from ramstream.backends.torch.fused.magnitude import tie_launch

                    tie_launch(raw, m, *on_device, packed, (codes[0], codes[1]))
                else:
                    bits = [b.to(torch.int64) for b in self._abs_bits(raw, codes, range(len(looked)))]
                    packed = probe.pack(torch.stack([bits[r] == int(v) for r, v in zip(rows, values, strict=True)]))
                # tiles start at multiples of 64: whole bytes of the masks
                outputs.put(packed, self._sink(ties, lo // 8, lo // 8 + packed.shape[1]))

            self._run(parts, n, tile, later=True)
        return self._after_landing(lambda: _tie_positions(ties, n, needs), np.full(queries, -1, np.int64))

    # -- exact sums -------------------------------------------------------------------------------
    def abs_sums(self, arrays: BlockArrays, keep: Keep, squares: bool = False) -> ExactSums:
        n_agents = len(arrays.agents)
        parts = self._array_parts(arrays)
        if isinstance(keep, KeepArray):
            parts += [array_part(np.ascontiguousarray(keep.keep[t])) for t in range(n_agents)]
        codes = self._codes(arrays)
        as_array = isinstance(keep, KeepArray) and keep.keep.dtype in (np.uint8, np.bool_, np.float32)
        if (isinstance(keep, KeepRandom | KeepAll) or as_array) and self._fused(codes):
            return self._abs_sums_fused(arrays, keep, codes, parts, squares)
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

            self._run(parts, arrays.size, tile, inputs=2 * n_agents + 2, later=True)
            return self._exact_sums(acc, first, (n_agents, 2, BINS + 1))

    def _abs_sums_fused(
        self, arrays: BlockArrays, keep: Keep, codes: list[int], parts: list[Part], squares: bool
    ) -> ExactSums:
        """``abs_sums`` of every element, DARE's draws or a keep array (bytes, or DELLA's float32
        keep values), in one fused kernel per tile (``fused/sums.py``): the accumulators and the first non-finite
        position per worker, read back once."""
        from ramstream.backends.torch.fused import sums

        n_agents = len(arrays.agents)
        mode, start, streams, density = sums.KEEP_ALL, 0, np.zeros(n_agents, np.uint64), np.zeros(n_agents, np.float32)
        if isinstance(keep, KeepRandom):
            mode, start, streams, density = sums.KEEP_RANDOM, keep.start, keep.keys, keep.density
        elif isinstance(keep, KeepArray):
            mode = sums.KEEP_FLOATS if keep.keep.dtype == np.float32 else sums.KEEP_ARRAY
        with self._scoped():
            acc = self._zeros(self.workers, 2 * n_agents, BINS + 1)
            first = self._first()
            keys, densities = self._keys(streams), self._f32(density)

            def tile(w: int, lo: int, m: int, raw: list[torch.Tensor], outputs: OutputRing) -> None:
                sums.sums_launch(
                    raw, m, lo, keys, densities, start + lo, acc[w], first[w : w + 1], (codes[0], codes[1]),
                    int(mode), squares,
                )  # fmt: skip

            self._run(parts, arrays.size, tile, later=True)
            return self._exact_sums(acc, first, (n_agents, 2, BINS + 1))

    def gram(self, arrays: BlockArrays, weights: bool = False) -> ExactSums:
        n_agents = len(arrays.agents)
        n_vectors = n_agents + (1 if weights else 0)
        pairs = [(a, b) for a in range(n_vectors) for b in range(a, n_vectors)]
        codes = self._codes(arrays)
        if self._fused(codes):
            return self._gram_fused(arrays, pairs, weights, codes)
        with self._scoped():
            zero = torch.zeros((), dtype=torch.float32, device=self._device)
            acc = self._zeros(self.workers, len(pairs), BINS + 1)
            first = self._first()
            left = self._constant(np.array([a for a, _ in pairs], np.int64))
            right = self._constant(np.array([b for _, b in pairs], np.int64))

            def tile(w: int, lo: int, m: int, raw: list[torch.Tensor], outputs: OutputRing) -> None:
                rows = _gram_rows(raw, codes, n_agents, weights, first, w, lo, zero)
                stacked = torch.stack(rows)
                exact_sums.accumulate(acc[w], exact_sums.product_group_sums(stacked[left], stacked[right]))

            self._run(self._array_parts(arrays), arrays.size, tile, inputs=2 * len(pairs) + n_vectors + 1, later=True)
            return self._exact_sums(acc, first, (len(pairs), BINS + 1))

    def _gram_fused(
        self, arrays: BlockArrays, pairs: list[tuple[int, int]], weights: bool, codes: list[int]
    ) -> ExactSums:
        """``gram`` in one fused kernel per tile (``fused/sums.py``; ``pairs`` in its order): the
        accumulators and the first non-finite position per worker, read back once."""
        from ramstream.backends.torch.fused.sums import gram_launch

        with self._scoped():
            acc = self._zeros(self.workers, len(pairs), BINS + 1)
            first = self._first()

            def tile(w: int, lo: int, m: int, raw: list[torch.Tensor], outputs: OutputRing) -> None:
                gram_launch(raw, m, lo, acc[w], first[w : w + 1], (codes[0], codes[1]), weights)

            self._run(self._array_parts(arrays), arrays.size, tile, later=True)
            return self._exact_sums(acc, first, (len(pairs), BINS + 1))

    def _exact_sums(self, acc: torch.Tensor, first: torch.Tensor, shape: tuple[int, ...]) -> ExactSums:
        """The per-worker accumulators ``acc`` summed and renormalised into ``shape``, and the first
        non-finite position: now, or both by a deferred scope's landing (``_statistic``, a token)."""
        return ExactSums(self._statistic(acc.sum(0), renormalised, shape, np.int64), self._found(first, later=True))

    # -- per-vector and pairwise sums --------------------------------------------------------------
    def vector_gram(self, arrays: BlockArrays, layout: VectorLayout, weights: bool = False) -> ExactSums:
        n_agents = len(arrays.agents)
        n_vectors = n_agents + (1 if weights else 0)
        pairs = [(a, b) for a in range(n_vectors) for b in range(a, n_vectors)]
        codes = self._codes(arrays)
        size = layout.count * len(pairs) * DIGITS
        if self._fused(codes):
            return self._vector_gram_fused(arrays, layout, weights, len(pairs), codes)
        with self._scoped():
            zero = torch.zeros((), dtype=torch.float32, device=self._device)
            acc = self._zeros(self.workers, self._fixed(size * 8, "the per-vector sums") // 8)
            first = self._first()

            def tile(w: int, lo: int, m: int, raw: list[torch.Tensor], outputs: OutputRing) -> None:
                rows = _gram_rows(raw, codes, n_agents, weights, first, w, lo, zero)
                which = vectors.block_vectors(
                    self._positions(layout.start + lo, m), layout.div, layout.mod, layout.start
                )
                for k, (a, b) in enumerate(pairs):
                    vectors.add_products(acc[w], rows[a], rows[b], which * len(pairs) + k)

            self._run(self._array_parts(arrays), arrays.size, tile, inputs=2 * len(pairs) + n_vectors + 4)
            total = normalise(self._host(acc.sum(0)).reshape(layout.count, len(pairs), DIGITS))
            return ExactSums(total, self._found(first))

    def _vector_gram_fused(
        self, arrays: BlockArrays, layout: VectorLayout, weights: bool, n_pairs: int, codes: list[int]
    ) -> ExactSums:
        """``vector_gram`` in one fused kernel per tile (``fused/vector_gram.py``): the
        accumulators and the first non-finite position per worker, read back once."""
        from ramstream.backends.torch.fused.vector_gram import vector_gram_launch

        size = layout.count * n_pairs * DIGITS
        first_vector = layout.start // layout.div % layout.mod
        with self._scoped():
            acc = self._zeros(self.workers, self._fixed(size * 8, "the per-vector sums") // 8)
            first = self._first()

            def tile(w: int, lo: int, m: int, raw: list[torch.Tensor], outputs: OutputRing) -> None:
                vector_gram_launch(
                    raw, m, lo, layout.start + lo, layout.div, layout.mod, first_vector, acc[w], first[w : w + 1],
                    (codes[0], codes[1]), weights,
                )  # fmt: skip

            self._run(self._array_parts(arrays), arrays.size, tile, fixed=size * 8)
            total = normalise(self._host(acc.sum(0)).reshape(layout.count, n_pairs, DIGITS))
            return ExactSums(total, self._found(first))

    def agreement(self, arrays: BlockArrays, eps: float) -> AgreementSums:
        n_agents = len(arrays.agents)
        pairs = agent_pairs(n_agents)
        codes = self._codes(arrays)
        if self._fused(codes):
            return self._agreement_fused(arrays, eps, len(pairs), codes)
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
            total = normalise(self._host(acc.sum(0)).reshape(sum_rows(n_agents), DIGITS))
            return AgreementSums(self._host(counts.sum(0)), total)

    def _agreement_fused(self, arrays: BlockArrays, eps: float, n_pairs: int, codes: list[int]) -> AgreementSums:
        """``agreement`` in one fused kernel per tile (``fused/agreement.py``): the accumulators
        and counts summed in each program, read back once."""
        from ramstream.backends.torch.fused.agreement import agreement_launch

        n_agents = len(arrays.agents)
        eps32 = float(np.float32(eps))
        with self._scoped():
            acc = self._zeros(self.workers, sum_rows(n_agents) * DIGITS)
            counts = self._zeros(self.workers, n_pairs, 2)

            def tile(w: int, lo: int, m: int, raw: list[torch.Tensor], outputs: OutputRing) -> None:
                agreement_launch(raw, m, eps32, acc[w], counts[w], (codes[0], codes[1]))

            self._run(self._array_parts(arrays), arrays.size, tile)
            total = normalise(self._host(acc.sum(0)).reshape(sum_rows(n_agents), DIGITS))
            return AgreementSums(self._host(counts.sum(0)), total)

    # -- DELLA ------------------------------------------------------------------------------------
    def magprune_keep(self, arrays: BlockArrays, params: MagpruneParams) -> np.ndarray:
        n_agents = len(arrays.agents)
        keep = np.empty((n_agents, arrays.size), np.float32)
        codes = self._codes(arrays)
        if self._fused(codes):
            return self._magprune_keep_fused(arrays, params, keep)
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

    def _magprune_keep_fused(self, arrays: BlockArrays, params: MagpruneParams, keep: np.ndarray) -> np.ndarray:
        """``magprune_keep`` in three launches per tile (``fused/della.py``)."""
        from ramstream.backends.torch.fused.della import magprune_keep

        codes = self._codes(arrays)
        n_agents = len(arrays.agents)
        with self._scoped():
            constants = self._magprune_constants(params)

            def tile(w: int, lo: int, m: int, raw: list[torch.Tensor], outputs: OutputRing) -> None:
                start = params.start + lo
                values = magprune_keep(raw, m, start, params.rows, params.slice_size, constants, params.inverse,
                                       (codes[0], codes[1]))  # fmt: skip
                outputs.put(values, self._sink(keep, lo, lo + m))

            inputs = 3 * n_agents + 5  # the inputs, and per agent its keys, their sort and its keep values
            self._run(self._array_parts(arrays), arrays.size, tile, align=params.slice_size, inputs=inputs)
        return keep


def _gram_rows(
    raw: list[torch.Tensor],
    codes: list[int],
    n_agents: int,
    weights: bool,
    first: torch.Tensor,
    w: int,
    lo: int,
    zero: torch.Tensor,
) -> list[torch.Tensor]:
    """The vectors a Gram matrix pairs up, non-finite values zeroed (the first one noted in
    ``first[w]``): the task vectors, or (``weights``) the base and the agents' weights."""
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
    return rows


def _tie_positions(ties: np.ndarray, n: int, needs: np.ndarray) -> np.ndarray:
    """Per query, the position of the ``need``-th set bit of its packed mask (-1 if fewer)."""
    return np.array(
        [nth_set(np.unpackbits(row, bitorder="little")[:n], int(need)) for row, need in zip(ties, needs, strict=True)],
        np.int64,
    )
