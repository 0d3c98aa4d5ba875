"""Progress in bytes with a rate and an ETA, on stderr, only for a terminal."""

from __future__ import annotations

import sys
import time
from dataclasses import dataclass
from typing import TextIO


def _human(nbytes: float) -> str:
    for unit in ("B", "KB", "MB", "GB", "TB"):
        if nbytes < 1000 or unit == "TB":
            return f"{nbytes:6.1f} {unit}"
        nbytes /= 1000
    return f"{nbytes:.1f} TB"


@dataclass(frozen=True)
class Done:
    """A pass's progress as of one block's mark: input bytes done, seconds spent, and where the
    blocks are computed (journals record it, so ``ramstream status`` can say so mid-pass)."""

    bytes: int
    seconds: float
    where: str = ""


class Progress:
    def __init__(self, label: str, total: int, enabled: bool, stream: TextIO | None = None) -> None:
        self.label = label
        self.total = total
        self.done = 0
        self.stream = stream or sys.stderr
        self.enabled = enabled
        self.where = ""  # the backend and device computing the blocks ("torch on cuda:0"), once known
        self.started = time.monotonic()
        self._last = 0.0

    @classmethod
    def for_terminal(cls, label: str, total: int, quiet: bool) -> Progress:
        return cls(label, total, enabled=not quiet and sys.stderr.isatty())

    def advance(self, nbytes: int) -> None:
        self.done += nbytes
        now = time.monotonic()
        if self.enabled and (now - self._last > 0.25 or self.done >= self.total):
            self._last = now
            elapsed = max(now - self.started, 1e-9)
            rate = self.done / elapsed
            eta = (self.total - self.done) / rate if rate > 0 else 0.0
            where = f" ({self.where})" if self.where else ""
            self.stream.write(
                f"\r{self.label}: {_human(self.done)} / {_human(self.total)}  "
                f"{_human(rate)}/s  ETA {int(eta) // 60}:{int(eta) % 60:02d}{where} "
            )
            self.stream.flush()

    def snapshot(self) -> Done:
        return Done(self.done, self.elapsed, self.where)

    def close(self) -> None:
        if self.enabled:
            self.stream.write("\n")
            self.stream.flush()

    @property
    def elapsed(self) -> float:
        return time.monotonic() - self.started
