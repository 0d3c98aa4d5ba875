"""A child process the sweep owns: an evaluator, run so that nothing it does can hang the sweep,
outlive it, or cost it unbounded memory.

- its stdin is closed (``/dev/null``): one that reads it gets end-of-file at once;
- on Linux it runs under a supervisor (``supervise.py``), a small process that makes itself a
  child subreaper: whatever the evaluator starts stays its descendant even after a double fork
  and ``setsid`` (a daemon), and all of it is killed when the evaluator exits (a background
  child holding its stdout would otherwise keep the sweep reading forever), when it runs past
  ``timeout`` seconds (SIGTERM, then SIGKILL ``KILL_AFTER`` seconds later), when the sweep is
  interrupted (Ctrl-C, or SIGTERM, which is turned into ``KeyboardInterrupt`` while the child
  runs) and when the sweep dies (the supervisor asks the kernel for SIGTERM then);
- the evaluator runs in a process group of its own (``setsid``), and elsewhere (no supervisor)
  that group, with everything the evaluator started in it, is what is killed in those cases;
- its stdout and stderr are read as they come, and only their last non-empty line is kept, at
  most ``LINE_BYTES`` of it (what counts of an evaluator's output is its last line).

Without the supervisor, a process that leaves the group on purpose (``setsid``, as a daemon
does) is outside the sweep's reach: the sweep stops reading ``AFTER_EXIT`` seconds after the
evaluator itself exited. ``supervised()`` says which of the two this machine gets.
"""

from __future__ import annotations

import os
import selectors
import signal
import subprocess
import sys
import time
from collections.abc import Iterator, Sequence
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path

from ramstream.io.signals import sigterm_raises

LINE_BYTES = 64 * 1024  # the longest last line kept
READ_BYTES = 64 * 1024
KILL_AFTER = 1.0  # seconds between SIGTERM and SIGKILL of a group that overran
AFTER_EXIT = 1.0  # seconds the output is still read after the evaluator exited
SUPERVISOR = Path(__file__).with_name("supervise.py")
# Seconds the supervisor has, beyond KILL_AFTER, to end the evaluator's tree (it gives up after
# supervise.KILL_ROUNDS_FOR); it takes milliseconds unless a process cannot die.
SUPERVISOR_GRACE = 8.0


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


def supervised() -> bool:
    """Whether evaluators run under the supervisor here (Linux, with a Python to run it)."""
    return sys.platform.startswith("linux") and bool(sys.executable) and SUPERVISOR.is_file()


class Status:
    """What the supervisor said on its status pipe (nothing to read without a supervisor)."""

    def __init__(self, fd: int | None) -> None:
        self.fd = fd
        self.supervised = fd is not None
        self.text = b""

    def read(self) -> None:
        """What the pipe holds now, without waiting."""
        if self.fd is None:
            return
        while True:
            try:
                data = os.read(self.fd, 4096)
            except BlockingIOError:
                return
            if not data:
                return
            self.text += data

    def close(self) -> None:
        self.read()
        if self.fd is not None:
            os.close(self.fd)
            self.fd = None

    def said(self, word: str) -> int | None:
        """The number on the last line ``word N``, if there is one."""
        found = None
        for line in self.lines():
            head, _, value = line.partition(" ")
            if head == word and value.lstrip("-").isdigit():
                found = int(value)
        return found

    def finished(self) -> bool:
        """The supervisor said it ended the evaluator's tree (its exit, or a stop)."""
        return any(line == "stopped" or line.startswith("exit ") for line in self.lines())

    def lines(self) -> list[str]:
        return self.text.decode("ascii", errors="replace").splitlines()


def _start(argv: Sequence[str]) -> tuple[subprocess.Popen[bytes], Status]:
    """The evaluator, under its supervisor where there is one; raises ``OSError`` when it cannot
    be started without one (with one, ``run`` raises it once the supervisor reported it)."""
    if not supervised():
        return _popen(list(argv)), Status(None)
    read, write = os.pipe()
    try:
        os.set_blocking(read, False)
        command = [sys.executable, "-I", "-S", str(SUPERVISOR), str(write), repr(KILL_AFTER), str(os.getpid())]
        proc = _popen([*command, "--", *argv], write)
    except BaseException:
        os.close(read)
        raise
    finally:
        os.close(write)
    return proc, Status(read)


def _popen(argv: list[str], *keep: int) -> subprocess.Popen[bytes]:
    """``argv`` with stdin closed, its output piped here, in a session (and group) of its own."""
    return subprocess.Popen(
        argv,
        stdin=subprocess.DEVNULL,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        start_new_session=True,
        pass_fds=keep,
    )


def run(argv: Sequence[str], timeout: float) -> Finished:
    """Run ``argv`` as an owned child (see the module's docstring) and say how it ended; raises
    ``OSError`` when it cannot be started."""
    started = time.monotonic()
    proc, status = _start(argv)
    deadline = started + timeout
    try:
        with _owned(proc, status):
            lines = _read(proc, deadline)
            try:  # its streams ended (or stopped being read): it exits, or runs out its time
                proc.wait(max(deadline - time.monotonic(), 0))
                timed_out = False
            except subprocess.TimeoutExpired:
                timed_out = True
    finally:
        status.close()
    error = status.said("error")
    if error is not None:
        raise OSError(error, os.strerror(error), argv[0])
    if timed_out:
        returncode = None
    elif not status.supervised:
        returncode = proc.returncode  # the evaluator's own
    else:  # the evaluator's, as its supervisor reported it (a supervisor that failed: its own)
        code = status.said("exit")
        returncode = code if code is not None else (proc.returncode or 1)
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
                _kill_group(proc.pid, signal.SIGKILL)  # what it started and left behind
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
def _owned(proc: subprocess.Popen[bytes], status: Status) -> Iterator[None]:
    """While the child runs: SIGTERM to the sweep raises ``Terminated``; however the block ends,
    the child is stopped and reaped. A supervisor is sent SIGTERM and given ``KILL_AFTER`` +
    ``SUPERVISOR_GRACE`` seconds to end the evaluator's tree, then SIGKILLed with the evaluator's
    group; without one, the evaluator's group gets SIGTERM, then SIGKILL ``KILL_AFTER`` later."""
    with sigterm_raises(Terminated):
        try:
            yield
        finally:
            _stop(proc, status)
            for stream in (proc.stdout, proc.stderr):
                if stream is not None:
                    stream.close()


def _stop(proc: subprocess.Popen[bytes], status: Status) -> None:
    supervisor = status.supervised
    if proc.poll() is None:
        if supervisor:
            proc.send_signal(signal.SIGTERM)
        else:
            _kill_group(proc.pid, signal.SIGTERM)
        try:
            proc.wait(KILL_AFTER + (SUPERVISOR_GRACE if supervisor else 0))
        except subprocess.TimeoutExpired:
            pass
    _kill_group(proc.pid, signal.SIGKILL)  # the group's id is the child's pid (start_new_session)
    proc.wait()
    status.read()
    evaluator = status.said("started")
    if supervisor and evaluator is not None and not status.finished():
        _kill_group(evaluator, signal.SIGKILL)  # a supervisor that could not finish: its group at least


def _kill_group(group: int, sig: signal.Signals) -> None:
    try:
        os.killpg(group, sig)
    except (ProcessLookupError, PermissionError):
        pass  # nothing left in it
