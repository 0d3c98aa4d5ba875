"""RAM / RAM+ merge kernel: read -> decode -> task vectors -> overlap-aware merge -> encode, per tile.

Per element: c = number of active agents (eps < |tau| < Inf, compared in float32: a NaN/Inf tau
is inactive).
c = 0: theta0; c = 1: theta0 + lambda_t * tau_t; c >= 2: theta0 + (sum of active tau, in agent
order) / c. All arithmetic in float32, then encoded to the output format.

The block's inputs are read by the kernel itself (``kernels/sources.py``: ``fds``, ``offsets``,
``codes``, base first; ``n`` elements); ``out`` is the block's output as raw bytes (``uint8``),
written in format ``out_code``; ``failed[w]`` = -1 or the input whose read failed.
"""

from __future__ import annotations

import numpy as np
from numba import njit, prange

from ramstream.backends.numba.codecs import TILE, decode_bytes, encode_bytes
from ramstream.backends.numba.sources import read_buffer, read_tile, reads_of


@njit(parallel=True, nogil=True, cache=True, error_model="numpy")
def merge_ram_block(fds, offsets, codes, n, eps, lambdas, out, out_code, failed):  # type: ignore[no-untyped-def]
    n_inputs = fds.shape[0]
    workers = failed.shape[0]
    n_reads = reads_of(n)
    eps32 = np.float32(eps)
    zero, one, two, inf = np.float32(0.0), np.float32(1.0), np.float32(2.0), np.float32(np.inf)
    for w in prange(workers):
        raw = read_buffer(n_inputs)
        base_bits = np.empty(TILE, np.uint32)
        agent_bits = np.empty(TILE, np.uint32)
        total = np.empty(TILE, np.float32)
        scaled = np.empty(TILE, np.float32)
        count = np.empty(TILE, np.float32)
        base_vals = base_bits.view(np.float32)
        agent_vals = agent_bits.view(np.float32)
        failed[w] = -1
        for read in range(n_reads * w // workers, n_reads * (w + 1) // workers):
            read_lo, read_m, failed[w] = read_tile(fds, offsets, codes, n, read, raw)
            if failed[w] >= 0:
                break
            for sub in range(0, read_m, TILE):
                m = min(TILE, read_m - sub)
                decode_bytes(raw[0], sub, m, codes[0], base_bits)
                for i in range(m):
                    total[i] = zero
                    scaled[i] = zero
                    count[i] = zero
                for t in range(n_inputs - 1):
                    decode_bytes(raw[t + 1], sub, m, codes[t + 1], agent_bits)
                    lam = lambdas[t]
                    for i in range(m):
                        tau = agent_vals[i] - base_vals[i]
                        active = (abs(tau) > eps32) & (abs(tau) < inf)
                        total[i] += tau if active else zero
                        scaled[i] += lam * tau if active else zero
                        count[i] += one if active else zero
                for i in range(m):
                    c = count[i]
                    mean = total[i] / max(c, one)
                    merged = scaled[i] if c == one else (mean if c >= two else zero)
                    base_vals[i] = base_vals[i] + merged
                encode_bytes(base_bits, read_lo + sub, m, out_code, out)
