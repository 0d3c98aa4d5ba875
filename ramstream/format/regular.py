"""Open user-given input files only when they are regular files.

A FIFO named as a checkpoint blocks ``open()`` until a writer appears (forever), and a device
such as ``/dev/zero`` reads without end. Opening non-blocking, then checking the open
descriptor, refuses both at once, and a file swapped between the check and the use cannot slip
through.
"""

from __future__ import annotations

import os
import stat
from pathlib import Path

from ramstream.errors import CorruptFileError

_KINDS = (
    (stat.S_ISDIR, "a directory"),
    (stat.S_ISFIFO, "a FIFO (named pipe)"),
    (stat.S_ISCHR, "a character device"),
    (stat.S_ISBLK, "a block device"),
    (stat.S_ISSOCK, "a socket"),
)


def kind_of(mode: int) -> str:
    """What a non-regular file is, for messages."""
    return next((name for test, name in _KINDS if test(mode)), "not a regular file")


def open_regular(path: Path) -> int:
    """A read-only descriptor of ``path``; ``CorruptFileError`` unless it is a regular file.

    ``OSError`` from ``open`` itself (missing, permissions, a name too long) is the caller's to word.
    """
    fd = os.open(path, os.O_RDONLY | os.O_NONBLOCK | os.O_CLOEXEC)
    mode = os.fstat(fd).st_mode
    if not stat.S_ISREG(mode):
        os.close(fd)
        raise CorruptFileError(f"{path}: is {kind_of(mode)}, not a file; give a .safetensors file or a model directory")
    os.set_blocking(fd, True)
    return fd
