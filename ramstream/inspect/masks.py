"""A tensor's active masks from the index: unpacked whole, or downsampled block by block.

Masks are stored bit-packed (bit ``e % 8`` of byte ``e // 8`` is element ``e``). The image of a
tensor views it as ``rows x cols`` (its first dimension by the product of the others; a vector
is one row) and cuts that into a grid of ``H x W`` cells, at most ``max_cells`` per side.
Columns are binned in units of ``u`` elements: ``u = 8`` (whole packed bytes, counted with a
popcount table) when ``cols`` is a multiple of 8 and ``cols >= 8 * max_cells``, else ``u = 1``.
Element ``(r, c)`` falls in cell ``(r * H // rows, (c // u) * W // (cols // u))`` with
``H = min(rows, max_cells)`` and ``W = min(cols // u, max_cells)``. Each cell counts, per agent,
its active elements, and the elements two or more agents changed. Blocks are read one at a
time, so memory stays near one block whatever the tensor's size.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from ramstream.index.store import IndexStore
from ramstream.plan import TensorPlan


def unpack(packed: np.ndarray, count: int) -> np.ndarray:
    """``(N, bytes)`` packed masks -> ``(N, count)`` bool."""
    return np.unpackbits(packed, axis=-1, count=count, bitorder="little").astype(bool)


def matrix_shape(shape: tuple[int, ...]) -> tuple[int, int]:
    """The ``rows x cols`` view of a tensor used for its image."""
    numel = int(np.prod(shape, dtype=np.int64))
    rows = int(shape[0]) if len(shape) >= 2 else 1
    return rows, (numel // rows if rows else 0)


def grid_shape(shape: tuple[int, ...], max_cells: int) -> tuple[int, int]:
    rows, cols = matrix_shape(shape)
    return min(rows, max_cells), min(cols, max_cells)


@dataclass(frozen=True)
class MaskImage:
    """Per-cell counts of one tensor: ``active (N, H, W)``, ``collide (H, W)``, ``cells (H, W)``."""

    tensor: str
    shape: tuple[int, ...]
    agents: tuple[str, ...]
    active: np.ndarray
    collide: np.ndarray
    cells: np.ndarray

    @property
    def density(self) -> np.ndarray:
        """Fraction of each cell's elements that each agent changed, ``(N, H, W)``."""
        return self.active / np.maximum(self.cells, 1)

    @property
    def collide_density(self) -> np.ndarray:
        """Fraction of each cell's elements that two or more agents changed, ``(H, W)``."""
        return self.collide / np.maximum(self.cells, 1)


def _bin_starts(n: int, bins: int) -> np.ndarray:
    """First index of each of ``bins`` bins when index ``i`` goes to bin ``i * bins // n``."""
    return -((-np.arange(bins, dtype=np.int64) * n) // bins)


POPCOUNT = np.array([bin(i).count("1") for i in range(256)], np.uint8)


def column_unit(cols: int, max_cells: int) -> int:
    return 8 if cols % 8 == 0 and cols >= 8 * max_cells else 1


class _Accumulator:
    """Sums per-unit counts (in element order) into the cells, carrying a partial row over."""

    def __init__(self, n_agents: int, shape: tuple[int, ...], max_cells: int) -> None:
        self.rows, cols = matrix_shape(shape)
        self.unit = column_unit(cols, max_cells)
        self.cols = cols // self.unit  # units per row
        self.height, self.width = min(self.rows, max_cells), min(self.cols, max_cells)
        self.active = np.zeros((n_agents, self.height, self.width), np.int64)
        self.collide = np.zeros((self.height, self.width), np.int64)
        self.col_starts = _bin_starts(self.cols, self.width)
        self.carry = np.zeros((n_agents + 1, 0), np.uint8)
        self.row = 0

    def add(self, counts: np.ndarray) -> None:
        """Feed the next units: ``(N+1, n)`` uint8, the agents' counts then the collide count."""
        data = np.concatenate([self.carry, counts], axis=1) if self.carry.shape[1] else counts
        n_rows = data.shape[1] // self.cols
        if n_rows:
            full = data[:, : n_rows * self.cols].reshape(data.shape[0], n_rows, self.cols)
            row_bins = (np.arange(self.row, self.row + n_rows, dtype=np.int64) * self.height) // self.rows
            starts = np.flatnonzero(np.r_[True, row_bins[1:] != row_bins[:-1]])
            per_row_bin = np.add.reduceat(full, starts, axis=1, dtype=np.int64)
            per_cell = np.add.reduceat(per_row_bin, self.col_starts, axis=2)
            self.active[:, row_bins[starts]] += per_cell[:-1]
            self.collide[row_bins[starts]] += per_cell[-1]
        self.carry = data[:, n_rows * self.cols :].copy()
        self.row += n_rows

    def cells(self) -> np.ndarray:
        row_sizes = np.diff(np.r_[_bin_starts(self.rows, self.height), self.rows])
        col_sizes = np.diff(np.r_[self.col_starts, self.cols]) * self.unit
        return np.outer(row_sizes, col_sizes).astype(np.int64)


def _counts(packed: np.ndarray, size: int, unit: int) -> np.ndarray:
    """One block's ``(N+1, units)`` counts: per agent, then of elements two or more agents changed."""
    if unit == 8:
        once = np.zeros(packed.shape[1], np.uint8)
        twice = np.zeros(packed.shape[1], np.uint8)
        for mask in packed:
            twice |= once & mask
            once |= mask
        return POPCOUNT[np.concatenate([packed, twice[None]])]
    bits = np.unpackbits(packed, axis=-1, count=size, bitorder="little")
    many = (bits.sum(axis=0, dtype=np.uint16) >= 2).astype(np.uint8)
    return np.concatenate([bits, many[None]])


def mask_image(store: IndexStore, tensor: int, max_cells: int = 256) -> MaskImage:
    info: TensorPlan = store.plan.tensors[tensor]
    acc = _Accumulator(store.n_agents, info.shape, max_cells)
    if acc.rows and acc.cols:
        for b in store.plan.blocks_of(tensor):
            acc.add(_counts(store.block_mask(b), store.plan.blocks[b].size, acc.unit))
    return MaskImage(info.name, info.shape, store.header.agents, acc.active, acc.collide, acc.cells())


def tensor_mask(store: IndexStore, tensor: int) -> np.ndarray:
    """Every agent's mask of one tensor, unpacked: ``(N, *shape)`` bool (one block at a time)."""
    info = store.plan.tensors[tensor]
    out = np.zeros((store.n_agents, info.numel), bool)
    for b in store.plan.blocks_of(tensor):
        block = store.plan.blocks[b]
        out[:, block.start : block.stop] = unpack(store.block_mask(b), block.size)
    return out.reshape(store.n_agents, *info.shape)
