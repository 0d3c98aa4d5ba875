"""RAM / RAM+ merge kernel: decode -> task vectors -> overlap-aware merge -> encode, per tile.

Per element: c = number of active agents (|tau| > eps, compared in float32).
c = 0: theta0; c = 1: theta0 + lambda_t * tau_t; c >= 2: theta0 + (sum of active tau, in agent
order) / c. All arithmetic in float32, then encoded to the output format.
"""

from __future__ import annotations

import numpy as np
from numba import njit, prange

from ramstream.kernels.codecs import TILE, decode_tile, encode_tile


@njit(parallel=True, nogil=True, cache=True, error_model="numpy")
def merge_ram_block(base, base_code, agents, agent_codes, eps, lambdas, out, out_code, workers):  # type: ignore[no-untyped-def]
    n = base.shape[0]
    n_agents = len(agents)
    n_tiles = (n + TILE - 1) // TILE
    eps32 = np.float32(eps)
    zero, one, two = np.float32(0.0), np.float32(1.0), np.float32(2.0)
    for w in prange(workers):
        base_bits = np.empty(TILE, np.uint32)
        agent_bits = np.empty(TILE, np.uint32)
        total = np.empty(TILE, np.float32)
        scaled = np.empty(TILE, np.float32)
        count = np.empty(TILE, np.float32)
        base_vals = base_bits.view(np.float32)
        agent_vals = agent_bits.view(np.float32)
        for tile in range(n_tiles * w // workers, n_tiles * (w + 1) // workers):
            lo = tile * TILE
            m = min(TILE, n - lo)
            decode_tile(base, lo, m, base_code, base_bits)
            for i in range(m):
                total[i] = zero
                scaled[i] = zero
                count[i] = zero
            for t in range(n_agents):
                decode_tile(agents[t], lo, m, agent_codes[t], agent_bits)
                lam = lambdas[t]
                for i in range(m):
                    tau = agent_vals[i] - base_vals[i]
                    active = abs(tau) > eps32
                    total[i] += tau if active else zero
                    scaled[i] += lam * tau if active else zero
                    count[i] += one if active else zero
            for i in range(m):
                c = count[i]
                mean = total[i] / max(c, one)
                merged = scaled[i] if c == one else (mean if c >= two else zero)
                base_vals[i] = base_vals[i] + merged
            encode_tile(base_bits, lo, m, out_code, out)
