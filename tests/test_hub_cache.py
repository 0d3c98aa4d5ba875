"""A Hugging Face cache that escapes (issue 21, class 2): every file taken from a snapshot leads
inside its repo's folder or is refused by name, a link whose blob is gone is "missing", and the
merge records exactly what was read.

The cache is laid out as huggingface_hub writes it (``tests/test_hub.py``'s ``cache_repo``),
then damaged the way a hostile or broken cache would be. Each case is tried on the hub id
(resolved through the cache) and on the snapshot's path, where it applies. In this process the
hub is never asked: huggingface_hub's ``HF_HUB_OFFLINE`` is set on its constants, as its
environment variable would at import; the CLI cases are real processes with ``HF_HUB_OFFLINE=1``.
"""

from __future__ import annotations

import json
import os
import shutil
from collections.abc import Callable
from pathlib import Path

import pytest

from ramstream.errors import CorruptFileError, InputError
from ramstream.format.checkpoint import open_checkpoint
from ramstream.format.hub import HubAccess
from tests.families import Family, build_family
from tests.test_cli import one_line_error
from tests.test_hub import blob_of, cache_repo, offline

SHA = "a0" * 20
OTHER_SHA = "c1" * 20
SHARD = "model-00001-of-00002.safetensors"


@pytest.fixture(scope="module")
def family(tmp_path_factory: pytest.TempPathFactory) -> Family:
    return build_family(tmp_path_factory.mktemp("hub-cache") / "family", densities=(0.1, 0.4), shards=2)


@pytest.fixture(autouse=True)
def hub_offline(monkeypatch: pytest.MonkeyPatch) -> None:
    import huggingface_hub.constants

    monkeypatch.setattr(huggingface_hub.constants, "HF_HUB_OFFLINE", True)


class Cache:
    """A cache holding org/base and org/agent0 (sharded), and a place outside it."""

    def __init__(self, root: Path, family: Family) -> None:
        self.root = root / "hub"
        self.outside = root / "outside"
        self.outside.mkdir(parents=True)
        self.family = family
        cache_repo(self.root, "org/base", family.base, "1" * 40)
        self.snapshot = cache_repo(self.root, "org/agent0", family.agents[0], SHA)
        self.repo = self.snapshot.parent.parent

    def relink(self, name: str, target: str | Path) -> None:
        (self.snapshot / name).unlink()
        (self.snapshot / name).symlink_to(target)

    def blob(self, name: str) -> Path:
        return Path(os.path.realpath(self.snapshot / name))

    def new_blob(self, name: str, text: str) -> None:
        """Replace ``name`` by a blob holding ``text`` (as a new upload would)."""
        blob = self.repo / "blobs" / f"new-{name}"
        blob.write_text(text)
        self.relink(name, Path("..") / ".." / "blobs" / blob.name)


def _shard_outside(cache: Cache) -> str:
    copy = cache.outside / SHARD  # a valid shard, readable, but not the cache's
    shutil.copyfile(cache.family.agents[0] / SHARD, copy)
    cache.relink(SHARD, copy)
    return f"{SHARD}: leads outside the Hugging Face cache folder of org/agent0"


def _shard_in_another_repo(cache: Cache) -> str:
    blob = blob_of(cache.family.base / SHARD)
    cache.relink(SHARD, Path("..") / ".." / ".." / "models--org--base" / "blobs" / blob)
    return f"{SHARD}: leads outside the Hugging Face cache folder of org/agent0"


def _config_to_a_private_file(cache: Cache) -> str:
    secret = cache.outside / "passwd"
    secret.write_text("root:x:0:0\n")
    cache.relink("config.json", secret)
    return "config.json: leads outside the Hugging Face cache folder of org/agent0"


def _weight_map_climbs_out(cache: Cache) -> str:
    shutil.copyfile(cache.family.agents[0] / SHARD, cache.outside / SHARD)
    index = json.loads((cache.snapshot / "model.safetensors.index.json").read_text())
    index["weight_map"] = {k: v.replace(SHARD, f"../../../../outside/{SHARD}") for k, v in index["weight_map"].items()}
    cache.new_blob("model.safetensors.index.json", json.dumps(index))
    return "outside its directory"


def _weight_map_absolute(cache: Cache) -> str:
    index = json.loads((cache.snapshot / "model.safetensors.index.json").read_text())
    absolute = str(cache.family.agents[0] / SHARD)
    index["weight_map"] = {k: v.replace(SHARD, absolute) for k, v in index["weight_map"].items()}
    cache.new_blob("model.safetensors.index.json", json.dumps(index))
    return "outside its directory"


def _snapshot_folder_elsewhere(cache: Cache) -> str:
    elsewhere = cache.outside / "snapshot"
    shutil.copytree(cache.snapshot, elsewhere, symlinks=False)  # real files: only the folder escapes
    shutil.rmtree(cache.snapshot)
    cache.snapshot.symlink_to(elsewhere)
    return f"{SHA}: leads outside the Hugging Face cache folder of org/agent0"


def _blob_deleted(name: str) -> Callable[[Cache], str]:
    def damage(cache: Cache) -> str:
        cache.blob(name).unlink()
        return (
            f"the cached file {name} of org/agent0 is missing (its blob was deleted); download it with "
            f"`hf download org/agent0 {name} --revision {SHA}`"
        )

    return damage


def _never_downloaded(cache: Cache) -> str:
    (cache.snapshot / SHARD).unlink()
    return f"the cached file {SHARD} of org/agent0 is missing (it was never downloaded)"


SNAPSHOT_CASES: dict[str, Callable[[Cache], str]] = {
    "shard-link-outside": _shard_outside,
    "shard-link-into-another-repo": _shard_in_another_repo,
    "config-link-to-a-private-file": _config_to_a_private_file,
    "weight-map-climbs-out": _weight_map_climbs_out,
    "weight-map-absolute": _weight_map_absolute,
    "snapshot-folder-elsewhere": _snapshot_folder_elsewhere,
    "shard-blob-deleted": _blob_deleted(SHARD),
    "index-blob-deleted": _blob_deleted("model.safetensors.index.json"),
    "tokenizer-blob-deleted": _blob_deleted("tokenizer.json"),
    "shard-never-downloaded": _never_downloaded,
}


@pytest.mark.parametrize("form", ["hub-id", "snapshot-path"])
@pytest.mark.parametrize("case", list(SNAPSHOT_CASES))
def test_a_snapshot_file_that_escapes_or_is_gone_is_refused_by_name(
    tmp_path: Path, family: Family, case: str, form: str
) -> None:
    cache = Cache(tmp_path, family)
    needle = SNAPSHOT_CASES[case](cache)
    given = "org/agent0" if form == "hub-id" else cache.repo / "snapshots" / SHA
    with pytest.raises((InputError, CorruptFileError)) as caught:
        open_checkpoint(given, HubAccess(cache.root))
    message = str(caught.value)
    assert needle in message and "\n" not in message, message


def _ref(text: str) -> Callable[[Cache], str]:
    def damage(cache: Cache) -> str:
        (cache.repo / "refs" / "main").write_text(text)
        return f"refs/main: holds {text!r}, not a commit"

    return damage


def _ref_link_outside(cache: Cache) -> str:
    elsewhere = cache.outside / "main"
    elsewhere.write_text(SHA)
    (cache.repo / "refs" / "main").unlink()
    (cache.repo / "refs" / "main").symlink_to(elsewhere)
    return "refs/main: leads outside the Hugging Face cache folder of org/agent0"


def _ref_to_a_snapshot_of_another_repo(cache: Cache) -> str:
    text = f"../../../models--org--base/snapshots/{'1' * 40}"
    (cache.repo / "refs" / "main").write_text(text)
    return "not a commit"


REF_CASES: dict[str, tuple[str, Callable[[Cache], str]]] = {
    "ref-climbs-out": ("org/agent0", _ref("../../x")),
    "ref-to-another-repo": ("org/agent0", _ref_to_a_snapshot_of_another_repo),
    "ref-with-a-newline": ("org/agent0", _ref(SHA + "\n")),
    "ref-link-outside": ("org/agent0", _ref_link_outside),
    "revision-climbs-out": ("org/agent0@../../../x", lambda cache: "'../../../x' is not a revision"),
}


@pytest.mark.parametrize("case", list(REF_CASES))
def test_a_ref_that_escapes_or_holds_no_commit_is_refused_by_name(tmp_path: Path, family: Family, case: str) -> None:
    cache = Cache(tmp_path, family)
    given, damage = REF_CASES[case]
    needle = damage(cache)
    with pytest.raises(InputError) as caught:
        open_checkpoint(given, HubAccess(cache.root))
    message = str(caught.value)
    assert needle in message and "\n" not in message, message


def test_a_shard_index_of_a_plain_directory_names_only_files_inside_it(tmp_path: Path, family: Family) -> None:
    model = tmp_path / "model"
    shutil.copytree(family.agents[0], model)
    index = model / "model.safetensors.index.json"
    original = json.loads(index.read_text())
    for outside in (str(family.agents[0] / SHARD), f"../{family.agents[0].name}/{SHARD}", f"sub/../../x/{SHARD}"):
        weight_map = {k: v.replace(SHARD, outside) for k, v in original["weight_map"].items()}
        index.write_text(json.dumps({**original, "weight_map": weight_map}))
        with pytest.raises(CorruptFileError, match="outside its directory"):
            open_checkpoint(model)
    (model / "sub").mkdir()
    weight_map = {k: v.replace(SHARD, f"sub/../{SHARD}") for k, v in original["weight_map"].items()}
    index.write_text(json.dumps({**original, "weight_map": weight_map}))
    assert open_checkpoint(model).files[0] == model / "sub" / ".." / SHARD  # inside: read as before


def test_the_record_names_the_commit_and_blobs_actually_read(tmp_path: Path, family: Family) -> None:
    """A snapshot folder that is a link to another snapshot of the same repo is read as that one."""
    cache = Cache(tmp_path, family)
    other = cache.repo / "snapshots" / OTHER_SHA
    other.symlink_to(SHA)
    source = open_checkpoint(other).hub
    assert source is not None
    assert (source.repo_id, source.revision, source.commit) == ("org/agent0", OTHER_SHA, SHA)
    shards = sorted(p.name for p in family.agents[0].glob("model-*.safetensors"))
    assert dict(source.blobs) == {name: blob_of(family.agents[0] / name) for name in shards}


@pytest.mark.parametrize("case", ["shard-link-outside", "shard-blob-deleted"])
def test_on_the_command_line_it_is_one_line_and_nothing_is_written(tmp_path: Path, family: Family, case: str) -> None:
    cache = Cache(tmp_path, family)
    needle = SNAPSHOT_CASES[case](cache)
    out = tmp_path / "out"
    args = ["merge", "org/base", "org/agent0", "--out", out, "--cache-dir", tmp_path / "index", "--quiet"]
    one_line_error(offline(*args, "--hf-cache", cache.root, hf_home=tmp_path / "home"), needle)
    assert not out.exists()
