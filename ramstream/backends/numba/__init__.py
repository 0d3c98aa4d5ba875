"""The Numba backend (``backend.NumbaBackend``) and its kernels: pure functions over arrays and
scalars (the spine kernels also ``pread`` their own tiles from descriptors they are given).

Work is split into one balanced range of tiles per thread (``workers.run_parts``); each
thread writes only its own slice of the outputs and its own row of partial statistics, which
the backend reduces serially. No atomics, no races, and results independent of the thread count.
"""
