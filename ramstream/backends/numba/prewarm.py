"""Compile the kernels a merge calls later in child processes, while this process works.

A first merge after installing spends most of its time compiling kernels (seconds each; Numba's
on-disk cache keeps them for every later run). Compiling is single-threaded, and a merge calls
its kernels one after the other: a RAM+ merge the probe's kernel, then the merge's; a TIES merge
the histograms', then the merge's. So ``start(method)`` arms the run: at its first kernel call
(a run with nothing to do, "already merged", starts nothing), the kernels the method calls after
that one and not cached yet go to child processes (``python -m ramstream.backends.numba.prewarm``,
one per spare core, at most ``MAX_CHILDREN``), which compile them into the same cache, the
last-called first, while this process compiles the one it called. Before its first call of a
later kernel (``workers.run_parts`` asks ``_Pending.wait_for``) this process waits for a child
that has begun that kernel until the child says it is done, then Numba loads it from the cache;
one no child has begun yet it compiles itself, as without children.

Which kernels, with which argument types, is ``kernel_table.KERNELS``, recorded from each
method's merge of a small family by ``tools/record_kernels.py`` (a test checks it is current).
A run whose first call is one of ``kernel_table.INPUT_KERNELS`` (decoding a block's inputs before
any method's kernel: an FP8 base's dequantization) hands all of the method's kernels to children.
What is computed never changes: a run whose first call has other argument types than the
recorded ones (another dtype) starts no child, a call of other types does not wait, and a child
that fails or hangs costs at most ``WAIT_SECONDS`` of waiting. ``RAMSTREAM_PREWARM=0`` turns it
off.
"""

from __future__ import annotations

import os
import re
import select
import subprocess
import sys
import threading
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from importlib import import_module
from pathlib import Path
from typing import Any

from numba import typeof, types

from ramstream.backends.numba import workers
from ramstream.backends.numba.kernel_table import INPUT_KERNELS, KERNELS

WAIT_SECONDS = 300.0  # the longest this process waits for a child's kernel
MAX_CHILDREN = 4

_ARRAY = re.compile(r"(readonly )?array\((\w+), (\d)d, ([CFA])\)")
_PACKAGE_ROOT = str(Path(__file__).resolve().parents[3])  # the directory holding ``ramstream``


def numba_type(text: str) -> types.Type:
    """The Numba type a recorded name stands for (``str`` of the type: 'int64',
    'readonly array(float32, 1d, C)'); ``ValueError`` for a kind the table never holds."""
    found = _ARRAY.fullmatch(text)
    if found:
        readonly, dtype, ndim, layout = found.groups()
        return types.Array(numba_type(dtype), int(ndim), layout, readonly=readonly is not None)  # type: ignore[arg-type]
    kind = types.boolean if text == "bool" else getattr(types, text, None)
    if not isinstance(kind, types.Type):
        raise ValueError(f"not a recorded argument type: {text!r}")
    return kind


@dataclass(frozen=True)
class Kernel:
    """One recorded kernel: its dispatcher and the argument types it was called with (``w`` and
    ``workers``, which ``run_parts`` adds, included)."""

    dispatcher: Any
    signature: tuple[types.Type, ...]

    @classmethod
    def of(cls, module: str, name: str, argument_types: Sequence[str]) -> Kernel:
        dispatcher = getattr(import_module(f"ramstream.backends.numba.{module}"), name)
        return cls(dispatcher, tuple(numba_type(t) for t in argument_types))

    def cached(self) -> bool:
        """Whether Numba's cache holds this kernel already (a run that compiled it before): its
        key in the cache's index, which is what Numba's own lookup reads first. Loading the
        kernel to find out (``load_overload``) would rebuild its machine code, and the run then
        loads it again: 0.4 s of every warm run."""
        cache = getattr(self.dispatcher, "_cache", None)
        try:
            key = cache._index_key(self.signature, self.dispatcher.targetctx.codegen())  # type: ignore[union-attr]
            return key in cache._cache_file._load_index()  # type: ignore[union-attr]
        except Exception:  # no cache, or an index Numba cannot read: a kernel to compile
            return False

    def compile(self) -> None:
        self.dispatcher.compile(self.signature)


def kernels(method: str) -> list[Kernel]:
    """The kernels a merge with ``method`` calls, in the order it first calls them."""
    return [Kernel.of(*entry) for entry in KERNELS.get(method, ())]


def is_input_kernel(part: Any, called: tuple[types.Type, ...]) -> bool:
    """Whether ``part`` called with types ``called`` is a recorded input kernel (any method's)."""
    inputs = (Kernel.of(*entry) for entry in INPUT_KERNELS)
    return any(k.dispatcher is part and k.signature[:-2] == called for k in inputs)


@dataclass
class _Child:
    """A child compiling kernels; it writes ``start N`` and ``done N`` lines as it goes."""

    proc: subprocess.Popen[bytes]
    started: set[int] = field(default_factory=set)
    done: set[int] = field(default_factory=set)
    buffer: bytes = b""
    ended: bool = False

    def read(self, timeout: float) -> None:
        """Take in what the child reported, waiting up to ``timeout`` seconds for a first line."""
        stdout = self.proc.stdout
        if self.ended or stdout is None or not select.select([stdout], [], [], max(timeout, 0.0))[0]:
            return
        data = os.read(stdout.fileno(), 4096)
        if not data:
            self.ended = True
            return
        self.buffer += data
        *lines, self.buffer = self.buffer.split(b"\n")
        for line in lines:
            what, _, position = line.decode("ascii", "replace").partition(" ")
            if position.isdigit():
                (self.started if what == "start" else self.done).add(int(position))

    def stop(self) -> None:
        if self.proc.poll() is None:
            self.proc.kill()
        self.proc.wait()
        if self.proc.stdout is not None:
            self.proc.stdout.close()


class _Pending:
    """The kernels children are compiling, by dispatcher: (its types, its position, its child)."""

    def __init__(self) -> None:
        self.lock = threading.Lock()
        self.kernels: dict[Any, tuple[tuple[types.Type, ...], int, _Child]] = {}
        self.children: list[_Child] = []
        self.method: str | None = None  # armed: the children start at the run's first kernel call

    def wait_for(self, part: Any, args: Sequence[Any]) -> None:
        """Before ``part``'s call with ``args``: wait for the child compiling it, if one is and
        the types are the recorded ones."""
        if part not in self.kernels:
            return
        with self.lock:
            entry = self.kernels.get(part)
            if entry is None:
                return
            signature, position, child = entry
            if tuple(typeof(a) for a in args) != signature[:-2]:
                return  # another specialisation: compiled here, as without a child
            del self.kernels[part]
            if not self.kernels:
                workers.before_call(None)  # nothing left to wait for: calls go straight on
            until = time.monotonic() + WAIT_SECONDS
            child.read(0.0)
            while position not in child.done and not child.ended and time.monotonic() < until:
                if position not in child.started:
                    child.read(0.0)
                    if position not in child.started:
                        return  # not begun yet: compiled here rather than waited for
                child.read(until - time.monotonic())

    def first_call(self, part: Any, args: Sequence[Any]) -> None:
        """The run's first kernel call: it computes after all (not "already merged"). Hand the
        kernels recorded after this one, those not cached, to children; nothing when this call is
        not the recorded one (another specialisation: the later ones would likely differ too)."""
        with self.lock:
            method, self.method = self.method, None
            if method is None:
                return
            recorded = kernels(method)
            called = tuple(typeof(a) for a in args)
            now = [p for p, k in enumerate(recorded) if k.dispatcher is part and k.signature[:-2] == called]
            if not now and is_input_kernel(part, called):
                now = [-1]  # the inputs decoded first: every kernel of the method comes later
            later = [(p, k) for p, k in enumerate(recorded) if now and p > now[0] and not k.cached()]
            self.spawn(method, later)
            workers.before_call(self.wait_for if self.kernels else None)

    def spawn(self, method: str, later: list[tuple[int, Kernel]]) -> None:
        """Start children for ``later`` (positions in the method's table, and kernels), the
        last-called first: the first ones are needed soonest, and this process compiles one no
        child has begun."""
        if not later:
            return
        count = max(1, min(len(later), (os.cpu_count() or 1) - 1, MAX_CHILDREN))
        paths = [_PACKAGE_ROOT, os.environ.get("PYTHONPATH")]
        env = dict(os.environ, PYTHONPATH=os.pathsep.join(p for p in paths if p))
        for c in range(count):
            share = later[::-1][c::count]
            argv = [sys.executable, "-P", "-m", __name__, method, *(str(position) for position, _ in share)]
            try:
                proc = subprocess.Popen(argv, env=env, stdin=subprocess.DEVNULL, stdout=subprocess.PIPE,
                                        stderr=subprocess.DEVNULL)  # fmt: skip
            except OSError:
                return  # no child: this process compiles the rest, as without one
            child = _Child(proc)
            self.children.append(child)
            for position, kernel in share:
                self.kernels[kernel.dispatcher] = (kernel.signature, position, child)

    def stop(self) -> None:
        with self.lock:
            for child in self.children:
                child.stop()
            self.kernels.clear()
            self.children.clear()
            self.method = None
        workers.before_call(None)


_pending = _Pending()


def start(method: str, *, now: bool = False) -> Callable[[], None]:
    """Prepare a merge with ``method``: at its first kernel call (so not for a run with nothing
    to do), the kernels recorded after that one and not cached yet go to child processes; with
    ``now``, those after the method's first go at once. Returns what stops the children (one
    still compiling is of no use to this run once it ended)."""
    if os.environ.get("RAMSTREAM_PREWARM", "1") == "0" or _pending.children or method not in KERNELS:
        return _pending.stop
    with _pending.lock:
        if now:
            recorded = kernels(method)
            _pending.spawn(method, [(p, k) for p, k in enumerate(recorded) if p > 0 and not k.cached()])
            if _pending.kernels:
                workers.before_call(_pending.wait_for)
        else:
            _pending.method = method
            workers.before_call(_pending.first_call)
    return _pending.stop


def wait(timeout: float = WAIT_SECONDS) -> int:
    """Wait until the children have ended (for a caller with nothing else to do first, and the
    tests); how many there were."""
    with _pending.lock:
        for child in _pending.children:
            child.proc.wait(timeout)
        return len(_pending.children)


def _forget() -> None:
    """A forked process has none of its parent's children to wait for."""
    global _pending
    _pending = _Pending()
    workers.before_call(None)


os.register_at_fork(after_in_child=_forget)


def main(argv: Sequence[str]) -> None:
    """The child: compile the method's kernels at the given positions, in that order, saying when
    each one starts and is done."""
    method, positions = argv[0], [int(p) for p in argv[1:]]
    recorded = kernels(method)
    for position in positions:
        print(f"start {position}", flush=True)
        recorded[position].compile()
        print(f"done {position}", flush=True)


if __name__ == "__main__":
    main(sys.argv[1:])
