"""Numba kernels: pure functions over arrays and scalars. They never touch files.

Work is split into one balanced range of tiles per thread (``prange`` over threads); each
thread writes only its own slice of the outputs and its own row of partial statistics, which
the caller reduces serially. No atomics, no races, and results independent of the thread count.
"""
