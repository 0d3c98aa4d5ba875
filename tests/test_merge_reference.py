"""End to end: ramstream's merged output is bit-identical to the naive dense reference.

Every family is real safetensors files on disk; the output is read back with the test-side
reader (tests/families.py), never with ramstream's own I/O.
"""

from __future__ import annotations

import json
import os
import struct
import subprocess
import sys
from collections.abc import Callable
from pathlib import Path
from typing import Any

import numpy as np
import pytest
import yaml

from ramstream.api import MergeResult, merge, probe
from ramstream.config import RunOptions
from ramstream.errors import ConfigError
from ramstream.methods.report import agent_reports
from ramstream.statistics.overlap import per_tensor
from tests import reference as ref
from tests.checks import assert_bit_identical
from tests.families import (
    DEFAULT_SHAPES,
    Family,
    build_family,
    decode,
    encode,
    read_model_dir,
    read_safetensors,
    write_safetensors,
)

# The default shapes plus odd sizes (not a multiple of 8, so masks end mid-byte), a scalar and
# an empty tensor. The embedding (2304 elements) spans more than one 2048-element kernel tile.
SHAPES: dict[str, tuple[int, ...]] = {
    **DEFAULT_SHAPES,
    "model.layers.0.self_attn.q_proj.bias": (37,),
    "model.layers.1.mlp.gate_proj.weight": (7, 13),
    "model.layers.1.scale": (),
    "model.layers.1.empty": (0, 4),
}

FAMILIES: dict[str, dict[str, object]] = {
    # 5 agents: three sparse ones, one with no unique element, one identical to the base.
    "bf16": {"subset_agent": True, "identical_agent": True, "int_tensor": True, "shards": 3, "shapes": SHAPES},
    "f16-single-file": {"dtype": "F16", "single_file": True, "seed": 1},
    "f32": {"dtype": "F32", "identical_agent": True, "int_tensor": True, "shapes": SHAPES, "seed": 2},
    # one f32 agent among bf16 ones: agents in different carriers (decoded to f32 first)
    "mixed-f32-agent": {"agent_dtypes": ("BF16", "F32", "BF16"), "shards": 2, "seed": 3},
    # bf16 and f16 agents: same uint16 carrier, different codes per agent inside the kernel
    "mixed-f16-agent": {"agent_dtypes": ("F16", "BF16", "BF16"), "seed": 4},
    # f32 base, bf16 agents: the rounding of every agent makes the task vectors dense
    "f32-base-bf16-agents": {"dtype": "F32", "agent_dtypes": ("BF16", "BF16", "BF16"), "seed": 5},
    # bf16 base, f32 agents: base and agents in different carriers
    "bf16-base-f32-agents": {"agent_dtypes": ("F32", "F32", "F32"), "seed": 9},
    # headers whose length is odd, so the data is not aligned for its dtype (rewritten below)
    "unaligned": {"dtype": "F32", "agent_dtypes": ("F32", "F16", "F32"), "int_tensor": True, "seed": 8},
}


# Families whose base mixes dtypes per tensor (build_family gives every base tensor one dtype).
MIXED_BASE: dict[str, tuple[str, tuple[int, ...]]] = {
    "model.embed_tokens.weight": ("BF16", (96, 24)),
    "model.layers.0.mlp.down_proj.weight": ("BF16", (24, 40)),
    "model.layers.0.input_layernorm.weight": ("F32", (24,)),
    "model.norm.weight": ("F32", (37,)),
}
F64_BASE: dict[str, tuple[str, tuple[int, ...]]] = {
    "model.layers.0.self_attn.q_proj.weight": ("F64", (24, 24)),
    "model.norm.weight": ("F64", (37,)),
}


def build_typed_family(root: Path, specs: dict[str, tuple[str, tuple[int, ...]]], seed: int) -> Family:
    """A base with its own dtype per tensor and three sparse agents in the same dtypes.

    Values are drawn in float64, so F64 tensors hold values that float32 cannot represent.
    """
    rng = np.random.default_rng(seed)
    fam = Family(root / "base", [root / f"agent{t}" for t in range(3)])
    fam.agent_values = [{} for _ in range(3)]
    base_raw, agent_raw = {}, [{} for _ in range(3)]

    def store(values: np.ndarray, dtype: str) -> np.ndarray:
        return values.astype(np.float64) if dtype == "F64" else encode(values.astype(np.float32), dtype)

    for name, (dtype, shape) in specs.items():
        numel = int(np.prod(shape))
        base = rng.standard_normal(numel) * 0.05
        base_raw[name] = (dtype, shape, store(base, dtype))
        fam.base_values[name], fam.dtypes[name], fam.shapes[name] = decode(store(base, dtype), dtype), dtype, shape
        for t, density in enumerate((0.1, 0.4, 0.6)):
            values = np.where(rng.random(numel) < density, base + rng.standard_normal(numel) * 0.01, base)
            agent_raw[t][name] = (dtype, shape, store(values, dtype))
            fam.agent_values[t][name] = decode(store(values, dtype), dtype)
    for path, tensors in zip([fam.base, *fam.agents], [base_raw, *agent_raw], strict=True):
        path.mkdir(parents=True)
        write_safetensors(path / "model.safetensors", tensors)
        (path / "config.json").write_text(json.dumps({"model_type": "qwen2", "torch_dtype": "bfloat16"}))
    return fam


def misalign(path: Path) -> None:
    """Rewrite the header of ``path`` with trailing spaces that make its length odd."""
    data = path.read_bytes()
    (n,) = struct.unpack("<Q", data[:8])
    text = data[8 : 8 + n].rstrip() + b" " * 3
    text += b" " * (1 - len(text) % 2)
    path.write_bytes(struct.pack("<Q", len(text)) + text + data[8 + n :])


@pytest.fixture(scope="module")
def family_of(tmp_path_factory: pytest.TempPathFactory) -> Callable[[str], Family]:
    built: dict[str, Family] = {}

    def get(name: str) -> Family:
        if name not in built:
            root = tmp_path_factory.mktemp(name)
            if name == "mixed-base":
                built[name] = build_typed_family(root, MIXED_BASE, seed=6)
            elif name == "f64":
                built[name] = build_typed_family(root, F64_BASE, seed=7)
            else:
                built[name] = build_family(root, **FAMILIES[name])  # type: ignore[arg-type]
            if name == "unaligned":
                for path in root.rglob("*.safetensors"):
                    misalign(path)
        return built[name]

    return get


def _options(family: Family, block_elems: int = 128) -> RunOptions:
    return RunOptions(cache_dir=family.base.parent / "cache", quiet=True, block_elems=block_elems)


def _merge(family: Family, out: Path, block_elems: int = 128, **kwargs: Any) -> MergeResult:
    return merge(family.base, [str(a) for a in family.agents], out=out, options=_options(family, block_elems), **kwargs)


# -- the families themselves -------------------------------------------------------------------


def test_main_family_covers_every_case(family_of: Callable[[str], Family]) -> None:
    fam = family_of("bf16")
    model = ref.model_counts(fam, 1e-5)
    assert model.coverage[0] > 0 and model.coverage[1] > 0 and model.coverage[2:].sum() > 0
    subset, identical = 3, 4
    assert model.unique[subset] == 0 < model.shared[subset]
    assert model.active[identical] == 0
    # the paper and script rules differ (some rho above 1), and alpha clips (some rho above 2)
    rho = ref.rho(model)
    assert np.isfinite(rho[:3]).all() and (rho[:3] > 2).any() and ((rho[:3] > 1) & (rho[:3] < 2)).any()
    assert not np.array_equal(ref.lambdas(model, "ram+", "paper"), ref.lambdas(model, "ram+", "script"))
    # and lambda visibly changes outputs: ram and ram+ differ
    a, b = ref.reference_merge(fam, method="ram"), ref.reference_merge(fam, method="ram+")
    assert any(a[n][2].tobytes() != b[n][2].tobytes() for n in a)
    # per-tensor rho differs from the model's
    per = ref.tensor_counts(fam, 1e-5)
    assert any(not np.array_equal(ref.rho(c), rho) for c in per.values())


# -- bit-identical to the reference --------------------------------------------------------


@pytest.mark.parametrize(
    ("method", "rho_scope", "lambda_rule", "block_elems"),
    [
        ("ram", "model", "paper", 128),
        ("ram", "tensor", "paper", 192),
        ("ram+", "model", "paper", 128),
        ("ram+", "model", "script", 192),
        ("ram+", "tensor", "paper", 192),
        ("ram+", "tensor", "script", 128),
        ("ram+s", "model", "paper", 128),
        ("ram+s", "tensor", "paper", 192),
    ],
)
def test_methods_match_reference(
    family_of: Callable[[str], Family], tmp_path: Path, method: str, rho_scope: str, lambda_rule: str, block_elems: int
) -> None:
    fam = family_of("bf16")
    result = _merge(fam, tmp_path / "out", block_elems, method=method, rho_scope=rho_scope, lambda_rule=lambda_rule)
    expected = ref.reference_merge(fam, method=method, rho_scope=rho_scope, lambda_rule=lambda_rule)
    assert_bit_identical(tmp_path / "out", expected)
    model_lambdas = ref.lambdas(ref.model_counts(fam, 1e-5), method, lambda_rule)
    np.testing.assert_allclose(result.lambdas, model_lambdas, rtol=1e-15)


@pytest.mark.parametrize("out_dtype", ["bf16", "f16", "f32", "auto"])
def test_out_dtypes_match_reference(family_of: Callable[[str], Family], tmp_path: Path, out_dtype: str) -> None:
    fam = family_of("bf16")
    _merge(fam, tmp_path / "out", out_dtype=out_dtype)
    assert_bit_identical(tmp_path / "out", ref.reference_merge(fam, out_dtype=out_dtype))
    config = json.loads((tmp_path / "out" / "config.json").read_text())
    torch_name = {"bf16": "bfloat16", "f16": "float16", "f32": "float32", "auto": "bfloat16"}[out_dtype]
    assert config["torch_dtype"] == torch_name
    assert config["model_type"] == "qwen2"


@pytest.mark.parametrize(
    ("family", "method", "rho_scope", "out_dtype"),
    [
        ("f16-single-file", "ram+", "model", "auto"),
        ("f16-single-file", "ram+s", "tensor", "bf16"),
        ("f32", "ram+", "model", "auto"),
        ("f32", "ram+", "tensor", "bf16"),
        ("mixed-f32-agent", "ram+", "model", "auto"),
        ("mixed-f32-agent", "ram+s", "model", "f32"),
        ("mixed-f16-agent", "ram+", "tensor", "auto"),
        ("mixed-f16-agent", "ram", "model", "f16"),
        ("f32-base-bf16-agents", "ram+", "model", "auto"),
        ("bf16-base-f32-agents", "ram+", "model", "auto"),
        ("unaligned", "ram+", "model", "auto"),
        ("unaligned", "ram", "tensor", "bf16"),
        ("mixed-base", "ram+", "model", "auto"),
        ("mixed-base", "ram+", "tensor", "f16"),
        ("f64", "ram+", "model", "auto"),
        ("f64", "ram+s", "model", "bf16"),
    ],
)
def test_families_match_reference(
    family_of: Callable[[str], Family], tmp_path: Path, family: str, method: str, rho_scope: str, out_dtype: str
) -> None:
    fam = family_of(family)
    _merge(fam, tmp_path / "out", method=method, rho_scope=rho_scope, out_dtype=out_dtype)
    expected = ref.reference_merge(fam, method=method, rho_scope=rho_scope, out_dtype=out_dtype)
    assert_bit_identical(tmp_path / "out", expected)


def test_f32_auto_updates_config_dtype(family_of: Callable[[str], Family], tmp_path: Path) -> None:
    fam = family_of("f32")  # the base config says bfloat16, but every tensor is F32
    _merge(fam, tmp_path / "out")
    assert json.loads((tmp_path / "out" / "config.json").read_text())["torch_dtype"] == "float32"


def test_unaligned_family_is_unaligned(family_of: Callable[[str], Family]) -> None:
    fam = family_of("unaligned")
    for path in fam.base.parent.rglob("*.safetensors"):
        assert struct.unpack("<Q", path.read_bytes()[:8])[0] % 2 == 1


def test_f64_values_are_merged_in_float32(family_of: Callable[[str], Family]) -> None:
    """The F64 family really holds values that float32 cannot represent (the reference rounds
    them to float32 first, as the spec says: all arithmetic in float32)."""
    fam = family_of("f64")
    raw = read_safetensors(fam.base / "model.safetensors")["model.norm.weight"][2]
    assert raw.dtype == np.float64 and (raw.astype(np.float32).astype(np.float64) != raw).all()


def test_config_dtype_does_not_depend_on_hash_seed(family_of: Callable[[str], Family], tmp_path: Path) -> None:
    """A base with as many BF16 as F32 tensors: config.json must come out the same in every run
    (output bytes depend only on inputs, never on the interpreter's string hash seed)."""
    fam = family_of("mixed-base")
    _merge(fam, tmp_path / "warm")  # probe once, so the subprocesses only merge
    script = (
        "import sys; from pathlib import Path; from ramstream.api import merge; "
        "from ramstream.config import RunOptions; "
        "merge(sys.argv[1], sys.argv[2:5], out=sys.argv[5], "
        "options=RunOptions(cache_dir=Path(sys.argv[6]), quiet=True, block_elems=128))"
    )
    configs = set()
    for seed in range(4):
        out = tmp_path / f"out{seed}"
        args = [str(fam.base), *map(str, fam.agents), str(out), str(fam.base.parent / "cache")]
        env = {**os.environ, "PYTHONHASHSEED": str(seed)}
        subprocess.run([sys.executable, "-c", script, *args], check=True, env=env, cwd=Path(__file__).parent.parent)
        configs.add((out / "config.json").read_text())
    assert len(configs) == 1, configs


def test_custom_r_alpha_match_reference(family_of: Callable[[str], Family], tmp_path: Path) -> None:
    fam = family_of("bf16")
    result = _merge(fam, tmp_path / "out", r=0.5, alpha=0.75)
    assert_bit_identical(tmp_path / "out", ref.reference_merge(fam, r=0.5, alpha=0.75))
    expected = ref.lambdas(ref.model_counts(fam, 1e-5), "ram+", "paper", 0.5, 0.75)
    np.testing.assert_allclose(result.lambdas, expected, rtol=1e-15)
    assert max(result.lambdas) == pytest.approx(1.375)  # clipped at alpha


@pytest.mark.parametrize("eps", [0.0, 2e-3])
def test_other_eps_match_reference(family_of: Callable[[str], Family], tmp_path: Path, eps: float) -> None:
    fam = family_of("mixed-f32-agent")
    _merge(fam, tmp_path / "out", method="ram+s", eps=eps)
    assert_bit_identical(tmp_path / "out", ref.reference_merge(fam, method="ram+s", eps=eps))


def test_ram_plus_s_refuses_a_lambda_rule(family_of: Callable[[str], Family], tmp_path: Path) -> None:
    fam = family_of("bf16")
    with pytest.raises(ConfigError):
        _merge(fam, tmp_path / "out", method="ram+s", lambda_rule="script")


def test_non_float_tensor_copied_from_base(family_of: Callable[[str], Family], tmp_path: Path) -> None:
    fam = family_of("bf16")
    _merge(fam, tmp_path / "out", method="ram")
    got = read_model_dir(tmp_path / "out")["model.position_ids"]
    base = {}
    for shard in sorted(fam.base.glob("*.safetensors")):
        base.update(read_safetensors(shard))
    assert got[0] == "I64" and got[1] == (32,)
    assert got[2].tobytes() == base["model.position_ids"][2].tobytes() == np.arange(32, dtype=np.int64).tobytes()


# -- statistics ----------------------------------------------------------------------------------


@pytest.mark.parametrize(
    "family", ["bf16", "f16-single-file", "mixed-f32-agent", "f32-base-bf16-agents", "unaligned", "mixed-base", "f64"]
)
def test_probe_statistics_match_reference(family_of: Callable[[str], Family], family: str) -> None:
    fam = family_of(family)
    store = probe(fam.base, [str(a) for a in fam.agents], options=_options(fam))
    model = ref.model_counts(fam, 1e-5)
    reports = agent_reports(store)
    assert len(reports) == len(fam.agents)
    total = sum(v.size for v in fam.base_values.values())
    rho, lam = ref.rho(model), ref.lambdas(model, "ram+")
    for t, rep in enumerate(reports):
        assert rep.params == total
        assert (rep.active, rep.shared, rep.unique) == (model.active[t], model.shared[t], model.unique[t])
        assert rep.overlap == tuple(int(x) for x in model.overlap[t])
        assert rep.rho == rho[t]
        assert rep.lam == pytest.approx(lam[t], rel=1e-15)
    # per tensor, and the stored bit-packed masks themselves
    tensors = per_tensor(store.plan, *store.block_stats())
    expected = ref.tensor_counts(fam, 1e-5)
    for i, plan in enumerate(store.plan.tensors):
        if not plan.merged:
            assert plan.name in fam.copied
            continue
        name = plan.name
        np.testing.assert_array_equal(tensors.overlap[i], expected[name].overlap, err_msg=name)
        np.testing.assert_array_equal(tensors.coverage[i], expected[name].coverage, err_msg=name)
        packed = np.packbits(ref.active_masks(fam, name, 1e-5), axis=1, bitorder="little")
        np.testing.assert_array_equal(store.tensor_mask(i), packed, err_msg=name)
    # one mask chunk per batch, as wide as the widest batch's packed masks (+ its CRC32C)
    chunks = [f for f in (store.path / "masks").iterdir() if f.name.startswith("c.")]
    assert len(chunks) == len(store.plan.batches)
    assert {f.stat().st_size for f in chunks} == {len(fam.agents) * store.plan.mask_width + 4}


# -- the output directory ----------------------------------------------------------------------


def test_output_directory(family_of: Callable[[str], Family], tmp_path: Path) -> None:
    fam = family_of("bf16")
    out = tmp_path / "out"
    _merge(fam, out, out_dtype="f16", shard_size=4096)  # several shards, so a shard index
    config = json.loads((out / "config.json").read_text())
    assert config["torch_dtype"] == "float16"
    assert (out / "tokenizer.json").read_bytes() == (fam.base / "tokenizer.json").read_bytes()
    card = (out / "README.md").read_text()
    assert "ram+" in card and "ramstream" in card
    for agent in fam.agents:
        assert agent.name in card
    index = json.loads((out / "model.safetensors.index.json").read_text())
    tensors = read_model_dir(out)
    assert set(index["weight_map"]) == set(SHAPES) | {"model.position_ids"}
    assert index["metadata"]["total_size"] == sum(raw.nbytes for _, _, raw in tensors.values())
    for shard in set(index["weight_map"].values()):
        assert (out / shard).is_file()
    assert not (out / ".ramstream").exists()
    assert not list(out.rglob("*.partial"))


def test_one_shard_is_model_safetensors_without_an_index(family_of: Callable[[str], Family], tmp_path: Path) -> None:
    """As ``save_pretrained`` writes a model that fits one shard: ``model.safetensors``, no index."""
    fam = family_of("f16-single-file")
    _merge(fam, tmp_path / "out", method="ram")
    assert (tmp_path / "out" / "README.md").is_file()
    assert not (tmp_path / "out" / "model.safetensors.index.json").exists()
    assert set(read_safetensors(tmp_path / "out" / "model.safetensors")) == set(DEFAULT_SHAPES)
    record = json.loads((tmp_path / "out" / "ramstream_merge.json").read_text())
    assert "model.safetensors" in record["files"] and "model.safetensors.index.json" not in record["files"]
    front = yaml.safe_load((tmp_path / "out" / "README.md").read_text().split("---\n")[1])
    assert "base_model" not in front  # local checkpoints only: no hub repo id to name
