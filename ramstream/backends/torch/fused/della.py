"""DELLA's MAGPRUNE keep values of one tile of whole slices in three launches, with the values of
``backends/numba/della.py`` (and of ``backends/torch/della.py``, the torch-op path):

1. ``keys_tile``: per agent and element, the sort key ``|tau| bits << 32 | j``, j the element's
   row within its slice: a key is unique within its group, so an ascending sort is the stable
   order of |tau| (ties: lower row first);
2. one ``torch.sort`` of every agent's groups (slices x rows x inner, along the rows);
3. ``keep_tile``: for each sorted position, its rank r, p = lo + (f32(r) / f32(rows - 1)) * width
   (0.5 for rows of one), the counter RNG's draw of the element's tensor position below p, and
   the keep value (1, or 1/p with ``inverse``; 0 where dropped) stored at the element's place;
   an agent whose mode is not ``PRUNE`` gets 1 or 0 everywhere, without draws.

The keep values (agents, m) float32 stay on the device: the GTA merge kernel takes them as
multipliers (``gta.KEEP_MULTIPLIERS``) and the exact sums as a keep array.
"""

from __future__ import annotations

import torch
import triton
import triton.language as tl

from ramstream.backends.base import KEEP_EVERYTHING, PRUNE
from ramstream.backends.torch.fused import codecs
from ramstream.backends.torch.fused.gta import uniform
from ramstream.backends.torch.fused.ram import EXACT, layout, on_device

BLOCK = 1024
PRUNING: tl.constexpr = tl.constexpr(PRUNE)
KEEPING: tl.constexpr = tl.constexpr(KEEP_EVERYTHING)


@triton.jit
def keys_tile(
    base,  # uint8 pointer: the base's raw bytes; agent t's are at base + agents_at + t * agent_stride
    agents_at,
    agent_stride,
    m,
    rows,
    inner,
    keys,  # int64 (N, m)
    BASE: tl.constexpr,
    AGENT: tl.constexpr,
    BLOCK: tl.constexpr,
):
    t = tl.program_id(1)
    offsets = tl.program_id(0) * BLOCK + tl.arange(0, BLOCK)
    mask = offsets < m
    a = codecs.decode(base + agents_at + t * agent_stride, offsets, mask, AGENT)
    tau = codecs.task_vector(a, codecs.decode(base, offsets, mask, BASE), AGENT)
    bits = (tau.to(tl.uint32, bitcast=True) & 0x7FFFFFFF).to(tl.int64)
    row = (offsets // inner) % rows  # the tile starts at a slice's first element
    tl.store(keys + t.to(tl.int64) * m + offsets, (bits << 32) | row.to(tl.int64), mask=mask)


@triton.jit
def keep_tile(
    ordered,  # int64 (N, m): each agent's keys sorted within their groups (slices, rows, inner)
    m,
    rows,
    inner,
    start,  # the tile's first element within its tensor (the draws' index)
    draw_keys,  # int64 (N,): the random streams' keys (uint64 bits)
    mode,  # int64 (N,)
    lo_p,  # float32 (N,)
    width,  # float32 (N,)
    keep,  # float32 (N, m)
    INVERSE: tl.constexpr,
    BLOCK: tl.constexpr,
):
    t = tl.program_id(1)
    at = tl.program_id(0) * BLOCK + tl.arange(0, BLOCK)  # positions in the sorted order
    mask = at < m
    key = tl.load(ordered + t.to(tl.int64) * m + at, mask=mask, other=0)
    slice_size = rows * inner
    first = (at // slice_size) * slice_size
    rank = (at - first) // inner
    element = first + (key & 0xFFFFFFFF) * inner + (at - first - rank * inner)
    if rows > 1:
        norm = tl.math.div_rn(rank.to(tl.float32), tl.zeros((BLOCK,), tl.float32) + (rows - 1))
    else:
        norm = tl.zeros((BLOCK,), tl.float32) + 0.5
    p = tl.load(lo_p + t) + norm * tl.load(width + t)
    stream = tl.load(draw_keys + t).to(tl.uint64, bitcast=True)
    survives = uniform(stream, element + start) < p
    if INVERSE:
        kept = tl.math.div_rn(tl.zeros((BLOCK,), tl.float32) + 1.0, p)
    else:
        kept = tl.zeros((BLOCK,), tl.float32) + 1.0
    value = tl.where(survives, kept, 0.0)
    how = tl.load(mode + t)
    if how != PRUNING:
        value = tl.zeros((BLOCK,), tl.float32) + tl.where(how == KEEPING, 1.0, 0.0)
    tl.store(keep + t.to(tl.int64) * m + element, value, mask=mask)


def magprune_keep(
    raw: list[torch.Tensor],
    m: int,
    start: int,
    rows: int,
    slice_size: int,
    constants: tuple[torch.Tensor, ...],
    inverse: bool,
    codes: tuple[int, int],
) -> torch.Tensor:
    """Queue MAGPRUNE over one tile of whole slices: ``raw`` the staged inputs (base first, then
    the agents of one format at one stride), ``start`` the tile's first element within its
    tensor, ``constants`` the device tensors random keys (int64), modes (int64), lo and width
    (float32), one per agent. Returns the keep values, (agents, m) float32 on the device."""
    n_agents = len(raw) - 1
    agents_at, stride = layout(raw)
    inner = slice_size // rows
    device = raw[0].device
    keys = torch.empty((n_agents, m), dtype=torch.int64, device=device)
    keep = torch.empty((n_agents, m), dtype=torch.float32, device=device)
    draw_keys, mode, lo_p, width = constants
    grid = (triton.cdiv(m, BLOCK), n_agents)
    with on_device(raw[0]):
        keys_tile[grid](
            raw[0], agents_at, stride, m, rows, inner, keys, BASE=codes[0], AGENT=codes[1], BLOCK=BLOCK, **EXACT,
        )  # fmt: skip
        groups = keys.view(-1, rows) if inner == 1 else keys.view(-1, rows, inner)
        ordered = torch.sort(groups, dim=1).values
        keep_tile[grid](
            ordered, m, rows, inner, start, draw_keys, mode, lo_p, width, keep, INVERSE=inverse, BLOCK=BLOCK,
            **EXACT,
        )  # fmt: skip
    return keep
