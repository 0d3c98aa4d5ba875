"""Tied output heads: the base's ``config.json`` decides whether an agent's ``lm_head.weight``
is dropped (tied base, the head equal to the agent's embedding), refused (tied base, a head that
differs) or taken from the agent's embedding (untied base, an agent that says it is tied)."""

from __future__ import annotations

import json
from collections.abc import Callable
from pathlib import Path

import pytest

from tests.families import build_family, read_model_dir, read_safetensors, write_safetensors
from tests.test_cli import RUNNERS, in_process, ok, one_line_error

HEAD, EMBED = "lm_head.weight", "model.embed_tokens.weight"
Tensors = dict[str, tuple[str, tuple[int, ...], object]]


def rewrite(directory: Path, change: Callable[[Tensors], Tensors], tie: bool | None) -> Path:
    """Rewrite a model directory's tensors with ``change`` and set ``tie_word_embeddings`` (None: absent)."""
    path = directory / "model.safetensors"
    write_safetensors(path, change(read_safetensors(path)))  # type: ignore[arg-type]
    config = json.loads((directory / "config.json").read_text())
    config.pop("tie_word_embeddings", None)
    config.update({} if tie is None else {"tie_word_embeddings": tie})
    (directory / "config.json").write_text(json.dumps(config))
    return directory


def without_head(tensors: Tensors) -> Tensors:
    return {k: v for k, v in tensors.items() if k != HEAD}


def head_is_embedding(tensors: Tensors) -> Tensors:
    return {**tensors, HEAD: tensors[EMBED]}


def weights(out: Path) -> dict[str, bytes]:
    return {name: raw.tobytes() for name, (_d, _s, raw) in read_model_dir(out).items()}


def merge(tmp_path: Path, base: Path, *agents: Path, out: str) -> Path:
    opts = ["--cache-dir", tmp_path / "cache", "--quiet"]
    ok(in_process("merge", base, *agents, "--out", tmp_path / out, *opts))
    return tmp_path / out


def copy_family(tmp_path: Path, name: str) -> tuple[Path, list[Path]]:
    fam = build_family(tmp_path / name, densities=(0.1, 0.4))
    return fam.base, fam.agents


def test_a_tied_base_ignores_an_agent_head_equal_to_its_embedding(tmp_path: Path) -> None:
    base, agents = copy_family(tmp_path, "tied")
    rewrite(base, without_head, tie=True)
    rewrite(agents[0], head_is_embedding, tie=True)  # saved with its tied head written out
    rewrite(agents[1], without_head, tie=True)
    got = weights(merge(tmp_path, base, *agents, out="out"))
    ref_base, ref_agents = copy_family(tmp_path, "reference")
    for directory in (ref_base, *ref_agents):
        rewrite(directory, without_head, tie=True)
    assert HEAD not in got and got == weights(merge(tmp_path, ref_base, *ref_agents, out="ref"))


@pytest.mark.parametrize("runner", list(RUNNERS))
def test_a_tied_base_refuses_an_agent_head_that_differs_by_name(tmp_path: Path, runner: str) -> None:
    base, agents = copy_family(tmp_path, "tied")
    rewrite(base, without_head, tie=True)  # agent 1 keeps its own, different, head
    out = tmp_path / "out"
    outcome = RUNNERS[runner]("merge", base, *agents, "--out", out, "--cache-dir", tmp_path / "cache")
    one_line_error(outcome, str(agents[0] / "model.safetensors"), f"'{HEAD}'", "differs from its embedding", "ties")
    assert not out.exists()


def test_a_base_that_does_not_say_it_is_tied_refuses_the_extra_head_as_before(tmp_path: Path) -> None:
    base, agents = copy_family(tmp_path, "untold")
    rewrite(base, without_head, tie=None)
    one_line_error(in_process("merge", base, *agents, "--out", tmp_path / "out"), f"'{HEAD}'", "not in the base")


def test_an_untied_base_takes_a_tied_agent_embedding_as_its_head(tmp_path: Path) -> None:
    base, agents = copy_family(tmp_path, "untied")
    rewrite(base, lambda t: t, tie=False)
    rewrite(agents[1], without_head, tie=True)
    got = weights(merge(tmp_path, base, *agents, out="out"))
    ref_base, ref_agents = copy_family(tmp_path, "reference")
    rewrite(ref_agents[1], head_is_embedding, tie=True)  # the head written out, as the agent means it
    assert HEAD in got and got == weights(merge(tmp_path, ref_base, *ref_agents, out="ref"))


def test_an_agent_without_a_head_that_does_not_say_it_is_tied_is_refused_as_before(tmp_path: Path) -> None:
    base, agents = copy_family(tmp_path, "missing")
    rewrite(agents[0], without_head, tie=None)
    one_line_error(in_process("merge", base, *agents, "--out", tmp_path / "out"), f"'{HEAD}'", "missing from agent")
