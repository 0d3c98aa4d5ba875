"""``status INDEX`` tells every pass: the probe, and each statistics pass the index holds (TIES's
histograms and boundary, the pairwise agreement, ...), done, partial or not started.

The statistics passes are real: run through the API on a real family, one of them stopped after
two of its units (its journal's marks, as a kill leaves them). ``status OUT`` of a merge (or a
sweep) killed in its probe finds the index the merge was given and shows how far the probe got.
"""

from __future__ import annotations

import json
import shutil
from pathlib import Path
from typing import Any

import pytest

from ramstream import api
from ramstream.config import RunOptions
from tests.checks import Interrupted, interrupted_after
from tests.families import Family, build_family
from tests.test_cli import in_process, ok, one_line_error
from tests.test_resume import SMALL, kill_at_step, renamed_to

SHAPES = {"model.embed_tokens.weight": (64, 32), "model.layers.0.mlp.up_proj.weight": (32, 32)}
TIES = ("--method", "ties", "--density", "0.3", "--trim-scope", "model")


def options(root: Path) -> RunOptions:
    return RunOptions(quiet=True, block_elems=512, cache_dir=root / "cache")


@pytest.fixture(scope="module")
def family(tmp_path_factory: pytest.TempPathFactory) -> Family:
    return build_family(tmp_path_factory.mktemp("status-passes"), shapes=SHAPES)


@pytest.fixture(scope="module")
def probed(family: Family, tmp_path_factory: pytest.TempPathFactory) -> Path:
    """An index with the probe and TIES's model-wide statistics done; no agreement yet."""
    root = tmp_path_factory.mktemp("probed")
    index = root / "index.zarr"
    api.probe(family.base, family.agents, index=index, options=options(root))
    members = [family.base, *family.agents]
    ok(in_process("merge", *members, "--out", root / "ties", "--index", index, *TIES, "--quiet"))
    return index


def passes(index: Path) -> dict[str, dict[str, object]]:
    done = ok(in_process("status", index, "--json"))
    return json.loads(done.out)["passes"]  # type: ignore[no-any-return]


def test_status_lists_each_statistics_pass_done(probed: Path) -> None:
    found = passes(probed)
    stats = {name.split("-")[0]: p for name, p in found.items() if name.startswith("stats/")}
    assert set(stats) == {"stats/abs_hi16_v1", "stats/abs_lo16_v1", "stats/tie_boundary_v1"}
    probe = found["probe"]
    for p in stats.values():
        assert p["state"] == "done" and p["blocks_done"] == p["blocks_total"]
        assert p["bytes_done"] == p["bytes_total"] == probe["bytes_total"]  # one read of the inputs each
    text = ok(in_process("status", probed)).out
    lines = [line for line in text.splitlines() if line.startswith("stats/")]
    assert len(lines) == 3 and all(" done " in line for line in lines), text


@pytest.mark.parametrize(("marks", "state"), [(2, "partial"), (0, "not started")])
def test_a_stopped_statistics_pass_is_shown_partial_with_how_far_it_got(
    family: Family, probed: Path, tmp_path: Path, marks: int, state: str
) -> None:
    index = tmp_path / "index.zarr"
    shutil.copytree(probed, index)
    with interrupted_after(marks), pytest.raises(Interrupted):
        api.probe(family.base, family.agents, index=index, agreement=True, options=options(tmp_path))
    found = passes(index)
    agreement = next(p for name, p in found.items() if name.startswith("stats/agreement_v1"))
    assert agreement["state"] == state
    assert agreement["blocks_done"] == marks and agreement["blocks_total"] == 6
    assert isinstance(agreement["bytes_total"], int) and agreement["bytes_total"] > 0
    assert (agreement["bytes_done"] > 0) == (marks > 0)
    text = ok(in_process("status", index)).out
    line = next(line for line in text.splitlines() if line.startswith("stats/agreement_v1"))
    assert f" {state} " in line and f"{marks} / 6 batches" in line, text
    if marks:
        assert "rerun the same command to resume it" in text
    # Finishing it: the rerun probes nothing again and completes the statistic.
    api.probe(family.base, family.agents, index=index, agreement=True, options=options(tmp_path))
    agreement = next(p for name, p in passes(index).items() if name.startswith("stats/agreement_v1"))
    assert agreement["state"] == "done" and agreement["blocks_done"] == 6


def test_a_finished_statistic_whose_journal_lost_a_mark_is_refused(probed: Path, tmp_path: Path) -> None:
    index = tmp_path / "index.zarr"
    shutil.copytree(probed, index)
    journal = next((index / "progress").glob("abs_hi16_v1"))
    (journal / "c.3").unlink()
    message = one_line_error(in_process("status", index), str(index), "'progress/abs_hi16_v1'")
    assert "run the command again" in message


# -- a merge or a sweep killed in its probe, before its merge pass recorded anything ----------


@pytest.fixture(scope="module")
def several_batches(tmp_path_factory: pytest.TempPathFactory) -> Family:
    """A family whose probe takes 13 batches under --memory 16MiB: a kill can land inside it."""
    return build_family(tmp_path_factory.mktemp("status-probe"), shapes=SMALL, seed=5)


def killed_in_probe(verb: str, family: Family, out: Path, index: Path, *extra: str) -> None:
    """Run ``verb`` (merge or sweep) with ``--index index`` and SIGKILL it in its probe pass."""
    members = [family.base, *family.agents]
    args: list[str | Path] = [verb, *members, "--out", out, "--index", index, *extra]
    args += ["--memory", "16MiB", "--quiet", "--cache-dir", out.parent / "cache"]
    kill_at_step(args, renamed_to("progress/probe/c.3"))


def shown(path: Path, *extra: str | Path) -> dict[str, Any]:
    """``status PATH --json``, with a cache directory that holds no index."""
    done = ok(in_process("status", path, "--json", "--cache-dir", path.parent / "elsewhere", *extra))
    return json.loads(done.out)  # type: ignore[no-any-return]


def assert_probe_stopped(doc: dict[str, Any], index: Path) -> None:
    """The index named, the probe partial with its bytes, the merge pass known but not begun."""
    assert doc["index"] == str(index.resolve()) and doc["notes"] == [], doc
    probe, merge = doc["passes"]["probe"], doc["passes"]["merge"]
    assert probe["state"] == "partial" and 0 < probe["blocks_done"] < probe["blocks_total"] == 13, probe
    assert 0 < probe["bytes_done"] < probe["bytes_total"], probe
    assert merge["state"] == "not started" and merge["bytes_total"] == probe["bytes_total"], merge


def test_a_merge_stopped_in_its_probe_names_its_index_and_how_far_the_probe_got(
    several_batches: Family, tmp_path: Path
) -> None:
    """Before its merge pass, no journal names the merge's index: the merge records it as it
    starts, so status finds the --index it was given without being told."""
    out, index = tmp_path / "out", tmp_path / "given" / "index.zarr"
    killed_in_probe("merge", several_batches, out, index)
    doc = shown(out)
    assert_probe_stopped(doc, index)
    members = [several_batches.base, *several_batches.agents]
    assert [i["path"] for i in doc["inputs"]] == [str(m.resolve()) for m in members]
    text = ok(in_process("status", out, "--cache-dir", tmp_path / "elsewhere")).out
    assert f"index  {index.resolve()}" in text and "not found" not in text, text
    assert next(line for line in text.splitlines() if line.startswith("probe")).split()[:2] == ["probe", "partial"]


def test_a_sweep_stopped_in_its_probe_names_its_index_and_how_far_the_probe_got(
    several_batches: Family, tmp_path: Path
) -> None:
    """A sweep's status shows its index's passes too, found as a merge's is, or through --index."""
    out, index = tmp_path / "sweep", tmp_path / "given" / "index.zarr"
    killed_in_probe("sweep", several_batches, out, index, "--grid", "ram+:r=0.1,0.2")
    for given in ((), ("--index", index)):
        doc = shown(out, *given)
        assert doc["kind"] == "sweep", doc
        assert_probe_stopped(doc, index)
    text = ok(in_process("status", out, "--cache-dir", tmp_path / "elsewhere")).out
    assert f"index  {index.resolve()}" in text, text
