"""Outputs that look finished must be finished (issue 21, class 3): what the base's directory
lacks or holds broken (config.json, tokenizer files), tied heads under methods that treat two
tensors differently, and a model card whose names cannot break its YAML or its tables."""

from __future__ import annotations

import json
import os
import re
import shutil
from pathlib import Path

import pytest
import yaml

from ramstream.errors import InputError
from ramstream.methods.registry import method_names
from ramstream.output.base_files import read_copied
from tests.families import build_family, read_model_dir
from tests.test_cli import as_process, in_process, ok, one_line_error
from tests.test_tied_heads import EMBED, HEAD, head_is_embedding, rewrite, without_head


def merge(tmp_path: Path, base: Path, *agents: Path, out: str = "out", args: tuple[str, ...] = ()) -> Path:
    """Merge on the command line; the output directory. Whatever came on stderr is the caller's to check."""
    done = in_process("merge", base, *agents, "--out", tmp_path / out, "--cache-dir", tmp_path / "cache", *args)
    assert done.code == 0 and not done.crashed, done.err
    return tmp_path / out


# -- what the base's directory lacks ------------------------------------------------------------


@pytest.mark.parametrize("base_is", ["a directory without config.json", "a single weights file"])
def test_an_output_without_config_json_says_so_on_stderr_in_the_card_and_the_record(
    tmp_path: Path, base_is: str
) -> None:
    (tmp_path / "fam").mkdir()
    fam = build_family(tmp_path / "fam", densities=(0.1, 0.4), single_file=base_is == "a single weights file")
    if base_is.startswith("a directory"):
        (fam.base / "config.json").unlink()
    out = tmp_path / "out"
    done = in_process("merge", fam.base, *fam.agents, "--out", out, "--cache-dir", tmp_path / "cache", "--quiet")
    assert done.code == 0 and not done.crashed, done.err
    missing = ["config.json"] if base_is.startswith("a directory") else ["config.json", "tokenizer files"]
    lines = done.err.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith(f"warning: {out} has no config.json"), done.err
    assert all(m in lines[0] for m in missing) and "transformers" in lines[0]
    assert not (out / "config.json").exists() and (out / "model.safetensors").is_file()
    record = json.loads((out / "ramstream_merge.json").read_text())
    assert record["missing"] == missing and "config.json" not in record["files"]
    card = (out / "README.md").read_text()
    assert "Not a complete model directory" in card and "no config.json" in card
    again = in_process("merge", fam.base, *fam.agents, "--out", out, "--cache-dir", tmp_path / "cache", "--quiet")
    assert again.out.startswith("already merged") and again.err == done.err  # said again, not forgotten


def test_an_output_without_tokenizer_files_says_so_in_the_card_and_the_record(tmp_path: Path) -> None:
    """It loads as a model, as many checkpoints saved without a tokenizer do: no warning, but the
    card and the record do not let it pass for complete."""
    fam = build_family(tmp_path / "fam", densities=(0.1, 0.4))
    (fam.base / "tokenizer.json").unlink()
    out = tmp_path / "out"
    ok(in_process("merge", fam.base, *fam.agents, "--out", out, "--cache-dir", tmp_path / "cache", "--quiet"))
    assert json.loads((out / "ramstream_merge.json").read_text())["missing"] == ["tokenizer files"]
    assert (out / "config.json").is_file() and "has no tokenizer files" in (out / "README.md").read_text()


def test_a_complete_base_gives_a_record_missing_nothing(tmp_path: Path) -> None:
    fam = build_family(tmp_path / "fam", densities=(0.1, 0.4))
    out = merge(tmp_path, fam.base, *fam.agents, args=("--quiet",))
    assert json.loads((out / "ramstream_merge.json").read_text())["missing"] == []
    assert (out / "config.json").is_file() and (out / "tokenizer.json").is_file()
    assert "Not a complete" not in (out / "README.md").read_text()


def _dangling(path: Path) -> str:
    path.symlink_to(path.parent / "gone.json")
    return "symbolic link"


def _directory(path: Path) -> str:
    path.mkdir()
    return "is a directory"


def _fifo(path: Path) -> str:
    os.mkfifo(path)
    return "FIFO"


BROKEN = {"dangling-link": _dangling, "directory": _directory, "fifo": _fifo}


@pytest.mark.parametrize("name", ["config.json", "tokenizer.json", "generation_config.json"])
@pytest.mark.parametrize("broken", list(BROKEN))
def test_a_broken_config_or_tokenizer_file_is_refused_before_the_merge(tmp_path: Path, name: str, broken: str) -> None:
    """The user meant the file to be there: it is refused by name, not left out quietly (nor a
    traceback in the middle of finalisation, after the long pass)."""
    fam = build_family(tmp_path / "fam", densities=(0.1, 0.4))
    path = fam.base / name
    path.unlink(missing_ok=True)
    what = BROKEN[broken](path)
    out = tmp_path / "out"
    run = as_process if broken == "fifo" else in_process  # a FIFO must not block a real process either
    done = run("merge", fam.base, *fam.agents, "--out", out, "--cache-dir", tmp_path / "cache")
    one_line_error(done, str(path), what, "fix it, or remove it")
    assert not out.exists()
    assert not (tmp_path / "cache").exists()  # refused before any pass


def test_a_file_to_copy_that_broke_after_the_check_is_one_named_input_error(tmp_path: Path) -> None:
    """Finalisation reads what it copies one file at a time; one gone since the check is named,
    with what to do (the rerun finishes), not worded as a full disk."""
    path = tmp_path / "tokenizer.json"
    path.symlink_to(tmp_path / "gone")
    with pytest.raises(InputError, match=rf"^{re.escape(str(path))}: cannot be read \(No such file.*rerun the same"):
        read_copied(path)


# -- tied heads ---------------------------------------------------------------------------------


def tied_family(tmp_path: Path, name: str, *, heads: bool) -> tuple[Path, list[Path]]:
    """A tied base and two tied agents; with ``heads``, the base and agent 0 write their head out
    (equal to their embedding), as a plain ``state_dict`` save does."""
    fam = build_family(tmp_path / name, densities=(0.1, 0.4))
    change = head_is_embedding if heads else without_head
    rewrite(fam.base, change, tie=True)
    rewrite(fam.agents[0], change, tie=True)
    rewrite(fam.agents[1], without_head, tie=True)
    return fam.base, fam.agents


def weights(out: Path) -> dict[str, bytes]:
    return {name: raw.tobytes() for name, (_d, _s, raw) in read_model_dir(out).items()}


def tied_args(method: str) -> list[str]:
    """Options under which a method treats the head and the embedding apart, given equal inputs:
    DARE and DELLA draw their drops per tensor, a cut ranked over the whole model falls between
    equal magnitudes of the two, RAM weighs each tensor by its own overlap."""
    if method.startswith(("dare", "della")):
        return ["--density", "0.5"]
    if method in ("ties", "breadcrumbs", "breadcrumbs_ties"):
        return ["--density", "0.5", "--trim-scope", "model"]
    if method in SPHERICAL:
        return SPHERICAL[method]
    return ["--rho-scope", "tensor"] if method.startswith("ram") else []


# The required values of the spherical methods and nearswap (slerp and nearswap merge the base and
# one agent: agent 0 here).
SPHERICAL = {
    "slerp": ["--t", "0.3"],
    "nuslerp": ["--weights", "0.3,0.9"],
    "multislerp": ["--weights", "1"],
    "nearswap": ["--t", "0.005"],
}
ONE_AGENT = ("slerp", "nearswap", "arcee_fusion")


@pytest.mark.parametrize("method", method_names())
def test_a_tied_base_with_its_head_written_out_gives_a_tied_output_for_every_method(
    tmp_path: Path, method: str
) -> None:
    """Merged apart, the head came out different from the embedding (DARE, DELLA, breadcrumbs
    here) while config.json says they are tied. The head is dropped, as save_pretrained writes a
    tied model: the output is the merge of the family saved without heads."""
    args = ("--quiet", "--method", method, *tied_args(method))
    base, agents = tied_family(tmp_path, "with-heads", heads=True)
    count = 1 if method in ONE_AGENT else len(agents)
    got = weights(merge(tmp_path, base, *agents[:count], out="out", args=args))
    assert HEAD not in got and EMBED in got
    assert json.loads((tmp_path / "out" / "config.json").read_text())["tie_word_embeddings"] is True
    ref_base, ref_agents = tied_family(tmp_path, "without-heads", heads=False)
    assert got == weights(merge(tmp_path, ref_base, *ref_agents[:count], out="ref", args=args))


def test_a_tied_base_whose_own_head_differs_from_its_embedding_is_refused_by_name(tmp_path: Path) -> None:
    fam = build_family(tmp_path / "fam", densities=(0.1, 0.4))
    rewrite(fam.base, lambda t: t, tie=True)  # its own random head, though config.json ties it
    out = tmp_path / "out"
    done = in_process("merge", fam.base, *fam.agents, "--out", out, "--cache-dir", tmp_path / "cache")
    one_line_error(done, str(fam.base / "model.safetensors"), f"'{HEAD}' of the base", "first at element 0", "tie")
    assert not out.exists()


# -- the model card -----------------------------------------------------------------------------

NAMES = [
    "pipe|agent",
    "two\nlines",
    "back`tick``s *stars*_<b>tag&amp;",
    "emoji-\U0001f600-\U00010348 yaml: - 'quoted' \"# no comment\" [x] {y}",
    os.fsdecode(b"latin-\xe9"),  # not UTF-8: a name Python holds with a lone surrogate
]


def table_rows(card: str, heading: str) -> list[str]:
    section = card.split(f"## {heading}\n\n", 1)[1].split("\n\n", 1)[0]
    return section.splitlines()


def cells(row: str) -> int:
    """The cells of a GitHub table row: its unescaped pipes, less one."""
    return len(re.findall(r"(?<!\\)\|", row)) - 1


@pytest.mark.parametrize("method", ["ram+", "task_arithmetic"])  # with and without the overlap columns
def test_the_card_escapes_names_and_lists_only_hub_ids(tmp_path: Path, method: str) -> None:
    fam = build_family(tmp_path / "fam", densities=(0.1, 0.2, 0.3, 0.4, 0.5))
    hub_base = tmp_path / "hf" / "models--org--base" / "snapshots" / "0123abcd"  # a base read from a HF cache
    hub_base.parent.mkdir(parents=True)
    shutil.move(fam.base, hub_base)
    agents = [agent.rename(agent.parent / name) for agent, name in zip(fam.agents, NAMES, strict=True)]
    out = merge(tmp_path, hub_base, *agents, args=("--quiet", "--method", method))
    card = (out / "README.md").read_bytes().decode("utf-8")  # strict: what was written is UTF-8
    _, front, body = card.split("---\n", 2)
    header = yaml.safe_load(front)
    assert header["base_model"] == ["org/base"]  # the hub id; local directory names are not hub ids
    assert header["base_model_relation"] == "merge" and header["tags"] == ["merge", "ramstream"]
    rows = table_rows(body, "Agents")
    assert len(rows) == 2 + len(agents) and len({cells(r) for r in rows}) == 1
    assert "emoji-\U0001f600-\U00010348" in body and "pipe\\|agent" in body and "two\\nlines" in body
    assert "latin-\\xe9" in body and "back\\`tick\\`\\`s" in body
    for line in table_rows(body, "Inputs"):
        assert line.startswith("- ")  # one line each: no name broke out of its item


def test_a_card_of_local_checkpoints_names_no_base_model(tmp_path: Path) -> None:
    fam = build_family(tmp_path / "fam", densities=(0.1, 0.4))
    out = merge(tmp_path, fam.base, *fam.agents, args=("--quiet", "--method", "linear"))
    header = yaml.safe_load((out / "README.md").read_text().split("---\n")[1])
    assert "base_model" not in header and "base_model_relation" not in header
