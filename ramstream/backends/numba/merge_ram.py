"""RAM / RAM+ merge kernel: read -> decode -> task vectors -> overlap-aware merge -> encode, per tile,
into K outputs at once (a sweep's RAM candidates differ only in their lambdas).

Per element: c = number of active agents (eps < |tau| < Inf, compared in float32: a NaN/Inf tau
is inactive).
c = 0: theta0; c = 1: theta0 + lambda_kt * tau_t; c >= 2: theta0 + (sum of active tau, in agent
order) / c. All arithmetic in float32, then encoded to the output format. Output k's arithmetic
is exactly that of a kernel call for it alone: the sums over agents run in the same order.

The block's inputs are read by the kernel itself (``kernels/sources.py``: ``fds``, ``offsets``,
``codes``, base first; ``n`` elements), once for all K outputs; ``lambdas`` is (K, agents);
``out_addresses[k]`` is the address of output k's raw bytes (``n`` elements in format
``out_code``; the caller keeps them alive): one compiled signature for any K. ``failed[w]`` = -1
or the input whose read failed; ``nonfinite[w]`` = -1 or the first element index whose base or
agent value is NaN/Inf (found while merging: a NaN/Inf input makes tau NaN/Inf, which the
activity test already compares, so a tile is searched only where one was seen; no second read).
"""

from __future__ import annotations

import numpy as np
from numba import njit

from ramstream.backends.numba.codecs import TILE, decode_at, encode_at, minus
from ramstream.backends.numba.probe import first_nonfinite_of
from ramstream.backends.numba.sources import read_buffer, read_tile, reads_of, row_address
from ramstream.backends.numba.workers import run_parts


def merge_ram_block(fds, offsets, codes, n, eps, lambdas, out_addresses, out_code, failed, nonfinite) -> None:  # type: ignore[no-untyped-def]
    """The RAM merge of one block, one part per row of ``failed``."""
    run_parts(
        _merge_ram_part, failed.shape[0], fds, offsets, codes, n, eps, lambdas, out_addresses, out_code, failed,
        nonfinite,
    )  # fmt: skip


@njit(nogil=True, cache=True, error_model="numpy")
def _merge_ram_part(fds, offsets, codes, n, eps, lambdas, out_addresses, out_code, failed, nonfinite, w, workers):  # type: ignore[no-untyped-def]
    n_inputs = fds.shape[0]
    n_outputs = lambdas.shape[0]
    n_reads = reads_of(n)
    eps32 = np.float32(eps)
    zero, one, two, inf = np.float32(0.0), np.float32(1.0), np.float32(2.0), np.float32(np.inf)
    raw = read_buffer(n_inputs)
    base_bits = np.empty(TILE, np.uint32)
    agent_bits = np.empty(TILE, np.uint32)
    result_bits = np.empty(TILE, np.uint32)
    zeros = np.zeros(TILE, np.float32)
    total = np.empty(TILE, np.float32)
    scaled = np.empty((n_outputs, TILE), np.float32)
    count = np.empty(TILE, np.float32)
    odd = np.empty(TILE, np.uint8)
    base_vals = base_bits.view(np.float32)
    agent_vals = agent_bits.view(np.float32)
    result_vals = result_bits.view(np.float32)
    failed[w] = -1
    first_bad = -1
    for read in range(n_reads * w // workers, n_reads * (w + 1) // workers):
        read_lo, read_m, failed[w] = read_tile(fds, offsets, codes, n, read, raw)
        if failed[w] >= 0:
            break
        for sub in range(0, read_m, TILE):
            m = min(TILE, read_m - sub)
            decode_at(row_address(raw, 0), sub, m, codes[0], base_bits)
            for i in range(m):
                total[i] = zero
                count[i] = zero
                odd[i] = 0
            for k in range(n_outputs):
                for i in range(m):
                    scaled[k, i] = zero
            for t in range(n_inputs - 1):
                decode_at(row_address(raw, t + 1), sub, m, codes[t + 1], agent_bits)
                under = minus(codes[t + 1], base_vals, zeros)
                for i in range(m):
                    tau = agent_vals[i] - under[i]
                    finite = abs(tau) < inf
                    active = (abs(tau) > eps32) & finite
                    total[i] += tau if active else zero
                    count[i] += one if active else zero
                    odd[i] |= np.uint8(not finite)  # a NaN/Inf input makes tau NaN/Inf
                for k in range(n_outputs):
                    lam = lambdas[k, t]
                    for i in range(m):
                        tau = agent_vals[i] - under[i]
                        active = (abs(tau) > eps32) & (abs(tau) < inf)
                        scaled[k, i] += lam * tau if active else zero
            for k in range(n_outputs):
                for i in range(m):
                    c = count[i]
                    mean = total[i] / max(c, one)
                    merged = scaled[k, i] if c == one else (mean if c >= two else zero)
                    result_vals[i] = base_vals[i] + merged
                encode_at(result_bits, out_addresses[k], read_lo + sub, m, out_code)
            if first_bad < 0 and odd[:m].max() > 0:  # or a finite difference overflowed: look
                found = first_nonfinite_of(raw, codes, sub, m, base_bits)
                first_bad = read_lo + sub + found if found < m else -1
    nonfinite[w] = first_bad
