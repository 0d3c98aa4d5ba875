"""The compute-backend contract: every operation the engine runs on a block's data.

A backend gets a block's inputs (``ramstream.blocks.BlockArrays``: it reads them itself through
``arrays.sources``, files and offsets, or takes the mapped views, base first; its choice) and
small parameter records, and returns arrays. It decides how to read and where to compute (Numba
threads on the CPU, torch on a GPU...), and owns its threads and scratch buffers; callers never
pass worker counts or library types. A merge reads each input once per block: the selection of
survivors (``Keep``) is evaluated inside its tiles, and it reports the first NaN/Inf input itself.

An input of code ``format.dtypes.TAU32`` (a LoRA agent's block, ``blocks.lora``) is a float32
task vector, not weights: every operation takes it as tau as it is (nothing subtracted), and
``merge_linear`` and ``merge_nearswap`` weigh it as ``f32(base) + tau``.

Every backend gives the same bytes for the same inputs: arithmetic in float32 in the order the
operations document (the Numba kernels in ``backends/numba/`` are the reference), exact integer
histograms, exact sums in the ``backends.exact_sum`` accumulator format, the counter RNG of
``backends.rng``. Outputs the caller persists (masks, merged blocks) go into buffers the caller
owns (``out``), so a pass can keep several in flight; everything else is returned.
"""

from __future__ import annotations

from collections.abc import Sequence
from contextlib import AbstractContextManager
from dataclasses import dataclass
from typing import Literal, Protocol

import numpy as np

from ramstream.backends.landing import Landing
from ramstream.backends.vector_sums import VectorLayout
from ramstream.blocks import BlockArrays, BlockSources
from ramstream.blocks.quantized import ScaledCodes

Consensus = Literal["none", "sum"]

# |tau| bit-pattern histograms (magnitude trimming): see ``abs_high_histogram``.
HIGH_BINS = 1 << 15
LOW_BINS = 1 << 16
NONFINITE_BIN = 0x7F80  # high halves >= this are Inf or NaN
ALL = np.uint32(0xFFFFFFFF)  # a cut value above every |tau|: the lower set is everything


def nth_set(mask: np.ndarray, need: int) -> int:
    """The position of the ``need``-th (1-based) nonzero element of ``mask``, -1 if fewer: where a
    cut's group of ties ends (``Backend.find_ties``)."""
    positions = np.flatnonzero(mask)
    return int(positions[need - 1]) if 1 <= need <= len(positions) else -1


# The probe counts the active agents of an element in a byte (and pads tiles with 255).
MAX_PROBE_AGENTS = 254

# DELLA's per-agent modes (``MagpruneParams.mode``)
PRUNE = 0
KEEP_EVERYTHING = 1
DROP_EVERYTHING = 2


@dataclass(frozen=True)
class KeepAll:
    """Every element of every task vector survives."""


@dataclass(frozen=True, eq=False)
class KeepArray:
    """Element i of agent t survives where ``keep[t, i] != 0``; ``keep`` is (N, n) uint8 (a mask)
    or float32 (multipliers, for the GTA merge: a survivor becomes ``(tau * keep) * scale``)."""

    keep: np.ndarray


@dataclass(frozen=True, eq=False)
class KeepRandom:
    """DARE's draw: element i of agent t survives where ``rng.uniform(keys[t], start + i) <
    density[t]`` (float32), ``start`` being the block's first element within its tensor."""

    keys: np.ndarray  # uint64 (N,)
    density: np.ndarray  # float32 (N,)
    start: int


@dataclass(frozen=True, eq=False)
class KeepCuts:
    """Magnitude trimming decided inside the merge tile from |tau| itself (``Cuts``: element i of
    agent t survives where it lies in cut 1's lower set and not in cut 0's), so the keep mask is
    never written, nor read back."""

    cuts: Cuts


@dataclass(frozen=True, eq=False)
class KeepMagprune:
    """DELLA's MAGPRUNE draw decided inside the merge (the arrays hold whole dim-0 slices; see
    ``MagpruneParams``): a kept element survives as ``(tau * m) * scale``, m being 1 or 1/p."""

    params: MagpruneParams


Keep = KeepAll | KeepArray | KeepRandom | KeepCuts | KeepMagprune


@dataclass(frozen=True, eq=False)
class GtaParams:
    """Generalized task arithmetic over one block (see ``merge_gta``)."""

    weights: np.ndarray  # float32 (N,)
    scale: np.ndarray  # float32 (N,): the rescale of each agent's survivors
    consensus: Consensus
    normalize: bool
    lams: np.ndarray  # float32 (K,): one lambda per output (a sweep's candidates differ only there)


@dataclass(frozen=True, eq=False)
class SceParams:
    """SCE over one block (see ``merge_sce``): the agents' weights and the variance cut."""

    weights: np.ndarray  # float32 (N,)
    cuts: Cuts  # one row (1, 2): element i is kept where its variance lies in cut 1's lower set, not cut 0's


@dataclass(frozen=True, eq=False)
class LinearParams:
    weights: np.ndarray  # float32 (N,)
    base_weight: np.float32
    normalize: bool


@dataclass(frozen=True, eq=False)
class MagpruneParams:
    """DELLA's MAGPRUNE over arrays holding whole dim-0 slices of a tensor (see ``magprune_keep``)."""

    start: int  # the arrays' first element within the tensor
    slice_size: int
    rows: int
    keys: np.ndarray  # uint64 (N,)
    mode: np.ndarray  # int64 (N,): PRUNE, KEEP_EVERYTHING or DROP_EVERYTHING
    lo: np.ndarray  # float32 (N,): density - epsilon
    width: np.ndarray  # float32 (N,): 2 epsilon
    inverse: bool  # kept elements get 1/p instead of 1


@dataclass(frozen=True, eq=False)
class Cuts:
    """Two magnitude cuts per agent: cut j of agent t is the lower set {|tau| bits < value[t, j]}
    plus the elements equal to it at block positions range[t, j, 0] <= i < range[t, j, 1]."""

    value: np.ndarray  # uint32 (N, 2)
    range: np.ndarray  # int64 (N, 2, 2)


@dataclass(frozen=True, eq=False)
class RowScale:
    """Per-row float32 factors over a block (arcee_fusion's row KL): element i of the block lies
    in row ``(offset + i) // row_len`` of ``scale``; its importance is f32(|agent - base|) times
    that row's factor, one float32 multiplication."""

    scale: np.ndarray  # float32 (rows,)
    row_len: int
    offset: int  # the block's first element's position within its first row


@dataclass(frozen=True)
class ProbeCounts:
    """One block's probe partials (the masks went into the caller's buffer)."""

    overlap: np.ndarray  # int64 (N, N): [t, k-1] elements where t and exactly k agents are active
    coverage: np.ndarray  # int64 (N+1,): [k] elements where exactly k agents are active
    first_nonfinite: int  # block position of the first NaN/Inf in any input, or -1


@dataclass(frozen=True)
class AgreementSums:
    """One block's agreement of every pair of agents (the layout in ``backends.agreement``)."""

    counts: np.ndarray  # int64 (P, 2): per pair, elements active in both, and of those, same sign
    sums: np.ndarray  # int64 (3 P + 2 N, DIGITS): exact sums, normalised


@dataclass(frozen=True)
class ExactSums:
    """Exact accumulators (``backends.exact_sum`` format) and where a task vector was NaN/Inf
    (those elements counted as 0)."""

    sums: np.ndarray  # int64 (*rows, exact_sum.BINS + 1)
    first_nonfinite: int  # block position, or -1


class Backend(Protocol):
    """The operations. ``out`` buffers are raw carriers of the output format ``out_code``
    (``format.dtypes.FloatCode``): uint16 for BF16/F16, float32, float64."""

    name: str

    @property
    def device(self) -> str:
        """Where it computes, for progress and status (``cpu``, ``cuda:0``...)."""
        ...

    def probe(self, arrays: BlockArrays, eps: float, masks: np.ndarray) -> ProbeCounts:
        """Active masks eps < |tau| < Inf (float32, strict) bit-packed into ``masks`` (N, >= ceil(n/8))
        uint8 (bit i % 8 of byte i // 8, little bit order, zero past n), and the overlap counts.
        A NaN/Inf tau (a non-finite input, or a difference that overflows float32) is inactive."""
        ...

    def merge_ram(
        self, arrays: BlockArrays, eps: float, lambdas: np.ndarray, outs: Sequence[np.ndarray], out_code: int
    ) -> int:
        """RAM into K outputs from one read of the inputs (``lambdas`` (K, N); ``outs[k]`` the block's
        output k): per element c = active agents (as in ``probe``); base where c = 0,
        base + lambdas[k, t] * tau_t where only t is active, base + (sum of active tau in agent
        order) / c otherwise. Output k is exactly what a call for it alone writes. Returns the
        block position of the first NaN/Inf input, or -1 (every merge does)."""
        ...

    def merge_gta(
        self, arrays: BlockArrays, params: GtaParams, keep: Keep, outs: Sequence[np.ndarray], out_code: int
    ) -> int:
        """Generalized task arithmetic (the semantics in ``backends/numba/gta.py``) into K outputs,
        output k with lambda ``params.lams[k]``, each exactly what a call for it alone writes.
        ``KeepMagprune`` needs arrays of whole dim-0 slices."""
        ...

    def merge_sce(self, arrays: BlockArrays, params: SceParams, out: np.ndarray, out_code: int) -> int:
        """SCE (the semantics in ``backends/numba/sce.py``): the elements whose ``variance`` bits lie
        in the cut are kept for every agent, signs elected by the sum of the kept tau, and the
        weighted mean of the agreeing ones (divisor at least 1e-6) added to the base."""
        ...

    def variance(self, arrays: BlockArrays) -> np.ndarray:
        """float32 (n,): per element, the population variance of the agents' tau (Welford in
        float64 in agent order, as torch's CPU ``var``; rounded to float32 once). SCE's key."""
        ...

    def merge_linear(self, arrays: BlockArrays, params: LinearParams, out: np.ndarray, out_code: int) -> int:
        """(w0 base + sum_t w_t agent_t), divided by the summed weights with ``normalize``."""
        ...

    def merge_nearswap(self, arrays: BlockArrays, t: np.float32, out: np.ndarray, out_code: int) -> int:
        """NearSwap of the base and the one agent (the semantics in ``backends/numba/nearswap.py``):
        per element w = clamp((1 / max(|a - b|, 1e-6)) * t, 0, 1), then w b + (1 - w) a."""
        ...

    def importance_high_histogram(self, arrays: BlockArrays, rows: RowScale) -> np.ndarray:
        """int32 (HIGH_BINS,): elements per high half of the bits of the one agent's importance
        f32(|b - a|) * rows.scale[row] (sign bit cleared; a TAU32 agent is b = f32(a + tau))."""
        ...

    def importance_low_histogram(self, arrays: BlockArrays, rows: RowScale, targets: np.ndarray) -> np.ndarray:
        """int32 (C, LOW_BINS): per target high half ``targets[c]`` (int32 (C,); -1 matches
        nothing), the low halves of the importances whose high half it is."""
        ...

    def merge_fusion(
        self, arrays: BlockArrays, rows: RowScale, threshold: np.float32, out: np.ndarray, out_code: int
    ) -> int:
        """arcee_fusion (``backends/numba/fusion.py``): per element, d = b - a and
        m = 1 where the importance (as ``importance_high_histogram``) >= threshold, else 0;
        merged = a + d * m, each operation in float32."""
        ...

    def has_nonfinite(self, out: np.ndarray, out_code: int) -> bool:
        """True when the merged block ``out`` (the raw carrier of format ``out_code``) holds NaN/Inf."""
        ...

    def abs_high_histogram(self, arrays: BlockArrays) -> np.ndarray:
        """int32 (N, HIGH_BINS): per agent, elements per high half (bits >> 16) of |tau| (float32)."""
        ...

    def abs_low_histogram(self, arrays: BlockArrays, targets: np.ndarray) -> np.ndarray:
        """int32 (N, C, LOW_BINS): per agent and cut, the low halves of the elements whose high
        half is ``targets[t, c]`` (int32 (N, C); -1 matches nothing)."""
        ...

    def cut_keep(self, arrays: BlockArrays, cuts: Cuts) -> np.ndarray:
        """uint8 (N, n): 1 where an element lies in cut 1's lower set and not in cut 0's."""
        ...

    def find_ties(self, arrays: BlockArrays, agents: np.ndarray, values: np.ndarray, needs: np.ndarray) -> np.ndarray:
        """int64 (Q,): per query q, the block position of the ``needs[q]``-th (1-based) element of
        agent ``agents[q]`` whose |tau| bits equal ``values[q]`` (-1 if fewer). One call answers
        every query of a block, reading each input once; inside ``deferred()`` on a backend that
        streams, the array is filled when the landing waits (it holds -1 until then)."""
        ...

    def abs_sums(self, arrays: BlockArrays, keep: Keep, squares: bool = False) -> ExactSums:
        """Per agent, exact sums of |tau| (row 0) and of |tau| over the kept elements (row 1):
        (N, 2, BINS + 1); with ``squares``, of tau * tau (exact in float64). Groups of 64 elements
        (aligned in the tensor) are summed in float64 in order, then added exactly."""
        ...

    def gram(self, arrays: BlockArrays, weights: bool = False) -> ExactSums:
        """Exact sums of tau_a * tau_b for every pair a <= b ((0,0), (0,1), ...): (pairs, BINS + 1);
        with ``weights``, of x_a * x_b over the weights themselves, the base first (N + 1 vectors).
        A NaN/Inf value counts as 0 and is reported."""
        ...

    def vector_gram(self, arrays: BlockArrays, layout: VectorLayout, weights: bool = False) -> ExactSums:
        """``gram`` per block vector (``layout``), in ``backends.vector_sums``' format, normalised:
        (layout.count, pairs, DIGITS) (the semantics in ``backends/numba/vectors.py``)."""
        ...

    def agreement(self, arrays: BlockArrays, eps: float) -> AgreementSums:
        """Per pair of agents, over the elements both change (eps < |tau| < Inf, as ``probe``): the
        count, the same-sign count, and exact sums of tau_i tau_j, tau_i^2, tau_j^2; per agent, exact
        sums of tau^2 over its unique and its shared elements (``backends.agreement``). A NaN/Inf
        tau is inactive, as in the probe's masks."""
        ...

    def merge_vectors(
        self,
        arrays: BlockArrays,
        layout: VectorLayout,
        coefs: np.ndarray,
        weights: bool,
        out: np.ndarray,
        out_code: int,
    ) -> int:
        """Each element combined with its vector's coefficients ``coefs`` (layout.count, K) float32:
        ``c0 f32(base) + sum_t c_t f32(agent_t)`` (``weights``) or ``base + sum_t c_t tau_t``
        (the semantics and order in ``backends/numba/vectors.py``)."""
        ...

    def magprune_keep(self, arrays: BlockArrays, params: MagpruneParams) -> np.ndarray:
        """float32 (N, n): 0 where MAGPRUNE drops an element, 1 (or 1/p) where it keeps it."""
        ...

    def host_memory(self, nbytes: int) -> np.ndarray:
        """``nbytes`` of uint8 host memory for the caller's result buffers (the merged blocks'
        ``out``): where the backend can, memory its results are copied straight into (registered
        with CUDA on a GPU); plain memory elsewhere."""
        ...

    def lora_product(self, left: np.ndarray, right: np.ndarray, scale: np.float32, out: np.ndarray) -> None:
        """``out`` (flat, zeroed) <- (left @ right) * scale in ``blocks.lora``'s order: a LoRA
        agent's update, computed on the host while its block is assembled (``blocks.lora.Product``)."""
        ...

    def fp8_dequantize(self, run: ScaledCodes, out: np.ndarray, code: int) -> None:
        """``out`` (the carrier of ``code``: F32, BF16 or F16) <- an FP8 run's values, encoded, in
        ``blocks.quantized``'s order and bytes: a quantized input's block, decoded on the host while
        the block is assembled (``blocks.quantized.Dequantize``)."""
        ...

    @property
    def defers(self) -> bool:
        """Whether merges called inside ``deferred()`` return before their results land (a
        backend that streams through a device); a caller that does not wait for them gains nothing."""
        ...

    def expect(self, upcoming: Sequence[BlockSources | None]) -> None:
        """The blocks the next calls will read, in order (None: one whose inputs are not all in
        files): a backend that streams reads the next block's first tile while a block's last
        computes. A hint only: calls on other blocks, or in another order, are computed as ever."""
        ...

    def deferred(self) -> AbstractContextManager[Landing]:
        """A scope whose merges may return a token (below -1) instead of the first NaN/Inf input
        position, their ``out`` not yet written: both come with the landing's ``wait``
        (``backends.landing``). So may the statistics a pass computes later (``abs_high_histogram``,
        ``abs_low_histogram``, ``abs_sums``, ``gram``): their arrays are written and their
        ``first_nonfinite`` resolved by the landing's ``wait``, not before. Outside it, or on a
        backend that does not defer, every call returns its results."""
        ...

    def close(self) -> None:
        """Release files, threads and buffers."""
        ...
