"""A sweep's magnitude candidates: every density's low histogram from one pass.

TIES at several densities and both trim scopes, breadcrumbs and breadcrumbs with TIES: the
high histogram decides each candidate's low histogram before any of them prepares, so a sweep
computes them all in one read, each under the key its own ``ramstream merge`` uses. Real
checkpoints, the real CLI; the passes are observed around the real statistics pass, which
still runs.
"""

from __future__ import annotations

from pathlib import Path

import pytest
import zarr

from ramstream.statistics import context
from tests.families import Family, build_family
from tests.test_resume import SMALL, cli, kill_at_step, run_ok, tree_bytes
from tests.test_sweep import inputs, invoke, run_sweep, tree

GRIDS = (
    "ties:density=0.2,0.5,1.0",
    "ties:density=0.3:trim_scope=model",
    "breadcrumbs:density=0.8",
    "breadcrumbs_ties:density=0.8",  # the same cuts as breadcrumbs': the same low histogram
    "ram+:r=0.1",
)
MERGE_FLAGS = {
    "ties-density=0.2": ("--method", "ties", "--density", "0.2"),
    "ties-density=0.5": ("--method", "ties", "--density", "0.5"),
    "ties-density=1.0": ("--method", "ties", "--density", "1.0"),  # no cut to refine
    "ties-density=0.3-trim_scope=model": ("--method", "ties", "--density", "0.3", "--trim-scope", "model"),
    "breadcrumbs-density=0.8": ("--method", "breadcrumbs", "--density", "0.8"),
    "breadcrumbs_ties-density=0.8": ("--method", "breadcrumbs_ties", "--density", "0.8"),
    "ram+-r=0.1": ("--method", "ram+", "--r", "0.1"),
}
LOW = "abs_lo16_v1-"
SHARDS = ("--shard-size", "20KB")  # several shards per output


@pytest.fixture(scope="module")
def family(tmp_path_factory: pytest.TempPathFactory) -> Family:
    return build_family(tmp_path_factory.mktemp("sweep-trim"), seed=5, shards=2)


@pytest.fixture
def passes(monkeypatch: pytest.MonkeyPatch) -> list[list[str]]:
    """The keys each statistics pass computed (those it found incomplete), in order."""
    seen: list[list[str]] = []
    real = context.run_statistics

    def observed(family, index, stats, executor, quiet):  # type: ignore[no-untyped-def]
        pending = [s.key for s in stats if not index.statistic_complete(s.key)]
        if pending:
            seen.append(pending)
        real(family, index, stats, executor, quiet)

    monkeypatch.setattr(context, "run_statistics", observed)
    return seen


def low_keys(cache: Path) -> set[str]:
    """The low histograms stored in the (one) index under ``cache``."""
    (index,) = (cache / "index").glob("*.zarr")
    return {p.name for p in (index / "stats").iterdir() if p.name.startswith(LOW)}


def test_one_pass_refines_every_density_and_each_candidate_is_its_merge(
    family: Family, tmp_path: Path, passes: list[list[str]]
) -> None:
    swept, cache = tmp_path / "sweep", tmp_path / "cache"
    done = run_sweep(family, swept, GRIDS, "--cache-dir", cache, *SHARDS)
    assert done.exit_code == 0, done.output + done.stderr
    # the high histogram, then every candidate's low histogram in one read, then every candidate's
    # tie boundaries in one more (ram+ reads the probe)
    assert len(passes) == 3 and passes[0] == ["abs_hi16_v1"], passes
    keys = low_keys(cache)
    assert len(keys) == 4 and sorted(passes[1]) == sorted(keys), passes  # breadcrumbs' two share one
    assert passes[2] and all(key.startswith("tie_boundary_v1-") for key in passes[2]), passes
    passes.clear()

    own = tmp_path / "merges-cache"  # each merge alone, on an index of their own
    for name, flags in MERGE_FLAGS.items():
        reference = tmp_path / "merge" / name
        merged = invoke("merge", *inputs(family), "--out", reference, *flags, "--quiet", *SHARDS, "--cache-dir", own)
        assert merged.exit_code == 0, merged.output + merged.stderr
        assert tree(swept / name) == tree(reference), name
    assert low_keys(own) == keys  # a merge alone computes the same statistics, under the same keys
    # the high histogram, four low ones and four candidates' tie boundaries, a pass each
    assert sum(len(p) for p in passes) == 9
    passes.clear()

    again = tmp_path / "again"  # and a merge after the sweep reads the sweep's back
    flags = MERGE_FLAGS["ties-density=0.2"]
    merged = invoke("merge", *inputs(family), "--out", again, *flags, "--quiet", *SHARDS, "--cache-dir", cache)
    assert merged.exit_code == 0 and passes == [], passes
    assert tree(again) == tree(swept / "ties-density=0.2")


def test_one_magnitude_candidate_runs_its_merges_passes_and_leaves_the_others_alone(
    family: Family, tmp_path: Path, passes: list[list[str]]
) -> None:
    swept = tmp_path / "sweep"
    done = run_sweep(family, swept, ("linear", "ties:density=0.4"), "--cache-dir", tmp_path / "cache")
    assert done.exit_code == 0, done.output + done.stderr
    assert len(passes) == 3 and passes[0] == ["abs_hi16_v1"] and passes[1][0].startswith(LOW), passes
    assert passes[2][0].startswith("tie_boundary_v1-"), passes
    for name, flags in (
        ("linear", ("--method", "linear")),
        ("ties-density=0.4", ("--method", "ties", "--density", "0.4")),
    ):
        reference = tmp_path / name
        merged = invoke(
            "merge", *inputs(family), "--out", reference, *flags, "--quiet", "--cache-dir", tmp_path / "own"
        )
        assert merged.exit_code == 0 and tree(reference) == tree(swept / name), name


KILL_GRIDS = ("ties:density=0.2,0.5", "breadcrumbs:density=0.8")


def test_a_sweep_killed_in_the_shared_low_pass_resumes_to_the_same_bytes(
    tmp_path_factory: pytest.TempPathFactory,
) -> None:
    root = tmp_path_factory.mktemp("sweep-trim-kill")
    family = build_family(root / "family", shapes=SMALL, shards=2, seed=17)
    grids = [x for g in KILL_GRIDS for x in ("--grid", g)]
    common = ["--memory", "16MiB", "--quiet"]
    reference, reference_cache = root / "reference", root / "reference-cache"
    run_ok(cli("sweep", *inputs(family), "--out", reference, *grids, "--cache-dir", reference_cache, *common))
    keys = sorted(low_keys(reference_cache))
    assert len(keys) == 3

    out, cache = root / "sweep", root / "cache"
    args: list[str | Path] = ["sweep", *inputs(family), "--out", out, *grids, "--cache-dir", cache, *common]
    # the second unit of one low histogram marked done: the shared pass is under way
    kill_at_step(args, {"event": "os.rename", "arg": 1, "suffix": f"progress/{keys[0]}/c.1", "n": 1})
    (index,) = (cache / "index").glob("*.zarr")
    complete = zarr.open_group(str(index), mode="r", zarr_format=3).attrs.get("statistics", {})
    assert set(complete) == {"abs_hi16_v1"}, complete  # no low histogram finished
    run_ok(cli(*args))
    for name in ("ties-density=0.2", "ties-density=0.5", "breadcrumbs-density=0.8"):
        assert tree_bytes(out / name) == tree_bytes(reference / name), name
    assert sorted(low_keys(cache)) == keys
