"""The write path: write-behind ordering and errors, O_DIRECT staging, durable index chunks.

Real files only: shards written through ``ShardWriter`` (its O_DIRECT middle, buffered head and
tail, and the buffered fallback) must hold exactly the bytes a plain write would; a failure on
the write-behind thread must reach the caller unchanged; large Zarr chunks written by
``DurableLocalStore`` must read back through plain zarr.
"""

from __future__ import annotations

import threading
from pathlib import Path

import numpy as np
import pytest
import zarr
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from zarr.codecs import Crc32cCodec

from ramstream.errors import OutputError
from ramstream.execution.write_behind import WriteBehind
from ramstream.index.local_store import DROP_AT, open_group
from ramstream.io.writer import DIRECT_MIN, ShardWriter
from ramstream.output.shards import plan_shards

pytestmark = pytest.mark.disk  # O_DIRECT and the page cache: not on a tmpfs


def test_write_behind_runs_items_in_order_on_one_thread() -> None:
    seen: list[tuple[int, str]] = []
    with WriteBehind(depth=2, threads=1) as behind:
        for i in range(20):
            behind.submit(lambda i=i: seen.append((i, threading.current_thread().name)))
    assert [i for i, _ in seen] == list(range(20))
    assert len({name for _, name in seen}) == 1
    assert seen[0][1] != threading.current_thread().name


def test_write_behind_holds_at_most_depth_items_and_runs_them_at_once() -> None:
    """Two threads: two items run together (each waits for the other to start), never a third."""
    depth = 2
    started = threading.Barrier(depth, timeout=10)
    running, peak, lock = [0], [0], threading.Lock()

    def item() -> None:
        with lock:
            running[0] += 1
            peak[0] = max(peak[0], running[0])
        started.wait()
        with lock:
            running[0] -= 1

    with WriteBehind(depth=depth) as behind:
        for _ in range(6):
            behind.submit(item)
    assert peak[0] == depth


def test_write_behind_raises_the_threads_error_in_the_caller() -> None:
    ran: list[int] = []

    def fail() -> None:
        raise OutputError("disk full")

    behind = WriteBehind(depth=1)
    behind.submit(fail)
    with pytest.raises(OutputError, match="disk full"):
        behind.submit(lambda: ran.append(1))  # waits for the failed item first
        behind.drain()
    behind.close()
    assert ran in ([], [1])


def test_write_behind_close_cancels_what_has_not_started() -> None:
    gate = threading.Event()
    ran: list[int] = []
    behind = WriteBehind(depth=3)
    behind.submit(gate.wait)
    behind.submit(lambda: ran.append(1))
    gate.set()
    behind.close()
    assert ran in ([], [1])  # either cancelled or finished, never running after close
    with pytest.raises(RuntimeError):
        behind.submit(lambda: None)


@settings(max_examples=25, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(
    sizes=st.lists(st.integers(1, 3 * DIRECT_MIN // 2), min_size=1, max_size=4),
    cuts=st.lists(st.integers(DIRECT_MIN // 16, DIRECT_MIN), min_size=1, max_size=6),
    itemsize=st.sampled_from([2, 4]),
)
def test_staged_blocks_give_the_bytes_of_plain_writes(
    tmp_path_factory: pytest.TempPathFactory, sizes: list[int], cuts: list[int], itemsize: int
) -> None:
    """Tensors of odd sizes (so most blocks start unaligned), cut into blocks of random sizes and
    written from staging buffers: the shard equals the concatenated data."""
    directory = tmp_path_factory.mktemp("shards")
    dtype = np.dtype(f"u{itemsize}")
    name_of = {2: "BF16", 4: "F32"}
    rng = np.random.default_rng(len(sizes) * 7919 + sum(cuts))
    tensors = [(f"t{i}", name_of[itemsize], (n,), n * itemsize) for i, n in enumerate(sizes)]
    layout = plan_shards(tensors, shard_size=1 << 40)
    data = {name: rng.integers(0, 1 << (8 * itemsize), shape[0], dtype=dtype) for name, _, shape, _ in tensors}
    writer = ShardWriter(layout, directory)
    try:
        slot = 0
        for name, _, (n,), _ in tensors:
            start = 0
            k = 0
            while start < n:
                count = min(cuts[k % len(cuts)], n - start)
                out = writer.staging(slot % 2, name, start * itemsize, count, dtype)
                out[:] = data[name][start : start + count]
                writer.write(name, start * itemsize, out)
                start += count
                k += 1
                slot += 1
        writer.sync()
    finally:
        writer.close()
    raw = (directory / f"{layout.names[0]}.partial").read_bytes()
    header = layout.headers[0]
    assert raw[: len(header)] == header
    assert raw[len(header) :] == b"".join(data[name].tobytes() for name, *_ in tensors)


def test_unstaged_writes_go_through_the_page_cache(tmp_path: Path) -> None:
    """Bytes and arrays not placed by ``staging`` (copied tensors, misaligned memory) are written
    buffered, with the same result."""
    n = 2 * DIRECT_MIN + 5
    layout = plan_shards([("a", "U8", (n,), n)], shard_size=1 << 40)
    payload = np.arange(n + 1, dtype=np.uint8)[1:]  # an array that starts one byte off alignment
    writer = ShardWriter(layout, tmp_path)
    try:
        writer.write("a", 0, payload[: n // 2])
        writer.write("a", n // 2, bytes(payload[n // 2 :]))
    finally:
        writer.close()
    raw = (tmp_path / f"{layout.names[0]}.partial").read_bytes()
    assert raw[len(layout.headers[0]) :] == payload.tobytes()


def test_large_index_chunks_are_written_durably_and_read_back_by_plain_zarr(tmp_path: Path) -> None:
    group = open_group(tmp_path / "store", mode="w")
    cols = DROP_AT  # one chunk of 2 * DROP_AT bytes: the durable path; a small one: zarr's own
    big = group.create_array("big", shape=(2, cols), chunks=(2, cols), dtype="uint8", compressors=(Crc32cCodec(),))
    small = group.create_array("small", shape=(4,), chunks=(4,), dtype="int64", compressors=(Crc32cCodec(),))
    values = np.random.default_rng(0).integers(0, 256, (2, cols), dtype=np.uint8)
    big[...] = values
    small[...] = np.arange(4)
    assert not list((tmp_path / "store").rglob("*.partial"))
    plain = zarr.open_group(str(tmp_path / "store"), mode="r", zarr_format=3)
    assert np.array_equal(np.asarray(plain["big"][...]), values)
    assert np.array_equal(np.asarray(plain["small"][...]), np.arange(4))


def test_a_refused_direct_write_falls_back_to_the_page_cache(tmp_path: Path) -> None:
    """A file system may accept O_DIRECT at open and refuse the write (EINVAL); a misaligned
    direct write gets that same refusal from the kernel here. The writer then goes buffered for
    good, and the bytes are right."""
    n = 4 * DIRECT_MIN
    layout = plan_shards([("a", "U8", (n,), n)], shard_size=1 << 40)
    payload = np.random.default_rng(1).integers(0, 256, n, dtype=np.uint8)
    writer = ShardWriter(layout, tmp_path)
    try:
        if writer._direct_fds[0] is None:
            pytest.skip("this file system has no O_DIRECT")
        direct = writer._direct_fds[0]
        assert not writer._write_direct(0, direct, memoryview(payload[1:4097]), 4096)  # misaligned: EINVAL
        assert writer._direct_fds[0] is None
        out = writer.staging(0, "a", 0, n, np.dtype(np.uint8))
        out[:] = payload
        writer.write("a", 0, out)
    finally:
        writer.close()
    raw = (tmp_path / f"{layout.names[0]}.partial").read_bytes()
    assert raw[len(layout.headers[0]) :] == payload.tobytes()
