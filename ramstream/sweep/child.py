"""A child process the sweep owns: an evaluator, run so that nothing it does can hang the sweep,
outlive it, or cost it unbounded memory.

- its stdin is closed (``/dev/null``): one that reads it gets end-of-file at once;
- it runs in a process group of its own (``start_new_session``), and that group, with everything
  the evaluator started in it, is killed when the evaluator exits (a background child holding its
  stdout would otherwise keep the sweep reading forever), when it runs past ``timeout`` seconds
  (SIGTERM, then SIGKILL ``KILL_AFTER`` seconds later), and when the sweep is interrupted
  (Ctrl-C, or SIGTERM, which is turned into ``KeyboardInterrupt`` while the child runs);
- its stdout and stderr are read as they come, and only their last non-empty line is kept, at
  most ``LINE_BYTES`` of it (what counts of an evaluator's output is its last line).

A process that leaves the group on purpose (``setsid``, as a daemon does) is outside its reach:
the sweep stops reading ``AFTER_EXIT`` seconds after the evaluator itself exited.
"""

from __future__ import annotations

import os
import selectors
import signal
import subprocess
import threading
import time
from collections.abc import Callable, Iterator, Sequence
from contextlib import contextmanager
from dataclasses import dataclass
from types import FrameType

LINE_BYTES = 64 * 1024  # the longest last line kept
READ_BYTES = 64 * 1024
KILL_AFTER = 1.0  # seconds between SIGTERM and SIGKILL of a group that overran
AFTER_EXIT = 1.0  # seconds the output is still read after the evaluator exited


class Terminated(KeyboardInterrupt):
    """SIGTERM received while a child ran: the sweep stops as for Ctrl-C, its child killed first."""


@dataclass(frozen=True)
class Finished:
    """How a child ended: its exit status (negative: the signal that killed it; None: stopped at
    the deadline), and the last non-empty line of each stream (None: longer than ``LINE_BYTES``)."""

    returncode: int | None
    stdout: str | None
    stderr: str | None
    seconds: float

    @property
    def timed_out(self) -> bool:
        return self.returncode is None


class LastLine:
    """The last non-empty line of a stream fed in pieces, in at most ``2 * limit`` bytes."""

    def __init__(self, limit: int = LINE_BYTES) -> None:
        self.limit = limit
        self.last: bytes | None = b""  # None: the last line was too long
        self.partial = bytearray()
        self.overlong = False  # the line being read is already too long

    def feed(self, data: bytes) -> None:
        first = data.find(b"\n")
        if first < 0:
            self._extend(data)
            return
        self._extend(data[:first])  # the line being read ends here
        self._finish()
        last = data.rfind(b"\n")
        for line in reversed(data[first + 1 : last].split(b"\n")):  # whole lines in between
            if line.strip():
                self.last = line.strip() if len(line) <= self.limit else None
                break
        self._extend(data[last + 1 :])

    def close(self) -> str | None:
        self._finish()
        return None if self.last is None else self.last.decode("utf-8", errors="replace")

    def _extend(self, data: bytes) -> None:
        if self.overlong:
            return
        self.partial += data
        if len(self.partial) > self.limit:
            self.overlong = True
            self.partial.clear()

    def _finish(self) -> None:
        if self.overlong:
            self.last = None
        elif self.partial.strip():
            self.last = bytes(self.partial.strip())
        self.partial.clear()
        self.overlong = False


def run(argv: Sequence[str], timeout: float) -> Finished:
    """Run ``argv`` as an owned child (see the module's docstring) and say how it ended; raises
    ``OSError`` when it cannot be started."""
    started = time.monotonic()
    proc = subprocess.Popen(
        list(argv),
        stdin=subprocess.DEVNULL,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        start_new_session=True,
    )
    deadline = started + timeout
    with _owned(proc):
        lines = _read(proc, deadline)
        try:  # its streams ended (or stopped being read): it exits, or runs out its time
            proc.wait(max(deadline - time.monotonic(), 0))
            timed_out = False
        except subprocess.TimeoutExpired:
            timed_out = True
    returncode = None if timed_out else proc.returncode
    return Finished(returncode, *lines, seconds=time.monotonic() - started)


def _read(proc: subprocess.Popen[bytes], deadline: float) -> tuple[str | None, str | None]:
    """Both streams' last lines, read until both end, the deadline passes, or ``AFTER_EXIT``
    seconds after the child exited (its group killed then: what it left must not hold the pipes)."""
    assert proc.stdout is not None and proc.stderr is not None
    tails = {proc.stdout.fileno(): LastLine(), proc.stderr.fileno(): LastLine()}
    with selectors.DefaultSelector() as selector:
        for fd in tails:
            selector.register(fd, selectors.EVENT_READ)
        stop = deadline
        while selector.get_map():
            if proc.poll() is not None and stop == deadline:
                _kill_group(proc, signal.SIGKILL)  # what it started and left behind
                stop = min(deadline, time.monotonic() + AFTER_EXIT)
            left = stop - time.monotonic()
            if left <= 0:
                break
            for key, _ in selector.select(min(left, 0.1)):
                data = os.read(key.fd, READ_BYTES)
                if data:
                    tails[key.fd].feed(data)
                else:
                    selector.unregister(key.fd)
    return tails[proc.stdout.fileno()].close(), tails[proc.stderr.fileno()].close()


@contextmanager
def _owned(proc: subprocess.Popen[bytes]) -> Iterator[None]:
    """While the child runs: SIGTERM to the sweep raises ``Terminated``; however the block ends,
    the child's group is stopped (SIGTERM, SIGKILL after ``KILL_AFTER``) and the child reaped."""
    restore = _catch_sigterm()
    try:
        yield
    finally:
        try:
            if proc.poll() is None:
                _kill_group(proc, signal.SIGTERM)
                try:
                    proc.wait(KILL_AFTER)
                except subprocess.TimeoutExpired:
                    pass
            _kill_group(proc, signal.SIGKILL)
            proc.wait()
            for stream in (proc.stdout, proc.stderr):
                if stream is not None:
                    stream.close()
        finally:
            restore()


def _kill_group(proc: subprocess.Popen[bytes], sig: signal.Signals) -> None:
    try:
        os.killpg(proc.pid, sig)  # the group's id is the child's pid (start_new_session)
    except (ProcessLookupError, PermissionError):
        pass  # nothing left in it


def _catch_sigterm() -> Callable[[], None]:
    """Turn SIGTERM into ``Terminated`` (once) while a child runs; returns what puts the handler
    it replaced back (nothing to do outside the main thread, where signals cannot be caught)."""
    if threading.current_thread() is not threading.main_thread():
        return lambda: None
    raised: list[int] = []

    def terminate(signum: int, frame: FrameType | None) -> None:
        if not raised:
            raised.append(signum)
            raise Terminated

    previous = signal.signal(signal.SIGTERM, terminate)

    def restore() -> None:
        signal.signal(signal.SIGTERM, signal.SIG_DFL if previous is None else previous)

    return restore
