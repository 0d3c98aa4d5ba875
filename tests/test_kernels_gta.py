"""The generalized task arithmetic, linear and exact-sum kernels against slow twins written here
with Python loops over float32 scalars (and Fractions for the exact sums).

Inputs are typed the way the passes hand them over (read-only bf16 carriers, a tuple of agents),
so these calls reuse the compiled signatures of the end-to-end runs.
"""

from __future__ import annotations

from fractions import Fraction

import numpy as np
import pytest

from ramstream.backends.numba import gta
from ramstream.backends.numba.addresses import addresses_of
from ramstream.backends.numba.codecs import BF16, F32, TILE
from ramstream.backends.numba.counter_rng import stream_key, uniforms
from ramstream.backends.numba.della import della_keep, della_merge_block
from ramstream.backends.numba.exact_stats import abs_sums_block, gram_block, reduce_workers
from ramstream.backends.numba.exact_sum import BINS, finish
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
from ramstream.backends.numba.linear import merge_linear_block
from tests.families import bf16_to_f32, f32_to_bf16

N = 5
LENGTH = TILE + 101  # two tiles, the second one partial
WEIGHTS = np.array([0.5, 2.0, -0.25, 0.0, 1.0], np.float32)
SCALE = np.array([1.0, 1.5, 0.75, 2.0, 1.0], np.float32)
Z = np.float32(0.0)


def at(agents: tuple[np.ndarray, ...] | list[np.ndarray]) -> np.ndarray:
    """The agents' blocks as the kernels take them: their addresses (the arrays stay alive)."""
    return addresses_of(agents, agents[0].size)


def _readonly(array: np.ndarray) -> np.ndarray:
    array = np.ascontiguousarray(array)
    array.setflags(write=False)
    return array


@pytest.fixture(scope="module")
def inputs() -> tuple[np.ndarray, tuple[np.ndarray, ...], np.ndarray, list[np.ndarray]]:
    """bf16 base and agents: sparse changes, an agent equal to the base, opposite signs (agent 1
    mostly undoes agent 0), elements where only the zero-weight agent 3 changed."""
    rng = np.random.default_rng(0)
    base = bf16_to_f32(f32_to_bf16(rng.standard_normal(LENGTH).astype(np.float32) * np.float32(0.05)))
    agents: list[np.ndarray] = []
    for t, density in enumerate((0.5, 0.5, 0.6, 0.4, 0.0)):
        delta = rng.standard_normal(LENGTH).astype(np.float32) * np.float32(0.01)
        if t == 1:
            delta = base - agents[0]
        values = np.where(rng.random(LENGTH) < density, base + delta, base).astype(np.float32)
        agents.append(bf16_to_f32(f32_to_bf16(values)))
    raw_agents = tuple(_readonly(f32_to_bf16(a)) for a in agents)
    return _readonly(f32_to_bf16(base)), raw_agents, base, agents


def naive_gta(
    base: np.ndarray,
    agents: list[np.ndarray],
    mode: int,
    keep: np.ndarray,
    kept_random: np.ndarray,
    consensus: int,
    normalize: bool,
    lam: np.float32,
) -> np.ndarray:
    out = np.empty(len(base), np.float32)
    total_weight = Z
    for w in WEIGHTS:
        total_weight = np.float32(total_weight + w)
    if abs(total_weight) < np.float32(1e-8):
        total_weight = np.float32(1.0)
    for i in range(len(base)):
        deltas = []
        for t in range(N):
            tau = np.float32(agents[t][i] - base[i])
            if mode == KEEP_ARRAY:
                k = np.float32(keep[t, i])
                d, alive = WEIGHTS[t] * ((tau * k) * SCALE[t]), k != 0
            else:
                d = WEIGHTS[t] * (tau * SCALE[t])
                alive = mode == KEEP_ALL or bool(kept_random[t, i])  # KEEP_CUTS: drawn into kept_random
            deltas.append(np.float32(d) if alive else Z)
        if consensus == gta.CONSENSUS_NONE:
            mixed, divisor = Z, total_weight
            for d in deltas:
                mixed = np.float32(mixed + d)
        else:
            vote = Z
            for d in deltas:
                vote = np.float32(vote + d)
            mixed, divisor = Z, Z
            for t, d in enumerate(deltas):
                if (d > 0 and vote >= 0) or (d < 0 and vote < 0):
                    mixed, divisor = np.float32(mixed + d), np.float32(divisor + WEIGHTS[t])
            divisor = np.float32(1.0) if divisor == 0 else divisor
        value = np.float32(mixed / divisor) if normalize else mixed
        out[i] = np.float32(base[i] + np.float32(lam * value))
    return out


CASES = [  # (keep mode, keep dtype, consensus, normalize, lambda)
    (KEEP_ALL, "uint8", gta.CONSENSUS_NONE, False, 1.0),
    (KEEP_ALL, "uint8", gta.CONSENSUS_NONE, True, 0.7),
    (KEEP_ALL, "uint8", gta.CONSENSUS_SUM, True, 1.0),
    (KEEP_ARRAY, "uint8", gta.CONSENSUS_SUM, True, 1.0),
    (KEEP_ARRAY, "uint8", gta.CONSENSUS_NONE, False, 0.5),
    (KEEP_ARRAY, "float32", gta.CONSENSUS_SUM, True, 1.0),
    (KEEP_ARRAY, "float32", gta.CONSENSUS_NONE, True, 0.5),
    (KEEP_RANDOM, "uint8", gta.CONSENSUS_NONE, True, 1.0),
    (KEEP_RANDOM, "uint8", gta.CONSENSUS_SUM, False, 2.0),
    (KEEP_CUTS, "uint8", gta.CONSENSUS_SUM, True, 1.0),
    (KEEP_CUTS, "uint8", gta.CONSENSUS_NONE, False, 0.5),
]


def magnitude_cuts(base: np.ndarray, agents: list[np.ndarray]) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """Two cuts per agent chosen at values that have ties (so the tie ranges matter), one agent
    with cut 1 above everything, one with an empty cut 0; and the survivors they define, decided
    here from |tau| bits with Python comparisons."""
    value = np.zeros((N, 2), np.uint32)
    ranges = np.zeros((N, 2, 2), np.int64)
    kept = np.zeros((N, LENGTH), bool)
    for t in range(N):
        bits = np.abs(agents[t] - base).astype(np.float32).view(np.uint32)
        ordered = np.sort(bits)
        value[t] = (ordered[LENGTH // 4], ordered[3 * LENGTH // 4])
        ranges[t] = ((100, TILE + 50), (0, TILE - 7))
        if t == 2:
            value[t, 1] = 0xFFFFFFFF
        if t == 3:
            value[t, 0], ranges[t, 0] = 0, (0, 0)

        def lower(b: int, i: int, v: int, a: int, e: int) -> bool:
            return b < v or (b == v and a <= i < e)

        for i in range(LENGTH):
            b = int(bits[i])
            (v0, v1), ((a0, e0), (a1, e1)) = value[t].tolist(), ranges[t].tolist()
            kept[t, i] = lower(b, i, v1, a1, e1) and not lower(b, i, v0, a0, e0)
    return value, ranges, kept


@pytest.mark.parametrize(("mode", "keep_dtype", "consensus", "normalize", "lam"), CASES)
def test_gta_kernel_matches_naive_twin(
    inputs: tuple[np.ndarray, tuple[np.ndarray, ...], np.ndarray, list[np.ndarray]],
    mode: int,
    keep_dtype: str,
    consensus: int,
    normalize: bool,
    lam: float,
) -> None:
    raw_base, raw_agents, base, agents = inputs
    rng = np.random.default_rng(1)
    start = 64 * 37  # the block's first element within its tensor
    keys = np.array([stream_key(9, t, "w") for t in range(N)], np.uint64)
    density = np.array([0.5, 0.3, 1.0, 0.7, 0.2], np.float32)
    kept_random = np.array([uniforms(keys[t], start, LENGTH) < density[t] for t in range(N)])
    cut_value, cut_range = NO_CUT_VALUE, NO_CUT_RANGE
    if mode == KEEP_CUTS:
        cut_value, cut_range, kept_random = magnitude_cuts(base, agents)
        assert 0 < kept_random.sum() < kept_random.size
    if keep_dtype == "uint8":
        keep = (rng.random((N, LENGTH)) < 0.6).astype(np.uint8)
    else:
        keep = rng.choice(np.array([0.0, 1.0, 2.5, 0.125], np.float32), (N, LENGTH))
    lams = np.array([lam, 0.5, -1.25], np.float32)  # one read, three outputs: a sweep over lambda
    expected = [naive_gta(base, agents, mode, keep, kept_random, consensus, normalize, x) for x in lams]
    for workers in (1, 3):
        outs = [np.empty(LENGTH, np.float32) for _ in lams]
        keep_arg = keep if mode == KEEP_ARRAY else NO_KEEP
        keys_arg, density_arg = (keys, density) if mode == KEEP_RANDOM else (NO_KEYS, NO_DENSITY)
        found = gta.gta_merge_block(
            raw_base,
            BF16,
            at(raw_agents),
            np.full(N, BF16, np.int64),
            WEIGHTS,
            SCALE,
            mode,
            keep_arg,
            keys_arg,
            density_arg,
            start,
            cut_value,
            cut_range,
            consensus,
            normalize,
            lams,
            np.array([o.ctypes.data for o in outs], np.int64),
            F32,
            workers,
        )
        assert found == -1
        for out, want in zip(outs, expected, strict=True):
            np.testing.assert_array_equal(out.view(np.uint32), want.view(np.uint32))


def test_gta_twin_sees_every_case(
    inputs: tuple[np.ndarray, tuple[np.ndarray, ...], np.ndarray, list[np.ndarray]],
) -> None:
    """The inputs hold elements where agents disagree in sign, where only the zero-weight agent
    changed (a zero vote: nothing kept, divisor 1), and an agent equal to the base."""
    _, _, base, agents = inputs
    taus = np.array([a - base for a in agents])
    assert ((taus > 0).any(axis=0) & (taus < 0).any(axis=0)).any()
    only_zero_weight = (taus[3] != 0) & (np.delete(taus, 3, axis=0) == 0).all(axis=0)
    assert only_zero_weight.any()
    assert not taus[4].any()


@pytest.mark.parametrize(("base_weight", "normalize"), [(0.0, True), (0.0, False), (0.7, True), (-0.5, False)])
def test_linear_kernel_matches_naive_twin(
    inputs: tuple[np.ndarray, tuple[np.ndarray, ...], np.ndarray, list[np.ndarray]], base_weight: float, normalize: bool
) -> None:
    raw_base, raw_agents, base, agents = inputs
    w0 = np.float32(base_weight)
    expected = np.empty(LENGTH, np.float32)
    divisor = np.float32(Z + w0)
    for w in WEIGHTS:
        divisor = np.float32(divisor + w)
    for i in range(LENGTH):
        total = np.float32(Z + w0 * base[i]) if w0 != 0 else Z
        for t in range(N):
            total = np.float32(total + WEIGHTS[t] * agents[t][i])
        expected[i] = np.float32(total / divisor) if normalize else total
    out = np.empty(LENGTH, np.uint16)
    codes = np.full(N, BF16, np.int64)
    assert merge_linear_block(raw_base, BF16, w0, at(raw_agents), codes, WEIGHTS, normalize, out, BF16, 2) == -1
    np.testing.assert_array_equal(out, f32_to_bf16(expected))


def _grouped_exact(values: list[float]) -> float:
    """Groups of 64 summed in float64 in order, then exactly; rounded once."""
    total = Fraction(0)
    for g in range(0, len(values), 64):
        s = 0.0
        for v in values[g : g + 64]:
            s += v
        total += Fraction(s)
    return float(total)


@pytest.mark.parametrize("workers", [1, 3])
def test_exact_sum_kernels_match_fractions(
    inputs: tuple[np.ndarray, tuple[np.ndarray, ...], np.ndarray, list[np.ndarray]], workers: int
) -> None:
    raw_base, raw_agents, base, agents = inputs
    codes = np.full(N, BF16, np.int64)
    start = 64 * 5
    keys = np.array([stream_key(2, t, "w") for t in range(N)], np.uint64)
    density = np.array([0.5, 0.3, 1.0, 0.7, 0.2], np.float32)
    acc = np.zeros((workers, N, 2, BINS + 1), np.int64)
    nonfinite = np.empty(workers, np.int64)
    abs_sums_block(
        raw_base,
        BF16,
        at(raw_agents),
        codes,
        KEEP_RANDOM,
        keys,
        density,
        start,
        NO_KEEP,
        False,
        acc,
        nonfinite,
    )
    sums = np.asarray(reduce_workers(acc)).reshape(N, 2, BINS + 1)
    assert (nonfinite == -1).all()
    taus = [np.abs(a - base).astype(np.float64) for a in agents]
    for t in range(N):
        kept = uniforms(keys[t], start, LENGTH) < density[t]
        assert finish(sums[t, 0]) == _grouped_exact(taus[t].tolist())
        assert finish(sums[t, 1]) == _grouped_exact(np.where(kept, taus[t], 0.0).tolist())
    # The same sums over a keep mask (magnitude ranks, DELLA): here, every third element of agent t
    # from offset t.
    mask = np.zeros((N, LENGTH), np.uint8)
    for t in range(N):
        mask[t, t::3] = 1
    acc = np.zeros((workers, N, 2, BINS + 1), np.int64)
    no_keys, no_density = NO_KEYS, NO_DENSITY
    abs_sums_block(
        raw_base, BF16, at(raw_agents), codes, KEEP_ARRAY, no_keys, no_density, 0, mask, False, acc, nonfinite
    )
    sums = np.asarray(reduce_workers(acc)).reshape(N, 2, BINS + 1)
    for t in range(N):
        assert finish(sums[t, 0]) == _grouped_exact(taus[t].tolist())
        assert finish(sums[t, 1]) == _grouped_exact(np.where(mask[t] != 0, taus[t], 0.0).tolist())
    pairs = [(a, b) for a in range(N) for b in range(a, N)]
    acc = np.zeros((workers, len(pairs), BINS + 1), np.int64)
    gram_block(raw_base, BF16, at(raw_agents), codes, False, acc, nonfinite)
    gram = np.asarray(reduce_workers(acc))
    signed = [(a - base).astype(np.float64) for a in agents]
    for k, (a, b) in enumerate(pairs):
        assert finish(gram[k]) == _grouped_exact((signed[a] * signed[b]).tolist())
    # over the weights themselves, the base first
    weights = [base.astype(np.float64), *(a.astype(np.float64) for a in agents)]
    pairs = [(a, b) for a in range(N + 1) for b in range(a, N + 1)]
    acc = np.zeros((workers, len(pairs), BINS + 1), np.int64)
    gram_block(raw_base, BF16, at(raw_agents), codes, True, acc, nonfinite)
    gram = np.asarray(reduce_workers(acc))
    for k, (a, b) in enumerate(pairs):
        assert finish(gram[k]) == _grouped_exact((weights[a] * weights[b]).tolist())


def test_exact_sums_add_across_blocks(
    inputs: tuple[np.ndarray, tuple[np.ndarray, ...], np.ndarray, list[np.ndarray]],
) -> None:
    """Partials of two blocks (split at a multiple of 64) add up to the whole's total."""
    raw_base, raw_agents, _, _ = inputs
    codes = np.full(N, BF16, np.int64)
    pairs = N * (N + 1) // 2

    def partial(lo: int, hi: int) -> np.ndarray:
        acc = np.zeros((2, pairs, BINS + 1), np.int64)
        part = tuple(_readonly(a[lo:hi]) for a in raw_agents)
        gram_block(_readonly(raw_base[lo:hi]), BF16, at(part), codes, False, acc, np.empty(2, np.int64))
        return np.asarray(reduce_workers(acc))

    whole = partial(0, LENGTH)
    split = partial(0, 640) + partial(640, LENGTH)
    for k in range(pairs):
        assert finish(split[k]) == finish(whole[k])


def test_exact_sum_kernels_flag_nonfinite(
    inputs: tuple[np.ndarray, tuple[np.ndarray, ...], np.ndarray, list[np.ndarray]],
) -> None:
    raw_base, raw_agents, _, _ = inputs
    agents = list(raw_agents)
    bad = agents[2].copy()
    bad[[1500, 700]] = 0x7FC0  # bf16 NaN
    agents[2] = _readonly(bad)
    acc = np.zeros((2, N * (N + 1) // 2, BINS + 1), np.int64)
    nonfinite = np.empty(2, np.int64)
    gram_block(raw_base, BF16, at(agents), np.full(N, BF16, np.int64), False, acc, nonfinite)
    assert nonfinite[nonfinite >= 0].min() == 700


# -- one read per block: the merges report NaN/Inf inputs, DELLA prunes inside its merge ---------


def _gta_call(raw_base: np.ndarray, raw_agents: tuple[np.ndarray, ...], outs: list[np.ndarray], workers: int) -> int:
    density = np.full(N, 0.5, np.float32)
    keys = np.arange(1, N + 1, dtype=np.uint64)
    found = gta.gta_merge_block(
        raw_base, BF16, at(raw_agents), np.full(N, BF16, np.int64), WEIGHTS, SCALE, KEEP_RANDOM, NO_KEEP,
        keys, density, 0, NO_CUT_VALUE, NO_CUT_RANGE, gta.CONSENSUS_SUM, True,
        np.ones(len(outs), np.float32), np.array([o.ctypes.data for o in outs], np.int64), BF16, workers,
    )  # fmt: skip
    return int(found)


@pytest.mark.parametrize("workers", [1, 3])
@pytest.mark.parametrize(
    "where",
    [
        [("base", 2000, np.nan)],
        [("agent2", TILE + 3, np.inf)],
        [("agent0", 1500, -np.inf), ("base", 1499, np.nan), ("agent4", 7, np.inf)],
        [("agent1", LENGTH - 1, np.nan)],
    ],
)
def test_merges_report_their_first_nonfinite_input(
    inputs: tuple[np.ndarray, tuple[np.ndarray, ...], np.ndarray, list[np.ndarray]],
    workers: int,
    where: list[tuple[str, int, float]],
) -> None:
    """GTA, DELLA and linear merges find NaN/Inf while they merge (no second read): the lowest
    position over every input, whatever the thread count."""
    _, _, base, agents = inputs
    base, agents = base.copy(), [a.copy() for a in agents]
    for who, position, value in where:
        (base if who == "base" else agents[int(who[-1])])[position] = value
    raw_base = _readonly(f32_to_bf16(base))
    raw_agents = tuple(_readonly(f32_to_bf16(a)) for a in agents)
    codes = np.full(N, BF16, np.int64)
    first = min(position for _, position, _ in where)
    out = np.empty(LENGTH, np.uint16)
    assert _gta_call(raw_base, raw_agents, [out], workers) == first
    assert merge_linear_block(raw_base, BF16, Z, at(raw_agents), codes, WEIGHTS, False, out, BF16, workers) == first
    mode, lo, width = np.zeros(N, np.int64), np.full(N, 0.3, np.float32), np.full(N, 0.2, np.float32)
    found = della_merge_block(
        raw_base, BF16, at(raw_agents), codes, 0, LENGTH, LENGTH, np.arange(N, dtype=np.uint64), mode, lo, width,
        False, WEIGHTS, SCALE, gta.CONSENSUS_SUM, True, np.ones(1, np.float32),
        np.array([out.ctypes.data], np.int64), BF16, workers,
    )  # fmt: skip
    assert found == first


@pytest.mark.parametrize(
    ("slices", "rows", "inner", "inverse", "consensus"),
    [
        (7, 40, 3, False, gta.CONSENSUS_SUM),
        (2, 1500, 3, True, gta.CONSENSUS_NONE),
        (1, 5000, 1, False, gta.CONSENSUS_SUM),
        (9, 1, 4, True, gta.CONSENSUS_SUM),
    ],
)
def test_della_merge_is_its_keep_then_the_gta_merge(
    slices: int, rows: int, inner: int, inverse: bool, consensus: int
) -> None:
    """Pruning inside the merge (a slice at a time, in cache) gives the bytes of the keep array
    written by ``della_keep`` and merged by ``gta_merge_block``: for every slice shape, with slices
    longer than a tile, one row, one slice, and agents kept or dropped whole."""
    rng = np.random.default_rng(slices * rows)
    n = slices * rows * inner
    base = bf16_to_f32(f32_to_bf16(rng.standard_normal(n).astype(np.float32)))
    agents = [
        bf16_to_f32(
            f32_to_bf16(np.where(rng.random(n) < 0.5, base + rng.standard_normal(n).astype(np.float32) * 0.01, base))
        )
        for _ in range(N)
    ]
    raw_base = _readonly(f32_to_bf16(base))
    raw_agents = tuple(_readonly(f32_to_bf16(a)) for a in agents)
    codes = np.full(N, BF16, np.int64)
    keys = np.array([stream_key(3, t, "della") for t in range(N)], np.uint64)
    mode = np.array([0, 0, 1, 2, 0], np.int64)  # prune, prune, keep all, drop all, prune
    lo, width = np.array([0.2, 0.5, 0.1, 0.1, 0.7], np.float32), np.full(N, 0.2, np.float32)
    start = 5 * slices * rows * inner
    lams = np.array([1.0, 0.5], np.float32)
    for workers in (1, 3):
        keep = np.empty((N, n), np.float32)
        della_keep(
            raw_base,
            BF16,
            at(raw_agents),
            codes,
            start,
            rows * inner,
            rows,
            keys,
            mode,
            lo,
            width,
            inverse,
            keep,
            workers,
        )
        want = [np.empty(n, np.uint16) for _ in lams]
        gta.gta_merge_block(
            raw_base, BF16, at(raw_agents), codes, WEIGHTS, SCALE, KEEP_ARRAY, keep, NO_KEYS, NO_DENSITY, 0,
            NO_CUT_VALUE, NO_CUT_RANGE, consensus, True, lams, np.array([o.ctypes.data for o in want], np.int64),
            BF16, workers,
        )  # fmt: skip
        got = [np.empty(n, np.uint16) for _ in lams]
        found = della_merge_block(
            raw_base, BF16, at(raw_agents), codes, start, rows * inner, rows, keys, mode, lo, width, inverse,
            WEIGHTS, SCALE, consensus, True, lams, np.array([o.ctypes.data for o in got], np.int64), BF16, workers,
        )  # fmt: skip
        assert found == -1
        for g, w in zip(got, want, strict=True):
            np.testing.assert_array_equal(g, w)
