"""Index chunks that are missing or damaged: every array and journal, every read path.

Zarr reads a chunk that is not there as the array's fill value, so a deleted statistics chunk
used to be read as zeros (RAM+ merged with lambda = 1, ``inspect`` showed agents with nothing
active). Here real chunk files of a real index are deleted, truncated and bit-flipped; each
command that reads them must stop in one line naming the array and saying what to do, and leave
nothing that looks finished. An index written by an earlier ramstream, which left chunks of
zeros out, is told apart by its metadata: a chunk missing there is refused saying so, with the
commands that probe it again.
"""

from __future__ import annotations

import json
import shlex
import shutil
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import pytest
import zarr

from ramstream import api
from ramstream.config import RunOptions
from ramstream.errors import StoreCorruptError
from ramstream.index.store import open_index_store
from tests.families import Family, build_family
from tests.test_cli import assert_nothing_finished, in_process, one_line_error

SHAPES = {"model.embed_tokens.weight": (64, 32), "model.layers.0.mlp.up_proj.weight": (32, 32)}
TIES = ("--method", "ties", "--density", "0.3", "--trim-scope", "model")


@dataclass(frozen=True)
class Probed:
    family: Family
    index: Path  # probed, with agreement and TIES's model-wide histograms: never damaged itself
    options: RunOptions

    def members(self) -> list[str]:
        return [str(self.family.base), *map(str, self.family.agents)]


@pytest.fixture(scope="module")
def probed(tmp_path_factory: pytest.TempPathFactory) -> Probed:
    root = tmp_path_factory.mktemp("damaged-index")
    family = build_family(root / "family", shapes=SHAPES)
    made = Probed(family, root / "index.zarr", RunOptions(quiet=True, block_elems=512, cache_dir=root / "cache"))
    api.probe(family.base, family.agents, index=made.index, agreement=True, options=made.options)
    ties = in_process("merge", *made.members(), "--out", root / "ties", "--index", made.index, *TIES, "--quiet")
    assert ties.code == 0, ties.err
    return made


def copy_of(probed: Probed, tmp_path: Path) -> Path:
    index = tmp_path / "index.zarr"
    shutil.copytree(probed.index, index)
    return index


def array_dir(index: Path, prefix: str) -> Path:
    """The folder of the array whose path starts with ``prefix`` (statistics keys end in a hash)."""
    parent, _, name = prefix.rpartition("/")
    found = [p for p in (index / parent).iterdir() if p.name.startswith(name) and (p / "zarr.json").is_file()]
    assert len(found) == 1, found
    return found[0]


def first_chunk(array: Path) -> Path:
    return min((p for p in array.rglob("*") if p.is_file() and p.name != "zarr.json"), key=lambda p: str(p))


def damage(chunk: Path, how: str) -> None:
    data = bytearray(chunk.read_bytes())
    if how == "delete":
        chunk.unlink()
    elif how == "truncate":
        chunk.write_bytes(bytes(data[: len(data) // 2]))
    else:
        data[len(data) // 2] ^= 0x10
        chunk.write_bytes(bytes(data))


def merge_reads(*method: str) -> Callable[[Probed, Path, Path], str]:
    """A merge with ``--index``: one line naming the index, nothing finished in its output."""

    def run(probed: Probed, index: Path, tmp: Path) -> str:
        out = tmp / "out"
        args = ("merge", *probed.members(), "--out", out, "--index", index, *method, "--quiet")
        message = one_line_error(in_process(*args), str(index))
        assert_nothing_finished(out)
        return message

    return run


def inspect_reads(*options: str) -> Callable[[Probed, Path, Path], str]:
    def run(probed: Probed, index: Path, tmp: Path) -> str:
        return one_line_error(in_process("inspect", index, *options), str(index))

    return run


def api_reads(read: Callable[[Path], object]) -> Callable[[Probed, Path, Path], str]:
    def run(probed: Probed, index: Path, tmp: Path) -> str:
        with pytest.raises(StoreCorruptError) as caught:
            read(index)
        return f"error: {caught.value}"

    return run


# Each array of the index, and a command (or the API call) that reads it.
READERS: dict[str, Callable[[Probed, Path, Path], str]] = {
    "masks": api_reads(lambda index: api.open_index(index).tensor_mask("model.embed_tokens.weight")),
    "stats/counts": api_reads(lambda index: open_index_store(index).block_stats()),
    "stats/tensor_overlap": merge_reads("--method", "ram+"),
    "stats/tensor_coverage": inspect_reads("--by", "layer"),
    "stats/agreement": inspect_reads("--pairs"),
    "stats/abs_hi16": merge_reads(*TIES),
    "stats/abs_lo16": merge_reads(*TIES),
    "stats/tie_boundary": merge_reads(*TIES),
}


@pytest.mark.parametrize("how", ["delete", "truncate", "flip"])
@pytest.mark.parametrize("prefix", list(READERS))
def test_a_damaged_chunk_of_any_index_array_is_refused_by_name(
    probed: Probed, tmp_path: Path, prefix: str, how: str
) -> None:
    index = copy_of(probed, tmp_path)
    array = array_dir(index, prefix)
    damage(first_chunk(array), how)
    message = READERS[prefix](probed, index, tmp_path)
    name = str(array.relative_to(index))
    assert f"'{name}'" in message, message
    assert ("lacks its chunk" if how == "delete" else "damaged") in message, message
    assert "run the command again" in message, message
    assert "earlier ramstream" not in message, message  # this index says it writes every chunk
    assert len(message) < 400, message  # an excerpt of the codec's complaint, not the bytes


def test_the_ram_merge_reads_no_zeros_for_a_lost_roll_up(probed: Probed, tmp_path: Path) -> None:
    """The case reported: the roll-up's chunk deleted, RAM+ wrote lambda = 1 and exited 0."""
    index = copy_of(probed, tmp_path)
    for name in ("tensor_overlap", "tensor_coverage"):
        first_chunk(index / "stats" / name).unlink()
    message = merge_reads("--method", "ram+")(probed, index, tmp_path)
    assert "'stats/tensor_overlap'" in message and "lacks its chunk" in message


@pytest.mark.parametrize("how", ["delete", "flip"])
def test_a_finished_probe_whose_journal_is_damaged_is_refused_by_status(
    probed: Probed, tmp_path: Path, how: str
) -> None:
    index = copy_of(probed, tmp_path)
    damage(index / "progress" / "probe" / "c.0", how)
    message = one_line_error(in_process("status", index), str(index))
    assert "'progress/probe'" in message and "run the command again" in message, message


def test_a_resumed_probe_refuses_a_lost_chunk_of_a_batch_it_marked(probed: Probed, tmp_path: Path) -> None:
    index = copy_of(probed, tmp_path)
    # What a probe killed after three batches leaves: three marks, no roll-up, not complete.
    group = zarr.open_group(str(index), mode="r+", zarr_format=3)
    group.attrs["probe"] = {"complete": False, "seconds": 1.0, "bytes": 1, "finished_at": None}
    for mark in sorted((index / "progress" / "probe").glob("c.*"))[3:]:
        mark.unlink()
    shutil.rmtree(index / "stats" / "tensor_overlap")
    first_chunk(index / "stats" / "counts").unlink()  # batch 0's counts, which its mark vouches for
    message = one_line_error(in_process("probe", *probed.members(), "--index", index, "--quiet"), str(index))
    assert "'stats/counts'" in message and "lacks its chunk" in message, message


def test_chunks_of_zeros_are_written_so_that_a_missing_one_means_damage(tmp_path: Path) -> None:
    """Agents equal to their base have masks, agreement and roll-up of zeros only: zarr would
    skip writing such chunks by default, and a missing chunk could then not be told from one."""
    family = build_family(tmp_path / "family", shapes=SHAPES, densities=(0.0, 0.0))
    index = tmp_path / "index.zarr"
    options = RunOptions(quiet=True, block_elems=512, cache_dir=tmp_path / "cache")
    store = api.probe(family.base, family.agents, index=index, agreement=True, options=options)
    arrays = [store.group[k] for k in ("masks", "stats/tensor_overlap")]
    arrays += [store.group[f"stats/{k}"] for k in store.group["stats"] if k.startswith("agreement")]
    assert len(arrays) == 3
    for array in arrays:
        assert not np.asarray(array[...]).any(), array.path
        assert array.nchunks_initialized == array.nchunks, array.path
    view = api.open_index(index)  # and they are read back as the zeros they are, not refused
    assert not view.model.active.any()
    assert not view.pairs.model.both.any()


def as_an_earlier_ramstream_wrote_it(index: Path, zero_chunks: list[Path]) -> None:
    """The index as ramstream wrote it before every chunk was written: the same schema (3) and
    header, its group metadata without ``every_chunk_written``, and its chunks of zeros absent
    (zarr skipped them)."""
    meta = json.loads((index / "zarr.json").read_text())
    assert meta["attributes"].pop("every_chunk_written") is True
    (index / "zarr.json").write_text(json.dumps(meta))
    for chunk in zero_chunks:
        if chunk.is_dir():
            shutil.rmtree(chunk)
        else:
            chunk.unlink()


def test_an_index_of_an_earlier_writer_lacking_a_chunk_of_zeros_says_so_and_how_to_probe_again(tmp_path: Path) -> None:
    """Agents equal to their base: the roll-up's overlap and the agreement are zeros, the chunks
    an earlier ramstream did not write. The refusal says which writer and gives the commands;
    running them gives an index that reads."""
    family = build_family(tmp_path / "family", shapes=SHAPES, densities=(0.0, 0.0))
    members = [str(family.base), *map(str, family.agents)]
    index = tmp_path / "index.zarr"
    made = in_process("probe", *members, "--index", index, "--agreement", "--memory", "16MiB", "--quiet")
    assert made.code == 0, made.err
    agreement = array_dir(index, "stats/agreement")
    zeros = [index / "stats" / "tensor_overlap" / "c", *(p for p in agreement.iterdir() if p.name != "zarr.json")]
    as_an_earlier_ramstream_wrote_it(index, zeros)
    out = tmp_path / "out"
    for args in (
        ("inspect", index),
        ("inspect", index, "--pairs"),
        ("merge", *members, "--out", out, "--index", index, "--method", "ram+", "--quiet"),
    ):
        message = one_line_error(in_process(*args), str(index), "written by an earlier ramstream", "probe again")
        assert "lacks its chunk" in message and "lost by the disk" not in message, message
        assert_nothing_finished(out)
    commands = message.split("probe again into a new index (", 1)[1].rsplit("), then run the command again", 1)[0]
    remove, probe = commands.split(" && ")
    assert shlex.split(remove) == ["rm", "-r", str(index)]
    words = shlex.split(probe)
    assert words == ["ramstream", "probe", *members, "--index", str(index), "--agreement"], words
    shutil.rmtree(index)
    assert in_process(*words[1:], "--quiet").code == 0
    assert in_process("inspect", index, "--pairs").code == 0
    assert json.loads((index / "zarr.json").read_text())["attributes"]["every_chunk_written"] is True


def test_an_index_of_an_earlier_writer_with_every_chunk_still_reads(probed: Probed, tmp_path: Path) -> None:
    """Its agents changed their weights, so no chunk was all zeros: nothing is missing."""
    index = copy_of(probed, tmp_path)
    as_an_earlier_ramstream_wrote_it(index, [])
    for args in (("inspect", index), ("inspect", index, "--pairs"), ("status", index)):
        done = in_process(*args)
        assert done.code == 0 and done.err == "", done.err
    out = tmp_path / "out"
    merged = in_process("merge", *probed.members(), "--out", out, "--index", index, "--method", "ram+", "--quiet")
    assert merged.code == 0, merged.err
