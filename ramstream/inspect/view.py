"""``IndexView``: what a finished index knows about a family, as typed tables (no weights read).

    >>> view = ramstream.open_index("index.zarr")
    >>> view.agents                      # ('agent1', 'agent2', 'agent3')
    >>> view.model.density               # (1, N) float64
    >>> view.layers.unique_share         # (layers, N)
    >>> view.tensors.top(0, 10)          # agent 0's ten tensors with the largest unique share
    >>> view.tensor_mask("model.layers.0.mlp.down_proj.weight")   # (N, *shape) bool
    >>> view.layers.to_pandas()          # long DataFrame (needs pandas)
    >>> view.pairs.layers.cosine         # (layers, pairs), with the agreement statistics

Every number is derived from the integer counts of the index (per-tensor roll-up, or the
per-block statistics summed), so any view gives the same totals.
"""

from __future__ import annotations

from collections.abc import Sequence
from functools import cached_property
from pathlib import Path
from typing import Any

import numpy as np

from ramstream.errors import ConfigError, IndexMismatchError
from ramstream.index.header import IndexHeader
from ramstream.index.store import IndexStore, open_index_store
from ramstream.inspect import masks
from ramstream.inspect.grouping import Role, layer_groups, module_groups, role_of
from ramstream.inspect.pairs import Pairs
from ramstream.inspect.tables import By, Table
from ramstream.plan import TensorPlan
from ramstream.statistics.overlap import OverlapCounts

_TABLES = {"model": "model", "tensor": "tensors", "layer": "layers", "module": "modules"}


class IndexView:
    """A read-only view of a finished index. Cheap to open; tables are computed on first use."""

    def __init__(self, store: IndexStore) -> None:
        if not store.probe_complete():
            raise IndexMismatchError(
                f"{store.path}: the probe pass has not finished; rerun probe (or merge) to complete it "
                "(ramstream status shows how far it got)"
            )
        self.store = store
        self._merged = [i for i, t in enumerate(store.plan.tensors) if t.merged]

    @property
    def path(self) -> Path:
        return self.store.path

    @property
    def header(self) -> IndexHeader:
        return self.store.header

    @property
    def agents(self) -> tuple[str, ...]:
        return self.store.header.agents

    @property
    def base(self) -> str:
        return self.store.header.base

    @property
    def eps(self) -> float:
        return self.store.header.eps

    @cached_property
    def counts(self) -> OverlapCounts:
        """Per-tensor counts over every tensor of the index (non-float tensors are zero)."""
        return OverlapCounts(*self.store.tensor_counts())

    @cached_property
    def tensors(self) -> Table:
        """One row per merged (float) tensor, in model order."""
        counts = self.counts
        rows = np.asarray(self._merged, dtype=np.int64)
        keys = tuple(self.store.plan.tensors[i].name for i in self._merged)
        return Table(
            "tensor",
            keys,
            self.agents,
            OverlapCounts(counts.overlap[rows], counts.coverage[rows]),
            np.ones(len(keys), np.int64),
        )

    @cached_property
    def roles(self) -> tuple[Role, ...]:
        """Layer, module and kind of each merged tensor (rows of ``tensors``)."""
        return tuple(role_of(name) for name in self.tensors.keys)

    def grouping(self, by: By) -> tuple[Sequence[str], Sequence[int]]:
        """The row keys of the table ``by`` and the row of each merged tensor (``tensors``' rows)."""
        if by == "layer":
            return layer_groups(self.roles)
        if by == "module":
            return module_groups(self.roles)
        if by == "model":
            return ("model",), [0] * len(self.tensors)
        self._check_by(by)
        return self.tensors.keys, range(len(self.tensors))

    @cached_property
    def layers(self) -> Table:
        return self.tensors.group("layer", *self.grouping("layer"))

    @cached_property
    def modules(self) -> Table:
        return self.tensors.group("module", *self.grouping("module"))

    @cached_property
    def model(self) -> Table:
        """One row, ``model``: the whole model's numbers (the per-agent summary)."""
        return self.tensors.group("model", *self.grouping("model"))

    @cached_property
    def pairs(self) -> Pairs:
        """How each pair of agents' updates relate (``inspect.pairs``); an index without the
        agreement statistics is refused in one line that says how to add them."""
        return Pairs(self.store, self._merged, self.grouping, self.table)

    @cached_property
    def _positions(self) -> dict[str, int]:
        return {t.name: i for i, t in enumerate(self.store.plan.tensors)}

    def table(self, by: By) -> Table:
        self._check_by(by)
        table: Table = getattr(self, _TABLES[by])
        return table

    @staticmethod
    def _check_by(by: str) -> None:
        if by not in _TABLES:
            raise ConfigError(f"cannot group by {by!r}; choose one of {', '.join(_TABLES)}")

    def tensor_info(self, name: str) -> tuple[int, TensorPlan]:
        """The index and plan entry of tensor ``name`` (refusing unknown and non-float tensors)."""
        i = self._positions.get(name)
        if i is not None:
            t = self.store.plan.tensors[i]
            if not t.merged:
                raise ConfigError(
                    f"tensor {name!r} is {t.dtypes[0]}: it is copied from the base, not merged, and has no masks"
                )
            return i, t
        close = [k for k in self.tensors.keys if name in k][:5]
        hint = f"; did you mean {', '.join(close)}?" if close else "; ramstream inspect --by tensor lists them"
        raise ConfigError(f"no tensor {name!r} in this index{hint}")

    def tensor_mask(self, name: str) -> np.ndarray:
        """Every agent's active mask of tensor ``name``, unpacked: ``(N, *shape)`` bool."""
        index, _ = self.tensor_info(name)
        return masks.tensor_mask(self.store, index)

    def mask_image(self, name: str, max_cells: int = 256) -> masks.MaskImage:
        """Per-cell counts of tensor ``name`` on a grid of at most ``max_cells`` per side."""
        if max_cells < 1:
            raise ConfigError("the image needs at least one cell per side")
        index, _ = self.tensor_info(name)
        return masks.mask_image(self.store, index, max_cells)

    def to_pandas(self, by: By = "tensor") -> Any:
        """``table(by).to_pandas()``, with layer / module / kind columns for tensors (needs pandas)."""
        frame = self.table(by).to_pandas()
        if by == "tensor":
            roles = {name: role for name, role in zip(self.tensors.keys, self.roles, strict=True)}
            frame.insert(1, "layer", [roles[n].layer for n in frame["tensor"]])
            frame.insert(2, "module", [roles[n].module for n in frame["tensor"]])
            frame.insert(3, "kind", [roles[n].kind for n in frame["tensor"]])
        return frame

    def __repr__(self) -> str:
        return f"IndexView({str(self.path)!r}, base={self.base!r}, agents={list(self.agents)!r})"


def open_index(path: str | Path) -> IndexView:
    """Open a finished index for inspection; its checkpoints are never read."""
    return IndexView(open_index_store(Path(path), read_only=True))
