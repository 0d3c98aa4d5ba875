"""Two per-call costs of triton's interpreter, taken out of the fused-kernel checks
(``tests/fused_checks.py``) without changing what it computes.

- Every call of a ``@triton.jit`` helper from a kernel patches the whole ``triton.language``
  module again (``_patch_lang``: an ``inspect.getmembers`` of each of its namespaces, ~0.25 ms),
  though the launch patched it already; the kernels call their codec and element helpers tens of
  thousands of times per check. Here a helper patches once per launch, the first time it is called.
- ``_get_np_dtype`` builds its table of numpy dtypes anew on every call (100,000s per check); here
  its answers are kept per triton element type (a block's answer is its element's).

Together they take about half off each check (measured alone, ``python -m tests.fused_checks``:
``sums_tiles`` 16.6 s to 8.9 s, ``gta_tiles`` 15.1 s to 7.6 s; the first change alone gave 12.4 s
and 10.4 s). Applied to triton 3.6's interpreter only (the version the tests pin); with another
version the interpreter runs as it is.
"""

from __future__ import annotations

import functools
from typing import Any


def install() -> bool:
    """Patch the interpreter if it is the one this was written against; whether it was."""
    import triton
    from triton.runtime import interpreter

    if not triton.__version__.startswith("3.6.") or not all(
        hasattr(interpreter, name)
        for name in ("GridExecutor", "InterpretedFunction", "InterpreterError", "_patch_lang", "_get_np_dtype")
    ):
        return False
    launches: list[set[object]] = []  # per launch in progress: the helpers that patched already
    launch = interpreter.GridExecutor.__call__

    def launched(self: Any, *args: Any, **kwargs: Any) -> Any:
        launches.append(set())
        try:
            return launch(self, *args, **kwargs)
        finally:
            launches.pop()

    def helper_called(self: Any, *args: Any, **kwargs: Any) -> Any:
        if not launches or self.fn not in launches[-1]:
            if launches:
                launches[-1].add(self.fn)
            interpreter._patch_lang(self.fn)
        fn = self.rewrite()
        try:
            return fn(*args, **kwargs)
        except Exception as e:
            raise interpreter.InterpreterError(repr(e)) from e

    interpreter.GridExecutor.__call__ = launched
    interpreter.InterpretedFunction.__call__ = helper_called
    np_dtype = interpreter._get_np_dtype
    of_element = functools.cache(np_dtype)  # the table's answer for a block is its element's

    def cached_np_dtype(tt_dtype: Any) -> Any:
        if isinstance(tt_dtype, interpreter.tl.block_type):
            tt_dtype = tt_dtype.element_ty
        try:
            return of_element(tt_dtype)
        except TypeError:  # a type that cannot be a key
            return np_dtype(tt_dtype)

    interpreter._get_np_dtype = cached_np_dtype
    return True
