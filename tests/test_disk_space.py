"""Outputs that cannot fit on their disk are refused before any pass, naming the bytes needed.

The checkpoints are real safetensors files whose one tensor is larger than the test's disk has
free: sparse files (the header, then a hole), so they take no space, and nothing reads them
because the check comes before the probe.
"""

from __future__ import annotations

import json
import os
import re
import shutil
from pathlib import Path

import pytest
from click.testing import CliRunner, Result

from ramstream.cli import main


def sparse_checkpoint(directory: Path, elements: int) -> Path:
    """A bf16 checkpoint of one 1-D tensor of ``elements`` zeros, as a sparse file."""
    directory.mkdir()
    header = json.dumps({"w": {"dtype": "BF16", "shape": [elements], "data_offsets": [0, 2 * elements]}}).encode()
    header += b" " * (-len(header) % 8)
    with open(directory / "model.safetensors", "wb") as f:
        f.write(len(header).to_bytes(8, "little") + header)
        f.truncate(8 + len(header) + 2 * elements)
    return directory


def invoke(*args: object) -> Result:
    return CliRunner().invoke(main, [str(a) for a in args])


@pytest.fixture
def free(tmp_path: Path) -> int:
    free = shutil.disk_usage(tmp_path).free
    if free > 1 << 41:  # a sparse input of half that would exceed some file systems' largest file
        pytest.skip("the disk has more than 2 TiB free")
    return free


def needed(output: str) -> int:
    match = re.search(r"needs [0-9.]+ GiB \(([0-9]+) bytes\)", output)
    assert match, output
    return int(match.group(1))


def test_a_merge_larger_than_the_free_space_is_refused_before_the_probe(tmp_path: Path, free: int) -> None:
    elements = free // 4 + (1 << 24)  # float32 output: 4 bytes each, more than the disk has
    base = sparse_checkpoint(tmp_path / "base", elements)
    agent = sparse_checkpoint(tmp_path / "agent", elements)
    out, cache = tmp_path / "out", tmp_path / "cache"
    result = invoke("merge", base, agent, "--out", out, "--out-dtype", "f32", "--cache-dir", cache)
    assert result.exit_code != 0
    assert result.output.startswith(f"error: {out}: writing the merged model needs "), result.output
    assert "free space or choose another --out" in result.output
    assert needed(result.output) >= 4 * elements  # the shard: its header and the data
    assert "Traceback" not in result.output
    assert not cache.exists()  # no probe ran: no index was created
    assert not out.exists() or not any(p.suffix == ".partial" for p in out.rglob("*"))


def test_a_sweep_counts_every_candidate(tmp_path: Path, free: int) -> None:
    """One output would fit, two do not: the sweep is refused, naming both outputs' bytes."""
    elements = free // 3  # a bf16 output: 2/3 of the free space
    base = sparse_checkpoint(tmp_path / "base", elements)
    agent = sparse_checkpoint(tmp_path / "agent", elements)
    out, cache = tmp_path / "sweep", tmp_path / "cache"
    grid = ("--grid", "task_arithmetic:lambda=0.5,1.0")
    result = invoke("sweep", base, agent, "--out", out, *grid, "--cache-dir", cache)
    assert result.exit_code != 0
    assert f"error: {out}: writing 2 candidates needs " in result.output, result.output
    assert needed(result.output) >= 2 * 2 * elements
    assert "Traceback" not in result.output
    assert not cache.exists()
    assert not [p for p in out.rglob("*") if p.suffix == ".partial" or p.name.endswith(".safetensors")]


def test_a_resumed_merge_counts_only_what_is_left(tmp_path: Path) -> None:
    """A partial shard's written blocks are not counted again: the need is what is still a hole."""
    from ramstream.io.writer import ShardLayout
    from ramstream.output.disk_space import output_need

    work = tmp_path / "out" / ".ramstream"
    work.mkdir(parents=True)
    layout = ShardLayout(("model.safetensors",), (b"",), (64 << 20,), {})
    assert output_need(tmp_path / "out", work, layout, ()).nbytes == 64 << 20
    with open(work / "model.safetensors.partial", "wb") as f:
        f.truncate(64 << 20)
        f.seek(8 << 20)
        f.write(os.urandom(16 << 20))
    left = output_need(tmp_path / "out", work, layout, ()).nbytes
    assert 48 << 20 <= left <= (48 << 20) + (1 << 20)  # the hole, give or take the file system's blocks
