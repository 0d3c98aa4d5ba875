"""``ramstream status``: passes done, blocks and bytes done / total, inputs and an ETA, for an
index and for a merge's output directory, while a pass runs, after it was killed, and after it
finished. Expected numbers are computed here from the shapes and dtypes the family was written
with; which blocks are done is read straight from the journals (plain zarr)."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import numpy as np
import pytest
import zarr
from click.testing import CliRunner

from ramstream.api import merge, probe
from ramstream.cli import main
from ramstream.config import RunOptions
from tests.families import Family, build_family

BLOCK = 64
MEMBERS_BYTES = 2 * 4  # BF16 base and 3 agents: bytes read per element

# A pass slowed down by a sleep per block, in its own process, recording its rate often.
CHILD = r"""
import json, sys, time
from pathlib import Path
import ramstream.index.journal
ramstream.index.journal.RATE_EVERY = 0.2
from ramstream import api
from ramstream.config import RunOptions
from ramstream.index.store import IndexStore
from ramstream.io.writer import ShardWriter

args = json.loads(sys.argv[1])
slowed = IndexStore if args["verb"] == "probe" else ShardWriter
method = "write_batch" if args["verb"] == "probe" else "write_runs"
original = getattr(slowed, method)
def slow(self, *a, **k):
    time.sleep(args["delay"])
    return original(self, *a, **k)
setattr(slowed, method, slow)
options = RunOptions(block_elems=args["block"], quiet=True, cache_dir=Path(args["cache"]))
if args["verb"] == "probe":
    api.probe(args["base"], args["agents"], index=args["index"], options=options)
else:
    api.merge(args["base"], args["agents"], out=args["out"], index=args["index"], options=options)
"""


@pytest.fixture(scope="module")
def family(tmp_path_factory: pytest.TempPathFactory) -> Family:
    return build_family(tmp_path_factory.mktemp("family"), int_tensor=True, seed=3)


def options(tmp: Path) -> RunOptions:
    return RunOptions(block_elems=BLOCK, quiet=True, cache_dir=tmp / "cache")


def tensor_order(index: Path) -> list[dict[str, Any]]:
    """The tensors in the order the index's header lists them (docs/index-format.md)."""
    header = json.loads((index / "zarr.json").read_text())["attributes"]["ramstream_index"]
    return list(header["tensors"])


def block_bytes(family: Family, index: Path) -> np.ndarray:
    """Input bytes of each block: BLOCK-element slices of each float tensor, in order."""
    sizes = []
    for t in tensor_order(index):
        if t["name"] in family.copied:
            continue
        numel = int(np.prod(t["shape"]))
        sizes += [min(BLOCK, numel - s) * MEMBERS_BYTES for s in range(0, numel, BLOCK)]
    return np.array(sizes, np.int64)


def merge_item_bytes(family: Family, index: Path) -> np.ndarray:
    """The merge's work items: every block, then each copied tensor (its bytes in the base)."""
    copies = [raw.nbytes for _, raw in family.copied.values()]
    return np.concatenate([block_bytes(family, index), np.array(copies, np.int64)])


def status(*args: str) -> dict[str, Any]:
    result = CliRunner().invoke(main, ["status", *args, "--json"])
    assert result.exit_code == 0, result.output
    doc: dict[str, Any] = json.loads(result.output)
    return doc


def start(family: Family, tmp: Path, verb: str, index: Path, out: Path | None = None) -> subprocess.Popen[bytes]:
    args = {
        "verb": verb,
        "base": str(family.base),
        "agents": [str(a) for a in family.agents],
        "index": str(index),
        "out": str(out),
        "block": BLOCK,
        "cache": str(tmp / "cache"),
        "delay": 0.05,
    }
    return subprocess.Popen([sys.executable, "-c", CHILD, json.dumps(args)], stderr=subprocess.PIPE)


def wait_for(proc: subprocess.Popen[bytes], ready: Callable[[], bool], timeout: float = 180.0) -> None:
    deadline = time.monotonic() + timeout
    while not ready():
        if proc.poll() is not None:
            pytest.fail(f"the pass ended before it could be observed: {proc.stderr.read().decode()}")  # type: ignore[union-attr]
        if time.monotonic() > deadline:
            proc.kill()
            pytest.fail("the pass made no progress in time")
        time.sleep(0.02)


def journal_state(array_path: Path) -> tuple[np.ndarray, dict[str, Any] | None]:
    """(done flags, rate record) of a journal array, or (empty, None) before it exists."""
    if not (array_path / "zarr.json").is_file():
        return np.zeros(0, bool), None
    array = zarr.open_array(str(array_path), mode="r")
    rate = array.attrs.get("rate")
    return np.asarray(array[:]) != 0, dict(rate) if isinstance(rate, dict) else None


def progressed(array_path: Path, blocks: int) -> Callable[[], bool]:
    def ready() -> bool:
        done, rate = journal_state(array_path)
        return int(done.sum()) >= blocks and rate is not None

    return ready


def kill(proc: subprocess.Popen[bytes]) -> None:
    os.kill(proc.pid, signal.SIGKILL)
    proc.wait()
    assert proc.stderr is not None
    proc.stderr.close()


def check_pass(doc: dict[str, Any], sizes: np.ndarray, done: np.ndarray, rate: dict[str, Any], source: str) -> None:
    """A partial pass, exactly: counts, bytes and the ETA from the recorded rate."""
    assert doc["state"] == "partial"
    assert (doc["blocks_done"], doc["blocks_total"]) == (int(done.sum()), len(sizes))
    assert (doc["bytes_done"], doc["bytes_total"]) == (int(sizes[done].sum()), int(sizes.sum()))
    speed = rate["bytes"] / rate["seconds"]
    assert doc["rate_bytes_per_s"] == pytest.approx(speed, rel=1e-12) and doc["rate_from"] == source
    assert doc["eta_seconds"] == pytest.approx((sizes.sum() - sizes[done].sum()) / speed, rel=1e-9)
    assert doc["eta_seconds"] > 0


def check_inputs(doc: dict[str, Any], family: Family) -> None:
    members = [family.base, *family.agents]
    assert [i["name"] for i in doc["inputs"]] == [p.name for p in members]
    assert [Path(i["path"]) for i in doc["inputs"]] == members
    assert [i["bytes"] for i in doc["inputs"]] == [
        sum(f.stat().st_size for f in p.glob("*.safetensors")) for p in members
    ]


def test_index_during_and_after_an_interrupted_probe(family: Family, tmp_path: Path) -> None:
    index = tmp_path / "index.zarr"
    journal = index / "progress" / "probe"
    proc = start(family, tmp_path, "probe", index)
    try:
        wait_for(proc, progressed(journal, 8))
        sizes = block_bytes(family, index)
        # while it runs: a prefix of the blocks is done (the pass goes in order)
        during = status(str(index))
        probe_doc = during["passes"]["probe"]
        k = probe_doc["blocks_done"]
        assert during["kind"] == "index" and probe_doc["state"] == "partial"
        assert 8 <= k < len(sizes) and probe_doc["bytes_done"] == int(sizes[:k].sum())
        assert probe_doc["eta_seconds"] > 0 and probe_doc["rate_from"] == "last probe run"
    finally:
        kill(proc)
    done, rate = journal_state(journal)
    assert rate is not None and 0 < done.sum() < len(sizes)
    after = status(str(index))
    check_pass(after["passes"]["probe"], sizes, done, rate, "last probe run")
    check_inputs(after, family)
    assert after["index_info"]["block_elems"] == BLOCK and after["index_info"]["agents"] == [
        a.name for a in family.agents
    ]
    # the real CLI, in text
    text = subprocess.run(
        [sys.executable, "-m", "ramstream", "status", str(index)], capture_output=True, text=True, check=True
    ).stdout
    line = next(x for x in text.splitlines() if x.startswith("probe"))
    assert line.split()[:5] == ["probe", "partial", str(int(done.sum())), "/", str(len(sizes))]
    assert "ETA" in line and "rerun the same command to resume" in text
    # resumed to the end: everything done, nothing left
    probe(family.base, [str(a) for a in family.agents], index=index, options=options(tmp_path))
    final = status(str(index))["passes"]["probe"]
    assert final["state"] == "done" and final["eta_seconds"] == 0
    assert (final["blocks_done"], final["bytes_done"]) == (len(sizes), int(sizes.sum()))
    assert final["rate_from"] == "last probe run" and final["rate_bytes_per_s"] > 0


def test_output_during_and_after_an_interrupted_merge(family: Family, tmp_path: Path) -> None:
    index, out = tmp_path / "index.zarr", tmp_path / "merged"
    probe(family.base, [str(a) for a in family.agents], index=index, options=options(tmp_path))
    journal = out / ".ramstream" / "journal" / "merge"
    proc = start(family, tmp_path, "merge", index, out)
    try:
        wait_for(proc, progressed(journal, 8))
        items = merge_item_bytes(family, index)
        during = status(str(out))
        assert during["kind"] == "output" and Path(during["index"]) == index.resolve()
        assert during["passes"]["probe"]["state"] == "done"
        merge_doc = during["passes"]["merge"]
        k = merge_doc["blocks_done"]
        assert merge_doc["state"] == "partial" and 8 <= k < len(items)
        assert merge_doc["bytes_done"] == int(items[:k].sum()) and merge_doc["eta_seconds"] > 0
        assert during["merge"]["method"] == "ram+"
    finally:
        kill(proc)
    done, rate = journal_state(journal)
    assert rate is not None
    after = status(str(out))
    check_pass(after["passes"]["merge"], items, done, rate, "last merge run")
    check_inputs(after, family)
    assert after["notes"] == []

    # a journal that does not name its index, and no started.json (older merges): found through --index only
    group = zarr.open_group(str(journal.parent), mode="r+")
    del group.attrs["index"]
    (out / ".ramstream" / "started.json").unlink()
    lost = status(str(out), "--cache-dir", str(tmp_path / "elsewhere"))
    assert lost["index"] is None and "probe" not in lost["passes"] and "--index" in lost["notes"][0]
    assert lost["passes"]["merge"]["blocks_done"] == int(done.sum()) and lost["passes"]["merge"]["bytes_done"] is None
    found = status(str(out), "--index", str(index))
    check_pass(found["passes"]["merge"], items, done, rate, "last merge run")

    merge(family.base, [str(a) for a in family.agents], out=out, index=index, options=options(tmp_path))
    final = status(str(out))
    assert final["passes"]["merge"]["state"] == final["passes"]["probe"]["state"] == "done"
    assert final["merge"]["method"] == "ram+" and set(final["merge"]["lambdas"]) == {a.name for a in family.agents}
    check_inputs(final, family)


def test_merge_not_started_uses_the_probe_rate(family: Family, tmp_path: Path) -> None:
    """run.json written, the journal not yet: the merge's bytes are known, its ETA comes from the probe."""
    from ramstream.output import directory as output_dir

    index, out = tmp_path / "index.zarr", tmp_path / "merged"
    probe(family.base, [str(a) for a in family.agents], index=index, options=options(tmp_path))
    key = json.loads((index / "zarr.json").read_text())["attributes"]["ramstream_index"]["content_key"]
    output_dir.prepare(out, {"inputs": key, "method": "ram+"}, force=False)
    doc = status(str(out), "--index", str(index))
    merge_doc, probe_doc = doc["passes"]["merge"], doc["passes"]["probe"]
    assert merge_doc["state"] == "not started" and merge_doc["bytes_done"] == 0
    assert merge_doc["bytes_total"] == int(merge_item_bytes(family, index).sum())
    assert merge_doc["rate_from"] == "last probe run"
    assert merge_doc["eta_seconds"] == pytest.approx(merge_doc["bytes_total"] / probe_doc["rate_bytes_per_s"])
    # the cached index of the merge is found by its key under --cache-dir
    cached = tmp_path / "cache2" / "index" / f"{key}.zarr"
    cached.parent.mkdir(parents=True)
    index.rename(cached)
    assert Path(status(str(out), "--cache-dir", str(tmp_path / "cache2"))["index"]) == cached


def test_not_a_status_path(tmp_path: Path) -> None:
    result = CliRunner().invoke(main, ["status", str(tmp_path)])
    assert result.exit_code == 1 and result.output.count("\n") == 1
    assert (
        result.output.startswith("error: ")
        and "neither a ramstream index nor a merge output directory" in result.output
    )
