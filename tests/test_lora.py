"""LoRA agents: PEFT adapter directories, written by peft itself, merged as agents.

The reference task vector of a targeted tensor is written here from the definition
(``format.lora``): delta = float32(sum_k B[:, k] A[k, :]) * float32(scale), products and sums in
float32 in k order from +0.0, transposed for embeddings and fan_in_fan_out; tensors saved whole
have saved - base; the rest 0. The dense references of the methods (``tests/reference*.py``) then
take those task vectors as given.
"""

from __future__ import annotations

import json
import math
import shutil
import subprocess
import sys
import warnings
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

pytest.importorskip("peft")
torch = pytest.importorskip("torch")
transformers = pytest.importorskip("transformers")

from peft import LoraConfig, get_peft_model  # noqa: E402

from ramstream.api import merge, probe  # noqa: E402
from ramstream.config import RunOptions  # noqa: E402
from ramstream.errors import IndexMismatchError  # noqa: E402
from ramstream.format.lora import is_adapter  # noqa: E402
from ramstream.methods.report import agent_reports  # noqa: E402
from ramstream.statistics.overlap import per_tensor  # noqa: E402
from tests import reference as ref  # noqa: E402
from tests import reference_baselines as refb  # noqa: E402
from tests import reference_magnitude as refm  # noqa: E402
from tests.checks import assert_bit_identical  # noqa: E402
from tests.families import (  # noqa: E402
    Family,
    decode,
    encode,
    read_model_dir,
    read_safetensors,
    write_safetensors,
)
from tests.test_backends import installed_backends  # noqa: E402
from tests.test_cli import assert_nothing_finished, in_process, ok, one_line_error  # noqa: E402
from tests.test_resume import KILL_AT_STEP, KILLED, renamed_to, tree_bytes  # noqa: E402

PREFIX = "base_model.model."
BASE_ID = "tiny-org/tiny-llama"
# Rows of 48 and 80 elements: blocks (multiples of 64 elements) start and end inside rows.
LLAMA = {
    "vocab_size": 256,
    "hidden_size": 48,
    "intermediate_size": 80,
    "num_hidden_layers": 2,
    "num_attention_heads": 4,
    "num_key_value_heads": 2,
    "tie_word_embeddings": False,
}


@dataclass(frozen=True)
class Lab:
    root: Path
    base: Path
    full: Path  # an ordinary fine-tuned agent
    lora_a: Path  # f32 factors, rank/alpha patterns, modules_to_save
    lora_b: Path  # bf16 factors, rsLoRA, an embedding
    family: Family  # base, [lora_a, full, lora_b] with the LoRA agents' task vectors given

    @property
    def agents(self) -> list[str]:
        return [str(a) for a in self.family.agents]


def _randomise(model: Any, seed: int) -> None:
    """lora_B starts at zero: every LoRA factor (and saved module) gets random values."""
    generator = torch.Generator().manual_seed(seed)
    with torch.no_grad():
        for name, param in model.named_parameters():
            if "lora_" in name or "modules_to_save" in name:
                param.copy_(torch.randn(param.shape, generator=generator) * 0.05)


@contextmanager
def quiet() -> Iterator[None]:
    """peft and transformers warn about their own deprecations and defaults (the suite makes
    warnings errors): silenced around their calls only."""
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        yield


def write_adapter(base_model: Any, path: Path, config: LoraConfig, seed: int, dtype: Any = None) -> Path:
    with quiet():
        model = get_peft_model(base_model, config)
        _randomise(model, seed)
        if dtype is not None:
            model = model.to(dtype)
        model.save_pretrained(str(path))
    return path


def _tiny_llama(seed: int = 0) -> Any:
    torch.manual_seed(seed)
    with quiet():
        return transformers.LlamaForCausalLM(transformers.LlamaConfig(**LLAMA)).to(torch.bfloat16)


def lora_delta(a: np.ndarray, b: np.ndarray, scale: float, transposed: bool) -> np.ndarray:
    """The definition: float32(sum_k B[:, k] A[k, :]) * float32(scale), k in order from +0.0."""
    a, b = a.astype(np.float32), b.astype(np.float32)
    total = np.zeros((b.shape[0], a.shape[1]), np.float32)
    for k in range(a.shape[0]):
        total = (total + (b[:, k : k + 1] * a[k : k + 1, :]).astype(np.float32)).astype(np.float32)
    delta = (total * np.float32(scale)).astype(np.float32)
    return delta.T if transposed else delta


def adapter_taus(
    adapter: Path, base: dict[str, np.ndarray], scale: Callable[[str], float], transposed: bool = False
) -> dict[str, np.ndarray]:
    """Every base tensor's task vector under the adapter (flat float32), from its files."""
    saved = {
        k.removeprefix(PREFIX): decode(raw, dtype).reshape(shape)
        for k, (dtype, shape, raw) in read_safetensors(adapter / "adapter_model.safetensors").items()
    }
    taus = {name: np.zeros(values.size, np.float32) for name, values in base.items()}
    for key, a in saved.items():
        for suffix, b_suffix, flip in [
            (".lora_A.weight", ".lora_B.weight", transposed),
            (".lora_embedding_A", ".lora_embedding_B", True),
        ]:
            if key.endswith(suffix):
                module = key.removeprefix(PREFIX)[: -len(suffix)]
                taus[module + ".weight"] = lora_delta(a, saved[module + b_suffix], scale(module), flip).ravel()
    for name in base:
        if name in saved:  # saved whole: saved - base
            taus[name] = (saved[name].astype(np.float32).ravel() - base[name]).astype(np.float32)
    return taus


def _values(directory: Path) -> tuple[dict[str, np.ndarray], dict[str, str], dict[str, tuple[int, ...]]]:
    tensors = read_model_dir(directory)
    return (
        {n: decode(raw, d).astype(np.float32).ravel() for n, (d, _, raw) in tensors.items()},
        {n: d for n, (d, _, _) in tensors.items()},
        {n: s for n, (_, s, _) in tensors.items()},
    )


def _full_agent(base: Path, dest: Path, seed: int) -> dict[str, np.ndarray]:
    """An ordinary agent: the base with a sparse update (bf16), beside a copy of its config."""
    rng = np.random.default_rng(seed)
    dest.mkdir()
    shutil.copy(base / "config.json", dest / "config.json")
    tensors, values = {}, {}
    for name, (dtype, shape, raw) in read_model_dir(base).items():
        x = decode(raw, dtype)
        changed = rng.random(x.size) < 0.3
        agent = np.where(changed, x + rng.standard_normal(x.size).astype(np.float32) * 0.01, x).astype(np.float32)
        tensors[name] = (dtype, shape, encode(agent, dtype))
        values[name] = decode(tensors[name][2], dtype)
    write_safetensors(dest / "model.safetensors", tensors)
    return values


def build_lab(root: Path) -> Lab:
    base = root / "base"
    with quiet():
        _tiny_llama().save_pretrained(base)
    config = json.loads((base / "config.json").read_text())
    (base / "config.json").write_text(json.dumps({**config, "_name_or_path": BASE_ID}))
    lora_a = write_adapter(
        _tiny_llama(),
        root / "lora_a",
        LoraConfig(
            r=8,
            lora_alpha=16,
            target_modules=["q_proj", "v_proj", "up_proj"],
            rank_pattern={"v_proj": 2},
            alpha_pattern={"layers.1.self_attn.q_proj": 3},
            modules_to_save=["lm_head"],
        ),
        seed=1,
    )
    lora_b = write_adapter(
        _tiny_llama(),
        root / "lora_b",
        LoraConfig(r=4, lora_alpha=6, use_rslora=True, target_modules=["q_proj", "down_proj", "embed_tokens"]),
        seed=2,
        dtype=torch.bfloat16,
    )
    base_values, dtypes, shapes = _values(base)
    full_values = _full_agent(base, root / "full", seed=3)

    def scale_a(module: str) -> float:
        r = 2 if module.endswith("v_proj") else 8
        alpha = 3 if module.endswith("layers.1.self_attn.q_proj") else 16
        return alpha / r

    taus_a = adapter_taus(lora_a, base_values, scale_a)
    taus_b = adapter_taus(lora_b, base_values, lambda _: 6 / math.sqrt(4))
    family = Family(
        base,
        [lora_a, root / "full", lora_b],
        base_values=base_values,
        agent_values=[{}, full_values, {}],
        dtypes=dtypes,
        shapes=shapes,
        given_taus=[taus_a, None, taus_b],
    )
    return Lab(root, base, root / "full", lora_a, lora_b, family)


@pytest.fixture(scope="module")
def lab(tmp_path_factory: pytest.TempPathFactory) -> Lab:
    return build_lab(tmp_path_factory.mktemp("lora"))


def _options(cache: Path, **run: Any) -> RunOptions:
    return RunOptions(cache_dir=cache, quiet=True, **{"block_elems": 640, **run})


def _files(out: Path) -> dict[str, bytes]:
    return {str(p.relative_to(out)): p.read_bytes() for p in sorted(out.rglob("*")) if p.is_file()}


def test_is_adapter(lab: Lab) -> None:
    assert is_adapter(lab.lora_a) and is_adapter(str(lab.lora_b))
    assert not is_adapter(lab.base) and not is_adapter(lab.root / "missing")


def test_probe_counts_and_masks_match_the_reference(lab: Lab, tmp_path: Path) -> None:
    store = probe(lab.base, lab.agents, options=_options(tmp_path))
    expected = ref.model_counts(lab.family, 1e-5)
    assert [r.overlap for r in agent_reports(store)] == [tuple(int(x) for x in row) for row in expected.overlap]  # type: ignore[attr-defined]
    per = per_tensor(store.plan, *store.block_stats())
    for i, t in enumerate(store.plan.tensors):
        want = ref.counts_of(ref.active_masks(lab.family, t.name, 1e-5))
        np.testing.assert_array_equal(per.overlap[i], want.overlap, err_msg=t.name)
        packed = np.packbits(ref.active_masks(lab.family, t.name, 1e-5), axis=1, bitorder="little")
        np.testing.assert_array_equal(store.tensor_mask(i), packed, err_msg=t.name)
    # the adapters' untouched tensors are inactive, their targets active
    assert expected.active[0] > 0 and expected.active[2] > 0


REFERENCE_CASES: list[tuple[str, dict[str, Any], Callable[[Family], refb.Output]]] = [
    ("ram+", {}, lambda f: ref.reference_merge(f)),
    ("task_arithmetic", {"lambda": 0.7}, lambda f: refb.task_arithmetic(f, [1.0, 1.0, 1.0], 0.7)),
    ("ties", {"density": 0.3}, lambda f: refm.magnitude_merge(f, "ties", density=0.3)),
    (
        "ties",
        {"density": 0.3, "trim_scope": "model"},
        lambda f: refm.magnitude_merge(f, "ties", density=0.3, trim_scope="model"),
    ),
    ("linear", {"weights": [0.5, 1.0, 2.0]}, lambda f: refb.linear(f, [0.5, 1.0, 2.0])),
]


@pytest.mark.parametrize(
    ("method", "opts", "expected"), REFERENCE_CASES, ids=[f"{c[0]}-{i}" for i, c in enumerate(REFERENCE_CASES)]
)
def test_merges_of_adapters_and_full_agents_match_the_reference(
    lab: Lab, tmp_path: Path, method: str, opts: dict[str, Any], expected: Callable[[Family], refb.Output]
) -> None:
    merge(
        lab.base,
        lab.agents,
        out=tmp_path / "out",
        method=method,
        method_options=opts,
        options=_options(lab.root / "cache"),
    )
    assert_bit_identical(tmp_path / "out", expected(lab.family))


def test_a_merge_of_the_adapter_equals_the_materialised_agent_up_to_rounding(lab: Lab, tmp_path: Path) -> None:
    """base + delta written as a float32 checkpoint: merged, it differs from the adapter only by
    the rounding of f32(base + delta) - f32(base) against delta."""
    taus = lab.family.given_taus[0]
    assert taus is not None
    materialised = _materialised(lab, tmp_path / "materialised", taus)
    outs = {}
    for label, agent in [("adapter", lab.lora_a), ("materialised", materialised)]:
        out = tmp_path / f"out-{label}"
        merge(
            lab.base,
            [str(agent)],
            out=out,
            method="task_arithmetic",
            out_dtype="f32",
            options=_options(tmp_path / "cache"),
        )
        outs[label] = {n: decode(raw, d) for n, (d, _, raw) in read_model_dir(out).items()}
    for name, got in outs["adapter"].items():
        np.testing.assert_allclose(got, outs["materialised"][name], rtol=0, atol=1e-6, err_msg=name)


def test_the_adapter_merged_alone_is_peft_merge_and_unload(lab: Lab, tmp_path: Path) -> None:
    """task_arithmetic with weight 1 is PEFT's own merge, up to its matmul's rounding."""
    from peft import PeftModel

    merge(
        lab.base,
        [str(lab.lora_b)],
        out=tmp_path / "out",
        method="task_arithmetic",
        out_dtype="f32",
        options=_options(tmp_path / "cache"),
    )
    with quiet():
        model = transformers.LlamaForCausalLM.from_pretrained(lab.base, dtype=torch.float32)
        merged = PeftModel.from_pretrained(model, lab.lora_b).merge_and_unload().state_dict()
    for name, (dtype, _, raw) in read_model_dir(tmp_path / "out").items():
        np.testing.assert_allclose(decode(raw, dtype), merged[name].numpy().ravel(), rtol=0, atol=1e-6, err_msg=name)


def test_fan_in_fan_out_adapter_of_a_gpt2_model(tmp_path: Path) -> None:
    """GPT-2's Conv1D stores W as in x out: PEFT's delta is (B @ A)^T there."""
    torch.manual_seed(0)
    with quiet():
        config = transformers.GPT2Config(vocab_size=64, n_positions=32, n_embd=32, n_layer=1, n_head=2)
        transformers.GPT2LMHeadModel(config).to(torch.bfloat16).save_pretrained(tmp_path / "base")
        model = transformers.GPT2LMHeadModel.from_pretrained(tmp_path / "base")
    lora = write_adapter(
        model,
        tmp_path / "lora",
        LoraConfig(r=4, lora_alpha=8, target_modules=["c_attn", "c_proj"], fan_in_fan_out=True),
        seed=4,
    )
    base_values, dtypes, shapes = _values(tmp_path / "base")
    taus = adapter_taus(lora, base_values, lambda _: 2.0, transposed=True)
    family = Family(tmp_path / "base", [lora], base_values, [{}], dtypes, shapes, given_taus=[taus])
    merge(
        family.base, [str(lora)], out=tmp_path / "out", method="task_arithmetic", options=_options(tmp_path / "cache")
    )
    assert_bit_identical(tmp_path / "out", refb.task_arithmetic(family, [1.0]))
    assert any(np.any(t) for n, t in taus.items() if "c_attn" in n)


# -- backends and block sizes -------------------------------------------------------------------

BACKEND_CASES: list[tuple[str, dict[str, Any]]] = [
    ("ram+", {}),
    ("linear", {"weights": [0.5, 1.0, 2.0]}),
    ("ties", {"density": 0.3, "trim_scope": "model", "rescale": "l1"}),
    ("dare_ties", {"density": 0.5, "seed": 3}),
    ("della", {"density": 0.5, "epsilon": 0.1, "seed": 1}),
    ("model_stock", {}),
]


@pytest.mark.parametrize(("method", "opts"), BACKEND_CASES, ids=[m for m, _ in BACKEND_CASES])
def test_every_backend_writes_the_numba_bytes(lab: Lab, tmp_path: Path, method: str, opts: dict[str, Any]) -> None:
    outputs = {}
    for backend in installed_backends():
        out = tmp_path / backend
        options = _options(tmp_path / f"cache-{backend}", block_elems=1984, backend=backend)
        merge(lab.base, lab.agents, out=out, method=method, method_options=opts, options=options)
        outputs[backend] = _files(out)
    assert all(files == outputs["numba"] for files in outputs.values())


@settings(max_examples=5, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(
    block_elems=st.integers(4, 64).map(lambda k: 64 * k),
    backend=st.sampled_from(installed_backends()),
    method=st.sampled_from(["ram+", "task_arithmetic"]),
)
def test_merge_bytes_do_not_depend_on_blocks_or_backend(
    lab: Lab, tmp_path_factory: pytest.TempPathFactory, block_elems: int, backend: str, method: str
) -> None:
    """ram+ reads its inputs as tiles (held in memory for an adapter), task arithmetic as views."""
    root = tmp_path_factory.mktemp("blocks")
    options = _options(root / "cache", block_elems=block_elems, backend=backend)
    merge(lab.base, lab.agents, out=root / "out", method=method, options=options)
    expected = ref.reference_merge(lab.family) if method == "ram+" else refb.task_arithmetic(lab.family, [1.0] * 3)
    assert_bit_identical(root / "out", expected)


# -- the index and resume --------------------------------------------------------------------------


def test_a_changed_adapter_invalidates_the_index(lab: Lab, tmp_path: Path) -> None:
    adapter = tmp_path / "adapter"
    shutil.copytree(lab.lora_a, adapter)
    index = tmp_path / "index.zarr"
    probe(lab.base, [str(adapter)], index=index, options=_options(tmp_path))
    config = json.loads((adapter / "adapter_config.json").read_text())
    (adapter / "adapter_config.json").write_text(json.dumps({**config, "lora_alpha": 32}))
    with pytest.raises(IndexMismatchError):
        probe(lab.base, [str(adapter)], index=index, options=_options(tmp_path))


# Merges the JSON spec's family with TIES in blocks of 640 elements, through the API (the CLI
# sizes blocks from --memory, at least 16 MiB: this family would be one block).
MERGE_CALL = """
from pathlib import Path
from ramstream.api import merge
from ramstream.config import RunOptions
job = json.loads(sys.argv[1])
options = RunOptions(cache_dir=Path(job["cache"]), quiet=True, block_elems=640, threads=1)
merge(job["base"], job["agents"], out=job["out"], method="ties", method_options={"density": 0.3}, options=options)
"""
CLI_CALL = "from ramstream.cli import main\nmain()\n"


def _merge_process(job: dict[str, str | list[str]], kill_at: dict[str, object] | None) -> int:
    """Run the merge in its own process (SIGKILLed by itself at ``kill_at``); its exit status."""
    assert KILL_AT_STEP.endswith(CLI_CALL)
    script = KILL_AT_STEP.removesuffix(CLI_CALL) + MERGE_CALL
    spec = kill_at or {"event": "never", "arg": 0, "suffix": "", "n": 1}
    done = subprocess.run(
        [sys.executable, "-c", script, json.dumps(spec), json.dumps(job)], capture_output=True, text=True, timeout=300
    )
    assert "Traceback" not in done.stderr, done.stderr
    return done.returncode


def test_a_merge_killed_mid_pass_resumes_to_identical_bytes(lab: Lab, tmp_path: Path) -> None:
    def job(name: str) -> dict[str, str | list[str]]:
        return {
            "base": str(lab.base),
            "agents": lab.agents,
            "out": str(tmp_path / name),
            "cache": str(tmp_path / f"cache-{name}"),
        }

    assert _merge_process(job("reference"), None) == 0
    assert _merge_process(job("out"), renamed_to(".ramstream/journal/merge/c.5")) == KILLED
    assert_nothing_finished(tmp_path / "out")
    assert _merge_process(job("out"), None) == 0
    assert tree_bytes(tmp_path / "out") == tree_bytes(tmp_path / "reference")


# -- refusals ----------------------------------------------------------------------------------------


Raw = dict[str, tuple[str, tuple[int, ...], np.ndarray]]


def _edited(
    lab: Lab,
    dest: Path,
    config: dict[str, Any] | None = None,
    tensors: Callable[[Raw], None] | None = None,
) -> Path:
    shutil.copytree(lab.lora_a, dest)
    if config is not None:
        given = json.loads((dest / "adapter_config.json").read_text())
        (dest / "adapter_config.json").write_text(json.dumps({**given, **config}))
    if tensors is not None:
        saved = read_safetensors(dest / "adapter_model.safetensors")
        tensors(saved)
        write_safetensors(dest / "adapter_model.safetensors", saved)
    return dest


Q0 = PREFIX + "model.layers.0.self_attn.q_proj"


def _wrong_shape(saved: Raw) -> None:
    saved[Q0 + ".lora_B.weight"] = ("F32", (40, 8), np.zeros(40 * 8, np.float32))


def _missing_factor(saved: Raw) -> None:
    del saved[Q0 + ".lora_B.weight"]


def _int_factor(saved: Raw) -> None:
    _, shape, raw = saved[Q0 + ".lora_A.weight"]
    saved[Q0 + ".lora_A.weight"] = ("I8", shape, np.zeros(raw.size, np.int8))


def _unknown_module(saved: Raw) -> None:
    saved[PREFIX + "model.layers.7.self_attn.q_proj.lora_A.weight"] = saved.pop(Q0 + ".lora_A.weight")
    saved[PREFIX + "model.layers.7.self_attn.q_proj.lora_B.weight"] = saved.pop(Q0 + ".lora_B.weight")


REFUSALS: dict[str, tuple[dict[str, Any] | None, Callable[[Raw], None] | None, tuple[str, ...]]] = {
    "target-shape": (None, _wrong_shape, ("model.layers.0.self_attn.q_proj.weight", "do not fit")),
    "other-base-model": (
        {"base_model_name_or_path": "other-org/other-model"},
        None,
        ("other-org/other-model", BASE_ID, "base_model_name_or_path"),
    ),
    "dora": ({"use_dora": True}, None, ("DoRA", "adapter_config.json")),
    "peft-type": ({"peft_type": "IA3"}, None, ("peft_type", "IA3")),
    "missing-factor": (None, _missing_factor, ("lora_B", "model.layers.0.self_attn.q_proj")),
    "dtype": (None, _int_factor, ("I8", "lora_A")),
    "unknown-module": (None, _unknown_module, ("layers.7", "matches no tensor")),
}


@pytest.mark.parametrize("case", list(REFUSALS))
def test_refusals_are_one_line_and_write_nothing(lab: Lab, tmp_path: Path, case: str) -> None:
    config, tensors, needles = REFUSALS[case]
    adapter = _edited(lab, tmp_path / "adapter", config, tensors)
    out = tmp_path / "out"
    outcome = in_process("merge", lab.base, lab.full, adapter, "--out", out, "--cache-dir", tmp_path / "cache")
    one_line_error(outcome, *needles)
    assert_nothing_finished(out)


def test_an_adapter_named_for_a_mirror_of_the_base_is_accepted(lab: Lab, tmp_path: Path) -> None:
    adapter = _edited(lab, tmp_path / "adapter", {"base_model_name_or_path": "mirror-org/Tiny-Llama"})
    probe(lab.base, [str(adapter)], options=_options(tmp_path))


def test_an_adapter_given_as_base_is_refused(lab: Lab, tmp_path: Path) -> None:
    outcome = in_process("merge", lab.lora_a, lab.full, "--out", tmp_path / "out", "--cache-dir", tmp_path / "cache")
    one_line_error(outcome, "PEFT adapter", "AGENT")
    assert_nothing_finished(tmp_path / "out")


def _materialised(lab: Lab, dest: Path, taus: dict[str, np.ndarray]) -> Path:
    """The agent base + delta written as a float32 checkpoint."""
    dest.mkdir()
    shutil.copy(lab.base / "config.json", dest / "config.json")
    tensors = {
        name: ("F32", lab.family.shapes[name], (lab.family.base_values[name] + taus[name]).astype(np.float32))
        for name in lab.family.base_values
    }
    write_safetensors(dest / "model.safetensors", tensors)
    return dest


SPHERE_CASES: list[tuple[str, dict[str, Any], bool]] = [
    ("slerp", {"t": 0.4}, True),  # weights: f32(base) + delta, as the materialised agent's
    ("nearswap", {"t": 0.001}, True),  # weights, per element
    ("karcher", {}, True),
    ("multislerp", {"weights": [1.0, 2.0]}, False),  # task vectors: delta against f32(base + delta) - base
]


@pytest.mark.parametrize(("method", "opts", "same_bytes"), SPHERE_CASES, ids=[c[0] for c in SPHERE_CASES])
def test_spherical_merges_of_an_adapter_equal_the_materialised_agent(
    lab: Lab, tmp_path: Path, method: str, opts: dict[str, Any], same_bytes: bool
) -> None:
    """The spherical methods see an adapter agent's weights as f32(base) + delta: where they work
    on the weights they write the materialised agent's bytes; on task vectors, up to rounding."""
    taus = lab.family.given_taus[0]
    assert taus is not None
    materialised = _materialised(lab, tmp_path / "materialised", taus)
    others = [] if method in ("slerp", "nearswap") else [str(lab.full)]
    outs = {}
    for label, agent in [("adapter", lab.lora_a), ("materialised", materialised)]:
        out = tmp_path / f"out-{label}"
        merge(
            lab.base,
            [str(agent), *others],
            out=out,
            method=method,
            method_options=opts,
            out_dtype="f32",
            options=_options(tmp_path / f"cache-{label}"),
        )
        outs[label] = {n: decode(raw, d) for n, (d, _, raw) in read_model_dir(out).items()}
    for name, got in outs["adapter"].items():
        if same_bytes:
            assert np.array_equal(got.view(np.uint32), outs["materialised"][name].view(np.uint32)), name
        else:
            np.testing.assert_allclose(got, outs["materialised"][name], rtol=0, atol=1e-5, err_msg=name)


def test_a_config_names_adapters_as_mergekit_does(lab: Lab, tmp_path: Path) -> None:
    """``base_model+adapter`` and the adapter directory itself: the same merge as the agents given
    on the command line."""
    config = tmp_path / "merge.yaml"
    config.write_text(
        json.dumps(
            {
                "merge_method": "ties",
                "base_model": str(lab.base),
                "models": [
                    {"model": f"{lab.base}+{lab.lora_a}", "parameters": {"weight": 1.0, "density": 0.3}},
                    {"model": str(lab.full), "parameters": {"weight": 1.0, "density": 0.3}},
                    {"model": str(lab.lora_b), "parameters": {"weight": 1.0, "density": 0.3}},
                ],
            }
        )
    )
    cache = ["--cache-dir", tmp_path / "cache", "--quiet"]
    ok(in_process("merge", "--config", config, "--out", tmp_path / "by-config", *cache))
    ok(
        in_process(
            "merge",
            lab.base,
            *lab.agents,
            "--method",
            "ties",
            "--density",
            "0.3",
            "--out",
            tmp_path / "by-flags",
            *cache,
        )
    )
    assert _files(tmp_path / "by-config") == _files(tmp_path / "by-flags")
