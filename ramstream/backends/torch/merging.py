"""The torch backend's merge operations: each block's merged values, tile by tile, with the
Numba kernels' bytes (the arithmetic in ``merges.py``, ``sce.py``, ``fusion.py``, ``vectors.py``)."""

from __future__ import annotations

from collections.abc import Callable, Sequence

import numpy as np
import torch

from ramstream.backends import nonfinite
from ramstream.backends.base import (
    GtaParams,
    Keep,
    KeepAll,
    KeepArray,
    KeepCuts,
    KeepMagprune,
    KeepRandom,
    LinearParams,
    RowScale,
    SceParams,
)
from ramstream.backends.torch import (
    codecs,
    della,
    fused,
    fusion,
    magnitude,
    merges,
    probe,
    sce,
    vectors,
)
from ramstream.backends.torch.rng import uniform
from ramstream.backends.torch.staging import OutputRing, array_part
from ramstream.backends.torch.tiles import GROUP, TileBackend, _torch_dtype
from ramstream.backends.vector_sums import VectorLayout
from ramstream.blocks import BlockArrays, BlockSources
from ramstream.format.dtypes import TAU32, FloatCode

# launch(raw, m, lo, merged, state): a fused kernel with one output over one tile
OneOutput = Callable[[list[torch.Tensor], int, int, torch.Tensor, torch.Tensor], None]


class MergeOps(TileBackend):
    """Merges: RAM, the GTA family (selections evaluated in the tile), linear, nearswap, SCE,
    arcee_fusion and per-vector combinations."""

    def merge_ram(
        self, arrays: BlockArrays, eps: float, lambdas: np.ndarray, outs: Sequence[np.ndarray], out_code: int
    ) -> int:
        sources = arrays.sources
        codes = [int(c) for c in sources.codes]
        raw_outs = [out.view(np.uint8) for out in outs]
        size = int(outs[0].dtype.itemsize) if outs else 1
        if outs and self._fused(codes):
            return self._merge_ram_fused(sources, codes, eps, lambdas, outs, out_code)
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

            self._run(self._source_parts(sources), sources.size, tile, later=True)
            return self._found(first, later=True)

    def _merge_ram_fused(
        self,
        sources: BlockSources,
        codes: list[int],
        eps: float,
        lambdas: np.ndarray,
        outs: Sequence[np.ndarray],
        out_code: int,
    ) -> int:
        """``merge_ram`` in one fused kernel per tile (``fused/ram.py``): the outputs' NaN/Inf
        flags come back with the first non-finite input position, in one read-back, and answer
        ``has_nonfinite`` for these outputs until the next operation."""
        from ramstream.backends.torch.fused import ram

        k_outputs = len(outs)
        raw_outs = [out.view(np.uint8) for out in outs]
        size = int(outs[0].dtype.itemsize)
        carrier = fused.CARRIERS[out_code]
        with self._scoped():
            lams = self._f32(np.reshape(lambdas, (k_outputs, -1)))
            eps32 = float(np.float32(eps))
            state = self._state(1 + k_outputs)

            def tile(w: int, lo: int, m: int, raw: list[torch.Tensor], outputs: OutputRing) -> None:
                out = torch.empty((k_outputs, m), dtype=carrier, device=self._device)
                ram.merge_tile(raw, m, lo, eps32, lams, out, state[w], (codes[0], codes[1], out_code))
                for k, raw_out in enumerate(raw_outs):
                    outputs.put(out[k], self._sink(raw_out, lo * size, (lo + m) * size))

            self._run(self._source_parts(sources), sources.size, tile, inputs=k_outputs + 4, later=True)
            flagged = [fused.key(out, out_code) for out in outs]
            return self._settle(state, lambda found: self._flagged(found, flagged), later=True)

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
        if outs and isinstance(keep, KeepAll | KeepCuts | KeepRandom | KeepMagprune) and self._fused(codes):
            return self._merge_gta_fused(arrays, params, keep, total_weight, outs, out_code)
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

            self._run(parts, arrays.size, tile, align=align, inputs=2 * n_agents + 4, later=True)
            return self._found(first, later=True)

    def _merge_gta_fused(
        self,
        arrays: BlockArrays,
        params: GtaParams,
        keep: KeepAll | KeepCuts | KeepRandom | KeepMagprune,
        total_weight: np.float32,
        outs: Sequence[np.ndarray],
        out_code: int,
    ) -> int:
        """``merge_gta`` without a keep array in one fused kernel per tile (``fused/gta.py``), DELLA's
        MAGPRUNE in three more (``fused/della.py``: its keep values stay on the device); the
        outputs' NaN/Inf flags as in ``_merge_ram_fused``."""
        from ramstream.backends.torch.fused import della as fused_della
        from ramstream.backends.torch.fused import gta

        n_agents, k_outputs = len(arrays.agents), len(outs)
        codes = self._codes(arrays)
        raw_outs = [out.view(np.uint8) for out in outs]
        size = int(outs[0].dtype.itemsize)
        carrier = fused.CARRIERS[out_code]
        if isinstance(keep, KeepCuts):
            cut_value = keep.cuts.value.astype(np.int64)
            cut_range = np.ascontiguousarray(keep.cuts.range, np.int64)
        else:
            cut_value, cut_range = np.zeros((n_agents, 2), np.int64), np.zeros((n_agents, 2, 2), np.int64)
        keys, density, start = np.zeros(n_agents, np.uint64), np.zeros(n_agents, np.float32), 0
        if isinstance(keep, KeepRandom):
            keys, density, start = keep.keys, np.asarray(keep.density, np.float32), int(keep.start)
        mode = {KeepAll: gta.KEEP_ALL, KeepCuts: gta.KEEP_CUTS, KeepRandom: gta.KEEP_RANDOM,
                KeepMagprune: gta.KEEP_MULTIPLIERS}[type(keep)]  # fmt: skip
        prune = keep.params if isinstance(keep, KeepMagprune) else None
        consensus = 0 if params.consensus == "none" else 1
        with self._scoped():
            constants = (
                self._f32(params.weights),
                self._f32(params.scale),
                self._constant(cut_value),
                self._constant(cut_range),
                self._keys(keys),
                self._f32(density),
                self._f32(np.reshape(total_weight, (1,))),
                self._f32(np.asarray(params.lams)),
            )
            state = self._state(1 + k_outputs)
            pruning = self._magprune_constants(prune) if prune is not None else ()

            def tile(w: int, lo: int, m: int, raw: list[torch.Tensor], outputs: OutputRing) -> None:
                out = torch.empty((k_outputs, m), dtype=carrier, device=self._device)
                multipliers = None
                if prune is not None:
                    multipliers = fused_della.magprune_keep(
                        raw, m, prune.start + lo, prune.rows, prune.slice_size, pruning, prune.inverse,
                        (codes[0], codes[1]),
                    )  # fmt: skip
                gta.gta_tile_launch(
                    raw, m, lo, start + lo, constants, out, state[w], (codes[0], codes[1], out_code), int(mode),
                    consensus, bool(params.normalize), multipliers,
                )  # fmt: skip
                for k, raw_out in enumerate(raw_outs):
                    outputs.put(out[k], self._sink(raw_out, lo * size, (lo + m) * size))

            align = prune.slice_size if prune is not None else GROUP
            # MAGPRUNE's keys, their sort (values, indices, scratch) and keep values: under 96 bytes per agent
            inputs = k_outputs + 4 + (2 * n_agents if prune is not None else 0)
            self._run(self._array_parts(arrays), arrays.size, tile, align=align, inputs=inputs, later=True)
            flagged = [fused.key(out, out_code) for out in outs]
            return self._settle(state, lambda found: self._flagged(found, flagged), later=True)

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
        flag = self._flags.pop(fused.key(out, out_code), None)  # found by a fused kernel
        if flag is not None:
            return flag
        return nonfinite.has_nonfinite(out, out_code)  # the block is in host memory already

    def merge_linear(self, arrays: BlockArrays, params: LinearParams, out: np.ndarray, out_code: int) -> int:
        uses_base = np.float32(params.base_weight) != np.float32(0.0)
        parts = self._array_parts(arrays)  # the base too: it is checked for NaN/Inf, as every input
        codes = self._codes(arrays)
        raw_out, size = out.view(np.uint8), out.dtype.itemsize
        divisor = np.float32(0.0) + np.float32(params.base_weight)
        for weight in np.asarray(params.weights, np.float32):
            divisor = np.float32(divisor + weight)
        if self._fused(codes):
            return self._merge_linear_fused(arrays, params, divisor, out, out_code)
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

            self._run(parts, arrays.size, tile, later=True)
            return self._found(first, later=True)

    def _merge_linear_fused(
        self, arrays: BlockArrays, params: LinearParams, divisor: np.float32, out: np.ndarray, out_code: int
    ) -> int:
        """``merge_linear`` in one fused kernel per tile (``fused/linear.py``); the output's NaN/Inf
        flag comes back with the first non-finite input position and answers ``has_nonfinite``."""
        from ramstream.backends.torch.fused.linear import linear_launch

        codes = self._codes(arrays)
        base_weight = float(np.float32(params.base_weight))
        div = float(divisor) if params.normalize else None
        with self._scoped():
            weights = self._f32(params.weights)
            return self._one_output_fused(
                arrays, out, out_code,
                lambda raw, m, lo, merged, state: linear_launch(
                    raw, m, lo, weights, base_weight, div, merged, state, (codes[0], codes[1], out_code)
                ),
            )  # fmt: skip

    def _one_output_fused(self, arrays: BlockArrays, out: np.ndarray, out_code: int, launch: OneOutput) -> int:
        """Queue ``launch(raw, m, lo, merged, state)``, a fused kernel with one output, for every
        tile of the block (inside the caller's scope): the tiles land in ``out``, the kernel's
        NaN/Inf flag answers ``has_nonfinite``; the first non-finite input position (-1: none)."""
        raw_out, size = out.view(np.uint8), out.dtype.itemsize
        carrier = fused.CARRIERS[out_code]
        state = self._state(2)

        def tile(w: int, lo: int, m: int, raw: list[torch.Tensor], outputs: OutputRing) -> None:
            merged = torch.empty(m, dtype=carrier, device=self._device)
            launch(raw, m, lo, merged, state[w])
            outputs.put(merged, self._sink(raw_out, lo * size, (lo + m) * size))

        self._run(self._array_parts(arrays), arrays.size, tile, later=True)
        flagged = [fused.key(out, out_code)]
        return self._settle(state, lambda found: self._flagged(found, flagged), later=True)

    def merge_nearswap(self, arrays: BlockArrays, t: np.float32, out: np.ndarray, out_code: int) -> int:
        codes = self._codes(arrays)
        if self._fused(codes):
            return self._merge_nearswap_fused(arrays, t, out, out_code)
        parts = self._array_parts(arrays)
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

            self._run(parts, arrays.size, tile, later=True)
            return self._found(first, later=True)

    def _merge_nearswap_fused(self, arrays: BlockArrays, t: np.float32, out: np.ndarray, out_code: int) -> int:
        """``merge_nearswap`` in one fused kernel per tile (``fused/nearswap.py``)."""
        from ramstream.backends.torch.fused.nearswap import nearswap_launch

        codes = self._codes(arrays)
        with self._scoped():
            return self._one_output_fused(
                arrays, out, out_code,
                lambda raw, m, lo, merged, state: nearswap_launch(
                    raw, m, lo, float(t), merged, state, (codes[0], codes[1], out_code)
                ),
            )  # fmt: skip

    # -- SCE --------------------------------------------------------------------------------------
    def merge_sce(self, arrays: BlockArrays, params: SceParams, out: np.ndarray, out_code: int) -> int:
        codes = self._codes(arrays)
        if self._fused(codes):
            return self._merge_sce_fused(arrays, params, out, out_code)
        parts = self._array_parts(arrays)
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

            self._run(parts, arrays.size, tile, inputs=2 * len(parts) + 4, later=True)
            return self._found(first, later=True)

    def _merge_sce_fused(self, arrays: BlockArrays, params: SceParams, out: np.ndarray, out_code: int) -> int:
        """``merge_sce`` in one fused kernel per tile (``fused/sce.py``): the variance, its cut and
        the merge; the output's NaN/Inf flag as in ``_merge_linear_fused``."""
        from ramstream.backends.torch.fused.sce import sce_launch

        codes = self._codes(arrays)
        with self._scoped():
            weights = self._f32(params.weights)
            cut_value = self._constant(params.cuts.value[0].astype(np.int64))
            cut_range = self._constant(np.ascontiguousarray(params.cuts.range[0], np.int64))
            return self._one_output_fused(
                arrays, out, out_code,
                lambda raw, m, lo, merged, state: sce_launch(
                    raw, m, lo, weights, cut_value, cut_range, merged, state, (codes[0], codes[1], out_code)
                ),
            )  # fmt: skip

    def variance(self, arrays: BlockArrays) -> np.ndarray:
        out = np.empty(arrays.size, np.float32)
        codes = self._codes(arrays)
        if self._fused(codes):
            return self._variance_fused(arrays, out)
        parts = self._array_parts(arrays)
        with self._scoped():

            def tile(w: int, lo: int, m: int, raw: list[torch.Tensor], outputs: OutputRing) -> None:
                decoded = [codecs.decode(r, c) for r, c in zip(raw, codes, strict=True)]
                outputs.put(sce.variance(self._taus(decoded, codes)), self._sink(out, lo, lo + m))

            self._run(parts, arrays.size, tile, inputs=len(parts) + 4)
        return out

    def _variance_fused(self, arrays: BlockArrays, out: np.ndarray) -> np.ndarray:
        """``variance`` in one fused kernel per tile (``fused/sce.py`` without the merge)."""
        from ramstream.backends.torch.fused.sce import sce_launch

        codes = self._codes(arrays)
        with self._scoped():
            weights = self._f32(np.zeros(len(arrays.agents), np.float32))
            cuts = self._constant(np.zeros(6, np.int64))
            state = self._state(2)

            def tile(w: int, lo: int, m: int, raw: list[torch.Tensor], outputs: OutputRing) -> None:
                var = torch.empty(m, dtype=torch.float32, device=self._device)
                sce_launch(
                    raw, m, lo, weights, cuts, cuts, var, state[w], (codes[0], codes[1], FloatCode.F32), merge=False
                )
                outputs.put(var, self._sink(out, lo, lo + m))

            self._run(self._array_parts(arrays), arrays.size, tile)
        return out

    # -- arcee_fusion -----------------------------------------------------------------------------
    def merge_fusion(
        self, arrays: BlockArrays, rows: RowScale, threshold: np.float32, out: np.ndarray, out_code: int
    ) -> int:
        codes = self._codes(arrays)
        if self._fused(codes):
            return self._merge_fusion_fused(arrays, rows, threshold, out, out_code)
        raw_out, size = out.view(np.uint8), out.dtype.itemsize
        with self._scoped():
            importance, limit, first = (
                fusion.Importance(rows, self._f32(rows.scale), self._codes(arrays), self._device),
                self._f32(threshold),
                self._first(),
            )

            def tile(w: int, lo: int, m: int, raw: list[torch.Tensor], outputs: OutputRing) -> None:
                values = [codecs.decode(r, c) for r, c in zip(raw, importance.codes, strict=True)]
                first[w] = torch.minimum(first[w], probe.first_nonfinite(values) + lo)
                merged = fusion.merge(*importance(raw, lo, m), limit)
                outputs.put(codecs.encode(merged, out_code), self._sink(raw_out, lo * size, (lo + m) * size))

            self._run(self._array_parts(arrays), arrays.size, tile, inputs=6, later=True)
            return self._found(first, later=True)

    def _merge_fusion_fused(
        self, arrays: BlockArrays, rows: RowScale, threshold: np.float32, out: np.ndarray, out_code: int
    ) -> int:
        """``merge_fusion`` in one fused kernel per tile (``fused/fusion.py``)."""
        from ramstream.backends.torch.fused.fusion import fusion_launch

        codes = self._codes(arrays)
        layout = (rows.row_len, rows.offset)
        with self._scoped():
            scale = self._f32(rows.scale)
            return self._one_output_fused(
                arrays, out, out_code,
                lambda raw, m, lo, merged, state: fusion_launch(
                    raw, m, lo, scale, layout, float(threshold), merged, state, (codes[0], codes[1], out_code)
                ),
            )  # fmt: skip

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
        if self._fused(codes):
            return self._merge_vectors_fused(arrays, layout, table, weights, out, out_code)
        with self._scoped():
            self._fixed(table.nbytes, "the per-vector coefficients")
            on_device = self._constant(table)
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

            self._run(parts, arrays.size, tile, inputs=len(parts) + 3, later=True)
            return self._found(first, later=True)

    def _merge_vectors_fused(
        self,
        arrays: BlockArrays,
        layout: VectorLayout,
        table: np.ndarray,
        weights: bool,
        out: np.ndarray,
        out_code: int,
    ) -> int:
        """``merge_vectors`` in one fused kernel per tile (``fused/vectors.py``); the output's
        NaN/Inf flag comes back with the first non-finite input position."""
        from ramstream.backends.torch.fused.vectors import vectors_launch

        codes = self._codes(arrays)
        where = (int(layout.start), int(layout.div), int(layout.mod))
        with self._scoped():
            self._fixed(table.nbytes, "the per-vector coefficients")
            on_device = self._constant(table)
            return self._one_output_fused(
                arrays, out, out_code,
                lambda raw, m, lo, merged, state: vectors_launch(
                    raw, m, lo, where, on_device, weights, merged, state, (codes[0], codes[1], out_code)
                ),
            )  # fmt: skip
