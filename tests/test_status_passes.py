"""``status INDEX`` tells every pass: the probe, and each statistics pass the index holds (TIES's
histograms and boundary, the pairwise agreement, ...), done, partial or not started.

The statistics passes are real: run through the API on a real family, one of them stopped after
two of its units (its journal's marks, as a kill leaves them).
"""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import pytest

from ramstream import api
from ramstream.config import RunOptions
from tests.checks import Interrupted, interrupted_after
from tests.families import Family, build_family
from tests.test_cli import in_process, ok, one_line_error

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
