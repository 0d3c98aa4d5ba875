"""Records that are damaged or foreign, and paths that are not ours (Reliability III, classes 5 and 6).

``inspect`` and ``status`` size everything from what an index or an output directory records
(agents, tensors, block sizes, run records, journals); a record of the wrong type, count or
size must be answered in one ``error:`` line, never a traceback nor a table computed with the
wrong counts. An ``--index`` that is somebody else's directory or Zarr store is refused without
advice to delete it (and is left as it was), and the output, the index and the cache directory
never nest in one another.
"""

from __future__ import annotations

import json
import shutil
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest
import zarr
from click.testing import CliRunner, Result

from ramstream.api import merge, probe
from ramstream.cli import main
from ramstream.config import RunOptions
from ramstream.index.journal import Journal
from tests.families import Family, build_family


@pytest.fixture(scope="module")
def made(tmp_path_factory: pytest.TempPathFactory) -> tuple[Family, Path, Path]:
    """A family, its index and a finished merge of it."""
    root = tmp_path_factory.mktemp("records")
    family = build_family(root / "family", seed=5)
    options = RunOptions(block_elems=128, quiet=True, cache_dir=root / "cache")
    agents = [str(a) for a in family.agents]
    probe(family.base, agents, index=root / "index.zarr", options=options)
    merge(family.base, agents, out=root / "out", index=root / "index.zarr", options=options)
    return family, root / "index.zarr", root / "out"


def invoke(*args: object) -> Result:
    return CliRunner().invoke(main, [str(a) for a in args])


def assert_one_line(result: Result, *words: str) -> str:
    """A clean refusal: a non-zero exit, no traceback, one ``error:`` line holding ``words``."""
    assert result.exit_code != 0, result.output
    assert isinstance(result.exception, SystemExit), repr(result.exception)
    lines = result.stderr.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("error: "), result.stderr
    for word in words:
        assert word in lines[0], lines[0]
    return lines[0]


# -- class 5: damaged records ----------------------------------------------------------------
def _set(path: str, value: Any) -> Callable[[dict[str, Any]], None]:
    """An edit of the header at a dotted path (``tensors.0.dtypes``)."""
    *parents, last = path.split(".")

    def edit(header: dict[str, Any]) -> None:
        node: Any = header
        for key in parents:
            node = node[int(key)] if key.isdigit() else node[key]
        node[int(last) if last.isdigit() else last] = value

    return edit


HEADER_DAMAGE = {
    "agents-a-string": ("agents", "x"),
    "agents-empty": ("agents", []),
    "agents-not-names": ("agents", [1, 2, 3]),
    "agents-fewer-than-inputs": ("agents", ["a"]),
    "block-elems-zero": ("block_elems", 0),
    "block-elems-a-string": ("block_elems", "128"),
    "block-elems-a-bool": ("block_elems", True),
    "block-elems-another-size": ("block_elems", 64),
    "eps-a-string": ("eps", "x"),
    "eps-negative": ("eps", -1.0),
    "inputs-not-records": ("inputs", [1, 2, 3, 4]),
    "inputs-one-short": ("inputs", None),  # replaced by the first three below
    "file-size-a-string": ("inputs.0.files", [{"size": "x"}]),
    "files-a-number": ("inputs.1.files", 3),
    "tensors-a-mapping": ("tensors", {}),
    "tensor-name-a-number": ("tensors.0.name", 7),
    "tensor-dtypes-empty": ("tensors.0.dtypes", []),
    "tensor-dtypes-unknown": ("tensors.0.dtypes", ["XX", "BF16", "BF16", "BF16"]),
    "tensor-shape-negative": ("tensors.0.shape", [-4, 2]),
    "tensor-shape-another-size": ("tensors.0.shape", [3, 3]),
    "tensor-named-twice": ("tensors.1.name", "model.embed_tokens.weight"),
    "header-a-list": ("", [1, 2]),
}


def _damaged_index(source: Path, target: Path, case: str) -> Path:
    shutil.copytree(source, target)
    document = json.loads((target / "zarr.json").read_text())
    header = document["attributes"]["ramstream_index"]
    path, value = HEADER_DAMAGE[case]
    if case == "inputs-one-short":
        header["inputs"] = header["inputs"][:-1]
    elif path == "":
        document["attributes"]["ramstream_index"] = value
    else:
        _set(path, value)(header)
    (target / "zarr.json").write_text(json.dumps(document))
    return target


@pytest.mark.parametrize("case", sorted(HEADER_DAMAGE))
def test_an_index_header_of_the_wrong_types_or_counts_is_one_line(
    made: tuple[Family, Path, Path], tmp_path: Path, case: str
) -> None:
    _, index, _ = made
    damaged = _damaged_index(index, tmp_path / "index.zarr", case)
    for command in (("inspect",), ("inspect", "--by", "all", "--json"), ("status",), ("status", "--json")):
        assert_one_line(invoke(command[0], damaged, *command[1:]), str(damaged), "damaged")


def _replace_array(index: Path, key: str, shape: tuple[int, ...], dtype: str = "uint8") -> None:
    group = zarr.open_group(str(index), mode="r+", zarr_format=3)
    group.create_array(key, shape=shape, dtype=dtype, fill_value=0, overwrite=True)


@pytest.mark.parametrize(
    "case",
    ["masks-another-shape", "counts-another-width", "counts-another-dtype", "journal-shorter", "journal-missing"],
)
def test_index_arrays_whose_sizes_disagree_with_the_header_are_one_line(
    made: tuple[Family, Path, Path], tmp_path: Path, case: str
) -> None:
    _, index, _ = made
    damaged = tmp_path / "index.zarr"
    shutil.copytree(index, damaged)
    group = zarr.open_group(str(damaged), mode="r", zarr_format=3)
    masks, counts = group["masks"].shape, group["stats/counts"].shape
    if case == "masks-another-shape":
        _replace_array(damaged, "masks", (masks[0], masks[1], masks[2] + 8))
    elif case.startswith("counts"):
        shape = (*counts[:2], counts[2] - 1) if case == "counts-another-width" else counts
        _replace_array(damaged, "stats/counts", shape, "int64" if case == "counts-another-width" else "int32")
        shutil.rmtree(damaged / "stats" / "tensor_overlap")  # the roll-up would answer without the counts
    elif case == "journal-shorter":
        _replace_array(damaged, "progress/probe", (1,))
    else:
        shutil.rmtree(damaged / "progress" / "probe")
    assert_one_line(invoke("inspect", damaged, "--by", "tensor"), str(damaged), "damaged")
    assert_one_line(invoke("status", damaged), str(damaged), "damaged")


RECORD_DAMAGE: dict[str, Callable[[dict[str, Any]], Any]] = {
    "a-list": lambda r: [1, 2],
    "agents-a-string": lambda r: {**r, "agents": "agent0"},
    "agents-empty": lambda r: {**r, "agents": []},
    "lambdas-one-short": lambda r: {**r, "per_agent": {"lambda": r["per_agent"]["lambda"][:-1]}},
    "lambdas-a-string": lambda r: {**r, "per_agent": {"lambda": "1.2"}},
    "lambdas-nested": lambda r: {**r, "per_agent": {"lambda": [[1.0]] * len(r["agents"])}},
    "inputs-one-short": lambda r: {**r, "inputs": r["inputs"][:-1]},
    "inputs-not-records": lambda r: {**r, "inputs": ["base", "a", "b", "c"]},
}


@pytest.mark.parametrize("case", sorted(RECORD_DAMAGE))
def test_a_merge_record_of_the_wrong_types_or_counts_is_one_line(
    made: tuple[Family, Path, Path], tmp_path: Path, case: str
) -> None:
    _, _, out = made
    damaged = tmp_path / "out"
    shutil.copytree(out, damaged)
    record = json.loads((damaged / "ramstream_merge.json").read_text())
    (damaged / "ramstream_merge.json").write_text(json.dumps(RECORD_DAMAGE[case](record)))
    for command in (("status",), ("status", "--json")):
        assert_one_line(invoke(command[0], damaged, *command[1:]), "ramstream_merge.json", "damaged")


def _unfinished(out: Path, target: Path, index: Path) -> tuple[Path, zarr.Group]:
    """``out`` as a merge interrupted before its first batch: run record and an empty journal."""
    shutil.copytree(out, target)
    record = json.loads((target / "ramstream_merge.json").read_text())
    (target / "ramstream_merge.json").unlink()
    work = target / ".ramstream"
    work.mkdir()
    (work / "run.json").write_text(json.dumps(record["run"]))
    journal = zarr.open_group(str(work / "journal"), mode="w", zarr_format=3)
    Journal.create(journal, "merge", 4)
    journal.attrs.update({"block_elems": 128, "index": str(index.resolve()), "units": "batches"})
    return work, journal


def test_an_unfinished_merge_with_damaged_records_is_one_line_or_an_answer(
    made: tuple[Family, Path, Path], tmp_path: Path
) -> None:
    _, index, out = made
    target = tmp_path / "out"
    work, journal = _unfinished(out, target, index)
    run = json.loads((work / "run.json").read_text())
    assert invoke("status", target).exit_code == 0
    for damaged in ([run], "run", None):
        (work / "run.json").write_text(json.dumps(damaged))
        assert_one_line(invoke("status", target), "run.json", "damaged")
    # A key that would be a path outside the cache is not followed; the answer says the index is not found.
    (work / "run.json").write_text(json.dumps({**run, "inputs": "../../.."}))
    journal.attrs["index"] = 7
    done = invoke("status", target, "--cache-dir", tmp_path / "cache")
    assert done.exit_code == 0 and "index was not found" in done.output, done.output
    # Advisory records of the wrong types are read as absent: a block size of True is not a plan of
    # one-element blocks, a throughput of strings is "no ETA".
    (work / "run.json").write_text(json.dumps(run))
    journal.attrs.update({"index": str(index.resolve()), "block_elems": True})
    journal["merge"].attrs["rate"] = {"seconds": "x", "bytes": [1], "recorded_at": "now"}
    doc = json.loads(invoke("status", target, "--json").output)
    assert doc["passes"]["merge"]["rate_bytes_per_s"] is None or doc["passes"]["merge"]["rate_from"] != "last merge run"
    assert doc["passes"]["merge"]["blocks_total"] == 4


# -- class 6: paths that are not ours --------------------------------------------------------
def _args(family: Family) -> list[str]:
    return [str(family.base), *map(str, family.agents)]


def test_an_index_path_that_is_a_user_directory_or_file_is_refused_and_left_alone(
    made: tuple[Family, Path, Path], tmp_path: Path
) -> None:
    family, _, _ = made
    user = tmp_path / "notes"
    user.mkdir()
    (user / "thesis.tex").write_text("mine")
    (user / "masks").mkdir()  # a name an index holds too does not make it one
    a_file = tmp_path / "notes.txt"
    a_file.write_text("mine")
    cache = ("--cache-dir", tmp_path / "cache")
    for path in (user, a_file):
        for command in (
            ("probe", *_args(family), "--index", path, *cache),
            ("merge", *_args(family), "--out", tmp_path / "out", "--index", path, *cache),
            ("inspect", path),
        ):
            line = assert_one_line(invoke(*command), str(path))
            assert "delete" not in line, line
    assert (user / "thesis.tex").read_text() == "mine" and a_file.read_text() == "mine"


def test_a_foreign_zarr_store_as_index_is_refused_and_left_alone(
    made: tuple[Family, Path, Path], tmp_path: Path
) -> None:
    family, _, _ = made
    stores = []
    for name, attrs in (("plain", {"owner": "climate model"}), ("creating", {"state": "creating", "run": 3})):
        store = tmp_path / f"{name}.zarr"
        group = zarr.open_group(str(store), mode="w", zarr_format=3, attributes=attrs)
        group.create_array("temperature", shape=(4,), dtype="float32", fill_value=1.5)
        stores.append(store)
    for store in stores:
        before = sorted(p.relative_to(store) for p in store.rglob("*"))
        line = assert_one_line(
            invoke("probe", *_args(family), "--index", store, "--cache-dir", tmp_path / "cache"), str(store)
        )
        assert "delete" not in line, line
        assert sorted(p.relative_to(store) for p in store.rglob("*")) == before


def test_output_index_and_cache_never_nest(made: tuple[Family, Path, Path], tmp_path: Path) -> None:
    family, _, _ = made
    out, cache, index = tmp_path / "out", tmp_path / "cache", tmp_path / "i.zarr"
    refused = {
        "index-inside-out": ("--out", out, "--index", out / "index.zarr", "--cache-dir", cache),
        "out-inside-index": ("--out", index / "out", "--index", index, "--cache-dir", cache),
        "out-is-the-cache": ("--out", cache, "--cache-dir", cache),
        "cache-inside-out": ("--out", out, "--cache-dir", out / "cache"),
        "out-among-the-cached-indexes": ("--out", cache / "index" / "merged", "--cache-dir", cache),
    }
    for case, options in refused.items():
        line = assert_one_line(invoke("merge", *_args(family), *options), "--out" if "index" in case else "cache")
        assert not out.exists() or not any(out.iterdir()), (case, line)
    assert not (cache / "index").exists()  # refused before any index was made
