"""What merges called inside ``Backend.deferred()`` leave in flight, collected when the pass needs it.

On a GPU a merge that waited for its last tiles at its end would leave the device idle between
blocks: the host would then read the next block's first tile while nothing computes. Inside
``deferred()`` a backend that streams (``Backend.defers``) returns from a merge (or a probe) as
soon as its tiles are queued; the merge's return value is a token (below -1) that ``Landing.wait``
maps to the first NaN/Inf input position (or -1) once every result has landed in its ``out``
(the probe's counts carry the token as their ``first_nonfinite``, and it maps to the counts). The merge
pass waits for a batch's landing after the next batch's merges are queued (``execution.local``),
so the device goes from one block to the next without a drain. A backend that does not stream
(Numba, torch on the CPU) returns its results at once and its landing holds nothing.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable, Mapping
from typing import Any, TypeVar

import numpy as np

T = TypeVar("T")
Wait = Callable[[], object]  # blocks until something queued has landed (raising its failure)


class Landing:
    """The results of the deferred merges of one batch: their waits and their read-backs."""

    def __init__(self) -> None:
        self._waits: list[Wait] = []
        self._results: list[tuple[int, Callable[[], np.ndarray], Callable[[np.ndarray], Any]]] = []

    def also_wait(self, waits: Iterable[Wait]) -> None:
        """Results to wait for (downloads into the caller's buffers, their copies)."""
        self._waits.extend(waits)

    def later(self, read: Callable[[], np.ndarray], post: Callable[[np.ndarray], Any]) -> int:
        """A token for a call's result: ``post`` of what ``read`` returns once landed (a merge's
        first NaN/Inf input position, a probe's counts)."""
        token = -2 - len(self._results)
        self._results.append((token, read, post))
        return token

    def wait(self) -> dict[int, Any]:
        """Every result landed (all waited for, even after one failed: none may land later; the
        first failure raised): what each token stands for."""
        errors: list[BaseException] = []
        for wait in self._waits:
            try:
                wait()
            except BaseException as error:  # raised once nothing is in flight
                errors.append(error)
        found = {}
        for token, read, post in self._results:
            try:
                found[token] = post(read())
            except BaseException as error:
                errors.append(error)
        if errors:
            raise errors[0]
        return found


def landed(token: int, found: Mapping[int, Any], result: T) -> T:
    """A call's result: what ``token`` stood for in a landing's ``found``, or ``result`` itself
    where ``token`` is none (a merge's first NaN/Inf position or -1, a probe's counts' field)."""
    return found[token] if token < -1 else result
