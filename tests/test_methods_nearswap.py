"""nearswap against a dense float32 reference written from mergekit's formula (per element, in
numpy), to the byte: bf16 and float32 outputs, t = 0 (the base), a t above every difference (the
agent), gradients and filters; the same bytes from every backend, block size and thread count;
the first NaN/Inf input found by the kernel and named by the merge; bad input refused in one line
before anything is written."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import numpy as np
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from ramstream import api
from ramstream.backends.numba.addresses import addresses_of
from ramstream.backends.numba.codecs import BF16, F32
from ramstream.backends.numba.nearswap import merge_nearswap_block
from ramstream.config import RunOptions
from ramstream.errors import NonFiniteWeightError
from tests import reference_sphere as ref
from tests.families import Family, build_family, decode, f32_to_bf16, read_safetensors, write_safetensors
from tests.test_cli import assert_nothing_finished, in_process, one_line_error
from tests.test_methods_sphere import merged, run_merge

LAYERS = 2
F = np.float32

# The family's task vectors are N(0, 0.01) on 5 % to 60 % of the elements, its weights N(0, 0.05):
# these t take a task vector whole, cut it to t, or (0) leave the base.
T_FILTERS: Any = [
    {"filter": "self_attn", "value": [0.001, 0.02]},
    {"filter": "mlp", "value": [0.006, 0.0]},
    {"value": 0.003},
]


@pytest.fixture(scope="module")
def fam(tmp_path_factory: pytest.TempPathFactory) -> Family:
    return build_family(tmp_path_factory.mktemp("nearswap"), densities=(0.05, 0.4, 0.6), seed=11)


def nearswap(t: float, a: np.ndarray, b: np.ndarray) -> np.ndarray:
    """mergekit 0.1.5's ``nearswap_merge`` in numpy float32, one rounding per operation. mergekit
    writes ``t / absdiff.clamp(min=1e-6)``: a Python number divided by a tensor is torch's
    ``Tensor.__rtruediv__``, ``reciprocal() * t``."""
    a, b = a.astype(F), b.astype(F)
    absdiff = np.abs(a - b)
    weight = np.clip(np.reciprocal(np.maximum(absdiff, F(1e-6))) * F(t), F(0), F(1))
    return weight * b + (F(1) - weight) * a


def t_of(t: Any, name: str) -> float:
    value = ref.setting_value(t, name, ref.layer_x(name, LAYERS))
    assert value is not None
    return value


def reference(fam: Family, t: Any, agent: int) -> dict[str, np.ndarray]:
    """float32 per tensor (flat)."""
    return {
        name: nearswap(t_of(t, name), fam.base_values[name].ravel(), fam.agent_values[agent][name].ravel())
        for name in fam.base_values
    }


@pytest.mark.parametrize("t", [0.0, 0.001, 0.004, 0.02, 1e6, T_FILTERS])
def test_nearswap_matches_the_reference_to_the_byte(fam: Family, tmp_path: Path, t: Any) -> None:
    ours = run_merge(tmp_path, [fam.base, fam.agents[2]], "ns", "--method", "nearswap", "--t", json.dumps(t))
    values = reference(fam, t, 2)
    assert set(ours) == set(values)
    for name, want in values.items():
        assert np.array_equal(ours[name], f32_to_bf16(want)), name
    base = {n: f32_to_bf16(v.ravel()) for n, v in fam.base_values.items()}
    agent = {n: f32_to_bf16(v.ravel()) for n, v in fam.agent_values[2].items()}
    # w = 0 gives 0 b + a, the base; w = 1 gives b + 0 a, the agent (but for a -0.0 where the
    # other term is +0.0: the family holds none)
    assert not any(np.any(v == 0x8000) for v in (*base.values(), *agent.values()))
    if t == 0.0:
        assert all(np.array_equal(raw, base[name]) for name, raw in ours.items())
    if t == 1e6:
        assert all(np.array_equal(raw, agent[name]) for name, raw in ours.items())
    if t == 0.004:  # some elements are taken whole, some cut to t, the rest are the base's already
        name = "model.embed_tokens.weight"
        a, b = fam.base_values[name].ravel(), fam.agent_values[2][name].ravel()
        near, far = (0 < np.abs(a - b)) & (np.abs(a - b) <= 0.003), np.abs(a - b) > 0.005
        assert near.sum() > 10 and far.sum() > 10
        assert np.array_equal(ours[name][near], agent[name][near])
        assert not np.any(ours[name][far] == agent[name][far])


def test_float32_output_is_mergekits_arithmetic_to_the_bit(fam: Family, tmp_path: Path) -> None:
    """With float32 output nothing hides a last-bit difference: ours, the numpy reference and
    mergekit's own torch expression (where torch is installed) agree on every element."""
    flags = ["--method", "nearswap", "--t", json.dumps(T_FILTERS), "--out-dtype", "f32"]
    ours = run_merge(tmp_path, [fam.base, fam.agents[1]], "ns32", *flags)
    values = reference(fam, T_FILTERS, 1)
    for name, want in values.items():
        assert np.array_equal(ours[name].view(np.uint32), want.view(np.uint32)), name
    try:
        import torch
    except ImportError:
        return
    for name, want in values.items():
        a = torch.from_numpy(fam.base_values[name].ravel().astype(F))
        b = torch.from_numpy(fam.agent_values[1][name].ravel().astype(F))
        t = t_of(T_FILTERS, name)
        absdiff = torch.abs(a - b)  # mergekit/merge_methods/nearswap.py, as written there
        weight = (t / absdiff.clamp(min=1e-6)).clamp(min=0, max=1)
        theirs = (weight * b + (1 - weight) * a).numpy()
        assert np.array_equal(theirs.view(np.uint32), want.view(np.uint32)), name


def test_nearswap_of_an_agent_equal_to_the_base_is_the_base(tmp_path: Path) -> None:
    twins = build_family(tmp_path / "twins", densities=(0.0005,), identical_agent=True, seed=4)
    ours = run_merge(tmp_path, [twins.base, twins.agents[1]], "twin", "--method", "nearswap", "--t", "0.01")
    for name, raw in ours.items():  # |a - b| = 0: w = 1, 1 a + 0 a
        assert np.array_equal(raw, f32_to_bf16(twins.base_values[name].ravel()))


# Another block size, thread count and backend than the defaults (a one-agent method's property test).
OTHER_RUNS = {
    "block_elems": st.sampled_from([64, 320, 4096]),
    "threads": st.sampled_from([1, 2]),
    "backend": st.sampled_from(["numba", "torch"]),
}


def same_bytes_under(fam: Family, tmp: Path, agent: int, method: str, options: dict[str, Any], **run: Any) -> None:
    """The merge of the base and ``agent`` gives the same bytes under ``run`` as under the defaults."""
    if run.get("backend") == "torch":
        pytest.importorskip("torch")
    outputs = []
    out_dtype = run.pop("out_dtype", "auto")  # both outputs in it
    for name, more in (("plain", {}), ("other", run)):
        api.merge(fam.base, [str(fam.agents[agent])], out=tmp / name, method=method, method_options=options,
                  out_dtype=out_dtype, options=RunOptions(cache_dir=tmp / f"c-{name}", quiet=True, **more))  # fmt: skip
        outputs.append(merged(tmp / name))
    for name in outputs[0]:
        assert np.array_equal(outputs[0][name], outputs[1][name]), name


@settings(max_examples=8, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(agent=st.sampled_from([0, 2]), **OTHER_RUNS)
def test_block_size_threads_and_backend_change_no_byte(
    fam: Family, tmp_path_factory: pytest.TempPathFactory, block_elems: int, threads: int, backend: str, agent: int
) -> None:
    run = {"block_elems": block_elems, "threads": threads, "backend": backend}
    same_bytes_under(fam, tmp_path_factory.mktemp("prop"), agent, "nearswap", {"t": T_FILTERS}, **run)


def test_torch_tiles_smaller_than_a_block_give_the_numba_bytes(
    fam: Family, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Blocks of 256 elements in torch tiles of 64 (the last one of a tensor partial); float32
    output, where a last-bit difference would show."""
    pytest.importorskip("torch")
    from ramstream.backends.torch import tiles as torch_tiles

    outputs = []
    for backend in ("numba", "torch"):
        if backend == "torch":
            monkeypatch.setattr(torch_tiles, "CPU_TILE", 64)
        run = RunOptions(cache_dir=tmp_path / backend, quiet=True, block_elems=256, backend=backend)
        out = tmp_path / f"out-{backend}"
        options = {"t": 0.004}
        api.merge(fam.base, [str(fam.agents[1])], out=out, method="nearswap", method_options=options, out_dtype="f32",
                  options=run)  # fmt: skip
        outputs.append(merged(out))
    assert outputs[0].keys() == outputs[1].keys()
    for name in outputs[0]:
        assert np.array_equal(outputs[0][name], outputs[1][name]), name


# -- NaN/Inf inputs --------------------------------------------------------------------------------


@pytest.mark.parametrize("workers", [1, 2])
@pytest.mark.parametrize(
    "where",
    [[], [("base", 5000, np.nan)], [("agent", 70, np.inf), ("base", 4100, np.nan)], [("agent", 6200, -np.inf)]],
)
def test_the_kernel_reports_its_first_nonfinite_input(workers: int, where: list[tuple[str, int, float]]) -> None:
    """Over several tiles, whatever the thread count: the lowest position of any NaN/Inf input,
    and every other element merged as the reference says."""
    rng = np.random.default_rng(3)
    n = 3 * 2048 + 100
    base = f32_to_bf16(rng.standard_normal(n).astype(F) * F(0.05))
    agent = f32_to_bf16(decode(base, "BF16") + rng.standard_normal(n).astype(F) * F(0.01))
    for who, position, value in where:
        (base if who == "base" else agent)[position] = f32_to_bf16(np.array([value], F))[0]
    out = np.empty(n, np.uint16)
    found = merge_nearswap_block(
        base, BF16, addresses_of([agent], n), np.array([BF16], np.int64), F(0.004), out, BF16, workers
    )
    assert found == min((p for _, p, _ in where), default=-1)
    finite = np.isfinite(decode(base, "BF16")) & np.isfinite(decode(agent, "BF16"))
    with np.errstate(invalid="ignore"):  # Inf - Inf, 0 * Inf where the inputs are not finite
        want = f32_to_bf16(nearswap(0.004, decode(base, "BF16"), decode(agent, "BF16")))
    assert np.array_equal(out[finite], want[finite])


def test_a_task_vector_input_weighs_in_as_base_plus_tau() -> None:
    """An agent given as its float32 task vector (a LoRA agent) is f32(base) + tau."""
    from ramstream.backends.numba.codecs import TAU32

    rng = np.random.default_rng(8)
    n = 2048 + 77
    base = rng.standard_normal(n).astype(F) * F(0.05)
    tau = np.where(rng.random(n) < 0.5, rng.standard_normal(n).astype(F) * F(0.01), F(0)).astype(F)
    out = np.empty(n, np.float32)
    assert (
        merge_nearswap_block(
            base, F32, addresses_of([tau], tau.size), np.array([TAU32], np.int64), F(0.003), out, F32, 2
        )
        == -1
    )
    want = nearswap(0.003, base, (base + tau).astype(F))
    assert np.array_equal(out.view(np.uint32), want.view(np.uint32))


@pytest.mark.parametrize("backend", ["numba", "torch"])
def test_a_nan_in_the_agent_is_refused_by_name(tmp_path: Path, backend: str) -> None:
    if backend == "torch":
        pytest.importorskip("torch")
    fam = build_family(tmp_path / "fam", densities=(0.3,), seed=6)
    path = fam.agents[0] / "model.safetensors"
    tensors = read_safetensors(path)
    dtype, shape, raw = tensors["model.norm.weight"]
    raw = raw.copy()
    raw[5] = 0x7FC0  # bf16 NaN
    tensors["model.norm.weight"] = (dtype, shape, raw)
    write_safetensors(path, tensors)
    options = RunOptions(cache_dir=tmp_path / "cache", quiet=True, backend=backend)
    with pytest.raises(NonFiniteWeightError, match=r"tensor 'model.norm.weight' .* index \[5\]"):
        api.merge(fam.base, [str(fam.agents[0])], out=tmp_path / "out", method="nearswap",
                  method_options={"t": 0.01}, options=options)  # fmt: skip


# -- bad input: one line, nothing written ---------------------------------------------------------


def test_two_agents_are_refused(fam: Family, tmp_path: Path) -> None:
    out = tmp_path / "out"
    outcome = in_process("merge", fam.base, *fam.agents[:2], "--out", out, "--method", "nearswap", "--t", "0.01")
    one_line_error(outcome, "nearswap", "one agent", "2 agents")
    assert not out.exists()


def test_missing_t_is_refused(fam: Family, tmp_path: Path) -> None:
    out = tmp_path / "out"
    one_line_error(
        in_process("merge", fam.base, fam.agents[0], "--out", out, "--method", "nearswap"), "--t", "nearswap"
    )
    assert not out.exists()


def test_a_filter_matching_nothing_is_refused(fam: Family, tmp_path: Path) -> None:
    out = tmp_path / "out"
    setting = "[{filter: cross_attn, value: 0.2}, {value: 0.5}]"
    outcome = in_process("merge", fam.base, fam.agents[0], "--out", out, "--method", "nearswap", "--t", setting)
    one_line_error(outcome, "'cross_attn'", "matches no tensor")
    assert_nothing_finished(out)


def refuse_two_models(fam: Family, tmp_path: Path, method: str, parameters: dict[str, Any]) -> None:
    """A config of a one-agent method listing two models besides the base: one line, nothing written."""
    config = tmp_path / f"{method}.yml"
    models = [{"model": str(fam.agents[0])}, {"model": str(fam.agents[1])}]
    doc = {"merge_method": method, "base_model": str(fam.base), "models": models, "parameters": parameters}
    config.write_text(json.dumps({k: v for k, v in doc.items() if v}))
    out = tmp_path / "out"
    one_line_error(in_process("merge", "--config", config, "--out", out), method, "exactly 1 model", "lists 2")
    assert not out.exists()


def config_and_flags_agree(fam: Family, tmp_path: Path, parameters: dict[str, Any], flags: tuple[str, ...]) -> None:
    """The base listed in models, the agent second, ``parameters`` at the top: the bytes of ``flags``."""
    config = tmp_path / "merge.yml"
    doc = {
        "merge_method": flags[1],
        "base_model": str(fam.base),
        "models": [{"model": str(fam.base)}, {"model": str(fam.agents[1])}],
        "parameters": parameters,
        "dtype": "float32",
        "out_dtype": "bfloat16",
    }
    config.write_text(json.dumps({k: v for k, v in doc.items() if v}))
    cache = ("--cache-dir", tmp_path / "cache", "--quiet")
    by_config = in_process("merge", "--config", config, "--out", tmp_path / "a", *cache)
    assert by_config.code == 0, by_config.err
    by_flags = in_process(
        "merge", fam.base, fam.agents[1], "--out", tmp_path / "b", *flags, "--out-dtype", "bf16", *cache
    )
    assert by_flags.code == 0, by_flags.err
    a, b = merged(tmp_path / "a"), merged(tmp_path / "b")
    assert a.keys() == b.keys() and all(np.array_equal(a[n], b[n]) for n in a)


def test_a_config_with_two_models_is_refused(fam: Family, tmp_path: Path) -> None:
    refuse_two_models(fam, tmp_path, "nearswap", {"t": 0.01})


def test_a_config_and_flags_give_the_same_bytes(fam: Family, tmp_path: Path) -> None:
    config_and_flags_agree(fam, tmp_path, {"t": T_FILTERS}, ("--method", "nearswap", "--t", json.dumps(T_FILTERS)))
