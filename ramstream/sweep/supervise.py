"""The evaluator's supervisor: a small process between the sweep and its evaluator that ends
everything the evaluator started, even what left its process group on purpose.

Run by ``child.run`` as ``python -I -S supervise.py STATUS_FD KILL_AFTER SWEEP_PID -- CMD...``
(standard library only, so it starts in tens of milliseconds and needs nothing on ``sys.path``).
It makes itself a *child subreaper* (Linux ``prctl(PR_SET_CHILD_SUBREAPER)``): a process the
evaluator started whose parent exits (a double fork, ``setsid``, a daemon) is reparented to it
rather than to init, so the supervisor's descendants are everything the evaluator started. It
asks for SIGTERM when the sweep dies (``PR_SET_PDEATHSIG``: even a SIGKILLed sweep leaves
nothing behind), starts the evaluator in a session of its own with stdin, stdout and stderr its
own (``/dev/null`` and the sweep's pipes), and waits:

- when the evaluator exits, every descendant still running is killed (SIGKILL) and reaped, then
  the supervisor exits: the pipes close with it, so the sweep reads the last lines at once;
- on SIGTERM, SIGINT or SIGHUP (the sweep's timeout or interruption, or its death), every
  descendant gets SIGTERM, then SIGKILL ``KILL_AFTER`` seconds later if any is still running.

It writes what happened to ``STATUS_FD``, a line each: ``started PID``, then ``exit CODE`` (the
evaluator's exit status, negative for a signal), ``stopped``, or ``error ERRNO`` (it could not
be started). Where ``prctl`` is unavailable (not Linux, or refused) the supervisor still kills
the evaluator's process group and its descendants whose parents are alive; a process that left
both is out of its reach (``reaper no`` on the status says so).
"""

from __future__ import annotations

import ctypes
import os
import signal
import sys
import time
from collections.abc import Sequence

PR_SET_PDEATHSIG = 1
PR_SET_CHILD_SUBREAPER = 36
WAITED = {signal.SIGCHLD, signal.SIGTERM, signal.SIGINT, signal.SIGHUP}
KILL_ROUNDS_FOR = 5.0  # seconds of killing a tree that keeps forking (or cannot die) before giving up
POLL = 0.02  # seconds between rounds while a tree dies


def _prctl(option: int, value: int) -> bool:
    """``prctl(option, value)`` through the C library; False where that is not possible."""
    if not sys.platform.startswith("linux"):
        return False
    try:
        libc = ctypes.CDLL(None, use_errno=True)
        return int(libc.prctl(option, value, 0, 0, 0)) == 0
    except (OSError, AttributeError):
        return False


class Tree:
    """The supervisor's descendants: found through ``/proc``, signalled, and reaped."""

    def __init__(self, evaluator: int) -> None:
        self.evaluator = evaluator
        self.code: int | None = None  # the evaluator's exit status, once reaped

    def reap(self) -> None:
        """Reap every child that ended (the evaluator, and orphans reparented here)."""
        while True:
            try:
                pid, status = os.waitpid(-1, os.WNOHANG)
            except ChildProcessError:
                return
            if pid == 0:
                return
            if pid == self.evaluator:
                self.code = os.waitstatus_to_exitcode(status)

    def living(self) -> list[int]:
        """The descendants that are not zombies (a zombie child is reaped by ``reap``); none where
        ``/proc`` cannot be read (then the evaluator's group is all that is signalled)."""
        parents: dict[int, list[tuple[int, bool]]] = {}
        try:
            names = os.listdir("/proc")
        except OSError:
            return []
        for name in names:
            if not name.isdigit():
                continue
            try:
                with open(f"/proc/{name}/stat", "rb") as stat:
                    fields = stat.read().rsplit(b")", 1)[1].split()
            except (OSError, IndexError):
                continue  # gone meanwhile
            parents.setdefault(int(fields[1]), []).append((int(name), fields[0] not in (b"Z", b"X")))
        found: list[int] = []
        todo = [os.getpid()]
        while todo:
            for pid, running in parents.get(todo.pop(), []):
                todo.append(pid)
                if running:
                    found.append(pid)
        return found

    def signal(self, sig: int) -> bool:
        """Send ``sig`` to the evaluator's group and every living descendant; True if any was left."""
        try:
            os.killpg(self.evaluator, sig)
        except OSError:
            pass  # the group is empty
        left = self.living()
        for pid in left:
            try:
                os.kill(pid, sig)
            except OSError:
                pass  # ended meanwhile
        return bool(left)

    def end(self, graceful: bool, kill_after: float) -> None:
        """Stop every descendant: SIGTERM first when ``graceful``, SIGKILL once ``kill_after``
        seconds passed (at once otherwise), until none is left; reaped."""
        if graceful:
            deadline = time.monotonic() + kill_after
            self.signal(signal.SIGTERM)
            while time.monotonic() < deadline:
                self.reap()
                if not self.living():
                    break
                signal.sigtimedwait({signal.SIGCHLD}, POLL)
        deadline = time.monotonic() + KILL_ROUNDS_FOR
        while time.monotonic() < deadline:
            self.reap()
            if not self.signal(signal.SIGKILL):
                break
            signal.sigtimedwait({signal.SIGCHLD}, POLL)
        self.reap()


def supervise(status_fd: int, kill_after: float, sweep: int, command: Sequence[str]) -> None:
    def report(line: str) -> None:
        try:
            os.write(status_fd, (line + "\n").encode())
        except OSError:
            pass  # the sweep is gone: nobody to tell

    # Blocked here and waited for below; the evaluator starts with none blocked and none ignored.
    signal.pthread_sigmask(signal.SIG_BLOCK, WAITED)
    os.set_inheritable(status_fd, False)
    _prctl(PR_SET_PDEATHSIG, signal.SIGTERM)
    if not _prctl(PR_SET_CHILD_SUBREAPER, 1):
        report("reaper no")
    if os.getppid() != sweep:  # the sweep died before the death signal was asked for
        report("stopped")
        return
    try:
        pid = os.posix_spawnp(
            command[0],
            list(command),
            dict(os.environ),
            setsid=True,
            setsigmask=(),
            setsigdef=(signal.SIGPIPE, signal.SIGXFSZ, *WAITED),
        )
    except OSError as exc:
        report(f"error {exc.errno or 0}")
        return
    report(f"started {pid}")
    tree = Tree(pid)
    while tree.code is None:
        got = signal.sigwaitinfo(WAITED)
        if got.si_signo != signal.SIGCHLD:
            tree.end(graceful=True, kill_after=kill_after)
            report("stopped")
            return
        tree.reap()
    tree.end(graceful=False, kill_after=0)
    report(f"exit {tree.code}")


def main(argv: Sequence[str]) -> None:
    if len(argv) < 6 or argv[4] != "--":
        sys.exit("usage: supervise.py STATUS_FD KILL_AFTER SWEEP_PID -- CMD [ARG...]")
    supervise(int(argv[1]), float(argv[2]), int(argv[3]), argv[5:])


if __name__ == "__main__":
    main(sys.argv)
