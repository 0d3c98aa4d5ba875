"""Numba kernels: pure functions over arrays and scalars. They never touch files.

Work is split into one balanced range of tiles per thread (``prange`` over threads); each
thread writes only its own slice of the outputs and its own row of partial statistics, which
the caller reduces serially. No atomics, no races, and results independent of the thread count.
"""

import os as _os

# Numba's OpenMP workers spin after each parallel call by default, taking a core from the main
# thread's writes between kernels (on 2 cores that halved merge throughput). Passive waiting
# costs nothing measurable here. setdefault: a user's own OpenMP setting wins.
_os.environ.setdefault("OMP_WAIT_POLICY", "PASSIVE")
