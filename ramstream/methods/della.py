"""DELLA and linear DELLA (arXiv 2406.11617), as mergekit 0.1.5's ``della`` / ``della_linear``.

Per agent t and tensor, MAGPRUNE keeps element i with probability
p_i = (density - epsilon) + rank_norm_i * 2 epsilon, where rank_norm is the element's rank of |tau|
within its row scaled to [0, 1] (``ramstream.backends.numba.della``), drawn with the counter RNG keyed
by (seed, agent, tensor, element index). Survivors are then rescaled:

- ``rescale="l1"`` (``True``, the default, mergekit): by sum|tau| / sum|tau kept| per tensor and
  agent, from exact sums (skipped when either is below 1e-7);
- ``rescale="inverse"``: each survivor by 1/p_i, as the DELLA paper;
- ``rescale="none"`` (``False``): not at all.

Then generalized task arithmetic: ``della`` elects signs by summed mass (consensus ``sum``) and
normalizes by default; ``della_linear`` sums without consensus and does not normalize.
density >= 1 keeps a tensor whole (no rescale), density <= 0 drops it; otherwise
density - epsilon and density + epsilon must lie in (0, 1).

Ranks need whole rows: merge blocks hold whole dim-0 slices (``row_aligned``), and the L1
statistic widens each index block to the slices it touches (``BlockArrays.span``), counting only
the block's own elements.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from functools import cached_property
from typing import Any, Literal

import numpy as np

from ramstream.backends.base import (
    DROP_EVERYTHING,
    KEEP_EVERYTHING,
    PRUNE,
    Backend,
    Consensus,
    Keep,
    KeepMagprune,
    MagpruneParams,
)
from ramstream.backends.rng import random_keys
from ramstream.blocks import BlockArrays
from ramstream.errors import ConfigError
from ramstream.methods import options
from ramstream.methods import tensor_settings as ts
from ramstream.methods.base import MethodSpec, Prepared, refuse_unknown
from ramstream.methods.gta import (
    Selection,
    check_weighting,
    gta_prepared,
    parse_weighting,
    uniform_report,
    weight_report,
)
from ramstream.methods.options import OptionError
from ramstream.methods.trim import l1_factors
from ramstream.plan import Block, TensorPlan
from ramstream.statistics.context import StatsContext
from ramstream.statistics.magnitude import KeptL1, digest

Rescale = Literal["l1", "inverse", "none"]
OPTIONS = {"weights", "density", "epsilon", "lambda", "normalize", "rescale", "seed"}


@dataclass(frozen=True)
class DellaParams:
    weights: tuple[ts.Setting, ...]
    density: tuple[ts.Setting, ...]
    epsilon: tuple[ts.Setting, ...]
    lam: ts.Setting
    normalize: bool
    rescale: Rescale
    seed: int

    def to_dict(self) -> dict[str, Any]:
        return {
            "weights": [ts.to_json(w) for w in self.weights],
            "density": [ts.to_json(d) for d in self.density],
            "epsilon": [ts.to_json(e) for e in self.epsilon],
            "lambda": ts.to_json(self.lam),
            "normalize": self.normalize,
            "rescale": self.rescale,
            "seed": self.seed,
        }


def parse_della(name: str, given: Mapping[str, Any], n_agents: int) -> DellaParams:
    refuse_unknown(name, given, OPTIONS)
    density = ts.per_agent("density", given.get("density", 1.0), n_agents)
    ts.in_range("density", density, 0.0, 1.0)
    epsilon = ts.per_agent("epsilon", given.get("epsilon", 0.15), n_agents)
    ts.in_range("epsilon", epsilon, 0.0, 1.0)
    uniform = ts.uniform(density), ts.uniform(epsilon)
    if uniform[0] is not None and uniform[1] is not None:
        _check_window(np.array([uniform[0]]), np.array([uniform[1]]), None)
    weights, lam = parse_weighting(given, n_agents)
    return DellaParams(
        weights=weights,
        density=density,
        epsilon=epsilon,
        lam=lam,
        normalize=options.boolean("normalize", given.get("normalize", name == "della")),
        rescale=rescale_choice(given.get("rescale", "l1")),
        seed=options.seed("seed", given.get("seed", 0)),
    )


def _check_window(density: np.ndarray, epsilon: np.ndarray, names: Sequence[str] | None) -> None:
    """MAGPRUNE's probabilities density -/+ epsilon must lie in (0, 1) wherever it prunes
    (float64 (tensors, N) values; ``names`` the tensors', None when every tensor has them)."""
    bad = (density > 0) & (density < 1) & ~((density - epsilon > 0) & (density + epsilon < 1))
    if bad.any():
        ti, t = (int(i) for i in np.argwhere(bad)[0])
        where = "" if names is None else f" for tensor {names[ti]!r}"
        raise ConfigError(
            f"--density {density[ti, t]:g} with --epsilon {epsilon[ti, t]:g}{where}: density - epsilon and "
            "density + epsilon must lie in (0, 1)"
        )


def rescale_choice(value: Any) -> Rescale:
    if value is True or value == "l1":
        return "l1"
    if value is False or value == "none":
        return "none"
    if value == "inverse":
        return "inverse"
    raise OptionError("rescale", f"must be l1, inverse or none (or true / false), got {value!r}")


def geometry(tensor: TensorPlan) -> tuple[int, int]:
    """(slice size, rows): dim-0 slices of ``rows`` x (slice size / rows) elements; ranks run over
    dim 1 (a 1-D tensor is one row; a scalar one element)."""
    shape = tensor.shape
    if len(shape) >= 2:
        return tensor.numel // shape[0], shape[1]
    return max(tensor.numel, 1), max(tensor.numel, 1)


@dataclass(frozen=True, eq=False)
class Magprune:
    """MAGPRUNE's settings per tensor (rows, in the order of ``names``) and agent (columns)."""

    seed: int
    mode: np.ndarray  # int64 (tensors, N): PRUNE / KEEP_EVERYTHING / DROP_EVERYTHING
    lo: np.ndarray  # float32 (tensors, N): density - epsilon
    width: np.ndarray  # float32 (tensors, N): 2 epsilon
    names: tuple[str, ...]

    @classmethod
    def of(cls, params: DellaParams, names: Sequence[str]) -> Magprune:
        density, epsilon = ts.per_tensor64(params.density, names), ts.per_tensor64(params.epsilon, names)
        mode = np.where(density >= 1, KEEP_EVERYTHING, np.where(density <= 0, DROP_EVERYTHING, PRUNE))
        return cls(
            params.seed,
            mode.astype(np.int64),
            (density - epsilon).astype(np.float32),
            (2 * epsilon).astype(np.float32),
            tuple(names),
        )

    @cached_property
    def _rows(self) -> dict[str, int]:
        return {name: i for i, name in enumerate(self.names)}

    def digest(self) -> str:
        """The settings' identity: one row's when every tensor has the same (the key indexes made
        before per-tensor settings keep), else every row and the tensors' names."""
        seed = np.array([self.seed], np.uint64)
        if all((a == a[:1]).all() for a in (self.mode, self.lo, self.width)) and len(self.names):
            return digest(seed, self.mode[0], self.lo[0], self.width[0])
        return digest(seed, self.mode, self.lo, self.width, "\0".join(self.names))

    def params(self, tensor: TensorPlan, lo: int, n_agents: int, inverse: bool) -> MagpruneParams:
        """MAGPRUNE over arrays of whole slices of ``tensor`` starting at element ``lo``."""
        size, rows = geometry(tensor)
        keys = random_keys(self.seed, n_agents, tensor.name)
        row = self._rows[tensor.name]
        return MagpruneParams(lo, size, rows, keys, self.mode[row], self.lo[row], self.width[row], inverse)

    def keep(
        self, arrays: BlockArrays, tensor: TensorPlan, start: int, stop: int, inverse: bool, backend: Backend
    ) -> np.ndarray:
        """float32 (N, stop - start): 0 where dropped, 1 (or 1/p) where kept. ``arrays`` hold
        elements [start, stop) of the tensor, or lie inside them; rows are read whole."""
        size, _ = geometry(tensor)
        lo, hi = start // size * size, min(-(-stop // size) * size, tensor.numel)
        whole = arrays if arrays.size == hi - lo else arrays.span(lo, hi)
        keep = backend.magprune_keep(whole, self.params(tensor, lo, arrays.n_agents, inverse))
        return keep if (lo, hi) == (start, stop) else np.ascontiguousarray(keep[:, start - lo : stop - lo])

    def selection(self, tensors: list[TensorPlan], inverse: bool) -> Selection:
        """MAGPRUNE as a merge evaluates it, inside its tiles (merge blocks hold whole slices)."""

        def of(arrays: BlockArrays, block: Block, backend: Backend) -> Keep:
            return KeepMagprune(self.params(tensors[block.tensor], block.start, arrays.n_agents, inverse))

        return Selection(f"magprune:{self.digest()}:{inverse}", of)


def prepare_della(name: str, params: DellaParams, ctx: StatsContext) -> Prepared:
    names = list(ctx.family.base.tensors)
    prune = Magprune.of(params, names)
    n_tensors, n_agents = len(names), len(params.weights)
    if params.rescale == "l1" and (prune.mode == PRUNE).any():

        def select(arrays: BlockArrays, block: Block, tensor: TensorPlan, backend: Backend) -> np.ndarray:
            return prune.keep(arrays, tensor, block.start, block.stop, False, backend)

        stat = KeptL1("della", prune.digest(), select)
        ctx.compute(stat)
        scale = l1_factors(ctx, stat)
    else:
        scale = np.ones((n_tensors, n_agents), np.float32)
    tensors = [_tensor_plan(ctx, name) for name in names]
    consensus: Consensus = "sum" if name == "della" else "none"
    normalize = params.normalize
    inverse = params.rescale == "inverse"

    per_agent = {
        **weight_report(params.weights),
        **uniform_report("density", params.density),
        **uniform_report("epsilon", params.epsilon),
    }
    return gta_prepared(
        per_agent,
        ts.per_tensor(params.weights, names),
        scale,
        ts.resolve(params.lam, names).astype(np.float32),
        consensus=consensus,
        normalize=normalize,
        select=prune.selection(tensors, inverse),
    )


def _tensor_plan(ctx: StatsContext, name: str) -> TensorPlan:
    """Name, shape and size of a tensor (without opening the index)."""
    entry = ctx.family.base.tensors[name].entry
    return TensorPlan(name, entry.shape, entry.numel, (entry.dtype,))


DELLA_METHODS = {
    "della": "DELLA: MAGPRUNE (rank-based random drop, rescaled), sign election, disjoint mean",
    "della_linear": "linear DELLA: MAGPRUNE (rank-based random drop, rescaled), weighted sum",
}


def della_spec(name: str) -> MethodSpec:
    def parse(given: Mapping[str, Any], n_agents: int) -> DellaParams:
        return parse_della(name, given, n_agents)

    def prepare(params: DellaParams, ctx: StatsContext) -> Prepared:
        return prepare_della(name, params, ctx)

    def check(params: DellaParams, names: Sequence[str]) -> None:
        check_weighting(params.weights, params.lam, names)
        ts.check([*params.density, *params.epsilon], names)
        _check_window(ts.per_tensor64(params.density, names), ts.per_tensor64(params.epsilon, names), names)

    return MethodSpec(name, DELLA_METHODS[name], parse, prepare, row_aligned=True, accepts_nonfinite=False, check=check)
