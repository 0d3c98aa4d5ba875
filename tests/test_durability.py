"""A journal mark never outlives its data: every store write is synced, and a block whose counts
are gone after its mark (a deleted chunk, a disk that lied about a sync) is refused, not read as
zeros."""

from __future__ import annotations

import os
from pathlib import Path

import pytest
from click.testing import CliRunner

from ramstream.cli import main
from ramstream.index.local_store import DurableLocalStore, open_group
from ramstream.io import os_hints
from tests.families import build_family


def test_a_probed_block_without_its_counts_is_refused(tmp_path: Path) -> None:
    fam = build_family(tmp_path / "fam", seed=2)
    members = [str(fam.base), *map(str, fam.agents)]
    index = tmp_path / "index.zarr"
    runner = CliRunner()
    assert runner.invoke(main, ["probe", *members, "--index", str(index), "--quiet"]).exit_code == 0
    # The state a power loss could leave if chunks were not synced before their marks: every batch
    # marked, the pass not finished yet (its roll-up not written), batch 0's counts chunk gone.
    group = open_group(index, mode="r+")
    group.attrs["probe"] = {**dict(group.attrs["probe"]), "complete": False}  # type: ignore[arg-type]
    (index / "stats" / "counts" / "c.0.0.0").unlink()
    done = runner.invoke(main, ["merge", *members, "--index", str(index), "--out", str(tmp_path / "out"), "--quiet"])
    assert done.exit_code == 1
    assert done.output.strip() == (
        f"error: {index}: the index array 'stats/counts' lacks its chunk 'c.0.0.0', which the index records as "
        "written (deleted, or lost by the disk); delete the index and run the command again"
    )
    assert not (tmp_path / "out" / "config.json").exists()


def test_every_store_write_is_synced_and_renamed_into_place(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """Small values too (counts, journal bytes, metadata): data synced before the rename, the
    directory synced after it (the calls are observed, and still made)."""
    calls: list[str] = []
    real_sync_data, real_fsync, real_replace = os_hints.sync_data, os.fsync, Path.replace
    monkeypatch.setattr(os_hints, "sync_data", lambda fd: (calls.append("data"), real_sync_data(fd))[1])
    monkeypatch.setattr(os, "fsync", lambda fd: (calls.append("dir"), real_fsync(fd))[1])
    monkeypatch.setattr(Path, "replace", lambda self, target: (calls.append("rename"), real_replace(self, target))[1])
    group = open_group(tmp_path / "store.zarr", mode="w")
    assert isinstance(group.store, DurableLocalStore)
    calls.clear()
    array = group.create_array("journal", shape=(4,), chunks=(1,), dtype="uint8", fill_value=0)
    calls.clear()
    array[2] = 1
    assert calls == ["data", "rename", "dir"]
    assert not list((tmp_path / "store.zarr").rglob("*.partial"))
