"""arcee_fusion's statistics: the per-row KL divergence (on the host), and histograms of the
bit patterns of the importance, exact and out of core.

The row KL. mergekit's importance is |theta1 - theta0| * KL_row, where per row along the last
dimension (a 1-D tensor is one row, a scalar a row of one) KL_row = sum_j p_j log(p_j / q_j),
p = softmax(theta1 row) + 1e-8, q = softmax(theta0 row) + 1e-8. Exponentials and logarithms
are not correctly rounded, and numba's and torch's differ in the last bit, so the KL is computed
in one place for every backend: here, with numpy, in float64, from the row's float32 values
(``row_kl``): max-subtracted exponentials, sums in element order (``cumsum``: the order is
fixed, whatever the rows taken together), the float32 value of 1e-8 (mergekit adds a Python
float to a float32 tensor: torch rounds it to float32), clamped at +0.0 (the exact value is >= 0:
p and q have the same total mass, and the log-sum inequality applies; float64 rounding could
leave -1e-20), then rounded to float32 once. The backends take it per row (``RowScale``) and
compute importance = f32(|d|) * f32(KL_row), one float32 multiplication. The statistics of a
block read the whole rows it touches (``BlockArrays.span``) and count only its own elements.

- ``ImportanceHigh`` (``stats/fusion_importance_hi16_v1``, int32 (HIGH_BINS,) per block): elements
  per high half of the importance's bits (non-negative: its bits order as its values).
- ``ImportanceLow`` (``stats/fusion_importance_lo16_v1-<digest>``, int32 (C, LOW_BINS) per block):
  the low halves of the elements whose high half is target c of the block's tensor; the digest
  is that of the targets (tensors, C), which the high histogram decided.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from ramstream.backends.base import HIGH_BINS, LOW_BINS, NONFINITE_BIN, Backend, RowScale
from ramstream.blocks import BlockArrays
from ramstream.errors import NonFiniteWeightError
from ramstream.format import codecs
from ramstream.format.dtypes import TAU32
from ramstream.plan import Block, TensorPlan
from ramstream.statistics.magnitude import digest

EPS = float(np.float32(1e-8))  # mergekit's eps, as torch adds it to a float32 tensor
CHUNK = 1 << 18  # elements of whole rows whose KL is computed at a time (float64 temporaries)


def row_length(tensor: TensorPlan) -> int:
    """Elements of a row along the last dimension (a scalar is a row of one)."""
    return tensor.shape[-1] if tensor.shape else 1


def row_kl(arrays: BlockArrays, row_len: int) -> np.ndarray:
    """float32 (rows,): KL_row of each row of ``arrays`` (which hold whole rows), agent against base."""
    n_rows = arrays.size // row_len
    out = np.empty(n_rows, np.float32)
    step = max(1, CHUNK // row_len)
    for r0 in range(0, n_rows, step):
        lo, hi = r0 * row_len, min(r0 + step, n_rows) * row_len
        base = codecs.decode(arrays.base[lo:hi], arrays.base_code)
        agent = codecs.decode(arrays.agents[0][lo:hi], int(arrays.agent_codes[0]))
        if arrays.agent_codes[0] == TAU32:  # a task vector: the agent's weights are f32(base + tau)
            agent = base + agent
        out[r0 : r0 + (hi - lo) // row_len] = kl_rows(agent.reshape(-1, row_len), base.reshape(-1, row_len))
    return out


def kl_rows(agent: np.ndarray, base: np.ndarray) -> np.ndarray:
    """float32 (rows,) from float32 (rows, row_len): see the module docstring. A row holding a
    NaN/Inf gives NaN (the statistics then refuse the tensor by name)."""
    with np.errstate(all="ignore"):
        p = _softmax(agent.astype(np.float64)) + EPS
        q = _softmax(base.astype(np.float64)) + EPS
        kl = np.cumsum(p * np.log(p / q), axis=1)[:, -1]
        return np.maximum(kl, 0.0).astype(np.float32)  # NaN stays NaN


def _softmax(x: np.ndarray) -> np.ndarray:
    e = np.exp(x - x.max(axis=1, keepdims=True))
    return e / np.cumsum(e, axis=1)[:, -1:]


def row_scale(arrays: BlockArrays, tensor: TensorPlan) -> RowScale:
    """The row KL of the rows ``arrays`` touch (read whole: a span past the block's edges if need be)."""
    row_len = row_length(tensor)
    lo, hi = arrays.start // row_len * row_len, -(-arrays.stop // row_len) * row_len
    whole = arrays if (lo, hi) == (arrays.start, arrays.stop) else arrays.span(lo, hi)
    return RowScale(row_kl(whole, row_len), row_len, arrays.start - lo)


def _refuse_nonfinite(arrays: BlockArrays, tensor: TensorPlan, rows: RowScale) -> None:
    """Name the NaN/Inf input (or overflowing difference) behind a NaN/Inf importance: in the
    block, else in the rest of its rows (whose KL it spoils)."""
    for where in (
        arrays,
        arrays.span(arrays.start - rows.offset, arrays.start - rows.offset + rows.scale.size * rows.row_len),
    ):
        bad = where.first_nonfinite_tau()
        if bad >= 0:
            raise where.nonfinite_error(bad)
    raise NonFiniteWeightError(
        f"tensor {tensor.name!r}: arcee_fusion's importance |agent - base| * KL overflows float32 (weights "
        "near float32's limit, 3.4e38); fix the checkpoint"
    )


@dataclass(frozen=True)
class ImportanceHigh:
    @property
    def key(self) -> str:
        return "fusion_importance_hi16_v1"

    def shape(self, n_agents: int) -> tuple[int, ...]:
        return (HIGH_BINS,)

    @property
    def dtype(self) -> str:
        return "int32"

    def compute(self, arrays: BlockArrays, block: Block, tensor: TensorPlan, backend: Backend) -> np.ndarray:
        rows = row_scale(arrays, tensor)
        histogram = backend.importance_high_histogram(arrays, rows)
        if histogram[NONFINITE_BIN:].any():
            _refuse_nonfinite(arrays, tensor, rows)
        return histogram


@dataclass(frozen=True, eq=False)
class ImportanceLow:
    targets: np.ndarray  # int32 (tensors, C): target high halves per tensor; -1: none

    @property
    def key(self) -> str:
        return f"fusion_importance_lo16_v1-{digest(self.targets)}"

    def shape(self, n_agents: int) -> tuple[int, ...]:
        return (self.targets.shape[1], LOW_BINS)

    @property
    def dtype(self) -> str:
        return "int32"

    def compute(self, arrays: BlockArrays, block: Block, tensor: TensorPlan, backend: Backend) -> np.ndarray:
        targets = self.targets[block.tensor]
        if targets.max(initial=-1) < 0:
            return np.zeros((targets.size, LOW_BINS), np.int32)
        return backend.importance_low_histogram(arrays, row_scale(arrays, tensor), targets)
