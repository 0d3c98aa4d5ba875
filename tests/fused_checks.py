"""Checks of the fused Triton kernels run under triton's interpreter, on CPU tensors: each is one
command of ``python -m tests.fused_checks NAME``, which ``tests/test_fused_kernels.py`` runs in a
fresh process (the interpreter is chosen when a kernel is defined, so it is switched on here,
before anything imports triton, and never in the test process itself). A failed check raises.
"""

from __future__ import annotations

import json
import os
import sys
import tempfile
import traceback
from collections.abc import Callable
from pathlib import Path

os.environ["TRITON_INTERPRET"] = "1"

import numpy as np
import torch
import triton
import triton.language as tl

from ramstream.backends.numba.codecs import decode_array, encode_array
from ramstream.backends.torch.fused import codecs as fused_codecs
from ramstream.backends.torch.fused import probe as fused_probe
from ramstream.backends.torch.fused import ram as fused_ram
from ramstream.backends.torch.probe import NOWHERE
from ramstream.format.dtypes import TAU32, FloatCode
from tests import interpreter_speedup

interpreter_speedup.install()

CODES = (FloatCode.BF16, FloatCode.F16, FloatCode.F32, FloatCode.F64)
CARRIER = {FloatCode.BF16: np.uint16, FloatCode.F16: np.uint16, FloatCode.F32: np.float32, FloatCode.F64: np.float64}
TORCH_CARRIER = {
    FloatCode.BF16: torch.int16, FloatCode.F16: torch.int16, FloatCode.F32: torch.float32, FloatCode.F64: torch.float64
}  # fmt: skip


@triton.jit
def _codec_kernel(src, values, out, n, CODE: tl.constexpr, OUT: tl.constexpr, BLOCK: tl.constexpr):
    offsets = tl.program_id(0) * BLOCK + tl.arange(0, BLOCK)
    mask = offsets < n
    v = fused_codecs.decode(src, offsets, mask, CODE)
    tl.store(values + offsets, v, mask=mask)
    tl.store(out + offsets, fused_codecs.encode(v, OUT), mask=mask)


def _codec(raw: np.ndarray, code: int, out_code: int) -> tuple[np.ndarray, np.ndarray]:
    """The fused codecs' decode of ``raw`` (format ``code``) and its encode to ``out_code``."""
    n = raw.shape[0]
    values = torch.empty(n, dtype=torch.float32)
    out = torch.empty(n, dtype=TORCH_CARRIER[FloatCode(out_code)])
    _codec_kernel[(triton.cdiv(n, 4096),)](
        torch.from_numpy(raw.view(np.uint8).copy()), values, out, n, CODE=code, OUT=out_code, BLOCK=4096
    )
    return values.numpy(), out.numpy().view(CARRIER[FloatCode(out_code)])


def hard_floats() -> np.ndarray:
    """float32 patterns: random ones (NaNs, Infs, subnormals), every BF16 and F16 rounding tie
    and its neighbours, the F16 subnormal range and its edges."""
    rng = np.random.default_rng(0)
    every16 = np.arange(1 << 16, dtype=np.uint32)
    bits = np.concatenate(
        [
            rng.integers(0, 1 << 32, 100_000, dtype=np.uint64).astype(np.uint32),
            np.arange(0x33000000, 0x39000000, 997, dtype=np.uint32),
            np.arange(0, 0x00800000, 4099, dtype=np.uint32),
            (every16 << 16) | 0x8000,
            (every16 << 16) | 0x7FFF,
            (every16 << 13) | 0x1000,
            np.array([0, 0x80000000, 0x7F800000, 0xFF800000, 0x477FF000, 0x477FEFFF, 0x7FC00000, 0x7F800001]),
        ]
    ).astype(np.uint32)
    return bits.view(np.float32)


def codecs() -> None:
    """Every BF16/F16 pattern decoded (and encoded back) as the Numba codecs do; float32 patterns
    (ties, subnormals, NaN payloads) encoded to BF16/F16/F32 as they do."""
    every = np.arange(1 << 16, dtype=np.uint32).astype(np.uint16)
    for code in (FloatCode.BF16, FloatCode.F16):
        values, back = _codec(every, code, code)
        expected = decode_array(every, code)
        assert np.array_equal(values.view(np.uint32), expected.view(np.uint32)), f"decode {code.name}"
        again = np.empty(every.shape[0], np.uint16)
        encode_array(expected, code, again)
        assert np.array_equal(back, again), f"encode {code.name} of its own values"
    hard = hard_floats()
    for out_code in (FloatCode.BF16, FloatCode.F16, FloatCode.F32):
        values, got = _codec(hard, FloatCode.F32, out_code)
        assert np.array_equal(values.view(np.uint32), hard.view(np.uint32)), "decode F32"
        expected = np.empty(hard.shape[0], CARRIER[out_code])
        encode_array(hard, out_code, expected)
        assert np.array_equal(got.view(np.uint8), expected.view(np.uint8)), f"encode {out_code.name}"
    finite = hard[np.isfinite(hard)].astype(np.float64)
    values, got = _codec(finite, FloatCode.F64, FloatCode.F64)
    assert np.array_equal(values.view(np.uint32), decode_array(finite, FloatCode.F64).view(np.uint32)), "F64"
    assert np.array_equal(got, values.astype(np.float64)), "encode F64"


# -- one tile against a naive twin of the Numba kernels (numpy float32: one rounding per op) ------
def _family(code: int, n: int, agents: int, seed: int) -> tuple[np.ndarray, list[np.ndarray]]:
    """Raw base and agents in format ``code`` with sparse task vectors of a few densities, and
    the values that test the edges: NaN, +-Inf, -0.0, subnormals, |tau| exactly eps, overflowing tau."""
    rng = np.random.default_rng(seed)
    base = rng.normal(0, 0.02, n).astype(np.float32)
    base[:8] = [np.nan, np.inf, -0.0, 1e-40, 3e38, -3e38, 1.0, 0.5]
    out = []
    for t in range(agents):
        agent = base.copy()
        on = rng.random(n) < (0.05, 0.4, 0.6, 0.3)[t % 4]
        agent[on] += rng.normal(0, 0.01, int(on.sum())).astype(np.float32)
        agent[8 + t] = np.float32(1.0) + np.float32(1e-5) if t == 0 else agent[8 + t]  # close to eps
        if t == 1:
            agent[4], agent[5] = -3e38, 3e38  # tau overflows to Inf: inactive
            agent[n // 2] = np.nan if n > 64 else agent[n // 2]
        out.append(agent)
    return _raw(base, code), [_raw(a, code) for a in out]


def _tile_family(code: int, m: int, seed: int) -> tuple[np.ndarray, list[np.ndarray]]:
    """``_family`` of 3 agents in format ``code``; for ``TAU32`` an F32 base and the agents' task
    vectors (float32 differences)."""
    base_code = FloatCode.F32 if code == TAU32 else code
    base, agents = _family(base_code, m, 3, seed)
    if code == TAU32:
        b = decode_array(base, base_code)
        with np.errstate(all="ignore"):
            agents = [(decode_array(a, FloatCode.F32) - b).astype(np.float32) for a in agents]
    return base, agents


def _raw(values: np.ndarray, code: int) -> np.ndarray:
    if code in (FloatCode.F32, TAU32):
        return values.copy()
    if code == FloatCode.F64:
        return values.astype(np.float64)
    carrier = np.empty(values.shape[0], np.uint16)
    encode_array(values, code, carrier)
    return carrier


def _staged(base: np.ndarray, agents: list[np.ndarray]) -> list[torch.Tensor]:
    """The inputs as the input ring stages them: one uint8 buffer, each part 64-byte aligned."""
    sizes = [-(-a.nbytes // 64) * 64 for a in [base, *agents]]
    slot = torch.zeros(sum(sizes) + 64, dtype=torch.uint8)
    parts, at = [], 0
    for array, size in zip([base, *agents], sizes, strict=True):
        part = slot[at : at + array.nbytes]
        part.copy_(torch.from_numpy(array.view(np.uint8).copy()))
        parts.append(part)
        at += size
    return parts


def _naive_ram(
    base: np.ndarray, agents: list[np.ndarray], codes: tuple[int, int], eps: np.float32, lambdas: np.ndarray
) -> tuple[list[np.ndarray], int]:
    b = decode_array(base, codes[0])
    zero, one = np.float32(0), np.float32(1)
    total, count = np.zeros_like(b), np.zeros_like(b)
    scaled = np.zeros((lambdas.shape[0], b.shape[0]), np.float32)
    bad = ~np.isfinite(b)
    with np.errstate(all="ignore"):
        for t, raw in enumerate(agents):
            a = decode_array(raw, codes[1])
            bad |= ~np.isfinite(a)
            tau = a if codes[1] == TAU32 else a - b
            on = (np.abs(tau) > eps) & (np.abs(tau) < np.inf)
            total = total + np.where(on, tau, zero)
            count = count + np.where(on, one, zero)
            for k in range(lambdas.shape[0]):
                scaled[k] = scaled[k] + np.where(on, lambdas[k, t] * tau, zero)
        mean = total / np.maximum(count, one)
        merged = [b + np.where(count == one, scaled[k], np.where(count >= 2, mean, zero)) for k in range(len(scaled))]
    first = int(np.argmax(bad)) if bad.any() else -1
    return merged, first


def _encoded(values: np.ndarray, code: int) -> np.ndarray:
    out = np.empty(values.shape[0], CARRIER[FloatCode(code)])
    encode_array(values, code, out)
    return out


def ram_tiles() -> None:
    """``fused/ram.py`` on tiles of a base and 3 agents (BF16, F16, F32, F64, task vectors), two
    outputs with their own lambdas, a tile not a multiple of the program size, at a block offset:
    the naive twin's bytes, first non-finite input position and the outputs' NaN/Inf flags."""
    eps = np.float32(1e-5)
    lambdas = np.array([[1.1, 1.0, 1.2], [1.0, 1.0, 1.0]], np.float32)
    cases = [(c, c, o) for c in CODES for o in CODES if o != FloatCode.F64 or c == FloatCode.F64]
    cases += [(FloatCode.BF16, TAU32, FloatCode.BF16)]
    for base_code, agent_code, out_code in cases:
        for start in (0, 8):  # with NaN/Inf in the base and outputs, and without
            _ram_tile(base_code, agent_code, out_code, start, eps, lambdas)


def _ram_tile(base_code: int, agent_code: int, out_code: int, start: int, eps: np.float32, lambdas: np.ndarray) -> None:
    base, agents = _family(base_code, 2500, 3, seed=base_code)
    base, agents = base[start:].copy(), [a[start:].copy() for a in agents]
    if agent_code == TAU32:
        b = decode_array(base, base_code)
        with np.errstate(all="ignore"):
            agents = [(decode_array(a, base_code) - b).astype(np.float32) for a in agents]
    lo = 4096
    expected, first = _naive_ram(base, agents, (base_code, agent_code), eps, lambdas)
    out = torch.empty((2, base.shape[0]), dtype=TORCH_CARRIER[FloatCode(out_code)])
    state = torch.zeros(3, dtype=torch.int64)
    state[0] = NOWHERE
    raw = _staged(base, agents)
    fused_ram.merge_tile(raw, base.shape[0], lo, float(eps), torch.from_numpy(lambdas), out, state,
                         (base_code, agent_code, out_code))  # fmt: skip
    what = f"ram {base_code}/{agent_code} -> {out_code} from {start}"
    for k in range(2):
        want = _encoded(expected[k], out_code)
        got = out[k].numpy().view(want.dtype)
        flag = not np.isfinite(decode_array(want, out_code)).all()  # before NaNs are set aside
        if out_code == FloatCode.F64:  # NaN payloads through the hardware: NaN where NaN
            assert np.array_equal(np.isnan(got), np.isnan(want)), what
            got, want = got[~np.isnan(got)], want[~np.isnan(want)]
        assert np.array_equal(got.view(np.uint8), want.view(np.uint8)), f"{what}: output {k}"
        assert bool(state[1 + k] > 0) == flag, f"{what}: flag {k}"
    assert int(state[0]) == (lo + first if first >= 0 else NOWHERE), f"{what}: first"


def probe_tiles() -> None:
    """``fused/probe.py`` on tiles of a base and 3 agents: the naive masks (numpy's little bit
    order), coverage and overlap counts and first non-finite input, added to what was there."""
    eps = np.float32(1e-5)
    for code in (*CODES, TAU32):
        m = 2500 if code != FloatCode.F64 else 1000
        base, agents = _family(FloatCode.F32 if code == TAU32 else code, m, 3, seed=7 + code)
        base_code = FloatCode.F32 if code == TAU32 else code
        b = decode_array(base, base_code)
        if code == TAU32:
            with np.errstate(all="ignore"):
                agents = [(decode_array(a, FloatCode.F32) - b).astype(np.float32) for a in agents]
        with np.errstate(all="ignore"):
            taus = [decode_array(a, code) if code == TAU32 else decode_array(a, code) - b for a in agents]
        on = np.array([(np.abs(t) > eps) & (np.abs(t) < np.inf) for t in taus])
        bad = ~np.isfinite(b) | np.any([~np.isfinite(decode_array(a, code)) for a in agents], axis=0)
        count = on.sum(0)
        masks = torch.full((3, -(-m // 8)), 0xAA, dtype=torch.uint8)
        overlap = torch.full((3, 3), 5, dtype=torch.int64)
        coverage = torch.full((4,), 7, dtype=torch.int64)
        first = torch.tensor([NOWHERE], dtype=torch.int64)
        fused_probe.probe_tile_launch(
            _staged(base, agents), m, 64, float(eps), masks, overlap.view(-1), coverage, first, (base_code, code)
        )
        what = f"probe {code}"
        assert np.array_equal(masks.numpy(), np.packbits(on, axis=1, bitorder="little")), what
        assert np.array_equal(coverage.numpy(), 7 + np.array([(count == k).sum() for k in range(4)])), what
        want = np.array([[(on[t] & (count == k)).sum() for k in range(1, 4)] for t in range(3)])
        assert np.array_equal(overlap.numpy(), 5 + want), what
        assert int(first[0]) == (64 + int(np.argmax(bad)) if bad.any() else NOWHERE), what


def gta_tiles() -> None:
    """``fused/gta.py`` on tiles of a base and 3 agents: every element, magnitude cuts (with tie
    ranges) or random draws (keys past 2^63, indices past 2^32); no consensus or the sign
    election, with and without normalising; two outputs: the bytes of the torch-op twin
    (``merges.weighted_deltas``, ``mix_gta``, ``magnitude.kept_by_cuts``, ``rng.uniform``: the
    Numba kernel's arithmetic), its first non-finite input and the outputs' NaN/Inf flags."""
    from ramstream.backends.torch import codecs as torch_codecs
    from ramstream.backends.torch import magnitude, merges
    from ramstream.backends.torch.fused import gta
    from ramstream.backends.torch.rng import uniform

    weights = np.array([0.5, 1.0, 2.0], np.float32)
    scale = np.array([1.0, 2.0, 0.5], np.float32)
    lams = np.array([1.0, 0.7], np.float32)
    keys = np.array([2**63 + 12345, 7, 2**40 + 3], np.uint64)
    density = np.array([0.3, 0.5, 0.9], np.float32)
    lo, start = 4096, 2**33 + 4096  # the tile's first element in its block, and in its tensor
    for code in (*CODES, TAU32):
        base_code = FloatCode.F32 if code == TAU32 else code
        base, agents = _family(base_code, 2500 if code != FloatCode.F64 else 1100, 3, seed=11 + code)
        m = base.shape[0]
        b = decode_array(base, base_code)
        if code == TAU32:
            with np.errstate(all="ignore"):
                agents = [(decode_array(a, FloatCode.F32) - b).astype(np.float32) for a in agents]
        values = [
            torch.from_numpy(decode_array(r, c))
            for r, c in zip([base, *agents], [base_code, code, code, code], strict=True)
        ]
        unders = [torch_codecs.minus(values[0], code) for _ in agents]
        bits = [magnitude.abs_bits(a, u) for a, u in zip(values[1:], unders, strict=True)]
        sorted_bits = [np.sort(x.numpy().astype(np.int64)) for x in bits]
        cut_value = np.array([[s[m // 10], s[m * 8 // 10]] for s in sorted_bits], np.int64)
        cut_range = np.tile(np.array([[lo + 100, lo + 1500], [lo + 300, lo + 2200]], np.int64), (3, 1, 1))
        positions = torch.arange(lo, lo + m, dtype=torch.int64)
        draws = torch.arange(start, start + m, dtype=torch.int64)
        for keep in (int(gta.KEEP_ALL), int(gta.KEEP_CUTS), int(gta.KEEP_RANDOM)):
            for consensus in ("none", "sum"):
                for normalize in (False, True):
                    deltas = []
                    for t in range(3):
                        delta, _ = merges.weighted_deltas(
                            values[1 + t], unders[t], torch.tensor(weights[t]), torch.tensor(scale[t]), None
                        )
                        alive = None
                        if keep == gta.KEEP_CUTS:
                            alive = magnitude.kept_by_cuts(
                                bits[t], positions, cut_value[t].tolist(), cut_range[t].tolist()
                            )
                        elif keep == gta.KEEP_RANDOM:
                            alive = uniform(int(keys[t]), draws) < torch.tensor(density[t])
                        deltas.append((delta, alive))
                    total = torch.tensor(np.float32(weights.sum()))
                    mixed = merges.mix_gta(values[0], deltas, torch.from_numpy(weights), consensus, normalize, total)
                    out = torch.empty((2, m), dtype=TORCH_CARRIER[FloatCode(base_code)])
                    state = torch.zeros(3, dtype=torch.int64)
                    state[0] = NOWHERE
                    constants = tuple(
                        torch.from_numpy(np.ascontiguousarray(x))
                        for x in (weights, scale, cut_value, cut_range, keys.view(np.int64), density,
                                  np.array([weights.sum()], np.float32), lams)
                    )  # fmt: skip
                    gta.gta_tile_launch(
                        _staged(base, agents), m, lo, start, constants, out, state, (base_code, code, base_code), keep,
                        int(consensus == "sum"), normalize,
                    )  # fmt: skip
                    what = f"gta {code} keep {keep} {consensus} normalize {normalize}"
                    for k in range(2):
                        merged = values[0] + torch.tensor(lams[k]) * mixed
                        want = torch_codecs.encode(merged, base_code).numpy()
                        got = out[k].numpy()
                        flag = not np.isfinite(decode_array(want.view(CARRIER[FloatCode(base_code)]), base_code)).all()
                        if base_code == FloatCode.F64:
                            assert np.array_equal(np.isnan(got), np.isnan(want)), what
                            got, want = got[~np.isnan(got)], want[~np.isnan(want)]
                        assert np.array_equal(got.view(np.uint8), want.view(np.uint8)), f"{what}: output {k}"
                        assert bool(state[1 + k] > 0) == flag, f"{what}: flag {k}"
                    bad = ~np.isfinite(b) | np.any([~np.isfinite(v.numpy()) for v in values[1:]], axis=0)
                    assert int(state[0]) == (lo + int(np.argmax(bad)) if bad.any() else NOWHERE), f"{what}: first"


# -- the torch backend through the API, against the Numba backend ---------------------------------
def _abs_bits(base: np.ndarray, agents: list[np.ndarray], base_code: int, code: int) -> np.ndarray:
    """uint32 (agents, m): the 31-bit patterns of |tau|, as the Numba kernels make them."""
    b = decode_array(base, base_code)
    with np.errstate(all="ignore"):
        taus = [decode_array(a, code) if code == TAU32 else decode_array(a, code) - b for a in agents]
    return np.array([t.view(np.uint32) & 0x7FFFFFFF for t in taus])


def histogram_tiles() -> None:
    """``fused/magnitude.py`` on tiles of a base and 3 agents (every format, task vectors; NaN,
    Inf and |tau| = 0 among them): the high and low histograms of a naive numpy twin, added to
    what the accumulators held; cuts on the zero bin, on the busiest bin, on an empty one, on the
    NaN/Inf bins, and none; the tie searches' packed masks (from a position, on zero, on NaN)."""
    from ramstream.backends.base import HIGH_BINS, LOW_BINS
    from ramstream.backends.torch.fused import magnitude

    for code in (*CODES, TAU32):
        m = 2500 if code != FloatCode.F64 else 1000
        base_code = FloatCode.F32 if code == TAU32 else code
        base, agents = _tile_family(code, m, seed=11 + code)
        bits = _abs_bits(base, agents, base_code, code)
        high = np.array([np.bincount(row >> 16, minlength=HIGH_BINS) for row in bits])
        busiest = [int(np.argmax(np.where(np.arange(HIGH_BINS) > 0, row, -1))) for row in high]
        targets = np.array(
            [[0, busiest[0], -1], [-1, -1, -1], [busiest[2], 0x7FFF, int(bits[2].max() >> 16)]], np.int32
        )
        low = np.zeros((3, 3, LOW_BINS), np.int64)
        for t in range(3):
            for c in range(3):
                if targets[t, c] >= 0:
                    low[t, c] = np.bincount(bits[t][(bits[t] >> 16) == targets[t, c]] & 0xFFFF, minlength=LOW_BINS)
        staged = _staged(base, agents)
        got_high = torch.full((3, HIGH_BINS), 3, dtype=torch.int32)
        magnitude.high_launch(staged, m, got_high, (base_code, code))
        got_low = torch.full((3, 3, LOW_BINS), 2, dtype=torch.int32)
        magnitude.low_launch(staged, m, torch.from_numpy(targets), got_low, (base_code, code))
        what = f"histograms {code}"
        assert np.array_equal(got_high.numpy(), 3 + high), what
        assert np.array_equal(got_low.numpy(), 2 + low), what
        assert high[:, 0].min() > 0 and low[0, 0, 0] > 0 and low[2, 2].sum() > 0, what  # zeros and NaN seen
        # tie searches, one launch: agents 2 and 0 staged (in that order), agent 0 asked twice, a
        # value with no match
        queries = [(2, int(bits[2].max())), (0, 0), (0, int(bits[0][m // 3])), (2, 1)]
        looked = [2, 0]
        ties = torch.full((len(queries), -(-m // 8)), 0x5A, dtype=torch.uint8)
        rows = torch.tensor([looked.index(t) for t, _ in queries], dtype=torch.int32)
        values = torch.tensor([v for _, v in queries], dtype=torch.int64)
        magnitude.tie_launch(_staged(base, [agents[t] for t in looked]), m, rows, values, ties, (base_code, code))
        for q, (t, value) in enumerate(queries):
            want = np.packbits(bits[t] == value, bitorder="little")
            assert np.array_equal(ties[q].numpy(), want), f"ties {code} agent {t} value {value:#x}"
        # the cuts' keep mask: per agent (cut 0, cut 1) values with tie ranges in block positions
        # (the tile starts at block position 64): a band with ties split, everything (cut 1 at
        # 0xFFFFFFFF: the NaN bins too), nothing
        lo = 64
        mid = [int(np.sort(row)[m // 2]) for row in bits]
        value = np.array([[mid[0], int(bits[0].max())], [0, 0xFFFFFFFF], [0, 0]], np.int64)
        ranges = np.array([[[lo + 10, lo + m // 2], [lo, lo + m]], [[0, 0], [0, 0]], [[0, 0], [0, 0]]], np.int64)
        kept = torch.full((3, m), 7, dtype=torch.uint8)
        magnitude.cut_keep_launch(staged, m, lo, torch.from_numpy(value), torch.from_numpy(ranges), kept,
                                  (base_code, code))  # fmt: skip
        wide, at = bits.astype(np.int64), np.arange(m) + lo
        lower = [[_in_lower(wide[t], at, value[t, c], ranges[t, c]) for c in range(2)] for t in range(3)]
        want_keep = np.stack([lower[t][1] & ~lower[t][0] for t in range(3)]).astype(np.uint8)
        assert np.array_equal(kept.numpy(), want_keep), f"cut keep {code}"
        assert 0 < want_keep[0].sum() < m and want_keep[1].all() and not want_keep[2].any(), f"cut keep {code}"


def _in_lower(bits: np.ndarray, at: np.ndarray, value: int, ties: np.ndarray) -> np.ndarray:
    """A cut's lower set: bits below ``value``, or equal to it at positions in [ties[0], ties[1])."""
    return (bits < value) | ((bits == value) & (at >= ties[0]) & (at < ties[1]))


def histogram_merges(scratch: Path) -> None:
    """TIES (both trim scopes) and breadcrumbs (with its L1 rescale) through the API with the torch
    backend on the CPU, its statistics pass in the fused histogram, tie-search and keep-mask
    kernels: every histogram and tie search of every block equal to the Numba backend's on the
    same block, and the merges the Numba bytes."""
    from ramstream.backends.numba.backend import NumbaBackend
    from ramstream.backends.torch.counting import CountOps
    from ramstream.backends.torch.fused import magnitude

    calls = {"high": 0, "low": 0, "tie": 0, "cut keep": 0, "compared": 0, "ties compared": 0, "tie queries": 0}
    _count(magnitude, "high_launch", calls, "high")
    _count(magnitude, "low_launch", calls, "low")
    _count(magnitude, "tie_launch", calls, "tie")
    _count(magnitude, "cut_keep_launch", calls, "cut keep")
    numba = NumbaBackend(1)
    fused_high, fused_low = CountOps.abs_high_histogram, CountOps.abs_low_histogram

    def high(self: CountOps, arrays: object) -> np.ndarray:
        got = fused_high(self, arrays)  # type: ignore[arg-type]
        assert np.array_equal(got, numba.abs_high_histogram(arrays)), "high histogram"  # type: ignore[arg-type]
        calls["compared"] += 1
        return got

    def low(self: CountOps, arrays: object, targets: np.ndarray) -> np.ndarray:
        got = fused_low(self, arrays, targets)  # type: ignore[arg-type]
        assert np.array_equal(got, numba.abs_low_histogram(arrays, targets)), "low histogram"  # type: ignore[arg-type]
        calls["compared"] += 1
        return got

    fused_ties = CountOps.find_ties

    def ties(self: CountOps, arrays: object, agents: np.ndarray, values: np.ndarray, needs: np.ndarray) -> np.ndarray:
        got = fused_ties(self, arrays, agents, values, needs)  # type: ignore[arg-type]
        want = numba.find_ties(arrays, agents, values, needs)  # type: ignore[arg-type]
        assert np.array_equal(got, want) and (want >= 0).all(), "tie search"
        calls["ties compared"] += 1
        calls["tie queries"] += len(agents)
        return got

    _patch(CountOps, "abs_high_histogram", high)  # undone after the check, as every patch
    _patch(CountOps, "abs_low_histogram", low)
    _patch(CountOps, "find_ties", ties)
    _merges(
        scratch,
        [
            ("ties", {"density": 0.3}),
            ("ties", {"density": 0.3, "trim_scope": "model"}),
            ("breadcrumbs_ties", {"density": 0.5, "gamma": 0.05, "rescale": "l1"}),  # its L1 sums: the keep mask
        ],
    )
    assert min(calls.values()) > 0, calls
    assert calls["tie queries"] > calls["ties compared"], calls  # a block's cuts searched in one call


def _naive_linear(
    base: np.ndarray, agents: list[np.ndarray], codes: tuple[int, int], weights: np.ndarray, w0: float, normalize: bool
) -> tuple[np.ndarray, int]:
    """The linear merge as ``backends/numba/linear.py`` computes it, element by element in
    float32, and the first NaN/Inf input position (-1: none)."""
    b = decode_array(base, codes[0])
    values = [decode_array(a, codes[1]) for a in agents]
    bad = ~np.isfinite(b) | np.any([~np.isfinite(v) for v in values], axis=0)
    with np.errstate(all="ignore"):
        total = np.zeros_like(b)
        if np.float32(w0) != np.float32(0.0):
            total = total + np.float32(w0) * b
        divisor = np.float32(0.0) + np.float32(w0)
        for v, w in zip(values, weights, strict=True):
            agent = b + v if codes[1] == TAU32 else v
            total = total + np.float32(w) * agent
            divisor = np.float32(divisor + np.float32(w))
        if normalize:
            total = total / divisor
    return total.astype(np.float32), int(np.argmax(bad)) if bad.any() else -1


def linear_tiles() -> None:
    """``fused/linear.py`` on tiles of a base and 3 agents (BF16, F16, F32, F64, task vectors;
    NaN, Inf, -0.0, subnormals), with and without the base's weight and normalising, to a few
    output formats: the naive twin's bytes, its first position and the output's flag."""
    from ramstream.backends.torch.fused import linear

    weights = np.array([0.3, -0.7, 1.9], np.float32)
    for code in (*CODES, TAU32):
        m = 2500 if code != FloatCode.F64 else 1000
        base_code = FloatCode.F32 if code == TAU32 else code
        base, agents = _tile_family(code, m, seed=23 + code)
        cases = ((0.0, True, base_code), (0.25, False, FloatCode.F32), (-0.0, False, FloatCode.F16),
                 (1.5, True, FloatCode.BF16))  # fmt: skip
        for w0, normalize, out_code in cases:
            merged, first = _naive_linear(base, agents, (base_code, code), weights, w0, normalize)
            want = _encoded(merged, out_code)
            out = torch.full((m,), 77, dtype=TORCH_CARRIER[out_code])
            state = torch.tensor([NOWHERE, 0], dtype=torch.int64)
            divisor = np.float32(0.0) + np.float32(w0)
            for w in weights:
                divisor = np.float32(divisor + w)
            linear.linear_launch(
                _staged(base, agents), m, 0, torch.from_numpy(weights), float(np.float32(w0)),
                float(divisor) if normalize else None, out, state, (base_code, code, out_code),
            )  # fmt: skip
            what = f"linear {code} w0={w0} normalize={normalize} -> {out_code}"
            got = out.numpy().view(want.dtype)
            assert np.array_equal(got.view(np.uint8), want.view(np.uint8)), what
            assert int(state[0]) == (first if first >= 0 else NOWHERE), what
            assert bool(state[1]) == bool(_nonfinite_encoded(want, out_code).any()), what


def _naive_sce(
    base: np.ndarray, agents: list[np.ndarray], codes: tuple[int, int], weights: np.ndarray,
    cut_value: np.ndarray, cut_range: np.ndarray, lo: int,
) -> tuple[np.ndarray, np.ndarray, int]:  # fmt: skip
    """``backends/numba/sce.py`` element by element (numpy: one rounding per op) for a tile at
    block position ``lo``: the merged float32 values, the variance, the first NaN/Inf input (-1)."""
    b = decode_array(base, codes[0])
    values = [decode_array(a, codes[1]) for a in agents]
    bad = ~np.isfinite(b) | np.any([~np.isfinite(v) for v in values], axis=0)
    zero, floor = np.float32(0.0), np.float32(1e-6)
    with np.errstate(all="ignore"):
        taus = [v if codes[1] == TAU32 else v - b for v in values]
        mean, m2 = np.zeros(b.shape, np.float64), np.zeros(b.shape, np.float64)
        for t, tau in enumerate(taus):
            x = tau.astype(np.float64)
            d = x - mean
            mean = mean + d / np.float64(t + 1)
            m2 = m2 + d * (x - mean)
        var = (m2 / np.float64(len(taus))).astype(np.float32)
        bits, at = var.view(np.uint32).astype(np.int64), lo + np.arange(b.shape[0])

        def in_lower(j: int) -> np.ndarray:
            ties = (bits == cut_value[j]) & (at >= cut_range[j, 0]) & (at < cut_range[j, 1])
            return (bits < cut_value[j]) | ties

        kept = in_lower(1) & ~in_lower(0)
        rows = [np.where(kept, tau, zero) for tau in taus]
        total = np.zeros_like(b)
        for row in rows:
            total = total + row
        plus = total >= zero
        mixed, divisor = np.zeros_like(b), np.zeros_like(b)
        for row, w in zip(rows, weights, strict=True):
            counts = ((row > zero) & plus) | ((row < zero) & ~plus)
            mixed = mixed + np.where(counts, row * w, zero)
            divisor = divisor + np.where(counts, w, zero)
        merged = b + mixed / np.where(divisor >= floor, divisor, floor)
    return merged.astype(np.float32), var, int(np.argmax(bad)) if bad.any() else -1


def sce_tiles() -> None:
    """``fused/sce.py`` on tiles of a base and 3 agents (BF16, F16, F32, F64, task vectors; NaN,
    Inf, -0.0, subnormals, variances of exactly 0) at a block position past 0: the variance alone,
    and the merge with cuts that keep everything, nothing, or a middle band with ties split by
    block position, to a few output formats: the naive twin's bytes, first position and flag."""
    from ramstream.backends.torch.fused import sce

    weights = np.array([0.3, 1.7, 0.9], np.float32)
    lo = 1000
    for code in (*CODES, TAU32):
        m = 2500 if code != FloatCode.F64 else 1000
        base_code = FloatCode.F32 if code == TAU32 else code
        base, agents = _tile_family(code, m, seed=41 + code)
        _, var, first = _naive_sce(base, agents, (base_code, code), weights, np.zeros(2, np.int64),
                                   np.zeros((2, 2), np.int64), lo)  # fmt: skip
        finite = np.sort(var.view(np.uint32)[np.isfinite(var)])
        middle = int(finite[len(finite) // 2])
        assert (finite == 0).any() and middle > 0, "the family has no zero or no spread of variances"
        cuts = [
            ((0, 0xFFFFFFFF), ((0, 0), (0, 1 << 40))),  # everything (finite) kept
            ((0, 0), ((0, 0), (0, 0))),  # nothing kept
            ((0, middle), ((lo + 100, lo + 900), (0, lo + m // 2))),  # a band, ties split by position
        ]
        staged = _staged(base, agents)
        got_var = torch.full((m,), 77.0, dtype=torch.float32)
        state = torch.tensor([NOWHERE, 0], dtype=torch.int64)
        zeros = torch.zeros(4, dtype=torch.int64)
        sce.sce_launch(staged, m, lo, torch.from_numpy(weights), zeros, zeros, got_var, state,
                       (base_code, code, FloatCode.F32), merge=False)  # fmt: skip
        assert np.array_equal(got_var.numpy().view(np.uint32), var.view(np.uint32)), f"variance {code}"
        assert int(state[0]) == (first + lo if first >= 0 else NOWHERE), f"variance {code}"
        for number, (values, ranges) in enumerate(cuts):
            cut_value, cut_range = np.array(values, np.int64), np.array(ranges, np.int64)
            merged, _, _ = _naive_sce(base, agents, (base_code, code), weights, cut_value, cut_range, lo)
            for out_code in (base_code, FloatCode.F32, FloatCode.BF16)[: 2 if number else 3]:
                want = _encoded(merged, out_code)
                out = torch.full((m,), 77, dtype=TORCH_CARRIER[out_code])
                state = torch.tensor([NOWHERE, 0], dtype=torch.int64)
                sce.sce_launch(staged, m, lo, torch.from_numpy(weights), torch.from_numpy(cut_value),
                               torch.from_numpy(cut_range), out, state, (base_code, code, out_code))  # fmt: skip
                what = f"sce {code} cuts {number} -> {out_code}"
                got = out.numpy().view(want.dtype)
                assert np.array_equal(got.view(np.uint8), want.view(np.uint8)), what
                assert int(state[0]) == (first + lo if first >= 0 else NOWHERE), what
                assert bool(state[1]) == bool(_nonfinite_encoded(want, out_code).any()), what


def sce_merges(scratch: Path) -> None:
    """SCE (every element kept, and a top-k selection with its statistics pass) through the API
    with the torch backend on the CPU, its fused kernels interpreted: the Numba bytes, every merge
    and variance tile and the kept elements' sums of squares fused."""
    from ramstream.backends.torch.fused import sce, sums

    calls = {"merge": 0, "variance": 0, "squares": 0}
    launch = sce.sce_launch
    _count(sums, "sums_launch", calls, "squares")

    def counted(*args: object, merge: bool = True) -> None:
        calls["merge" if merge else "variance"] += 1
        launch(*args, merge=merge)  # type: ignore[arg-type]

    _patch(sce, "sce_launch", counted)
    _merges(scratch, [("sce", {"select_topk": 0.3}), ("sce", {})])
    assert min(calls.values()) > 0, calls


def della_tiles() -> None:
    """``fused/della.py``'s MAGPRUNE on tiles of whole slices (every format, task vectors; rows of
    one, inner dimensions of one and more; ties of |tau|, 0 most of all; every mode; with and
    without 1/p) at a tensor offset past 2^32: the torch-op path's keep values (``della.py``)."""
    from ramstream.backends.base import DROP_EVERYTHING, KEEP_EVERYTHING, PRUNE
    from ramstream.backends.torch import della
    from ramstream.backends.torch.fused import della as fused_della

    keys = np.array([3, (1 << 63) + 12345, 77], np.uint64)
    lo_p, width = np.array([0.3, 0.5, 0.1], np.float32), np.array([0.2, 0.4, 0.1], np.float32)
    geometries = [(8, 4, 64), (1, 1, 96), (24, 1, 40), (12, 12, 72)]  # rows, inner, slices
    for number, code in enumerate((*CODES, TAU32)):
        base_code = FloatCode.F32 if code == TAU32 else code
        rows, inner, slices = geometries[number % len(geometries)]
        slice_size = rows * inner
        m = slice_size * slices
        base, agents = _tile_family(code, m, seed=7 + code)
        b = decode_array(base, base_code)
        start = (1 << 32) + 5 * slice_size
        for modes, inverse in (((PRUNE, PRUNE, PRUNE), True), ((PRUNE, KEEP_EVERYTHING, DROP_EVERYTHING), False)):
            want = []
            for t, agent in enumerate(agents):
                value = decode_array(agent, code)
                with np.errstate(all="ignore"):
                    tau = value if code == TAU32 else value - b
                bits = torch.from_numpy(tau.view(np.int32) & 0x7FFFFFFF)
                position = torch.arange(start, start + m, dtype=torch.int64)
                want.append(della.keep_values(bits, position, slice_size, rows, int(keys[t]), modes[t],
                                              torch.tensor(lo_p[t]), torch.tensor(width[t]), inverse))  # fmt: skip
            constants = (torch.from_numpy(keys.view(np.int64)), torch.tensor(modes, dtype=torch.int64),
                         torch.from_numpy(lo_p), torch.from_numpy(width))  # fmt: skip
            got = fused_della.magprune_keep(_staged(base, agents), m, start, rows, slice_size, constants, inverse,
                                            (base_code, code))  # fmt: skip
            what = f"della {code} rows {rows} modes {modes} inverse {inverse}"
            assert np.array_equal(got.numpy().view(np.uint32), torch.stack(want).numpy().view(np.uint32)), what
            assert (got.numpy() != 0).any() and (got.numpy() == 0).any(), what


def della_merges(scratch: Path) -> None:
    """DELLA (its L1 rescale's statistics pass, 1/p, no rescale) through the API with the torch
    backend on the CPU, MAGPRUNE, the merge and the exact sums in the fused kernels interpreted:
    the Numba bytes."""
    from ramstream.backends.torch.fused import della, gta, sums

    calls = {"keep": 0, "gta": 0, "sums": 0}
    _count(della, "magprune_keep", calls, "keep")
    _count(gta, "gta_tile_launch", calls, "gta")
    _count(sums, "sums_launch", calls, "sums")
    _merges(
        scratch,
        [
            ("della", {"density": 0.5, "epsilon": 0.1, "seed": 1}),
            ("della_linear", {"density": 0.5, "epsilon": 0.1, "rescale": "inverse"}),
            ("della", {"density": 0.4, "epsilon": 0.2, "rescale": "none", "seed": 4}),
        ],
    )
    assert min(calls.values()) > 0, calls


def della_tiles_and_merges(scratch: Path) -> None:
    """Both DELLA checks in one process (one interpreter start-up)."""
    della_tiles()
    della_merges(scratch)


def _naive_nearswap(
    base: np.ndarray, agent: np.ndarray, codes: tuple[int, int], t: np.float32
) -> tuple[np.ndarray, int]:
    """``backends/numba/nearswap.py`` element by element (numpy float32: one rounding per op), and
    the first NaN/Inf input position (-1: none)."""
    b, a = decode_array(base, codes[0]), decode_array(agent, codes[1])
    bad = ~np.isfinite(b) | ~np.isfinite(a)
    zero, one, floor = np.float32(0.0), np.float32(1.0), np.float32(1e-6)
    with np.errstate(all="ignore"):
        if codes[1] == TAU32:
            a = b + a
        distance = np.abs(b - a)
        distance = np.where(distance < floor, floor, distance)
        weight = (one / distance) * t
        weight = np.where(weight < zero, zero, weight)
        weight = np.where(weight > one, one, weight)
        merged = weight * a + (one - weight) * b
    return merged.astype(np.float32), int(np.argmax(bad)) if bad.any() else -1


def nearswap_tiles_and_merges(scratch: Path) -> None:
    """``fused/nearswap.py`` on tiles of a base and an agent (every format, a task vector; NaN,
    Inf, -0.0, subnormals, distances below 1e-6) at a block position past 0, with a small and a
    large t, to a few output formats: the naive twin's bytes, first position and flag; then
    nearswap through the API with the torch backend on the CPU, its kernel interpreted: the
    Numba bytes on the BF16, F16 and F32 families, every tile fused."""
    from ramstream.backends.torch.fused import nearswap
    from tests.families import build_family
    from tests.test_backends import _merge

    lo = 320
    for code in (*CODES, TAU32):
        m = 2500 if code != FloatCode.F64 else 1000
        base_code = FloatCode.F32 if code == TAU32 else code
        base, agents = _tile_family(code, m, seed=53 + code)
        for t, out_code in (
            (np.float32(0.001), base_code),
            (np.float32(2.5), FloatCode.F32),
            (np.float32(1e-7), FloatCode.BF16),
        ):
            merged, first = _naive_nearswap(base, agents[1], (base_code, code), t)
            want = _encoded(merged, out_code)
            out = torch.full((m,), 77, dtype=TORCH_CARRIER[out_code])
            state = torch.tensor([NOWHERE, 0], dtype=torch.int64)
            nearswap.nearswap_launch(
                _staged(base, [agents[1]]), m, lo, float(t), out, state, (base_code, code, out_code)
            )
            what = f"nearswap {code} t={t} -> {out_code}"
            assert np.array_equal(out.numpy().view(np.uint8), want.view(np.uint8)), what
            assert int(state[0]) == (first + lo if first >= 0 else NOWHERE), what
            assert bool(state[1]) == bool(_nonfinite_encoded(want, out_code).any()), what
    calls = {"nearswap": 0}
    _count(nearswap, "nearswap_launch", calls, "nearswap")
    shapes = {"model.layers.0.mlp.up_proj.weight": (24, 40), "model.norm.weight": (40,)}
    for dtype, single in FAMILY_FORMATS:
        (scratch / dtype).mkdir(parents=True)
        family = build_family(scratch / dtype, dtype=dtype, shapes=shapes, single_file=single)
        expected = _merge(family, scratch / "numba" / dtype / "out", "nearswap", {"t": 0.001}, "numba", agents=1)
        got = _merge(family, scratch / "torch" / dtype / "out", "nearswap", {"t": 0.001}, "torch", agents=1,
                     device="cpu", threads=1)  # fmt: skip
        assert got == expected, f"nearswap {dtype}: not the Numba bytes"
    assert calls["nearswap"] > 0, calls


def _naive_fusion(
    base: np.ndarray, agent: np.ndarray, codes: tuple[int, int], scale: np.ndarray, rows: tuple[int, int],
    threshold: np.float32, lo: int,
) -> tuple[np.ndarray, np.ndarray, int]:  # fmt: skip
    """``backends/numba/fusion.py`` element by element (numpy float32) for a tile at block position
    ``lo``: the merged values, the importance's bits (sign cleared), the first NaN/Inf input (-1)."""
    b, a = decode_array(base, codes[0]), decode_array(agent, codes[1])
    bad = ~np.isfinite(b) | ~np.isfinite(a)
    with np.errstate(all="ignore"):
        if codes[1] == TAU32:
            a = b + a
        d = a - b
        weight = np.abs(d) * scale[(lo + np.arange(b.shape[0]) + rows[1]) // rows[0]]
        merged = b + d * np.where(weight >= threshold, np.float32(1.0), np.float32(0.0))
    bits = weight.view(np.int32) & 0x7FFFFFFF
    return merged.astype(np.float32), bits, int(np.argmax(bad)) if bad.any() else -1


def fusion_tiles_and_merges(scratch: Path) -> None:
    """``fused/fusion.py``'s merge and the histogram kernels' importance key on tiles of a base and
    an agent (every format, a task vector; NaN, Inf, -0.0, subnormals; rows of 48 elements from an
    offset, a tile at a block position past 0), against a naive numpy twin: the merged bytes, the
    first position and flag, and the high and low histograms of the importance's bits; then
    arcee_fusion through the API (its statistics and merge fused) with the Numba bytes."""
    from ramstream.backends.base import HIGH_BINS, LOW_BINS
    from ramstream.backends.torch.fused import fusion, magnitude
    from tests.families import build_family
    from tests.test_backends import _merge

    lo, rows = 96, (48, 17)
    for code in (*CODES, TAU32):
        m = 2500 if code != FloatCode.F64 else 1000
        base_code = FloatCode.F32 if code == TAU32 else code
        base, agents = _tile_family(code, m, seed=61 + code)
        scale = np.random.default_rng(code).random((lo + m + rows[1]) // rows[0] + 1).astype(np.float32) * 4
        scale[3] = 0.0
        staged = _staged(base, [agents[1]])
        _, bits, first = _naive_fusion(base, agents[1], (base_code, code), scale, rows, np.float32(0.0), lo)
        finite = np.sort(bits[bits < 0x7F800000])
        threshold = finite[len(finite) // 2].view(np.float32)  # half the elements kept, ties included
        merged, _, _ = _naive_fusion(base, agents[1], (base_code, code), scale, rows, threshold, lo)
        for out_code in (base_code, FloatCode.BF16):
            want = _encoded(merged, out_code)
            out = torch.full((m,), 77, dtype=TORCH_CARRIER[out_code])
            state = torch.tensor([NOWHERE, 0], dtype=torch.int64)
            fusion.fusion_launch(staged, m, lo, torch.from_numpy(scale), rows, float(threshold), out, state,
                                 (base_code, code, out_code))  # fmt: skip
            what = f"fusion {code} -> {out_code}"
            assert np.array_equal(out.numpy().view(np.uint8), want.view(np.uint8)), what
            assert int(state[0]) == (first + lo if first >= 0 else NOWHERE), what
            assert bool(state[1]) == bool(_nonfinite_encoded(want, out_code).any()), what
        at = (lo, torch.from_numpy(scale), rows[0], rows[1])
        high = torch.zeros((1, HIGH_BINS), dtype=torch.int32)
        magnitude.high_launch(staged, m, high, (base_code, code), at)
        assert np.array_equal(high.numpy()[0], np.bincount(bits >> 16, minlength=HIGH_BINS)), f"high {code}"
        targets = np.array([[int(bits[0]) >> 16, -1, int(finite[-1]) >> 16]], np.int32)
        low = torch.zeros((1, 3, LOW_BINS), dtype=torch.int32)
        magnitude.low_launch(staged, m, torch.from_numpy(targets), low, (base_code, code), at)
        for c, target in enumerate(targets[0]):
            want_low = np.bincount(bits[(bits >> 16) == target] & 0xFFFF, minlength=LOW_BINS) if target >= 0 else 0
            assert np.array_equal(low.numpy()[0, c], np.zeros(LOW_BINS, np.int32) + want_low), f"low {code} {c}"
    calls = {"merge": 0, "high": 0, "low": 0}
    _count(fusion, "fusion_launch", calls, "merge")
    _count(magnitude, "high_launch", calls, "high")
    _count(magnitude, "low_launch", calls, "low")
    shapes = {"model.layers.0.mlp.up_proj.weight": (24, 40), "model.norm.weight": (40,)}
    for dtype, single in FAMILY_FORMATS:
        (scratch / dtype).mkdir(parents=True)
        family = build_family(scratch / dtype, dtype=dtype, shapes=shapes, single_file=single)
        expected = _merge(family, scratch / "numba" / dtype / "out", "arcee_fusion", {}, "numba", agents=1)
        got = _merge(family, scratch / "torch" / dtype / "out", "arcee_fusion", {}, "torch", agents=1, device="cpu",
                     threads=1)  # fmt: skip
        assert got == expected, f"arcee_fusion {dtype}: not the Numba bytes"
    assert min(calls.values()) > 0, calls


def sce_tiles_and_merges(scratch: Path) -> None:
    """Both SCE checks in one process (one interpreter start-up)."""
    sce_tiles()
    sce_merges(scratch)


def _nonfinite_encoded(encoded: np.ndarray, code: int) -> np.ndarray:
    if code in (FloatCode.BF16, FloatCode.F16):
        exponent = 0x7F80 if code == FloatCode.BF16 else 0x7C00
        return (encoded.view(np.uint16) & exponent) == exponent
    return ~np.isfinite(encoded)


def linear_merges(scratch: Path) -> None:
    """linear merges (normalised, with the base's weight, unnormalised) through the API with the
    torch backend on the CPU, its fused kernel interpreted: the Numba bytes, every tile fused."""
    from ramstream.backends.torch.fused import linear

    calls = {"linear": 0}
    _count(linear, "linear_launch", calls, "linear")
    _merges(
        scratch,
        [
            ("linear", {}),
            ("linear", {"weights": [0.2, 0.5, 0.3, 0.1, 0.6], "base_weight": 0.4}),
            ("linear", {"weights": [0.7, -0.2, 0.9, 0.3, 1.1], "normalize": False}),
        ],
    )
    assert calls["linear"] > 0, calls


def _naive_vectors(
    base: np.ndarray, agents: list[np.ndarray], codes: tuple[int, int], where: tuple[int, int, int],
    coefs: np.ndarray, weights: bool, lo: int,
) -> tuple[np.ndarray, int]:  # fmt: skip
    """``merge_vectors_block`` (``backends/numba/vectors.py``) element by element in float32 for
    a tile at block position ``lo``, and the tile's first NaN/Inf input position (-1: none)."""
    start, div, mod = where
    b = decode_array(base, codes[0])
    values = [decode_array(a, codes[1]) for a in agents]
    bad = ~np.isfinite(b) | np.any([~np.isfinite(v) for v in values], axis=0)
    which = ((start + lo + np.arange(b.shape[0])) // div % mod - start // div % mod) % mod
    c = coefs[which]
    with np.errstate(all="ignore"):
        total = np.zeros_like(b)
        if weights:
            total = total + c[:, 0] * b
        for t, v in enumerate(values):
            if weights:
                total = total + c[:, 1 + t] * (b + v if codes[1] == TAU32 else v)
            else:
                total = total + c[:, t] * (v if codes[1] == TAU32 else v - b)
        if not weights:
            total = b + total
    return total.astype(np.float32), int(np.argmax(bad)) if bad.any() else -1


def vectors_tiles() -> None:
    """``fused/vectors.py`` on tiles of a base and 3 agents (every format, task vectors; NaN, Inf,
    -0.0, subnormals), both forms, rows of a matrix, columns, one vector, a block starting mid-row,
    a tile past the block's start: the naive twin's bytes, its first position and the output's
    flag."""
    from ramstream.backends.torch.fused import vectors

    rng = np.random.default_rng(5)
    for code in (*CODES, TAU32):
        m = 2500 if code != FloatCode.F64 else 1000
        base_code = FloatCode.F32 if code == TAU32 else code
        base, agents = _tile_family(code, m, seed=31 + code)
        # (start, div, mod): rows of 300 from mid-row 7, columns of a 100-wide matrix, one vector
        cases = (((2107, 300, 40), True, base_code), ((500, 1, 100), False, FloatCode.F32),
                 ((0, m, 1), False, base_code), ((64, 37, 1000), True, FloatCode.BF16))  # fmt: skip
        for where, weights, out_code in cases:
            count = where[2]
            coefs = rng.normal(0, 0.7, (count, 4)).astype(np.float32)
            merged, first = _naive_vectors(base, agents, (base_code, code), where, coefs, weights, 192)
            want = _encoded(merged, out_code)
            out = torch.full((m,), 77, dtype=TORCH_CARRIER[out_code])
            state = torch.tensor([NOWHERE, 0], dtype=torch.int64)
            vectors.vectors_launch(
                _staged(base, agents), m, 192, where, torch.from_numpy(coefs), weights, out, state,
                (base_code, code, out_code),
            )  # fmt: skip
            what = f"vectors {code} {where} weights={weights} -> {out_code}"
            assert np.array_equal(out.numpy().view(np.uint8), want.view(np.uint8)), what
            assert int(state[0]) == (192 + first if first >= 0 else NOWHERE), what
            assert bool(state[1]) == bool(_nonfinite_encoded(want, out_code).any()), what


def vectors_merges(scratch: Path) -> None:
    """slerp, nuslerp (both forms; flattened, per row and per column: the per-vector Gram sums),
    multislerp and karcher through the API with the torch backend on the CPU, the fused kernels
    interpreted: the Numba bytes, every tile fused."""
    from ramstream.backends.torch.fused import vector_gram, vectors

    calls = {"vectors": 0, "vector_gram": 0}
    _count(vectors, "vectors_launch", calls, "vectors")
    _count(vector_gram, "vector_gram_launch", calls, "vector_gram")
    methods = [
        ("slerp", {"t": 0.3}, 1),
        ("nuslerp", {"weights": [0.4, 0.6]}, 2),
        ("nuslerp", {"weights": [0.4, 0.6], "nuslerp_row_wise": True, "nuslerp_flatten": False}, 2),
        ("nuslerp", {"weights": [0.4, 0.6], "nuslerp_flatten": False}, 2),
        ("nuslerp", {"weights": [0.7, 0.3], "no_base": True}, 1),
        ("multislerp", {"weights": 1.0}, None),
        ("karcher", {}, None),
    ]
    # each method on one family, BF16 and F32 in turn: every kernel meets every format in
    # ``vectors_tiles`` and ``vector_gram_tiles``
    _merges(scratch, [(m, given) for m, given, _ in methods], (("BF16", False), ("F32", False)),
            [n for _, _, n in methods], subset_agent=False)  # fmt: skip
    assert min(calls.values()) > 0, calls


def sums_tiles() -> None:
    """``fused/sums.py`` on tiles of a base and 3 agents (every format, task vectors; NaN, Inf,
    tau overflowing; a tile whose last group is short), with DARE's draws at a tensor offset, and
    on a format each, with keep arrays of one byte per element or every element, of |tau| or tau^2: the
    accumulators of the torch-op path (``exact_sums``), renormalised, and its first position,
    added to what was there."""
    from ramstream.backends.exact_sum import BINS, renormalised
    from ramstream.backends.torch import exact_sums
    from ramstream.backends.torch.fused import sums
    from ramstream.backends.torch.rng import uniform

    keys = np.array([3, (1 << 63) + 12345, 77], np.uint64)
    density = np.array([0.5, 0.1, 0.9], np.float32)
    random, array, every = int(sums.KEEP_RANDOM), int(sums.KEEP_ARRAY), int(sums.KEEP_ALL)
    # DARE's draws on every format; the other selections on one format each (the interpreter is slow)
    more = {FloatCode.BF16: [(array, True)], FloatCode.F32: [(array, False)], TAU32: [(every, True)]}
    for code in (*CODES, TAU32):
        m = 2100  # two programs of 32 groups, the last group 12 elements short
        base_code = FloatCode.F32 if code == TAU32 else code
        base, agents = _tile_family(code, m, seed=41 + code)
        lo, start = 128, (1 << 33) + 128
        b = torch.from_numpy(decode_array(base, base_code))
        keep_rows = np.random.default_rng(code).random((3, m)) < np.array([[0.5], [0.0], [0.9]])
        keep_rows[0, :7] = True  # the NaN/Inf inputs kept
        for number, (mode, squares) in enumerate([(random, False), *more.get(code, [])]):
            rows, bad = [], np.zeros(m, bool)
            for t, agent in enumerate(agents):
                value = torch.from_numpy(decode_array(agent, code))
                size = (value if code == TAU32 else value - b).abs()
                bad |= ~np.isfinite(size.numpy())
                size = torch.where(torch.isfinite(size), size, torch.zeros(()))
                if mode == random:
                    kept = uniform(int(keys[t]), torch.arange(start, start + m, dtype=torch.int64)) < float(density[t])
                else:
                    kept = torch.from_numpy(keep_rows[t] | (mode == every))
                rows += [size, torch.where(kept, size, torch.zeros(()))]
            stacked = torch.stack(rows)
            want = torch.zeros((6, BINS + 1), dtype=torch.int64)
            want[:, 5] = 9
            group_sums = exact_sums.product_group_sums(stacked, stacked) if squares else exact_sums.group_sums(stacked)
            exact_sums.accumulate(want, group_sums)
            acc = torch.zeros((6, BINS + 1), dtype=torch.int64)
            acc[:, 5] = 9
            first = torch.tensor([NOWHERE], dtype=torch.int64)
            keeps = [keep_rows[t].astype(np.uint8) for t in range(3)] if mode == array else []
            sums.sums_launch(
                _staged(base, [*agents, *keeps]), m, lo, torch.from_numpy(keys.view(np.int64)),
                torch.from_numpy(density), start, acc, first, (base_code, code), mode, squares,
            )  # fmt: skip
            what = f"sums {code} case {number}"
            assert np.array_equal(renormalised(acc.numpy()), renormalised(want.numpy())), what
            assert int(first[0]) == (lo + int(np.argmax(bad)) if bad.any() else NOWHERE), what
            assert renormalised(want.numpy()).any(), what


def gram_tiles() -> None:
    """``fused/sums.py``'s Gram sums on tiles of a base and 3 agents (every format, task vectors;
    NaN, Inf, tau overflowing, negative products; a short last group), of the task vectors and of
    the base with the agents' weights: the torch-op path's accumulators (``_gram_rows`` and
    ``exact_sums``), renormalised, and its first position, added to what was there."""
    from ramstream.backends.exact_sum import BINS, renormalised
    from ramstream.backends.torch import exact_sums
    from ramstream.backends.torch.counting import _gram_rows
    from ramstream.backends.torch.fused import sums

    for number, code in enumerate((*CODES, TAU32)):
        m = 1100  # one program (``sums_tiles`` has two), the last group 12 elements long
        base_code = FloatCode.F32 if code == TAU32 else code
        base, agents = _tile_family(code, m, seed=5 + code)
        weights = number % 2 == 1
        n_vectors = 3 + weights
        pairs = [(a, b) for a in range(n_vectors) for b in range(a, n_vectors)]
        left = torch.tensor([a for a, _ in pairs], dtype=torch.int64)
        right = torch.tensor([b for _, b in pairs], dtype=torch.int64)
        lo = 192
        staged = _staged(base, agents)
        first_want = torch.full((1,), NOWHERE, dtype=torch.int64)
        rows = _gram_rows(staged, [base_code, code, code, code], 3, weights, first_want, 0, lo, torch.zeros(()))
        stacked = torch.stack(rows)
        want = torch.zeros((len(pairs), BINS + 1), dtype=torch.int64)
        want[:, 7] = 5
        exact_sums.accumulate(want, exact_sums.product_group_sums(stacked[left], stacked[right]))
        acc = torch.zeros((len(pairs), BINS + 1), dtype=torch.int64)
        acc[:, 7] = 5
        first = torch.tensor([NOWHERE], dtype=torch.int64)
        sums.gram_launch(staged, m, lo, acc, first, (base_code, code), weights)
        what = f"gram {code} weights={weights}"
        assert np.array_equal(renormalised(acc.numpy()), renormalised(want.numpy())), what
        assert int(first[0]) == int(first_want[0]) < NOWHERE, what
        assert weights or (renormalised(want.numpy()) < 0).any(), what  # signed sums of tau products


def agreement_tiles() -> None:
    """``fused/agreement.py`` on tiles of a base and 3 or 4 agents (every format, task vectors; NaN,
    Inf, tau overflowing, |tau| at eps, negative products; a short last program): the torch-op
    path's accumulator digits and counts (``agreement.accumulate``), added to what was there."""
    from ramstream.backends.agreement import agent_pairs, sum_rows
    from ramstream.backends.torch import agreement
    from ramstream.backends.torch import codecs as torch_codecs
    from ramstream.backends.torch.fused import agreement as fused_agreement
    from ramstream.backends.vector_sums import DIGITS

    eps = np.float32(1e-5)
    for number, code in enumerate((*CODES, TAU32)):
        n_agents = 3 + number % 2
        m = 300  # three programs, the last 44 elements long
        base_code = FloatCode.F32 if code == TAU32 else code
        if n_agents == 3:
            base, agents = _tile_family(code, m, seed=11 + code)
        else:
            base, agents = _family(base_code, m, n_agents, seed=11 + code)
        staged = _staged(base, agents)
        pairs = agent_pairs(n_agents)
        decoded = torch_codecs.decode(staged[0], base_code)
        taus = torch.stack(
            [torch_codecs.decode(staged[1 + t], code) - torch_codecs.minus(decoded, code) for t in range(n_agents)]
        )
        want = torch.full((sum_rows(n_agents) * DIGITS,), 3, dtype=torch.int64)
        want_counts = torch.full((len(pairs), 2), 2, dtype=torch.int64)
        agreement.accumulate(want, want_counts, taus, torch.tensor(eps), pairs)
        acc = torch.full((sum_rows(n_agents) * DIGITS,), 3, dtype=torch.int64)
        counts = torch.full((len(pairs), 2), 2, dtype=torch.int64)
        fused_agreement.agreement_launch(staged, m, float(eps), acc, counts, (base_code, code))
        what = f"agreement {code}, {n_agents} agents"
        assert torch.equal(counts, want_counts), what
        assert torch.equal(acc, want), what
        assert (want_counts[:, 0] > 2).all() and (want < 0).any(), what  # shared elements, negative products


def vector_gram_tiles() -> None:
    """``fused/vector_gram.py`` on tiles of a base and 3 agents (every format, task vectors; NaN,
    Inf, tau overflowing, negative products): rows of 300 from mid-row (programs in one vector and
    programs across two), columns of a 100-wide matrix (every element its own vector), one vector;
    of the task vectors and of the base with the agents' weights: the torch-op path's digits
    (``_gram_rows``, ``vectors.add_products``) and first position, added to what was there."""
    from ramstream.backends.torch import vectors
    from ramstream.backends.torch.counting import _gram_rows
    from ramstream.backends.torch.fused import vector_gram
    from ramstream.backends.vector_sums import DIGITS

    for number, code in enumerate((*CODES, TAU32)):
        m = 700
        base_code = FloatCode.F32 if code == TAU32 else code
        base, agents = _tile_family(code, m, seed=41 + code)
        staged = _staged(base, agents)
        weights = number % 2 == 0
        n_vectors = 3 + weights
        pairs = [(a, b) for a in range(n_vectors) for b in range(a, n_vectors)]
        lo = 192
        # (block start, div, mod, count): rows of 300 from mid-row 7, columns of 100, one vector
        for start, div, mod, count in ((2107, 300, 40, 4), (500, 1, 100, 100), (0, 4096, 1, 1)):
            first_want = torch.full((1,), NOWHERE, dtype=torch.int64)
            rows = _gram_rows(staged, [base_code, code, code, code], 3, weights, first_want, 0, lo, torch.zeros(()))
            which = vectors.block_vectors(torch.arange(start + lo, start + lo + m), div, mod, start)
            want = torch.full((count * len(pairs) * DIGITS,), 3, dtype=torch.int64)
            for k, (a, b) in enumerate(pairs):
                vectors.add_products(want, rows[a], rows[b], which * len(pairs) + k)
            acc = torch.full((count * len(pairs) * DIGITS,), 3, dtype=torch.int64)
            first = torch.tensor([NOWHERE], dtype=torch.int64)
            vector_gram.vector_gram_launch(
                staged, m, lo, start + lo, div, mod, start // div % mod, acc, first, (base_code, code), weights
            )
            what = f"vector gram {code} ({start}, {div}, {mod}) weights={weights}"
            assert torch.equal(acc, want), what
            assert int(first[0]) == int(first_want[0]) < NOWHERE, what
            assert weights or (want < 0).any(), what  # signed sums of tau products


def sums_and_gram_tiles() -> None:
    """The exact-sum kernels' tile checks in one process: abs sums, Gram, agreement, per vector."""
    sums_tiles()
    gram_tiles()
    agreement_tiles()
    vector_gram_tiles()


def sums_merges(scratch: Path) -> None:
    """dare_ties (its L1 rescale's exact sums) through the API with the torch
    backend on the CPU, the sums in the fused kernel: every block's sums equal to the Numba
    backend's on the same block, and the merges the Numba bytes."""
    from ramstream.backends.numba.backend import NumbaBackend
    from ramstream.backends.torch.counting import CountOps
    from ramstream.backends.torch.fused import sums

    calls = {"sums": 0, "compared": 0}
    _count(sums, "sums_launch", calls, "sums")
    numba = NumbaBackend(1)
    fused_sums = CountOps.abs_sums

    def compared(self: CountOps, arrays: object, keep: object, squares: bool = False) -> object:
        got = fused_sums(self, arrays, keep, squares)  # type: ignore[arg-type]
        want = numba.abs_sums(arrays, keep, squares)  # type: ignore[arg-type]
        assert np.array_equal(got.sums, want.sums) and got.first_nonfinite == want.first_nonfinite, "exact sums"
        calls["compared"] += 1
        return got

    _patch(CountOps, "abs_sums", compared)
    _merges(scratch, [("dare_ties", {"density": 0.5, "seed": 3})])
    assert min(calls.values()) > 0, calls


def agreement_merges(scratch: Path) -> None:
    """``probe --agreement`` through the API with the torch backend on the CPU, the agreement in
    the fused kernel: every block's counts and sums equal to the Numba backend's on the same block."""
    from ramstream import api
    from ramstream.backends.numba.backend import NumbaBackend
    from ramstream.backends.torch.counting import CountOps
    from ramstream.backends.torch.fused import agreement
    from ramstream.config import RunOptions
    from tests.families import build_family

    calls = {"agreement": 0, "compared": 0}
    _count(agreement, "agreement_launch", calls, "agreement")
    numba = NumbaBackend(1)
    fused_agreement = CountOps.agreement

    def compared(self: CountOps, arrays: object, eps: float) -> object:
        got = fused_agreement(self, arrays, eps)  # type: ignore[arg-type]
        want = numba.agreement(arrays, eps)  # type: ignore[arg-type]
        assert np.array_equal(got.counts, want.counts) and np.array_equal(got.sums, want.sums), "agreement"
        calls["compared"] += 1
        return got

    _patch(CountOps, "agreement", compared)
    shapes = {"model.layers.0.mlp.up_proj.weight": (24, 40), "model.norm.weight": (40,)}
    family = build_family(scratch / "family", dtype="F16", shapes=shapes, identical_agent=True, subset_agent=True)
    options = RunOptions(quiet=True, backend="torch", device="cpu", threads=1, block_elems=256)
    api.probe(family.base, [str(a) for a in family.agents], index=scratch / "index.zarr", agreement=True,
              options=options)  # fmt: skip
    assert min(calls.values()) > 0, calls


def merges(scratch: Path) -> None:
    """RAM and RAM+ merges (the probe pass included) with the torch backend on the CPU, its fused
    kernels interpreted, one method on each of the BF16, F16 and F32 families: the Numba bytes, every
    tile fused."""
    calls = {"ram": 0, "probe": 0}
    _count(fused_ram, "merge_tile", calls, "ram")
    _count(fused_probe, "probe_tile_launch", calls, "probe")
    _merges(scratch, [("ram", {}), ("ram+", {}), ("ram+", {"rho_scope": "tensor"})])
    assert calls["ram"] > 0 and calls["probe"] > 0, calls


def gta_merges(scratch: Path) -> None:
    """The GTA merges whose selections the fused kernel evaluates (every element, magnitude cuts),
    as ``merges``, model_stock's Gram statistics fused too; then an overflowing output refused as
    on the Numba backend. DARE's draws go through the same kernel in ``sums_merges`` (dare_ties),
    which checks their exact sums too, and in ``gta_tiles`` with and without the sign election."""
    from ramstream.backends.torch.fused import gta, sums

    calls = {"gta": 0, "gram": 0}
    _count(gta, "gta_tile_launch", calls, "gta")
    _count(sums, "gram_launch", calls, "gram")  # model_stock's statistics
    _merges(
        scratch,
        [
            ("task_arithmetic", {"lambda": 0.7}),
            ("ties", {"density": 0.3}),
            ("ties", {"density": 0.3, "trim_scope": "model", "rescale": "l1"}),
            ("breadcrumbs_ties", {"density": 0.5, "gamma": 0.05}),
            ("model_stock", {}),
        ],
    )
    assert min(calls.values()) > 0, calls
    _overflow_refused(scratch)


def streamed(scratch: Path) -> None:
    """The streamed loop (the CUDA path) with the fused kernels: a simulated device whose copies
    run late on their own threads and whose buffers start as NaN bytes, tiles of 64 elements, the
    probe pass included: RAM+, TIES, DARE and DELLA (its MAGPRUNE in tiles of whole slices) give
    the Numba bytes, every tile fused; a device whose compute forgets to wait for its upload gives
    other bytes, or a refusal."""
    from ramstream.backends.torch.fused import della, gta
    from ramstream.errors import NonFiniteOutputError, NonFiniteWeightError
    from tests.families import build_family
    from tests.simulated_gpu import ForgetfulGpu, SimulatedGpu
    from tests.test_backends import _merge
    from tests.test_torch_streamed import simulated_gpu

    calls = {"ram": 0, "probe": 0, "gta": 0, "magprune": 0}
    _count(fused_ram, "merge_tile", calls, "ram")
    _count(fused_probe, "probe_tile_launch", calls, "probe")
    _count(gta, "gta_tile_launch", calls, "gta")
    _count(della, "magprune_keep", calls, "magprune")
    shapes = {"model.layers.0.mlp.up_proj.weight": (24, 40), "model.norm.weight": (40,)}
    family = build_family(scratch / "family", shapes=shapes, identical_agent=True)
    methods = (("ram+", {}), ("ties", {"density": 0.3}), ("dare_ties", {"seed": 3}),
               ("della", {"density": 0.5, "epsilon": 0.1, "rescale": "none", "seed": 2}))  # fmt: skip
    for number, (method, given) in enumerate(methods):
        expected = _merge(family, scratch / "numba" / str(number) / "out", method, given, "numba")
        with simulated_gpu(SimulatedGpu) as devices:
            got = _merge(family, scratch / "streamed" / str(number) / "out", method, given, "torch", device="cpu")
        assert got == expected, f"{method}: not the Numba bytes"
        assert sum(d.uploads for d in devices) > 0
    assert min(calls.values()) > 0, calls
    expected = _merge(family, scratch / "numba" / "ram" / "out", "ram", {}, "numba")
    try:
        with simulated_gpu(lambda: ForgetfulGpu(delay=(0.001, 0.002))):
            got = _merge(family, scratch / "forgetful" / "out", "ram", {}, "torch", device="cpu")
    except (NonFiniteWeightError, NonFiniteOutputError):
        pass  # the poison was read as an input (probe pass) or reached a merged value
    else:
        assert got != expected, "a compute that did not wait for its upload gave the right bytes"


def _overflow_refused(scratch: Path) -> None:
    """A merged F16 output that overflows (task_arithmetic, lambda 1e8): the fused kernel's flag
    makes the merge pass refuse it with the Numba backend's message."""
    from ramstream.api import merge
    from ramstream.config import RunOptions
    from ramstream.errors import NonFiniteOutputError
    from tests.families import build_family

    family = build_family(scratch / "overflow", shapes={"model.norm.weight": (64,)})
    messages = []
    for backend, device, threads in (("numba", None, None), ("torch", "cpu", 1)):
        options = RunOptions(cache_dir=scratch / backend, quiet=True, backend=backend, device=device, threads=threads)
        try:
            agents = [str(a) for a in family.agents]
            given = {"lambda": 1e8}
            out = scratch / backend / "out"
            merge(family.base, agents, out=out, method="task_arithmetic", method_options=given, out_dtype="f16",
                  options=options)  # fmt: skip
        except NonFiniteOutputError as error:
            messages.append(str(error).replace(str(scratch / backend), ""))
    assert len(messages) == 2 and messages[0] == messages[1] and "f16" in messages[0], messages


# The families of ``_merges``, taken in turn: BF16, F16 in one file, F32.
FAMILY_FORMATS = (("BF16", False), ("F16", True), ("F32", False))


def _merges(
    scratch: Path,
    methods: list[tuple[str, dict[str, object]]],
    formats: tuple[tuple[str, bool], ...] = FAMILY_FORMATS,
    agents: list[int | None] | None = None,
    subset_agent: bool = True,
) -> None:
    """Each method through the API, Numba's bytes against the fused kernels', on the next family
    of ``formats`` in turn: a check of as many methods as formats or more runs every format
    through the API, and each kernel meets every format on its own in the ``*_tiles`` checks.
    (Every method on every format cost the interpreter's time again for no other path.)
    ``agents``: per method, how many of the family's agents it merges (None: all)."""
    from tests.families import build_family
    from tests.test_backends import _merge

    shapes = {"model.layers.0.mlp.up_proj.weight": (24, 40), "model.norm.weight": (40,)}
    families = {}
    for number, (method, given) in enumerate(methods):
        dtype, single = formats[number % len(formats)]
        if dtype not in families:
            (scratch / dtype).mkdir(parents=True)
            families[dtype] = build_family(scratch / dtype, dtype=dtype, shapes=shapes, single_file=single,
                                           identical_agent=True, subset_agent=subset_agent)  # fmt: skip
        name = f"{dtype}-{method}-{number}"
        used = agents[number] if agents else None
        expected = _merge(families[dtype], scratch / "numba" / name / "out", method, given, "numba", used)
        got = _merge(families[dtype], scratch / "torch" / name / "out", method, given, "torch", used, device="cpu",
                     threads=1)  # fmt: skip
        assert got == expected, f"{name}: not the Numba bytes"


# what the running check replaced, undone before the next check of the same process
_PATCHED: list[tuple[object, str, object]] = []


def _patch(owner: object, name: str, value: object) -> None:
    _PATCHED.append((owner, name, getattr(owner, name)))
    setattr(owner, name, value)


def _undo_patches() -> None:
    while _PATCHED:
        owner, name, old = _PATCHED.pop()
        setattr(owner, name, old)


def _count(module: object, name: str, calls: dict[str, int], key: str) -> None:
    launch = getattr(module, name)

    def counted(*args: object, **kwargs: object) -> object:
        calls[key] += 1
        return launch(*args, **kwargs)

    _patch(module, name, counted)


CHECKS: dict[str, Callable[[], None]] = {
    "codecs": codecs,
    "ram_tiles": ram_tiles,
    "probe_tiles": probe_tiles,
    "gta_tiles": gta_tiles,
    "histogram_tiles": histogram_tiles,
    "linear_tiles": linear_tiles,
    "vectors_tiles": vectors_tiles,
    "sums_tiles": sums_and_gram_tiles,
}

IN_A_DIRECTORY: dict[str, Callable[[Path], None]] = {
    "merges": merges,
    "gta_merges": gta_merges,
    "histogram_merges": histogram_merges,
    "linear_merges": linear_merges,
    "vectors_merges": vectors_merges,
    "sums_merges": sums_merges,
    "agreement_merges": agreement_merges,
    "sce": sce_tiles_and_merges,
    "della": della_tiles_and_merges,
    "nearswap": nearswap_tiles_and_merges,
    "fusion": fusion_tiles_and_merges,
    "streamed": streamed,
}


def run(check: str, scratch: Path) -> None:
    """Run one check (those that write files in a fresh directory under ``scratch``), then undo
    what it patched."""
    try:
        if check in IN_A_DIRECTORY:
            with tempfile.TemporaryDirectory(dir=scratch) as directory:
                IN_A_DIRECTORY[check](Path(directory))
        else:
            CHECKS[check]()
    finally:
        _undo_patches()


def run_all(checks: list[str], scratch: Path, results: Path) -> None:
    """Run ``checks`` one after another in this process (one interpreter start-up for all), each
    failure kept with its traceback; ``results`` (JSON: check -> "ok" or the traceback) is
    rewritten after each check, so a crash or a timeout leaves the ones that finished."""
    done: dict[str, str] = {}
    for check in checks:
        try:
            run(check, scratch)
            done[check] = "ok"
        except Exception:
            done[check] = traceback.format_exc()
        results.write_text(json.dumps(done))


if __name__ == "__main__":
    if sys.argv[1] == "--all":  # --all RESULTS SCRATCH CHECK...
        run_all(sys.argv[4:], Path(sys.argv[3]), Path(sys.argv[2]))
    else:  # CHECK [SCRATCH]: one check, by hand
        run(sys.argv[1], Path(sys.argv[2] if len(sys.argv) > 2 else tempfile.gettempdir()))
        print(f"{sys.argv[1]}: ok")
