"""Hugging Face hub ids as checkpoints, resolved from a real cache layout with no network.

The cache is laid out as huggingface_hub writes it: ``models--org--name/`` holding ``blobs/``
(the files, named by their hash), ``refs/<branch>`` (a commit sha) and ``snapshots/<sha>/``
whose entries are relative symlinks into ``blobs/``. Every run is a real ``ramstream`` process
with ``HF_HUB_OFFLINE=1`` (huggingface_hub reads its environment when it is imported).
"""

from __future__ import annotations

import hashlib
import json
import os
import subprocess
import sys
from pathlib import Path

import pytest
import yaml

from ramstream.format.checkpoint import open_checkpoint
from tests.families import Family, build_family, read_model_dir
from tests.test_cli import Outcome, in_process, ok, one_line_error

COMMITS = {"org/base": "1" * 40, "org/agent0": "a0" * 20, "org/agent1": "b1" * 20}


def blob_of(file: Path) -> str:
    """The blob a file is stored as in the cache (its sha256, as the hub names an LFS file's blob)."""
    return hashlib.sha256(file.read_bytes()).hexdigest()


def cache_repo(cache: Path, repo_id: str, source: Path, commit: str, refs: tuple[str, ...] = ("main",)) -> Path:
    """``source``'s files as the snapshot ``commit`` of ``repo_id`` in the cache ``cache``."""
    repo = cache / f"models--{repo_id.replace('/', '--')}"
    snapshot = repo / "snapshots" / commit
    snapshot.mkdir(parents=True)
    (repo / "blobs").mkdir(exist_ok=True)
    (repo / "refs").mkdir(exist_ok=True)
    for file in sorted(source.iterdir()):
        data = file.read_bytes()
        blob = hashlib.sha256(data).hexdigest()
        (repo / "blobs" / blob).write_bytes(data)
        (snapshot / file.name).symlink_to(Path("..") / ".." / "blobs" / blob)
    for ref in refs:
        (repo / "refs" / ref).write_text(commit)  # as huggingface_hub writes it: the sha, no newline
    return snapshot


@pytest.fixture
def hub(tmp_path: Path) -> tuple[Family, Path]:
    """A family on disk, and the same checkpoints in an HF cache under ``HF_HOME=<tmp>/hf``: the
    base on main, agent0 on main and dev, agent1 on main."""
    fam = build_family(tmp_path / "family", densities=(0.1, 0.4))
    cache = tmp_path / "hf" / "hub"
    cache_repo(cache, "org/base", fam.base, COMMITS["org/base"])
    cache_repo(cache, "org/agent0", fam.agents[0], COMMITS["org/agent0"], refs=("main", "dev"))
    cache_repo(cache, "org/agent1", fam.agents[1], COMMITS["org/agent1"])
    return fam, tmp_path / "hf"


def offline(*args: str | Path, hf_home: Path) -> Outcome:
    env = {k: v for k, v in os.environ.items() if not k.startswith(("HF_", "TRANSFORMERS_"))}
    env.update(HF_HUB_OFFLINE="1", HF_HOME=str(hf_home))
    done = subprocess.run(
        [sys.executable, "-m", "ramstream.cli", *map(str, args)], capture_output=True, text=True, timeout=120, env=env
    )
    return Outcome(done.returncode, done.stdout, done.stderr, "Traceback" in done.stderr)


def weights(out: Path) -> dict[str, bytes]:
    return {name: raw.tobytes() for name, (_d, _s, raw) in read_model_dir(out).items()}


def test_hub_ids_resolve_from_the_cache_by_branch_and_by_commit(tmp_path: Path, hub: tuple[Family, Path]) -> None:
    fam, hf_home = hub
    opts = ["--cache-dir", tmp_path / "cache", "--quiet"]
    ok(in_process("merge", fam.base, *fam.agents, "--out", tmp_path / "local", *opts))
    sha = COMMITS["org/agent1"]
    args = ["merge", "org/base", "org/agent0@dev", f"org/agent1@{sha}", "--out", tmp_path / "out", *opts]
    ok(offline(*args, hf_home=hf_home))
    assert weights(tmp_path / "out") == weights(tmp_path / "local")
    assert (tmp_path / "out" / "tokenizer.json").is_file()  # copied from the base's snapshot
    record = json.loads((tmp_path / "out" / "ramstream_merge.json").read_text())
    blobs = [{"model.safetensors": blob_of(p / "model.safetensors")} for p in (fam.base, *fam.agents)]
    assert [i["hub"] for i in record["inputs"]] == [
        {"repo_id": "org/base", "revision": "main", "commit": COMMITS["org/base"], "blobs": blobs[0]},
        {"repo_id": "org/agent0", "revision": "dev", "commit": COMMITS["org/agent0"], "blobs": blobs[1]},
        {"repo_id": "org/agent1", "revision": sha, "commit": sha, "blobs": blobs[2]},
    ]
    card = (tmp_path / "out" / "README.md").read_text()
    front = yaml.safe_load(card.split("---")[1])
    assert front["base_model"] == ["org/base", "org/agent0", "org/agent1"] and front["base_model_relation"] == "merge"
    assert f"`org/agent0` at commit `{COMMITS['org/agent0']}`" in card
    assert f"cached blob `{blobs[1]['model.safetensors']}`" in card
    # the resolved files are fingerprinted like any others: the same merge again is recognised
    again = ok(offline(*args, hf_home=hf_home))
    assert again.out.startswith("already merged")


def test_hf_cache_overrides_hf_home(tmp_path: Path, hub: tuple[Family, Path]) -> None:
    _fam, hf_home = hub
    elsewhere = tmp_path / "empty-home"
    args = ["probe", "org/base", "org/agent0", "--cache-dir", tmp_path / "cache", "--quiet"]
    one_line_error(
        offline(*args, hf_home=elsewhere), "org/base@main", "not in the Hugging Face cache", "HF_HUB_OFFLINE"
    )
    done = ok(offline(*args, "--hf-cache", hf_home / "hub", hf_home=elsewhere))
    assert done.out.startswith("index: ")


@pytest.mark.parametrize(
    ("agent", "needles"),
    [
        ("org/agent0@nope", ["org/agent0@nope", "not in the Hugging Face cache"]),
        ("org/missing", ["org/missing@main", "not in the Hugging Face cache", "--hf-cache"]),
    ],
    ids=["missing-revision", "repo-not-cached"],
)
def test_what_the_cache_lacks_is_one_line_naming_repo_and_revision(
    tmp_path: Path, hub: tuple[Family, Path], agent: str, needles: list[str]
) -> None:
    _fam, hf_home = hub
    out = tmp_path / "out"
    one_line_error(offline("merge", "org/base", agent, "--out", out, "--quiet", hf_home=hf_home), *needles)
    assert not out.exists()


def test_a_config_names_hub_models_with_revisions(tmp_path: Path, hub: tuple[Family, Path]) -> None:
    _fam, hf_home = hub
    config = tmp_path / "merge.yml"
    config.write_text(
        "merge_method: task_arithmetic\nbase_model: org/base\n"
        "models:\n  - model: org/agent0@dev\n    parameters: {weight: 0.5}\n"
        "  - model: org/agent1@main\n    parameters: {weight: 0.5}\n"
    )
    ok(offline("merge", "--config", config, "--out", tmp_path / "out", "--quiet", hf_home=hf_home))
    record = json.loads((tmp_path / "out" / "ramstream_merge.json").read_text())
    assert [i["hub"]["revision"] for i in record["inputs"]] == ["main", "dev", "main"]


def test_a_bin_checkpoint_in_the_cache(tmp_path: Path, hub: tuple[Family, Path]) -> None:
    pytest.importorskip("torch")
    from tests.test_torch_bin import save_as_bin

    fam, hf_home = hub
    as_bin = save_as_bin(fam.agents[1], tmp_path / "agent1-bin")
    cache_repo(hf_home / "hub", "org/agent1-bin", as_bin, "c" * 40)
    opts = ["--cache-dir", tmp_path / "cache", "--quiet"]
    ok(in_process("merge", fam.base, *fam.agents, "--out", tmp_path / "local", *opts))
    ok(offline("merge", "org/base", "org/agent0", "org/agent1-bin", "--out", tmp_path / "out", *opts, hf_home=hf_home))
    assert weights(tmp_path / "out") == weights(tmp_path / "local")


def test_a_snapshot_path_is_recorded_with_its_repo_and_an_existing_path_wins(
    tmp_path: Path, hub: tuple[Family, Path], monkeypatch: pytest.MonkeyPatch
) -> None:
    _fam, hf_home = hub
    snapshot = hf_home / "hub" / "models--org--agent0" / "snapshots" / COMMITS["org/agent0"]
    source = open_checkpoint(snapshot).hub
    assert source is not None and (source.repo_id, source.commit) == ("org/agent0", COMMITS["org/agent0"])
    monkeypatch.chdir(hf_home / "hub" / "models--org--agent0")
    local = open_checkpoint("snapshots/" + COMMITS["org/agent0"])  # reads as org/name, but it is a path
    assert local.directory == Path("snapshots") / COMMITS["org/agent0"]
