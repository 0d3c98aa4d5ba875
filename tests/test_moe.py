"""Mixture-of-experts checkpoints: thousands of small per-expert tensors, at the cost of their bytes.

A batch of blocks spans many tensors, so every method must write the same bytes whatever the
budget cuts the batches into (blocks of 64 elements to one batch for the whole model), the
thread count and the backend; a batch's index chunks and journal marks stand for all its blocks,
so a kill mid-pass resumes to the same bytes; the index of a 2000-tensor family is a few files;
an index or merge journal of the per-block format is refused or started over, never misread.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import numpy as np
import pytest
import zarr
from click.testing import CliRunner

from ramstream.api import probe
from ramstream.cli import main
from ramstream.config import RunOptions
from ramstream.index.store import ATTR, open_index_store
from ramstream.io.writer import ShardWriter
from ramstream.output.shards import plan_shards
from tests.checks import Interrupted, interrupted_after
from tests.families import Family, build_family, decode, encode, read_model_dir, write_safetensors
from tests.reference import reference_merge
from tests.test_backends import METHODS, _merge
from tests.test_resume import cli, killed_then_rerun, renamed_to, run_ok


def moe_shapes(layers: int, experts: int, rows: int = 8, hidden: int = 16) -> dict[str, tuple[int, ...]]:
    """Qwen3-MoE names: a router and ``experts`` x (gate, up, down) projections per layer."""
    shapes: dict[str, tuple[int, ...]] = {"model.embed_tokens.weight": (64, hidden)}
    for layer in range(layers):
        p = f"model.layers.{layer}."
        shapes[p + "input_layernorm.weight"] = (hidden,)
        shapes[p + "self_attn.q_proj.weight"] = (hidden, hidden)
        shapes[p + "mlp.gate.weight"] = (experts, hidden)
        for e in range(experts):
            shapes[p + f"mlp.experts.{e}.gate_proj.weight"] = (rows, hidden)
            shapes[p + f"mlp.experts.{e}.up_proj.weight"] = (rows, hidden)
            shapes[p + f"mlp.experts.{e}.down_proj.weight"] = (hidden, rows)
    shapes["model.norm.weight"] = (hidden,)
    shapes["lm_head.weight"] = (64, hidden)
    return shapes


@pytest.fixture(scope="module")
def moe(tmp_path_factory: pytest.TempPathFactory) -> Family:
    """2 layers x 16 experts (105 tensors of 16 to 1024 elements), in 2 shards; an agent equal
    to the base (c = 0 only) and one with no unique element, so c = 0, 1 and >= 2 all occur."""
    root = tmp_path_factory.mktemp("moe")
    return build_family(
        root, shapes=moe_shapes(2, 16), shards=2, identical_agent=True, subset_agent=True, int_tensor=True, seed=11
    )


@pytest.mark.slow  # 15 methods x 3 merges: in `make test`, not in the lowest-versions run
@pytest.mark.parametrize(("method", "given"), METHODS, ids=[f"{m}-{i}" for i, (m, _) in enumerate(METHODS)])
def test_every_method_writes_the_same_bytes_whatever_the_batches(
    moe: Family, tmp_path: Path, method: str, given: dict[str, Any]
) -> None:
    """Blocks of 320 elements (a batch of two 128-element experts; the embedding, the router
    and the head cut across blocks) or of 65536 (one batch for the whole model), one thread or
    all, Numba or torch: one set of bytes."""
    expected = _merge(moe, tmp_path / "a" / "out", method, given, block_elems=320, threads=1)
    assert _merge(moe, tmp_path / "b" / "out", method, given, block_elems=1 << 16) == expected
    if method in ("ram+", "ties", "della", "dare_ties", "model_stock"):
        pytest.importorskip("torch")
        assert (
            _merge(moe, tmp_path / "c" / "out", method, given, backend="torch", device="cpu", block_elems=512)
            == expected
        )


def test_ram_plus_on_experts_matches_the_dense_reference(moe: Family, tmp_path: Path) -> None:
    out = tmp_path / "out"
    _merge(moe, out, "ram+", {}, block_elems=1 << 16)
    expected = reference_merge(moe)
    got = read_model_dir(out)
    assert set(got) == set(expected)
    for name, (dtype, shape, raw) in expected.items():
        assert got[name][0] == dtype and got[name][1] == shape, name
        np.testing.assert_array_equal(got[name][2], raw, err_msg=name)


def test_a_batch_packs_many_expert_tensors(moe: Family, tmp_path: Path) -> None:
    """The probe of 105 tensors under 65536-element blocks is one batch: one chunk per array."""
    index = tmp_path / "index.zarr"
    probe(moe.base, [str(a) for a in moe.agents], index=index, options=_options(tmp_path, 1 << 16))
    store = open_index_store(index, read_only=True)
    assert len(store.plan.blocks) > 100 and len(store.plan.batches) == 1
    assert store.done().tolist() == [True]


def test_the_index_of_a_2000_tensor_family_is_a_few_files(tmp_path: Path) -> None:
    family = build_family(tmp_path / "fam", shapes=moe_shapes(4, 166, rows=4, hidden=8), densities=(0.05, 0.3))
    assert len(family.shapes) >= 2000
    index = tmp_path / "index.zarr"
    probe(family.base, [str(a) for a in family.agents], index=index, options=_options(tmp_path, 1 << 14))
    store = open_index_store(index, read_only=True)
    files = [p for p in index.rglob("*") if p.is_file()]
    # ~2000 tensors of 32 to 1328 elements are ~96 k elements: 6 batches of 16384; three chunk
    # files per batch (masks, counts, journal) and a dozen for the metadata.
    assert len(store.plan.batches) <= 8
    assert len(files) <= 3 * len(store.plan.batches) + 16, sorted(str(p.relative_to(index)) for p in files)


def test_an_index_of_the_per_block_format_is_refused_in_one_line(moe: Family, tmp_path: Path) -> None:
    index = tmp_path / "index.zarr"
    probe(moe.base, [str(a) for a in moe.agents], index=index, options=_options(tmp_path, 1 << 12))
    group = zarr.open_group(str(index), mode="r+", zarr_format=3)
    header = dict(group.attrs[ATTR])  # type: ignore[arg-type]
    header["schema_version"] = 2
    group.attrs[ATTR] = header
    for command in (["inspect", str(index)], ["status", str(index)]):
        result = CliRunner().invoke(main, command)
        assert result.exit_code != 0
        assert "index schema version 2, this ramstream reads 3; delete it and probe again" in result.stderr
        assert "Traceback" not in result.output + result.stderr and len(result.stderr.strip().splitlines()) == 1


def test_a_merge_journal_of_the_per_block_format_is_started_over(moe: Family, tmp_path: Path) -> None:
    """A journal whose marks stood for blocks (no ``units`` attribute) is never read as batches:
    an interrupted merge's journal, rewritten as such a journal with every mark set, is redone."""
    expected = _merge(moe, tmp_path / "a" / "out", "task_arithmetic", {"lambda": 0.7})
    out = tmp_path / "b" / "out"
    with interrupted_after(1), pytest.raises(Interrupted):
        _merge(moe, out, "task_arithmetic", {"lambda": 0.7})
    group = zarr.open_group(str(out / ".ramstream" / "journal"), mode="r+", zarr_format=3)
    del group.attrs["units"]
    group["merge"][...] = 1  # type: ignore[index]
    assert _merge(moe, out, "task_arithmetic", {"lambda": 0.7}) == expected


def test_inspect_groups_the_experts_of_a_layer_as_one_module(moe: Family, tmp_path: Path) -> None:
    index = tmp_path / "index.zarr"
    probe(moe.base, [str(a) for a in moe.agents], index=index, options=_options(tmp_path, 1 << 12))
    result = CliRunner().invoke(main, ["inspect", str(index), "--by", "module", "--json"])
    assert result.exit_code == 0, result.output
    modules = [row["key"] for row in json.loads(result.stdout)["modules"]]
    assert {"mlp.experts.*.gate_proj", "mlp.experts.*.up_proj", "mlp.experts.*.down_proj", "mlp.gate"} <= set(modules)
    assert not any("experts.0" in m for m in modules)
    by_tensor = CliRunner().invoke(main, ["inspect", str(index), "--by", "tensor", "--json"])
    assert by_tensor.exit_code == 0, by_tensor.output
    assert len(json.loads(by_tensor.stdout)["tensors"]) == len(moe.shapes)


@pytest.fixture(scope="module")
def moe_large(tmp_path_factory: pytest.TempPathFactory) -> Family:
    """~1.2 M elements per checkpoint in 2 x 64 x 3 expert tensors: under --memory 16MiB
    (blocks of 262144 elements) five batches, each of a hundred tensors or so."""
    root = tmp_path_factory.mktemp("moe-large")
    return build_family(root, shapes=moe_shapes(2, 64, rows=48, hidden=64), densities=(0.05, 0.3, 0.4), seed=3)


# Kills in each pass: the probe (RAM+), a statistics pass (TIES's |tau| histograms, stored in
# units of about 40 blocks) and the merge pass, each at its third journal mark.
KILLS = {
    "probe": ("ram+", "progress/probe/c.2"),
    "statistics": ("ties", "progress/abs_hi16_v1/c.2"),
    "merge": ("ties", "journal/merge/c.2"),
}


def _cli_flags(method: str) -> list[str]:
    given = ["--method", method, *(["--density", "0.3"] if method == "ties" else [])]
    return [*given, "--memory", "16MiB", "--quiet"]


@pytest.fixture(scope="module")
def uninterrupted(moe_large: Family, tmp_path_factory: pytest.TempPathFactory) -> dict[str, bytes]:
    """Each method's output of an uninterrupted CLI merge (TIES's serves two kill cases)."""
    members = [moe_large.base, *moe_large.agents]
    outputs = {}
    for method in sorted({method for method, _ in KILLS.values()}):
        root = tmp_path_factory.mktemp(f"reference-{method}")
        run_ok(cli("merge", *members, "--out", root / "out", *_cli_flags(method), "--cache-dir", root / "cache"))
        outputs[method] = (root / "out" / "model.safetensors").read_bytes()
    return outputs


@pytest.mark.slow  # a CLI process per case, and the uninterrupted merges
@pytest.mark.parametrize("where", list(KILLS))
def test_killed_mid_pass_the_rerun_gives_the_same_bytes(
    moe_large: Family, uninterrupted: dict[str, bytes], tmp_path: Path, where: str
) -> None:
    method, step = KILLS[where]
    members = [moe_large.base, *moe_large.agents]
    out = tmp_path / "out"
    args: list[str | Path] = ["merge", *members, "--out", out, *_cli_flags(method), "--cache-dir", tmp_path / "cache"]
    assert killed_then_rerun(args, renamed_to(step), out) == uninterrupted[method]


def _options(tmp_path: Path, block_elems: int) -> RunOptions:
    return RunOptions(cache_dir=tmp_path / "cache", quiet=True, block_elems=block_elems)


def test_a_tensor_at_a_misaligned_output_offset_is_staged_aligned_and_merged_right(tmp_path: Path) -> None:
    """Output tensors lie back to back: after 3 bf16 and 3 u8 values an f32 tensor starts at an
    odd offset. Its block gets a run of its own, staged at an aligned address (written through
    the page cache), and the merge still gives the reference bytes."""
    layout = plan_shards([("a", "BF16", (3,), 6), ("ids", "U8", (3,), 3), ("w", "F32", (40,), 160)], 1 << 40)
    (tmp_path / "shards").mkdir()
    writer = ShardWriter(layout, tmp_path / "shards")
    try:
        run = writer.run_of("w", 0, 160, itemsize=4)
        assert run.offset % 4 and not run.congruent
        (aside,) = writer.staging_runs(0, [run])
        assert aside.ctypes.data % 4096 == 0
        as_bytes = writer.run_of("w", 0, 160)
        assert as_bytes.congruent
        (congruent,) = writer.staging_runs(0, [as_bytes])
        assert congruent.ctypes.data % 4096 == run.offset % 4096
    finally:
        writer.close()

    rng = np.random.default_rng(2)
    fam = Family(tmp_path / "base", [tmp_path / "agent0", tmp_path / "agent1"])
    ids = np.array([7, 8, 9], np.uint8)
    fam.copied["ids"] = ("U8", ids)
    base = {"a": rng.standard_normal(3).astype(np.float32), "w": rng.standard_normal(40).astype(np.float32)}
    fam.base_values = {"a": decode(encode(base["a"], "BF16"), "BF16"), "w": base["w"]}
    fam.dtypes, fam.shapes = {"a": "BF16", "w": "F32"}, {"a": (3,), "w": (40,)}
    for path in (fam.base, *fam.agents):
        values = dict(fam.base_values)
        if path != fam.base:
            values = {n: v + (rng.random(v.size) < 0.5) * np.float32(0.01) for n, v in values.items()}
            values["a"] = decode(encode(values["a"], "BF16"), "BF16")
            fam.agent_values.append({n: v.astype(np.float32) for n, v in values.items()})
        path.mkdir()
        (path / "config.json").write_text("{}")
        write_safetensors(
            path / "model.safetensors",
            {
                "a": ("BF16", (3,), encode(values["a"], "BF16")),
                "ids": ("U8", (3,), ids),
                "w": ("F32", (40,), values["w"]),
            },
        )
    out = tmp_path / "out"
    _merge(fam, out, "ram+", {}, block_elems=1 << 16)
    got, expected = read_model_dir(out), reference_merge(fam)
    for name, (dtype, shape, raw) in expected.items():
        assert got[name][:2] == (dtype, shape), name
        np.testing.assert_array_equal(got[name][2], raw, err_msg=name)
