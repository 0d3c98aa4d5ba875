"""Merges that are, per tensor, a fixed combination of their inputs: the spherical methods.

slerp, nuslerp, multislerp and karcher look at whole tensors as vectors: their norms and the
angles between them decide, per tensor, a few coefficients, and the merged tensor is the inputs
combined with them. So a method needs the exact Gram matrix of its vectors per tensor (one
statistics pass: ``Gram`` over the weights or over the task vectors; exact
sums, so every backend, block size and executor gets the same matrix), computes the coefficients
in float64 by the method's own formula written over the Gram matrix (its iterations too: a
vector the method builds is a combination of the inputs, and its dot products follow from the
matrix), rounds them to float32 once, and merges each block as

    weights form:       out = c_0 f32(base) + sum_t c_t f32(agent_t)      (``merge_linear``)
    task-vector form:   out = base + sum_t c_t tau_t                      (``merge_gta``)

in float32. mergekit computes the same formulas in float32 over the materialised tensors; the
coefficients may differ in their last bits, which is the documented difference (docs/methods.md).
"""

from __future__ import annotations

from collections.abc import Callable, Sequence

import numpy as np

from ramstream.backends.base import Backend
from ramstream.backends.base import LinearParams as LinearRecord
from ramstream.blocks import BlockArrays
from ramstream.format.dtypes import is_merged
from ramstream.methods.base import Prepared
from ramstream.methods.gta import gta_prepared
from ramstream.plan import Block
from ramstream.statistics.context import StatsContext
from ramstream.statistics.exact_sums import Gram, pairs, tensor_sums

# A method's coefficients for one tensor: (its index, its Gram matrix) -> one per vector.
Coefficients = Callable[[int, np.ndarray], np.ndarray]


def grams(ctx: StatsContext, weights: bool) -> np.ndarray:
    """float64 (tensors, V, V): each tensor's Gram matrix of the weights (base first, V = N + 1)
    or of the task vectors (V = N)."""
    n_agents = len(ctx.family.agents)
    n_vectors = n_agents + 1 if weights else n_agents
    sums = tensor_sums(ctx, Gram(weights, ctx.allow_nonfinite))
    out = np.zeros((len(sums), n_vectors, n_vectors), np.float64)
    for k, (a, b) in enumerate(pairs(n_vectors)):
        out[:, a, b] = sums[:, k]
        out[:, b, a] = sums[:, k]
    return out


def tensor_names(ctx: StatsContext) -> list[str]:
    return list(ctx.family.base.tensors)


def combination_prepared(ctx: StatsContext, weights: bool, coefficients: Coefficients) -> Prepared:
    """The block merger of per-tensor combinations: ``coefficients(tensor, gram)`` over the
    weights (base first) or over the task vectors."""
    matrices = grams(ctx, weights)
    # an integer tensor is copied from the base, never merged: its Gram matrix is not gathered
    # (zeros), and a method's formula over it could only refuse (multislerp: no direction)
    merged = [is_merged(ref.entry.dtype) for ref in ctx.family.base.tensors.values()]
    coefs = np.array(
        [coefficients(t, g) if merged[t] else np.zeros(len(g)) for t, g in enumerate(matrices)], np.float64
    ).astype(np.float32)
    coefs = coefs.reshape(len(matrices), -1)
    if not weights:
        n_tensors, n_agents = coefs.shape
        return gta_prepared({}, np.ones(n_agents, np.float32), coefs, np.ones(n_tensors, np.float32))
    return Prepared(_weights_merger(coefs))


def _weights_merger(coefs: np.ndarray) -> Callable[[BlockArrays, Block, np.ndarray, int, Backend], int]:
    def merge_block(arrays: BlockArrays, block: Block, out: np.ndarray, out_code: int, backend: Backend) -> int:
        row = coefs[block.tensor]
        record = LinearRecord(np.ascontiguousarray(row[1:]), np.float32(row[0]), False)
        return backend.merge_linear(arrays, record, out, out_code)

    return merge_block


def dot(gram: np.ndarray, x: np.ndarray, y: np.ndarray) -> float:
    """<sum_i x_i v_i, sum_j y_j v_j> from the Gram matrix of the vectors v."""
    return float(x @ gram @ y)


def norm(gram: np.ndarray, x: np.ndarray) -> float:
    return float(np.sqrt(max(dot(gram, x, x), 0.0)))


def unit(n_vectors: int, i: int) -> np.ndarray:
    e = np.zeros(n_vectors, np.float64)
    e[i] = 1.0
    return e


def spread(values: Sequence[float], at: Sequence[int], n_vectors: int) -> np.ndarray:
    """Coefficients ``values`` on the vectors ``at``, 0 elsewhere."""
    out = np.zeros(n_vectors, np.float64)
    out[list(at)] = values
    return out
