"""Every kernel against a slow, obviously-correct twin written here with numpy and Python loops.

Inputs are typed the way the passes hand them to the kernels (read-only raw carriers, a tuple of
agents in one carrier; for the kernels that read their own tiles, a real file and its
descriptors), so these calls reuse the compiled signatures of the real runs.
"""

from __future__ import annotations

import os
from collections.abc import Callable, Iterator, Sequence
from pathlib import Path

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from ramstream.backends.numba.codecs import BF16, F16, F32, F64, TILE, decode_array, encode_array
from ramstream.backends.numba.lora import lora_product
from ramstream.backends.numba.merge_ram import merge_ram_block
from ramstream.backends.numba.probe import flat_rows, probe_block
from ramstream.backends.numba.sources import READ_TILE
from ramstream.blocks.lora import numpy_product
from tests.families import bf16_to_f32, f32_to_bf16

CODES = {"BF16": BF16, "F16": F16, "F32": F32, "F64": F64}
LENGTHS = [1, 7, 61, TILE - 1, TILE, TILE + 1, 2 * TILE + 37]
Sources = tuple[np.ndarray, np.ndarray, np.ndarray]  # fds, offsets, codes: what the spine kernels read


def _readonly(array: np.ndarray) -> np.ndarray:
    array = np.ascontiguousarray(array)
    array.setflags(write=False)
    return array


def raw_of(values: np.ndarray, dtype: str) -> np.ndarray:
    """float32 values -> the read-only raw carrier the reader hands to kernels."""
    values = np.asarray(values, np.float32)
    if dtype == "BF16":
        return _readonly(f32_to_bf16(values))
    if dtype == "F16":
        return _readonly(values.astype(np.float16).view(np.uint16))
    return _readonly(values.astype(np.float32 if dtype == "F32" else np.float64))


def naive_decode(raw: np.ndarray, dtype: str) -> np.ndarray:
    if dtype == "BF16":
        return bf16_to_f32(raw)
    if dtype == "F16":
        return raw.view(np.float16).astype(np.float32)
    return raw.astype(np.float32)


def naive_encode(values: np.ndarray, dtype: str) -> np.ndarray:
    if dtype == "BF16":
        return f32_to_bf16(values)
    if dtype == "F16":
        return values.astype(np.float16).view(np.uint16)
    return values.astype(np.float32)


def bits32(values: np.ndarray) -> np.ndarray:
    return np.ascontiguousarray(values, np.float32).view(np.uint32)


# -- codecs ----------------------------------------------------------------------------------


@pytest.mark.parametrize("dtype", ["BF16", "F16"])
def test_decode_every_16_bit_pattern(dtype: str) -> None:
    raw = _readonly(np.arange(1 << 16, dtype=np.uint32).astype(np.uint16))
    got = decode_array(raw, CODES[dtype])
    expected = naive_decode(raw, dtype)
    # bit for bit, NaN payloads and signed zeros included
    np.testing.assert_array_equal(bits32(got), bits32(expected))


def test_decode_f32_is_the_identity_on_bits() -> None:
    rng = np.random.default_rng(0)
    pattern = rng.integers(0, 1 << 32, 50_000, dtype=np.uint64).astype(np.uint32)
    edges = np.array([0, 0x80000000, 0x7F800000, 0xFF800000, 0x7FC00000, 0x00000001, 0x7F7FFFFF], np.uint32)
    raw = _readonly(np.concatenate([pattern, edges]).view(np.float32))
    got = decode_array(raw, F32)
    finite = np.isfinite(raw)
    np.testing.assert_array_equal(bits32(got)[finite], raw.view(np.uint32)[finite])
    np.testing.assert_array_equal(np.isnan(got), np.isnan(raw))
    np.testing.assert_array_equal(np.signbit(got), np.signbit(raw))


def test_decode_f64_rounds_like_numpy() -> None:
    rng = np.random.default_rng(1)
    values = np.concatenate(
        [
            rng.standard_normal(20_000) * 10.0 ** rng.integers(-45, 40, 20_000),
            rng.integers(0, 1 << 63, 5_000, dtype=np.uint64).view(np.float64),
            [0.0, -0.0, np.inf, -np.inf, np.nan, 3.4028235e38, 3.4028236e38, 1e300, 1e-46, 7e-46, 1.0 + 2.0**-24],
        ]
    )
    raw = _readonly(values.astype(np.float64))
    got = decode_array(raw, F64)
    with np.errstate(over="ignore", invalid="ignore"):
        expected = raw.astype(np.float32)
    nan = np.isnan(expected)
    np.testing.assert_array_equal(np.isnan(got), nan)
    np.testing.assert_array_equal(bits32(got)[~nan], bits32(expected)[~nan])


def _encode_inputs() -> np.ndarray:
    rng = np.random.default_rng(2)
    random_bits = rng.integers(0, 1 << 32, 200_000, dtype=np.uint64).astype(np.uint32)
    # every exponent near the f16 range, with mantissas that sit on and around rounding ties
    exps = np.arange(100, 150, dtype=np.uint32) << np.uint32(23)
    mants = np.array(
        [0, 1, 0xFFF, 0x1000, 0x1001, 0x2000, 0x3000, 0x7FFF, 0x8000, 0x8001, 0x18000, 0x7FFFFF], np.uint32
    )
    ties = (exps[:, None] | mants[None, :]).ravel()
    edges = np.array(
        [
            0x00000000, 0x80000000, 0x00000001, 0x807FFFFF, 0x3F800000, 0x3F808000, 0x3F818000, 0x3F80FFFF,
            0x7F7FFFFF, 0xFF7FFFFF, 0x7F7F8000, 0x7F800000, 0xFF800000,
            0x477FE000, 0x477FEFFF, 0x477FF000, 0x477FF001, 0x38800000, 0x387FFFFF, 0x387FF000,
            0x33800000, 0x33000000, 0x33000001, 0x33C00000, 0x34400000, 0xB3000000, 0xB3000001,
        ],
        np.uint32,
    )  # fmt: skip
    both = np.concatenate([random_bits, ties, ties | np.uint32(0x80000000), edges])
    return both.view(np.float32)


def test_encode_bf16_matches_the_reference_rounding() -> None:
    values = _readonly(_encode_inputs())
    out = np.empty(values.size, np.uint16)
    encode_array(values, BF16, out)
    np.testing.assert_array_equal(out, f32_to_bf16(values))


def test_encode_f16_matches_numpy() -> None:
    values = _readonly(_encode_inputs())
    out = np.empty(values.size, np.uint16)
    encode_array(values, F16, out)
    with np.errstate(over="ignore", invalid="ignore"):
        expected = values.astype(np.float16).view(np.uint16)
    nan = np.isnan(values)
    np.testing.assert_array_equal(out[~nan], expected[~nan])
    # NaN stays NaN with its sign; a quiet NaN keeps numpy's bits exactly (a signalling NaN is
    # quieted, as the hardware conversion does, where numpy sets the lowest mantissa bit)
    got = out.view(np.float16)
    assert np.isnan(got[nan]).all()
    np.testing.assert_array_equal(np.signbit(got[nan]), np.signbit(values[nan]))
    quiet = nan & ((values.view(np.uint32) & np.uint32(0x00400000)) != 0)
    np.testing.assert_array_equal(out[quiet], expected[quiet])


def test_encode_f32_is_the_identity_on_bits() -> None:
    values = _readonly(_encode_inputs())
    out = np.empty(values.size, np.float32)
    encode_array(values, F32, out)
    finite = ~np.isnan(values)
    np.testing.assert_array_equal(bits32(out)[finite], bits32(values)[finite])
    assert np.isnan(out[~finite]).all()


@pytest.mark.parametrize("dtype", ["BF16", "F16"])
@pytest.mark.parametrize("n", LENGTHS)
def test_codec_round_trip_any_length(dtype: str, n: int) -> None:
    """Lengths that are not a multiple of the tile: every element is written, none beyond."""
    rng = np.random.default_rng(n)
    raw = raw_of(rng.standard_normal(n).astype(np.float32), dtype)
    values = decode_array(raw, CODES[dtype])
    assert values.shape == (n,)
    out = np.full(n + 5, 0xABCD, np.uint16)
    encode_array(_readonly(values), CODES[dtype], out)
    np.testing.assert_array_equal(out[:n], raw)
    assert (out[n:] == 0xABCD).all()


@pytest.fixture
def on_disk(tmp_path: Path) -> Iterator[Callable[[Sequence[np.ndarray], Sequence[str]], Sources]]:
    """Write raw inputs into one real file, each at an odd offset, and return kernel sources."""
    fds: list[int] = []

    def write(raws: Sequence[np.ndarray], dtypes: Sequence[str]) -> Sources:
        path = tmp_path / f"inputs-{len(fds)}.bin"
        offsets = []
        with open(path, "wb") as f:
            for raw in raws:
                f.write(b"\xee" * 3)  # no alignment is promised: a header can have any length
                offsets.append(f.tell())
                f.write(np.ascontiguousarray(raw).tobytes())
        fds.append(os.open(path, os.O_RDONLY))
        n = len(raws)
        return np.full(n, fds[-1], np.int64), np.array(offsets, np.int64), np.array([CODES[d] for d in dtypes])

    yield write
    for fd in fds:
        os.close(fd)


# -- family values for the block kernels ------------------------------------------------------


def block_inputs(
    n: int, dtypes: tuple[str, ...], seed: int, eps: float
) -> tuple[np.ndarray, tuple[np.ndarray, ...], list[np.ndarray]]:
    """A base and agents whose task vectors overlap at every level 0..N, plus eps boundary cases.

    Returns the raw base, the raw agents (one tuple, one carrier) and the decoded float32 agents.
    """
    base_dtype, agent_dtypes = dtypes[0], dtypes[1:]
    rng = np.random.default_rng(seed)
    base_f = naive_decode(raw_of(rng.standard_normal(n).astype(np.float32) * np.float32(0.05), base_dtype), base_dtype)
    base_f = base_f.copy()
    eps32 = np.float32(eps)
    edge = rng.random(n) < 0.05  # where the base is 0 and agents sit on or next to eps
    base_f[edge] = 0.0
    base_raw = raw_of(base_f, base_dtype)
    agents_raw = []
    for t, dtype in enumerate(agent_dtypes):
        mask = rng.random(n) < (0.2, 0.5, 0.7, 0.35)[t % 4]
        delta = rng.standard_normal(n).astype(np.float32) * np.float32(0.01)
        values = np.where(mask, base_f + delta, base_f).astype(np.float32)
        on_eps = rng.choice(
            np.array([eps32, -eps32, np.nextafter(eps32, np.float32(1)), -np.nextafter(eps32, np.float32(1))]), n
        )
        values[edge] = np.where(rng.random(n) < 0.5, on_eps, np.float32(0.0))[edge]
        agents_raw.append(raw_of(values, dtype))
    decoded = [naive_decode(a, d) for a, d in zip(agents_raw, agent_dtypes, strict=True)]
    return base_raw, tuple(agents_raw), decoded


def naive_masks(base_f: np.ndarray, agents_f: list[np.ndarray], eps: float) -> np.ndarray:
    eps32 = np.float32(eps)
    taus = [(a - base_f).astype(np.float32) for a in agents_f]
    return np.array([(np.abs(tau) > eps32) & np.isfinite(tau) for tau in taus], dtype=bool)


BLOCK_CASES = [
    # (base dtype, agent dtypes...), eps
    (("BF16", "BF16", "BF16", "BF16"), 1e-5),
    (("BF16", "BF16", "F16", "BF16"), 2.0**-10),
    (("F32", "F32", "F32", "F32"), 1e-5),
    (("BF16", "F32", "F32", "F32"), 1e-3),
    (("F16", "BF16", "BF16", "BF16"), 0.0),
    (("F32", "BF16", "F64", "F16"), 1e-5),  # read from files, agents need not share a carrier
]


# -- probe ------------------------------------------------------------------------------------


@pytest.mark.parametrize(("dtypes", "eps"), BLOCK_CASES)
@pytest.mark.parametrize("n", [7, TILE + 1, 2 * TILE + 37, 2 * READ_TILE + TILE + 5])
@pytest.mark.parametrize("workers", [1, 2, 3])
def test_probe_block_matches_naive(
    dtypes: tuple[str, ...], eps: float, n: int, workers: int, on_disk: Callable[..., Sources]
) -> None:
    base_raw, agents_raw, agents_f = block_inputs(n, dtypes, seed=n + workers, eps=eps)
    base_f = naive_decode(base_raw, dtypes[0])
    n_agents = len(agents_raw)
    n_bytes = (n + 7) // 8
    masks = np.full((n_agents, n_bytes + 3), 0xEE, np.uint8)
    overlap = np.zeros((workers, n_agents, n_agents), np.int64)
    coverage = np.zeros((workers, n_agents + 1), np.int64)
    nonfinite = np.full(workers, -7, np.int64)
    failed = np.full(workers, -7, np.int64)
    probe_block(*on_disk([base_raw, *agents_raw], dtypes), n, eps, masks, overlap, coverage, nonfinite, failed)
    assert (failed == -1).all()

    expected = naive_masks(base_f, agents_f, eps)
    c = expected.sum(axis=0)
    if n > 100:
        assert (c == 0).any() and (c == 1).any() and (c >= 2).any()
    np.testing.assert_array_equal(masks[:, :n_bytes], np.packbits(expected, axis=1, bitorder="little"))
    assert (masks[:, n_bytes:] == 0xEE).all()  # nothing written past the block's bytes
    np.testing.assert_array_equal(np.unpackbits(masks[:, :n_bytes], axis=1, count=n, bitorder="little"), expected)
    naive_overlap = np.array(
        [[np.count_nonzero(expected[t] & (c == k)) for k in range(1, n_agents + 1)] for t in range(n_agents)]
    )
    naive_coverage = np.array([np.count_nonzero(c == k) for k in range(n_agents + 1)])
    np.testing.assert_array_equal(overlap.sum(axis=0), naive_overlap)
    np.testing.assert_array_equal(coverage.sum(axis=0), naive_coverage)
    assert (nonfinite == -1).all()


def test_probe_eps_is_strict(on_disk: Callable[..., Sources]) -> None:
    """|tau| == eps is inactive, the next float up is active (compared in float32)."""
    eps = 1e-5
    eps32 = np.float32(eps)
    above = np.nextafter(eps32, np.float32(1))
    base = raw_of(np.zeros(8, np.float32), "F32")
    agent_values = [
        np.array([eps32, -eps32, above, -above, 0, 0, 0, 0], np.float32),
        np.array([0, 0, 0, 0, eps32, above, -eps32, -above], np.float32),
        np.array([above, 0, 0, 0, 0, 0, 0, 0], np.float32),
    ]
    agents = tuple(raw_of(a, "F32") for a in agent_values)
    masks = np.zeros((3, 1), np.uint8)
    overlap = np.zeros((1, 3, 3), np.int64)
    coverage = np.zeros((1, 4), np.int64)
    nonfinite = np.full(1, -1, np.int64)
    failed = np.full(1, -1, np.int64)
    probe_block(*on_disk([base, *agents], ["F32"] * 4), 8, eps, masks, overlap, coverage, nonfinite, failed)
    assert list(masks[:, 0]) == [0b00001100, 0b10100000, 0b00000001]
    np.testing.assert_array_equal(coverage[0], [3, 5, 0, 0])


@pytest.mark.parametrize("workers", [1, 2, 3])
@pytest.mark.parametrize(
    ("where", "value"),
    [
        ([("base", 4000)], np.nan),
        ([("agent2", 4097)], np.inf),
        ([("agent0", 3000), ("base", 2500)], -np.inf),
        ([("agent1", 2047), ("agent2", 2046), ("base", 9)], np.nan),
        ([("agent0", 0)], np.nan),
        ([("agent2", 2 * TILE + 36)], -np.inf),
    ],
)
def test_probe_reports_first_nonfinite(
    workers: int, where: list[tuple[str, int]], value: float, on_disk: Callable[..., Sources]
) -> None:
    n = 2 * TILE + 37
    rng = np.random.default_rng(3)
    base_f = rng.standard_normal(n).astype(np.float32)
    agents_f = [base_f + np.float32(0.01) * rng.standard_normal(n).astype(np.float32) for _ in range(3)]
    for who, pos in where:
        (base_f if who == "base" else agents_f[int(who[-1])])[pos] = value
    base = raw_of(base_f, "BF16")
    agents = tuple(raw_of(a, "BF16") for a in agents_f)
    masks = np.zeros((3, (n + 7) // 8), np.uint8)
    overlap = np.zeros((workers, 3, 3), np.int64)
    coverage = np.zeros((workers, 4), np.int64)
    nonfinite = np.full(workers, -7, np.int64)
    failed = np.full(workers, -7, np.int64)
    sources = on_disk([base, *agents], ["BF16"] * 4)
    probe_block(*sources, n, 1e-5, masks, overlap, coverage, nonfinite, failed)
    first = min(pos for _, pos in where)
    merged = np.full(workers, -7, np.int64)  # the RAM merge finds them too, in the same read
    out = np.empty(n, np.uint16)
    merge_ram_block(*sources, n, 1e-5, np.ones((1, 3), np.float32), addresses(out), BF16, failed, merged)
    for found_by in (nonfinite, merged):
        found = found_by[found_by >= 0]
        assert found.size >= 1 and found.min() == first
        assert set(found.tolist()) <= {pos for _, pos in where}
        assert ((found_by >= 0) | (found_by == -1)).all()


def test_a_nonfinite_tau_is_inactive(on_disk: Callable[..., Sources]) -> None:
    """Inf/NaN in an agent, and a finite difference that overflows float32, are not active: the
    probe does not count them and RAM does not add them (the Backend contract)."""
    big = np.float32(3e38)
    base_f = np.array([0, 0, 0, big, 0, 0, 0, 0], np.float32)
    agent_values = [
        np.array([np.inf, -np.inf, np.nan, -big, 0.5, 0, 0, 0], np.float32),  # tau: Inf, -Inf, NaN, -Inf
        np.array([0.25, 0.25, 0.25, big, 0.25, 0, 0, 0], np.float32),
    ]
    base = raw_of(base_f, "F32")
    agents = tuple(raw_of(a, "F32") for a in agent_values)
    masks = np.zeros((2, 1), np.uint8)
    overlap = np.zeros((1, 2, 2), np.int64)
    coverage = np.zeros((1, 3), np.int64)
    nonfinite = np.full(1, -1, np.int64)
    failed = np.full(1, -1, np.int64)
    sources = on_disk([base, *agents], ["F32"] * 3)
    probe_block(*sources, 8, 1e-5, masks, overlap, coverage, nonfinite, failed)
    assert list(masks[:, 0]) == [0b00010000, 0b00010111]
    np.testing.assert_array_equal(coverage[0], [4, 3, 1])
    assert nonfinite[0] == 0
    out = np.zeros(8, np.float32)
    lambdas = np.array([[2.0, 2.0]], np.float32)
    merge_ram_block(*sources, 8, 1e-5, lambdas, addresses(out), CODES["F32"], failed, nonfinite)
    np.testing.assert_array_equal(out, [0.5, 0.5, 0.5, big, 0.375, 0, 0, 0])
    assert nonfinite[0] == 0  # the merge reports the Inf input as the probe does


# -- merge --------------------------------------------------------------------------------------


def addresses(*outs: np.ndarray) -> np.ndarray:
    """The kernel's output argument: each output's address (the caller keeps the arrays alive)."""
    return np.array([o.ctypes.data for o in outs], np.int64)


def naive_merge(
    base_f: np.ndarray, agents_f: list[np.ndarray], eps: float, lambdas: np.ndarray, out_dtype: str
) -> np.ndarray:
    """One element at a time, straight from the spec, in float32 scalars."""
    eps32 = np.float32(eps)
    out = np.empty(base_f.size, np.float32)
    for i in range(base_f.size):
        b = base_f[i]
        total, count, only = np.float32(0.0), 0, np.float32(0.0)
        for t, agent in enumerate(agents_f):
            tau = np.float32(agent[i] - b)
            if eps32 < abs(tau) < np.inf:  # a NaN/Inf tau is inactive
                total = np.float32(total + tau)
                count += 1
                only = np.float32(lambdas[t] * tau)
        if count == 0:
            merged = np.float32(0.0)
        elif count == 1:
            merged = only
        else:
            merged = np.float32(total / np.float32(count))
        out[i] = np.float32(b + merged)
    return naive_encode(out, out_dtype)


@pytest.mark.parametrize(("dtypes", "eps"), BLOCK_CASES)
@pytest.mark.parametrize(
    ("n", "workers", "out_dtype"),
    [
        (7, 2, "BF16"),
        (TILE + 1, 3, "F16"),
        (2 * TILE + 37, 2, "F32"),
        (2 * TILE + 37, 1, "BF16"),
        (2 * READ_TILE + TILE + 5, 3, "BF16"),
    ],
)
def test_merge_ram_block_matches_naive(
    dtypes: tuple[str, ...], eps: float, n: int, workers: int, out_dtype: str, on_disk: Callable[..., Sources]
) -> None:
    """One read, three outputs (a sweep's RAM candidates): each is the naive merge with its lambdas."""
    base_raw, agents_raw, agents_f = block_inputs(n, dtypes, seed=2 * n + workers, eps=eps)
    base_f = naive_decode(base_raw, dtypes[0])
    lambdas = np.array([[1.2, 1.0703918, 1.5], [1.0, 1.0, 1.0], [2.5, 0.3, 1.1]], np.float32)
    carrier = np.float32 if out_dtype == "F32" else np.uint16
    outs = [np.full(n + 9, 77, carrier) for _ in lambdas]
    failed = np.full(workers, -7, np.int64)
    sources = on_disk([base_raw, *agents_raw], dtypes)
    nonfinite = np.full(workers, -7, np.int64)
    merge_ram_block(*sources, n, eps, lambdas, addresses(*outs), CODES[out_dtype], failed, nonfinite)
    assert (failed == -1).all() and (nonfinite == -1).all()
    for out, row in zip(outs, lambdas, strict=True):
        expected = naive_merge(base_f, agents_f, eps, row, out_dtype)
        bad = np.flatnonzero(out[:n].view(np.uint8).reshape(n, -1) != expected.view(np.uint8).reshape(n, -1))
        assert bad.size == 0, f"{bad.size} elements differ, first at {bad[:5]}"
        assert (out[n:] == 77).all()


@pytest.mark.parametrize("workers", [1, 3])
def test_spine_kernels_report_a_file_that_ends_early(workers: int, on_disk: Callable[..., Sources]) -> None:
    """A file cut short after its header was checked (it changed under us): the input is named."""
    n = 2 * READ_TILE + 11
    base_raw, agents_raw, _ = block_inputs(n, ("BF16",) * 4, seed=5, eps=1e-5)
    fds, offsets, codes = on_disk([base_raw, *agents_raw], ["BF16"] * 4)
    os.truncate(f"/proc/self/fd/{fds[0]}", int(offsets[3]) + 2 * n - 4)  # the last agent loses 2 elements
    failed = np.full(workers, -7, np.int64)
    masks = np.zeros((3, (n + 7) // 8), np.uint8)
    nonfinite = np.full(workers, -1, np.int64)
    overlap, coverage = np.zeros((workers, 3, 3), np.int64), np.zeros((workers, 4), np.int64)
    probe_block(fds, offsets, codes, n, 1e-5, masks, overlap, coverage, nonfinite, failed)
    assert failed[-1] == 3 and set(failed.tolist()) <= {-1, 3}
    failed[:] = -7
    out = np.zeros(n, np.uint16)
    merge_ram_block(fds, offsets, codes, n, 1e-5, np.ones((1, 3), np.float32), addresses(out), BF16, failed, nonfinite)
    assert failed[-1] == 3 and set(failed.tolist()) <= {-1, 3}


@settings(max_examples=40, deadline=None)
@given(
    rows=st.integers(1, 9),
    rank=st.integers(0, 70),
    cols=st.integers(1, 2500),
    seed=st.integers(0, 2**32 - 1),
    scale=st.floats(0.125, 64.0, width=32),
)
def test_the_numba_lora_product_writes_numpys_bits(rows: int, rank: int, cols: int, seed: int, scale: float) -> None:
    """A LoRA update per element: float32 products added in k order, then scaled; the parallel,
    column-tiled kernel may not round differently (no fused multiply-add, no reordering)."""
    rng = np.random.default_rng(seed)
    left = (rng.standard_normal((rows, rank)) * 0.1).astype(np.float32)
    right = (rng.standard_normal((rank, cols)) * 0.1).astype(np.float32)
    want, got = np.zeros(rows * cols, np.float32), np.zeros(rows * cols, np.float32)
    numpy_product(left, right, np.float32(scale), want)
    lora_product(left, right, np.float32(scale), got)
    np.testing.assert_array_equal(got.view(np.uint32), want.view(np.uint32))


def test_masks_are_one_flat_run_of_bytes_whatever_their_layout() -> None:
    """The probe kernel takes the masks (agents, bytes) as one flat run and a row stride: a column
    range of a wider buffer, the whole buffer and a single row are one Numba type (one compile)."""
    buffer = np.arange(5 * 40, dtype=np.uint8).reshape(5, 40)
    for rows in (buffer[:, 8:24], buffer, buffer[2:3, 8:24], buffer[:, 39:]):
        flat, stride = flat_rows(rows)
        assert flat.flags.c_contiguous and flat.flags.writeable and flat.ndim == 1
        for t in range(rows.shape[0]):
            np.testing.assert_array_equal(flat[t * stride : t * stride + rows.shape[1]], rows[t])
        assert flat.size == (rows.shape[0] - 1) * stride + rows.shape[1]
    with pytest.raises(ValueError, match="contiguous rows"):
        flat_rows(buffer[:, ::2])
