"""Messages that mislead (issue 21, class 7): a task vector that overflows float32 named as such
(not as NaN/Inf weights), advice that never names the value the user already gave, and a head
equal in value to its embedding in another dtype taken as the same head."""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pytest

from ramstream.output import directory as output_dir
from tests.families import bf16_to_f32, build_family, read_model_dir, write_safetensors
from tests.test_cli import Outcome, in_process, ok, one_line_error
from tests.test_hub import offline
from tests.test_tied_heads import EMBED, HEAD, rewrite, without_head

Tensors = dict[str, tuple[str, tuple[int, ...], np.ndarray]]


def f32_family(root: Path, base: np.ndarray, *agents: np.ndarray) -> list[Path]:
    """A base and agents of one float32 tensor ``w`` (8, 8), with a config.json and a tokenizer each."""
    paths = [root / "base", *(root / f"agent{t}" for t in range(len(agents)))]
    for path, values in zip(paths, [base, *agents], strict=True):
        path.mkdir(parents=True)
        write_safetensors(path / "model.safetensors", {"w": ("F32", (8, 8), values.astype(np.float32))})
        (path / "config.json").write_text("{}")
        (path / "tokenizer.json").write_text("{}")
    return paths


def merged(paths: list[Path], out: Path, *args: str) -> Outcome:
    return in_process("merge", *paths, "--out", out, "--cache-dir", out.parent / "cache", "--quiet", *args)


# -- a task vector that overflows float32 -------------------------------------------------------


def overflowing_family(root: Path) -> list[Path]:
    """Finite weights everywhere; at element 19 ([2, 3]) agent 0 minus the base is 6e38 > float32's 3.4e38."""
    rng = np.random.default_rng(3)
    base = rng.standard_normal(64).astype(np.float32)
    agents = [base + rng.standard_normal(64).astype(np.float32) * (rng.random(64) < 0.5) for _ in range(2)]
    base[19], agents[0][19], agents[1][19] = -3e38, 3e38, -3e38
    return f32_family(root, base, *agents)


@pytest.mark.parametrize(
    "method",
    [
        "task_arithmetic",  # found in the merged block (its output would be Inf)
        "dare_linear",  # in the exact L1 sums of the rescale
        "model_stock",  # in the Gram sums
        "ties",  # in the |tau| histogram
        "della",
    ],
)
def test_a_task_vector_that_overflows_float32_is_named_as_such(tmp_path: Path, method: str) -> None:
    paths = overflowing_family(tmp_path / "fam")
    out = tmp_path / "out"
    line = one_line_error(
        merged(paths, out, "--method", method),
        str(paths[1] / "model.safetensors"),
        "'w' of agent0 at index [2, 3]",
        "task vector overflows float32",
        "3e+38 minus the base's -3e+38",
        "both weights are finite",
    )
    assert "NaN/Inf weights" not in line
    assert not (out / "config.json").exists() and not (out / "ramstream_merge.json").exists()


def test_linear_which_merges_no_task_vector_is_not_refused_for_one(tmp_path: Path) -> None:
    paths = overflowing_family(tmp_path / "fam")
    ok(merged(paths, tmp_path / "out", "--method", "linear"))
    assert read_model_dir(tmp_path / "out")["w"][2][19] == np.float32(0.0)  # the mean of 3e38 and -3e38


@pytest.mark.parametrize("method", ["ties", "breadcrumbs", "della"])
def test_a_nan_weight_under_a_ranking_method_is_named_by_file_tensor_and_index(tmp_path: Path, method: str) -> None:
    """Ranking methods found it in their |tau| histogram and named only 'agent 0' (counted from 0)."""
    base = np.linspace(-1, 1, 64, dtype=np.float32)
    agent = base + np.float32(0.25)
    agent[45] = np.nan
    paths = f32_family(tmp_path / "fam", base, base * 2, agent)
    line = one_line_error(merged(paths, tmp_path / "out", "--method", method))
    assert f"{paths[2] / 'model.safetensors'}: tensor 'w' of agent1 holds nan at index [5, 5]" in line


# -- advice that names what the user already gave -----------------------------------------------


def test_an_output_dtype_too_narrow_is_never_advised_back(tmp_path: Path) -> None:
    """Finite in float32 (3.398e38), Inf once rounded to bf16 (largest 3.3895e38): bf16 was the
    user's choice, so only f32 is advised."""
    base = np.full(64, 3.0e38, np.float32)
    agent = base.copy()
    agent[7] = 3.398e38
    paths = f32_family(tmp_path / "fam", base, agent, base)
    done = merged(paths, tmp_path / "out", "--method", "task_arithmetic", "--out-dtype", "bf16")
    line = one_line_error(done, "beyond the range of bf16", "write --out-dtype f32,")
    assert "(or bf16" not in line
    ok(merged(paths, tmp_path / "f32", "--method", "task_arithmetic", "--out-dtype", "f32"))


def test_a_budget_given_in_fractions_of_a_mib_is_not_shown_as_the_suggestion(tmp_path: Path) -> None:
    """DELLA's rows of 550000 elements need 20.98 MiB (inputs, masks and the output's three
    staging slots); --memory 20.5MiB is shown as given, not rounded up to the 21MiB advised."""
    rows = np.zeros((2, 550_000), np.uint16)
    paths = [tmp_path / name for name in ("base", "a0", "a1")]
    for k, path in enumerate(paths):
        path.mkdir()
        write_safetensors(path / "model.safetensors", {"w": ("BF16", rows.shape, rows + k)})
    out = tmp_path / "out"
    done = in_process("merge", *paths, "--out", out, "--method", "della", "--memory", "20.5MiB")
    line = one_line_error(done, "'w'", "rows of 550000 elements")
    assert "more than --memory 20.5MiB; pass --memory 21MiB or more" in line


def test_a_cache_given_with_hf_cache_is_not_advised_again(tmp_path: Path) -> None:
    args = ["probe", "org/base", "org/agent0", "--cache-dir", tmp_path / "cache", "--quiet"]
    without = offline(*args, hf_home=tmp_path / "home")
    one_line_error(without, "not in the Hugging Face cache", "pass --hf-cache DIR")
    given = offline(*args, "--hf-cache", tmp_path / "mine", hf_home=tmp_path / "home")
    line = one_line_error(given, f"not in the Hugging Face cache {tmp_path / 'mine'}", "check --hf-cache")
    assert "pass --hf-cache" not in line


def test_status_does_not_advise_the_index_it_was_given(tmp_path: Path) -> None:
    out = tmp_path / "merged"
    output_dir.prepare(out, {"inputs": "some-key", "method": "ram+"}, force=False)  # an unfinished merge
    plain = ok(in_process("status", out, "--json"))
    assert any("pass --index PATH" in n for n in json.loads(plain.out)["notes"])
    given = ok(in_process("status", out, "--index", tmp_path / "nothing", "--json"))
    notes = json.loads(given.out)["notes"]
    assert notes == [f"{tmp_path / 'nothing'}, given as --index, is not an index (it has no zarr.json)"]


# -- a head equal in value to its embedding, in another dtype -----------------------------------


def head_in_f32(change: float = 0.0, at: int = 0) -> object:
    """A tensors rewrite: the head as float32 values of the bf16 embedding (one changed by ``change``)."""

    def rewrite_head(tensors: Tensors) -> Tensors:
        _dtype, shape, raw = tensors[EMBED]
        values = bf16_to_f32(raw).copy()
        values[at] += np.float32(change)
        return {**tensors, HEAD: ("F32", shape, values)}

    return rewrite_head


def test_a_head_equal_in_value_to_its_embedding_in_another_dtype_is_the_same_head(tmp_path: Path) -> None:
    fam = build_family(tmp_path / "fam", densities=(0.1, 0.4))
    rewrite(fam.base, without_head, tie=True)
    rewrite(fam.agents[0], head_in_f32(), tie=True)  # type: ignore[arg-type]
    rewrite(fam.agents[1], without_head, tie=True)
    ok(merged([fam.base, *fam.agents], tmp_path / "out"))
    ref = build_family(tmp_path / "ref", densities=(0.1, 0.4))
    for path in (ref.base, *ref.agents):
        rewrite(path, without_head, tie=True)
    ok(merged([ref.base, *ref.agents], tmp_path / "ref-out"))
    got, want = read_model_dir(tmp_path / "out"), read_model_dir(tmp_path / "ref-out")
    assert HEAD not in got and {k: v[2].tobytes() for k, v in got.items()} == {
        k: v[2].tobytes() for k, v in want.items()
    }


def test_a_head_that_differs_in_another_dtype_says_where_and_in_which_dtypes(tmp_path: Path) -> None:
    fam = build_family(tmp_path / "fam", densities=(0.1, 0.4))
    rewrite(fam.base, without_head, tie=True)
    rewrite(fam.agents[0], head_in_f32(change=0.5, at=100), tie=True)  # type: ignore[arg-type]
    done = in_process("merge", fam.base, *fam.agents, "--out", tmp_path / "out", "--cache-dir", tmp_path / "cache")
    one_line_error(
        done,
        str(fam.agents[0] / "model.safetensors"),
        f"'{HEAD}' of agent agent0 differs from its embedding",
        "first at element 100",
        "stored as F32 against BF16",
    )
