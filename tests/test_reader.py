"""The input files' reader: descriptors for the spine kernels, mapped views for the others, and
read-ahead hints that skip what the page cache already holds."""

from __future__ import annotations

import os
from pathlib import Path
from types import SimpleNamespace

import numpy as np
import pytest

from ramstream.backends.numba.backend import NumbaBackend
from ramstream.blocks import BlockSources
from ramstream.errors import CorruptFileError
from ramstream.format.checkpoint import open_checkpoint
from ramstream.io import os_hints
from ramstream.io.reader import InputFiles
from tests.families import write_safetensors

pytestmark = pytest.mark.disk  # O_DIRECT and the page cache: not on a tmpfs


def _checkpoint(tmp_path: Path, n: int = 1 << 16):  # type: ignore[no-untyped-def]
    values = np.arange(n, dtype=np.float32)
    path = tmp_path / "model.safetensors"
    write_safetensors(path, {"w": ("F32", (n,), values)})
    return open_checkpoint(path), values


def test_descriptor_and_view_read_the_same_bytes(tmp_path: Path) -> None:
    checkpoint, values = _checkpoint(tmp_path)
    ref = checkpoint.tensors["w"]
    with InputFiles() as files:
        fd = files.descriptor(ref.file)
        assert files.descriptor(ref.file) == fd  # opened once
        raw = os.pread(fd, 40, ref.entry.offset + 4 * 100)
        np.testing.assert_array_equal(np.frombuffer(raw, np.float32), values[100:110])
        np.testing.assert_array_equal(files.float_view(ref, 100, 110), values[100:110])
        files.release(ref, 100, 110)
    with pytest.raises(OSError):  # closed with its InputFiles
        os.fstat(fd)


def test_prefetch_skips_cached_ranges_and_hints_the_rest(tmp_path: Path) -> None:
    checkpoint, _ = _checkpoint(tmp_path)
    ref = checkpoint.tensors["w"]
    with InputFiles() as files:
        fd = files.descriptor(ref.file)
        os.pread(fd, ref.entry.nbytes, ref.entry.offset)  # just read: in the page cache
        assert os_hints.is_cached(fd, ref.entry.offset) and os_hints.is_cached(
            fd, ref.entry.offset + ref.entry.nbytes - 1
        )
        lo, hi = ref.entry.offset, ref.entry.offset + ref.entry.nbytes
        files.prefetch_bytes(ref.file, lo, hi)  # cached: returns without a hint
        files.prefetch_bytes(ref.file, lo + 10, lo + 10)  # empty range
        os.posix_fadvise(fd, 0, 0, os.POSIX_FADV_DONTNEED)  # best effort: may stay cached
        files.prefetch_bytes(ref.file, lo, hi)  # either way, no error
    assert not os_hints.is_cached(-1, 0)  # a read that fails counts as "not cached": read ahead


def test_a_short_read_names_the_file_and_tensor(tmp_path: Path) -> None:
    files = (tmp_path / "base.safetensors", tmp_path / "a.safetensors", tmp_path / "b.safetensors")
    for f, nbytes in zip(files, (20, 20, 6), strict=True):  # 10 bf16 elements; b is cut short
        f.write_bytes(bytes(nbytes))
    zeros = np.zeros(3, np.int64)
    sources = BlockSources(files, zeros, zeros, 10, "model.embed_tokens.weight")
    backend = NumbaBackend(threads=1)
    masks = np.empty((2, 2), np.uint8)
    try:
        whole = BlockSources(files[:2], zeros[:2], zeros[:2], 10, "model.embed_tokens.weight")
        # a block known only by its files (the backend reads it through ``sources``)
        backend.probe(SimpleNamespace(sources=whole), 1e-5, masks[:1])  # every read whole: nothing to say
        with pytest.raises(
            CorruptFileError, match=r"b\.safetensors: could not read tensor 'model\.embed_tokens\.weight'"
        ):
            backend.probe(SimpleNamespace(sources=sources), 1e-5, masks)
    finally:
        backend.close()


def test_without_the_linux_calls_hints_are_skipped_and_syncs_are_full(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """What macOS lacks (fdatasync, posix_fadvise, RWF_NOWAIT): the same calls still work."""
    checkpoint, values = _checkpoint(tmp_path)
    ref = checkpoint.tensors["w"]
    monkeypatch.setattr(os_hints, "_FDATASYNC", os.fsync)
    monkeypatch.setattr(os_hints, "_FADVISE", None)
    monkeypatch.setattr(os_hints, "_NOWAIT", None)
    with InputFiles() as files:
        fd = files.descriptor(ref.file)
        assert not os_hints.is_cached(fd, ref.entry.offset)
        files.prefetch_bytes(ref.file, ref.entry.offset, ref.entry.offset + ref.entry.nbytes)
        os_hints.sync_data(fd)
        os_hints.drop_cached(fd)
        np.testing.assert_array_equal(files.float_view(ref, 0, 8), values[:8])
