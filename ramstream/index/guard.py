"""Turn failures of Zarr stores (ours: the index and the merge journal) into clear errors.

Zarr reports a full disk as an ``OSError`` and a damaged chunk (checksum mismatch, truncated or
altered file) or damaged metadata as a ``ValueError`` (its codecs, JSON, and ``zarr.errors``,
all ``ValueError``); at this boundary both become ramstream errors that name the store and say
what to do. Anything else is a bug and stays one: telling a user to delete a healthy store
would hide it.
"""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import contextmanager

from ramstream.errors import RamstreamError, StoreCorruptError, StoreWriteError, shown


@contextmanager
def store_io(where: object, doing: str) -> Iterator[None]:
    try:
        yield
    except RamstreamError:
        raise
    except OSError as exc:
        reason = exc.strerror or str(exc)
        raise StoreWriteError(
            f"{where}: {doing} failed ({reason}); free space (or fix permissions) and rerun the same command to resume"
        ) from exc
    except ValueError as exc:  # format errors: checksum mismatch, truncated or altered chunk, bad metadata
        raise StoreCorruptError(
            f"{where}: {doing} failed, the store is damaged ({type(exc).__name__}: {_excerpt(exc)}); "
            "delete it and run the command again"
        ) from exc


def _excerpt(exc: Exception) -> str:
    """The start of an error's first line: a codec's message may quote the damaged bytes."""
    text = str(exc).splitlines()[0] if str(exc) else ""
    return shown(text if len(text) <= 80 else text[:77] + "...")
