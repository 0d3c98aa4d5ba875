"""DELLA's MAGPRUNE (arXiv 2406.11617, as mergekit's ``della_magprune``): keep probabilities from
magnitude ranks within a row, and a counter-RNG draw per element.

The arrays hold whole slices along dim 0 (``slice_size`` elements each) of a tensor whose slices
are ``rows x inner`` (shape[1] and the product of the dimensions after it; a 1-D tensor is one
slice of ``rows = numel`` and ``inner = 1``). As ``torch.argsort(|tau|, dim=1)``,
the elements ranked together are those of one slice that share their index along the dimensions
after dim 1: ``slice_start + j * inner + k`` for j < rows. Per such group of ``rows`` elements:

    rank_j    = position of element j in the stable ascending order of |tau| (ties: lower index first)
    rank_norm = f32(rank_j) / f32(rows - 1)          (0.5 when rows == 1: p = density)
    p_j       = lo_t + rank_norm * width_t           (lo_t = f32(density - epsilon), width_t = f32(2 epsilon))
    keep_j    = uniform(keys[t], start + index_j) < p_j

all in float32, with ``counter_rng.uniform`` keyed by (seed, agent, tensor) and the element's
flat index in the tensor, so a decision never depends on the block split or the thread count.

``keep[t, i]`` receives 0 for a dropped element and, for a kept one, 1 (``inverse`` false) or
f32(1) / p (``inverse`` true: the paper's 1/p rescale). ``mode[t]``: 0 = prune as above,
1 = keep every element (density >= 1), 2 = drop every element (density <= 0).

``della_merge_block`` fuses the pruning with the GTA merge (``gta.merge_tile``): a slice is
pruned into a thread's own keep rows and merged while it is in cache, so a DELLA merge reads
each input once per block and never writes the (N, n) keep array. Without the 1/p rescale it
sorts little: p is monotone in the rank, so bounds on an element's rank (a histogram of the keys)
decide most draws, and only the few that fall between them are ranked exactly.
"""

from __future__ import annotations

import numpy as np
from numba import njit

from ramstream.backends.base import KEEP_EVERYTHING as KEEP_ALL
from ramstream.backends.base import PRUNE
from ramstream.backends.numba.codecs import TAU32, TILE, address, decode_at
from ramstream.backends.numba.counter_rng import uniform
from ramstream.backends.numba.gta import merge_tile, summed_weight, tile_scratch
from ramstream.backends.numba.keep import KEEP_ARRAY, NO_CUT_RANGE, NO_CUT_VALUE, NO_DENSITY, NO_KEYS
from ramstream.backends.numba.workers import lowest, run_parts

_LOW32 = np.uint64(0xFFFFFFFF)
RADIX_BITS = 11
RADIX = 1 << RADIX_BITS
MAX_UNDECIDED = 64  # draws per group left to the exact rank; beyond them a sort ranks the group
NO_PROBABILITIES = np.empty((0, 0), np.float32)


def della_keep(  # type: ignore[no-untyped-def]
    base, base_code, agents, agent_codes, start, slice_size, rows, keys, mode, lo, width, inverse, keep, workers
) -> None:
    """MAGPRUNE's keep values of a block (whole slices) on ``workers`` threads, into ``keep``."""
    run_parts(
        _della_keep_part, workers, address(base), base.shape[0] // slice_size, base_code, agents, agent_codes, start,
        slice_size, rows, keys, mode, lo, width, inverse, keep,
    )  # fmt: skip


@njit(nogil=True, cache=True, error_model="numpy")
def _della_keep_part(  # type: ignore[no-untyped-def]
    base, n_slices, base_code, agents, agent_codes, start, slice_size, rows, keys, mode, lo, width, inverse, keep,
    w, workers,
):  # fmt: skip
    first, end = n_slices * w // workers, n_slices * (w + 1) // workers
    if first < end:  # idle threads allocate nothing: a 1-D tensor is one (possibly long) row
        _prune_slices(
            base, base_code, agents, agent_codes, start, slice_size, rows, keys, mode, lo, width, inverse, keep,
            first, end,
        )  # fmt: skip


@njit(cache=True, nogil=True, error_model="numpy")
def _prune_slices(  # type: ignore[no-untyped-def]
    base, base_code, agents, agent_codes, start, slice_size, rows, keys, mode, lo, width, inverse, keep, first, end
):
    """Slices [first, end) of the block, by one thread."""
    scratch = prune_scratch(slice_size, rows)
    for s in range(first, end):
        at = s * slice_size
        prune_slice(
            base, base_code, agents, agent_codes, start, at, slice_size, rows, keys, mode, lo, width, inverse, keep,
            at, False, NO_PROBABILITIES, scratch,
        )  # fmt: skip


@njit(cache=True, nogil=True)
def prune_scratch(slice_size, rows):  # type: ignore[no-untyped-def]
    """One thread's buffers for ``prune_slice``."""
    return (
        np.empty((2, slice_size), np.float32),
        np.empty((2, rows), np.int64),
        np.empty(rows, np.uint64),
        np.empty(RADIX, np.int64),
        np.empty(TILE, np.uint32),
        np.empty(2 * RADIX, np.float32),
    )


@njit(cache=True, nogil=True, error_model="numpy")
def prune_slice(  # type: ignore[no-untyped-def]
    base, base_code, agents, agent_codes, start, at, slice_size, rows, keys, mode, lo, width, inverse, keep, keep_at,
    merging, probabilities, scratch,
):  # fmt: skip
    """MAGPRUNE over the slice at block position ``at`` of the base at address ``base`` (``agents``:
    the agents' addresses): ``keep[t, keep_at : keep_at + slice_size]``.

    ``merging``: the keep values go straight into a merge, where an element whose tau is 0
    contributes nothing whether kept or dropped (a zero delta neither adds to a sum nor takes
    part in a sign election): such elements get 0 without a draw, and only the nonzero ones,
    often a small part of a sparse task vector, are drawn; without the 1/p rescale, most draws
    are decided without a sort (``_merge_keep_by_buckets``, with ``probabilities``, the table of
    ``probability_table``). The merged bytes are the same."""
    slices, orders, packed, count, bits, bounds = scratch
    base_slice, agent_slice = slices[0], slices[1]
    work, rank_of = orders[0], orders[1]
    inner = slice_size // rows
    one, zero = np.float32(1.0), np.float32(0.0)
    span = np.float32(rows - 1)
    vals = bits.view(np.float32)
    _decode_range(base, base_code, at, slice_size, bits, vals, base_slice)
    for t in range(len(agents)):
        dst = keep[t, keep_at : keep_at + slice_size]
        if mode[t] != PRUNE:
            value = one if mode[t] == KEEP_ALL else zero
            for i in range(slice_size):
                dst[i] = value
            continue
        _decode_range(agents[t], agent_codes[t], at, slice_size, bits, vals, agent_slice)
        if agent_codes[t] == TAU32:  # a task vector already (codecs.minus)
            for i in range(slice_size):
                agent_slice[i] = abs(agent_slice[i] - zero)
        else:
            for i in range(slice_size):
                agent_slice[i] = abs(agent_slice[i] - base_slice[i])
        magnitude = agent_slice.view(np.uint32)
        key, lo_t, width_t = keys[t], lo[t], width[t]
        for k in range(inner):
            if merging and not inverse and width_t >= zero:
                if _merge_keep_by_buckets(
                    magnitude[k::inner],
                    dst[k::inner],
                    rows,
                    packed,
                    count,
                    bounds,
                    probabilities[t],
                    key,
                    start + at + k,
                    inner,
                ):
                    continue
            # |tau| = 0 (most of a sparse task vector) is the smallest key: those elements take the
            # first ranks in index order, as the stable sort gives them; only the rest is sorted
            zeros, nonzero = 0, 0
            for j in range(rows):  # a compaction without branches (half the elements may be 0)
                b = magnitude[j * inner + k]
                is_zero = np.int64(b == 0)
                rank_of[j] = zeros  # kept for a zero; a nonzero's is set after the sort
                packed[nonzero] = (np.uint64(b) << np.uint64(32)) | np.uint64(j)  # a zero's is overwritten next
                zeros += is_zero
                nonzero += 1 - is_zero
            ordered = sort_pairs(packed[:nonzero], work[:nonzero].view(np.uint64), count)
            if merging:
                for j in range(rows):
                    dst[j * inner + k] = zero
                for r in range(nonzero):
                    i = np.int64(ordered[r] & _LOW32) * inner + k
                    dst[i] = _keep_value(zeros + r, span, rows, lo_t, width_t, inverse, key, start + at + i)
                continue
            for r in range(nonzero):
                rank_of[np.int64(ordered[r] & _LOW32)] = zeros + r
            # in element order (rank_of is the inverse permutation): the loop vectorises
            for j in range(rows):
                i = j * inner + k
                dst[i] = _keep_value(rank_of[j], span, rows, lo_t, width_t, inverse, key, start + at + i)


@njit(inline="always", cache=True, error_model="numpy")
def _keep_value(rank, span, rows, lo_t, width_t, inverse, key, index):  # type: ignore[no-untyped-def]
    """The keep value of the element at tensor position ``index`` ranked ``rank`` in its group:
    p = lo + rank / (rows - 1) * width, then 1 (or 1 / p) where its draw is below p, else 0."""
    p = _probability(rank, span, rows, lo_t, width_t)
    kept = np.float32(1.0) / p if inverse else np.float32(1.0)
    return kept if uniform(key, index) < p else np.float32(0.0)


@njit(inline="always", cache=True, error_model="numpy")
def _probability(rank, span, rows, lo_t, width_t):  # type: ignore[no-untyped-def]
    """p = lo + rank / (rows - 1) * width, in float32 (rank norm 0.5 in a one-element row)."""
    norm = np.float32(rank) / span if rows > 1 else np.float32(0.5)
    return lo_t + norm * width_t


@njit(cache=True, nogil=True, error_model="numpy")
def probability_table(rows, lo, width):  # type: ignore[no-untyped-def]
    """float32 (N, rows): p of every rank for every agent (``_probability``): one thread's table
    for a block, no larger than the keep rows it holds beside it (N x slice size)."""
    table = np.empty((len(lo), rows), np.float32)
    span = np.float32(rows - 1)
    for t in range(len(lo)):
        for r in range(rows):
            table[t, r] = _probability(r, span, rows, lo[t], width[t])
    return table


@njit(cache=True, nogil=True, error_model="numpy")
def _merge_keep_by_buckets(  # type: ignore[no-untyped-def]
    magnitude, dst, rows, packed, count, bounds, probabilities, key, first, inner
):  # fmt: skip
    """The keep values (1 or 0) of one group for a merge, most of them without the exact rank;
    False when too many draws were left undecided (the caller then sorts the group).
    ``magnitude`` and ``dst`` are the group's ``rows`` elements (a contiguous row when ``inner``
    is 1); element j is at tensor position ``first + j * inner``.

    p is non-decreasing in the rank (each float32 step of ``_probability`` is monotone), so a draw
    below p of the lowest rank an element can have keeps it, and one at or above p of its highest
    drops it. Those bounds come from a histogram of the nonzero keys over their range, with about a
    quarter as many buckets as keys (finer ones decide little more: the |tau| of bf16 weights
    repeat, and equal keys share a bucket however fine): an element's rank lies within its
    bucket's ranks. A draw between the two (a bucket's share of the ranks, so a few per group)
    gets the exact rank, by counting the smaller keys; past ``MAX_UNDECIDED`` of them (a bucket
    holding most keys: many equal |tau|) the group is sorted. The bytes are those of the sort
    (``_keep_value``'s p, from the same table)."""
    zero, one = np.float32(0.0), np.float32(1.0)
    every = np.uint32(0xFFFFFFFF)
    under, high, n = every, np.uint32(0), 0
    for j in range(rows):  # compact the nonzero keys and find their range, without branches (half may be 0)
        b = magnitude[j]
        packed[n] = (np.uint64(b) << np.uint64(32)) | np.uint64(j)  # a zero's is overwritten next
        n += np.int64(b != 0)
        under = min(under, b - np.uint32(1))  # a zero wraps to the largest
        high = max(high, b)
        dst[j] = zero  # a nonzero's is set below
    low = under + np.uint32(1)
    if n == 0:
        return True
    zeros = rows - n
    span = high - low
    digit = 0  # about log2(n / 4) bits of the range per bucket index
    while (4 << digit) < n and digit < RADIX_BITS:
        digit += 1
    width = 0
    while width < 32 and (span >> np.uint32(width)) != 0:
        width += 1
    shift = np.uint64(max(width - digit, 0))
    bins = np.int64(span >> shift) + 1
    sizes = count
    for d in range(bins):
        sizes[d] = 0
    for r in range(n):
        sizes[np.int64(((packed[r] >> np.uint64(32)) - low) >> shift)] += 1
    total = zeros
    for d in range(bins):  # p at each bucket's lowest and highest rank
        bounds[2 * d] = probabilities[total]
        bounds[2 * d + 1] = probabilities[max(total + sizes[d] - 1, total)]
        total += sizes[d]
    left = 0
    for r in range(n):  # without branches (the draws fall anywhere): 1 kept, 0 dropped, -1 undecided
        v = packed[r]
        d = np.int64(((v >> np.uint64(32)) - low) >> shift)
        j = np.int64(v & _LOW32)
        u = uniform(key, first + j * inner)
        kept = np.int64(u < bounds[2 * d])
        within = np.int64(u < bounds[2 * d + 1])  # >= kept: p is non-decreasing
        dst[j] = np.float32(kept + kept - within)
        left += within - kept
    if left > MAX_UNDECIDED:
        return False
    for r in range(n if left else 0):  # the exact rank: the zeros and the nonzero keys below
        v = packed[r]
        j = np.int64(v & _LOW32)
        if dst[j] < zero:
            below = 0
            for q in range(n):
                below += np.int64(packed[q] < v)
            dst[j] = one if uniform(key, first + j * inner) < probabilities[zeros + below] else zero
    return True


def della_merge_block(  # type: ignore[no-untyped-def]
    base, base_code, agents, agent_codes, start, slice_size, rows, keys, mode, lo, width, inverse,
    weights, scale, consensus, normalize, lams, out_addresses, out_code, workers,
) -> int:  # fmt: skip
    """MAGPRUNE and generalized task arithmetic in one read: each thread prunes a slice into its
    own keep rows (float32 multipliers, as ``della_keep`` writes them) and merges it while it is
    in cache, with ``gta.merge_tile`` (``KEEP_ARRAY``). Returns the first NaN/Inf input's block
    position (-1: none)."""
    parts = run_parts(
        _della_merge_part, workers, address(base), base.shape[0], base_code, agents, agent_codes, start, slice_size,
        rows, keys, mode, lo, width, inverse, weights, scale, consensus, normalize, lams, out_addresses, out_code,
    )  # fmt: skip
    return lowest(parts)


@njit(nogil=True, cache=True, error_model="numpy")
def _della_merge_part(  # type: ignore[no-untyped-def]
    base, n, base_code, agents, agent_codes, start, slice_size, rows, keys, mode, lo, width, inverse,
    weights, scale, consensus, normalize, lams, out_addresses, out_code, w, workers,
):  # fmt: skip
    n_slices = n // slice_size
    first, end = n_slices * w // workers, n_slices * (w + 1) // workers
    if first >= end:
        return -1
    return _merge_slices(
        base, n, base_code, agents, agent_codes, start, slice_size, rows, keys, mode, lo, width, inverse, weights,
        scale, summed_weight(weights), consensus, normalize, lams, out_addresses, out_code, first, end,
    )  # fmt: skip


@njit(cache=True, nogil=True, error_model="numpy")
def _merge_slices(  # type: ignore[no-untyped-def]
    base, n, base_code, agents, agent_codes, start, slice_size, rows, keys, mode, lo, width, inverse,
    weights, scale, total_weight, consensus, normalize, lams, out_addresses, out_code, first, end,
):  # fmt: skip
    """Slices [first, end) of the block, pruned and merged by one thread; its first NaN/Inf."""
    pruning = prune_scratch(slice_size, rows)
    probabilities = NO_PROBABILITIES if inverse else probability_table(rows, lo, width)  # 1/p: the sort path
    keep = np.empty((len(agents), slice_size), np.float32)
    tiles = tile_scratch(len(agents), consensus)
    found = -1
    for s in range(first, end):
        at = s * slice_size
        prune_slice(
            base, base_code, agents, agent_codes, start, at, slice_size, rows, keys, mode, lo, width, inverse, keep,
            0, True, probabilities, pruning,
        )  # fmt: skip
        for sub in range(at, at + slice_size, TILE):
            m = min(TILE, at + slice_size - sub)
            bad = merge_tile(
                base, base_code, agents, agent_codes, sub, m, n, weights, scale, total_weight,
                KEEP_ARRAY, keep, sub - at, NO_KEYS, NO_DENSITY, start + sub, NO_CUT_VALUE, NO_CUT_RANGE,
                consensus, normalize, lams, out_addresses, out_code, found < 0, tiles,
            )  # fmt: skip
            if bad >= 0 and found < 0:
                found = sub + bad
    return found


@njit(cache=True, nogil=True)
def sort_pairs(packed, scratch, count):  # type: ignore[no-untyped-def]
    """``packed`` (key << 32 | index, uint64) sorted ascending, in ``packed`` or ``scratch``
    (returned): by a sort for short rows, by an LSD radix sort for long ones (stable passes of
    at most 11 bits over the key bits that differ, ping-ponging between the two buffers, which
    carry the keys along, so a pass reads them in order)."""
    n = packed.shape[0]
    if n < 64:
        packed.sort()
        return packed
    # Only the bits that differ between keys need passes (|tau| of bf16 weights spans a few
    # binades: about 14 bits), so the passes are fewer and their digits narrower than 32 / 11.
    ones, common = np.uint64(0), np.uint64(0xFFFFFFFFFFFFFFFF)
    for j in range(n):
        ones |= packed[j]
        common &= packed[j]
    varying = (ones ^ common) >> np.uint64(32)
    low = 0
    while low < 32 and not (varying >> np.uint64(low)) & np.uint64(1):
        low += 1
    high = 31
    while high > low and not (varying >> np.uint64(high)) & np.uint64(1):
        high -= 1
    span = high - low + 1 if low < 32 else 0
    passes = (span + RADIX_BITS - 1) // RADIX_BITS
    digit = (span + passes - 1) // passes if passes else 0
    bins = 1 << digit
    mask = np.uint64(bins - 1)
    source, target = packed, scratch
    for k in range(passes):
        digit_shift = np.uint64(32 + low + k * digit)
        for d in range(bins):
            count[d] = 0
        for j in range(n):
            count[(source[j] >> digit_shift) & mask] += 1
        total = 0
        for d in range(bins):
            c = count[d]
            count[d] = total
            total += c
        for j in range(n):
            v = source[j]
            d = (v >> digit_shift) & mask
            target[count[d]] = v
            count[d] += 1
        source, target = target, source
    return source


@njit(inline="always", cache=True)
def _decode_range(address, code, first, count, bits, vals, out):  # type: ignore[no-untyped-def]
    """Elements [first, first + count) of the raw block at ``address`` into ``out`` (float32)."""
    for lo in range(first, first + count, TILE):
        m = min(TILE, first + count - lo)
        decode_at(address, lo, m, code, bits)
        for i in range(m):
            out[lo - first + i] = vals[i]
