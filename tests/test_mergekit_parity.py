"""Parity with the real mergekit (0.1.5): the same YAML config, merged by both tools.

A small Qwen2-shaped bf16 family with sparse task vectors (tests/families.build_family) is
merged by ``ramstream merge --config X.yml`` and by mergekit's own ``run_merge`` (what
``mergekit-yaml X.yml OUT`` runs; all configs in one process, on the CPU), both in float32
arithmetic with bf16 output (``dtype: float32``, ``out_dtype: bfloat16``).

- Deterministic methods: the two outputs must be bit-identical on at least 99.99 % of the
  elements and never more than one bf16 ulp apart; the differences left are printed per method
  (run with ``-s``) and explained in docs/methods.md ("Parity with mergekit").
- Magnitude trimming (ties, breadcrumbs): which of the elements equal to a threshold |tau| are
  kept is up to the sort: mergekit calls torch's unstable sort, whose order of equal values is
  an implementation detail; ramstream breaks ties by position (a stable sort). bf16 task
  vectors hold many equal values, so mergekit runs twice: with its sorts pinned to stable ones
  (held to the bar above), and as it is (every element that differs must hold an agent's value
  equal to one of its thresholds).
- Random methods (DARE, DELLA): mergekit draws from torch's generator, ramstream from a
  counter-based one, so only statistics can agree: which fraction of each agent's task vector
  survives, and that the L1 rescale restores each tensor's L1 mass. ramstream's own
  determinism is checked exactly (another --memory, another --threads: the same bytes; another
  --seed: other bytes).

Methods not (yet) registered in ramstream are skipped, with the reason; mergekit missing skips
the whole module (``make test`` installs it: see the Makefile).
"""

from __future__ import annotations

import importlib.util
import json
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np
import pytest
from click.testing import CliRunner

from ramstream.cli import main
from ramstream.demo.samples import FamilyShape
from ramstream.methods.registry import method_names
from tests import reference_fusion, reference_sphere
from tests import test_methods_sce as reference_sce
from tests.families import Family, bf16_to_f32, build_family, f32_to_bf16, read_model_dir, read_safetensors
from tests.mergekit_runs import run_mergekit

pytestmark = pytest.mark.slow

if importlib.util.find_spec("mergekit") is None:
    pytest.skip(
        "mergekit is not installed: pip install torch==2.13.0 mergekit==0.1.5 (make test does)",
        allow_module_level=True,
    )

SHAPE = FamilyShape(hidden=128, layers=2, vocab=1024, intermediate=352, kv_hidden=32)
DENSITIES = (0.03, 0.4, 0.55)
MIN_IDENTICAL = 0.9999
SEED = 7

# name -> (mergekit merge_method, top-level parameters, per-agent parameters, the base model's
# entry in models: its parameters, None (not listed) or "appended" (not listed; linear only:
# base_model given all the same, so mergekit appends it to the inputs), or "absent" (no
# base_model: the base file is the first model, taking the first per-agent parameters)); a
# per-agent entry None leaves that agent out (nearswap takes one: the densest, the third)
Case = tuple[str, dict[str, Any], list[dict[str, Any] | None], dict[str, Any] | str | None]
WEIGHTS = [{"weight": 0.7}, {"weight": 0.5}, {"weight": 1.0}]
DETERMINISTIC: dict[str, Case] = {
    "ram": ("ram", {}, [{}, {}, {}], None),
    "ramplus_tl": ("ramplus_tl", {}, [{}, {}, {}], None),
    "ramplus_tl-r0.3-alpha1": ("ramplus_tl", {"r": 0.3, "alpha": 1.0}, [{}, {}, {}], None),
    "ramplus_tl-gradients": (
        "ramplus_tl",
        {"r": [0.1, 0.5], "alpha": [{"filter": "mlp", "value": 1.0}, {"value": 0.2}]},
        [{}, {}, {}],
        None,
    ),
    "linear": ("linear", {}, WEIGHTS, None),
    "linear-with-base": ("linear", {"normalize": True}, WEIGHTS, {"weight": 0.3}),
    "linear-base-appended": ("linear", {"weight": 0.25}, WEIGHTS, "appended"),
    "linear-gradients": (
        "linear",
        {},
        [{"weight": [0.2, 1.0]}, {"weight": [{"filter": "mlp", "value": 0.5}, {"value": 1.0}]}, {"weight": 1.0}],
        None,
    ),
    "task_arithmetic": ("task_arithmetic", {"lambda": 0.8}, WEIGHTS, {}),
    "task_arithmetic-normalize": ("task_arithmetic", {"normalize": True}, WEIGHTS, None),
    "ties": (
        "ties",
        {},
        [{"weight": 0.7, "density": 0.2}, {"weight": 0.5, "density": 0.5}, {"weight": 1.0, "density": 0.8}],
        {},
    ),
    "ties-density0.2": ("ties", {"density": 0.2, "weight": 1.0}, [{}, {}, {}], None),
    "breadcrumbs": ("breadcrumbs", {"density": 0.5, "gamma": 0.05}, WEIGHTS, None),
    "breadcrumbs_ties": ("breadcrumbs_ties", {"density": 0.3, "gamma": 0.01}, WEIGHTS, None),
    "model_stock": ("model_stock", {}, [{}, {}, {}], {}),
    "slerp": ("slerp", {"t": 0.3}, [{}], {}),
    "slerp-slices": (
        "slerp",
        {"t": [{"filter": "self_attn", "value": [0.1, 0.9]}, {"filter": "mlp", "value": [0.8, 0.25]}, {"value": 0.6}]},
        [{}],
        {},
    ),
    "slerp-filters-gradients": (
        "slerp",
        {
            "t": [
                {"filter": "self_attn", "value": [0.1, 0.9]},
                {"filter": "mlp", "value": [0.8, 0.25]},
                {"value": 0.6},
            ]
        },
        [{}],
        {},
    ),
    "task_arithmetic-slices": ("task_arithmetic", {"lambda": 0.8}, WEIGHTS, {}),
    "task_arithmetic-gradients": (
        "task_arithmetic",
        {"lambda": [{"filter": "mlp", "value": [0.5, 1.5]}, {"value": 0.9}]},
        [{"weight": [0.2, 1.0]}, {"weight": [{"filter": "self_attn", "value": 2.0}, {"value": 0.7}]}, {"weight": 1.0}],
        {},
    ),
    # More values than the family's two layers: mergekit interpolates over the whole list.
    "task_arithmetic-gradients-longer-than-the-layers": (
        "task_arithmetic",
        {"lambda": [0.5, 1.5, 0.7, 1.2, 0.9]},
        [{"weight": [0.2, 1.0, 0.4, 0.8, 1.1, 0.3]}, {"weight": 0.5}, {"weight": [1.0, 0.6, 0.2]}],
        {},
    ),
    "ties-gradients": (
        "ties",
        {"lambda": [0.7, 1.1]},
        [
            {"weight": [{"filter": "mlp", "value": [1.0, 0.3]}, {"value": 0.6}], "density": 0.2},
            {"weight": 0.5, "density": 0.5},
            {"weight": [0.4, 1.2], "density": 0.8},
        ],
        {},
    ),
    "ties-density-gradients": (
        "ties",
        {},
        [
            {"weight": 0.7, "density": [0.1, 0.6]},
            {"weight": 0.5, "density": [{"filter": "mlp", "value": 0.3}, {"value": 0.7}]},
            {"weight": 1.0, "density": 0.8},
        ],
        {},
    ),
    "breadcrumbs-gradients": (
        "breadcrumbs",
        {"density": [0.4, 0.7], "gamma": [{"filter": "self_attn", "value": 0.1}, {"value": 0.02}]},
        WEIGHTS,
        None,
    ),
    # task vectors N(0, 0.01) on 55 % of the third agent's elements: t takes some whole, cuts the others to t
    "nearswap": ("nearswap", {"t": 0.005}, [None, None, {}], {}),
    "nearswap-filters-gradients": (
        "nearswap",
        {
            "t": [
                {"filter": "self_attn", "value": [0.001, 0.02]},
                {"filter": "mlp", "value": [0.008, 0.002]},
                {"value": 0.004},
            ]
        },
        [None, None, {}],
        {},
    ),
    "sce": ("sce", {}, [{}, {}, {}], {}),
    "nuslerp": ("nuslerp", {}, [{"weight": 0.3}, {"weight": 0.9}], None),
    "nuslerp-no-base": ("nuslerp", {}, [{"weight": 1.0}, {"weight": [0.2, 2.0]}], "absent"),
    "nuslerp-rows": ("nuslerp", {"nuslerp_flatten": False}, [{"weight": 0.3}, {"weight": [0.9, 0.2]}], None),
    "nuslerp-columns": (
        "nuslerp",
        {"nuslerp_flatten": False, "nuslerp_row_wise": True},
        [{"weight": 0.3}, {"weight": 0.9}],
        None,
    ),
    "nuslerp-rows-no-base": ("nuslerp", {"nuslerp_flatten": False}, [{"weight": 1.0}, {"weight": 3.0}], "absent"),
    "nuslerp-columns-no-base": (
        "nuslerp",
        {"nuslerp_flatten": False, "nuslerp_row_wise": True},
        [{"weight": [0.2, 2.0]}, {"weight": 1.0}],
        "absent",
    ),
    "multislerp": ("multislerp", {}, WEIGHTS, None),
    "multislerp-no-base": ("multislerp", {"normalize_weights": False}, [{"weight": 0.4}, {"weight": 0.6}], "absent"),
    "karcher": ("karcher", {}, [{}, {}, {}], None),
    "karcher-tol": ("karcher", {"max_iter": 3, "tol": 1e-3}, [{}, {}], "absent"),
}
RANDOM: dict[str, Case] = {
    "dare_linear": ("dare_linear", {"density": 0.5, "weight": 1.0}, [{}, {}, {}], None),
    "dare_ties": ("dare_ties", {"density": 0.5}, WEIGHTS, None),
    "della": ("della", {"density": 0.5, "epsilon": 0.1}, WEIGHTS, None),
    "della_linear": ("della_linear", {"density": 0.4, "epsilon": 0.15, "weight": 1.0}, [{}, {}, {}], None),
}
# Random methods again with one agent (weight 1, no normalisation): what survives of that agent
# and its rescale can be read off the output directly.
SINGLE: dict[str, Case] = {
    f"{m}-single": (m, {"density": 0.5, "weight": 1.0, **({"epsilon": 0.2} if "della" in m else {})}, [{}], None)
    for m in ("dare_linear", "dare_ties", "della", "della_linear")
}
# arcee_fusion, on the float32 family only (mergekit's importance is continuous there): the base
# and one agent, each in turn.
FUSION: dict[str, Case] = {
    f"arcee_fusion-agent{i}": ("arcee_fusion", {}, [None] * i + [{}] + [None] * (2 - i), {}) for i in range(3)
}
# sce's top-k by variance: which of the elements equal to the k-th largest variance are kept is
# up to torch.topk (ramstream keeps the lowest indices), as magnitude trimming's ties.
VARIANCE_CUT: dict[str, Case] = {"sce-select_topk0.3": ("sce", {"select_topk": 0.3}, [{}, {}, {}], {})}
ALL = {**DETERMINISTIC, **RANDOM, **SINGLE, **FUSION, **VARIANCE_CUT}
# Cases written as mergekit's one slice over every layer of each model, as the hub's slerp
# configs are (mergekit turns a models: list into exactly that).
AS_SLICES = {"slerp-slices", "task_arithmetic-slices"}


RAMSTREAM_NAME = {"ramplus_tl": "ram+"}

# mergekit runs the magnitude methods with stable sorts (SORTED); the comparisons with stock
# mergekit read one density and gamma per agent, so cases with per-tensor ones are left out of them
SORTED = {n for n, case in DETERMINISTIC.items() if case[0] in ("ties", "breadcrumbs", "breadcrumbs_ties")}
MAGNITUDE = SORTED - {"ties-density-gradients", "breadcrumbs-gradients"}


@dataclass(frozen=True)
class Runs:
    root: Path
    family: Family
    configs: dict[str, Path]
    mergekit: dict[str, Path]  # magnitude methods: with stable sorts
    stock: dict[str, Path]  # magnitude methods: mergekit as it is
    f32_family: Family  # float32 inputs: no threshold ties
    f32_configs: dict[str, Path]
    f32_stock: dict[str, Path]  # magnitude methods on the float32 family, mergekit as it is


def write_config(path: Path, fam: Family, case: Case, agents: int | None = None, as_slices: bool = False) -> None:
    method, top, per_agent, base_entry = case
    models = []
    if isinstance(base_entry, dict):
        models.append({"model": str(fam.base), **({"parameters": base_entry} if base_entry else {})})
    for agent, params in zip(fam.agents[: agents or len(per_agent)], per_agent, strict=True):
        if params is not None:
            models.append({"model": str(agent), **({"parameters": params} if params else {})})
    doc: dict[str, Any] = {"merge_method": method, "models": models}
    if base_entry == "absent":  # the models alone (nuslerp, multislerp, karcher): the base is the first
        models.insert(0, {"model": str(fam.base), **({"parameters": per_agent[0]} if per_agent[0] else {})})
        models[1:] = [
            {"model": str(agent), **({"parameters": params} if params else {})}
            for agent, params in zip(fam.agents, per_agent[1:], strict=False)
        ]
    elif method != "linear" or base_entry is not None:  # mergekit's linear weighs a base_model as an input
        doc["base_model"] = str(fam.base)
    if top:
        doc["parameters"] = top
    if as_slices:
        layers = [0, SHAPE.layers]
        doc["slices"] = [{"sources": [{**m, "layer_range": layers} for m in doc.pop("models")]}]
    doc.update({"dtype": "float32", "out_dtype": "bfloat16"})
    path.write_text(json.dumps(doc, indent=1))  # JSON is YAML


@pytest.fixture(scope="module")
def runs(tmp_path_factory: pytest.TempPathFactory) -> Runs:
    """The family, one config per case, and mergekit's output for every case (one process)."""
    root = tmp_path_factory.mktemp("parity")
    fam = build_family(root / "family", densities=DENSITIES, shapes=dict(SHAPE.tensors()), seed=3)
    for member in (fam.base, *fam.agents):
        (member / "config.json").write_text(json.dumps(SHAPE.config()))
        (member / "tokenizer.json").unlink()  # a placeholder, not a tokenizer mergekit could load
    configs, outs, stock = {}, {}, {}
    jobs = []
    for name, case in ALL.items():
        if name in FUSION:
            continue
        configs[name] = root / f"{name}.yml"
        write_config(configs[name], fam, case, as_slices=name in AS_SLICES)
        outs[name] = root / "mergekit" / name
        jobs.append((configs[name], outs[name], name in SORTED))
        if name in MAGNITUDE:
            stock[name] = root / "mergekit-stock" / name
            jobs.append((configs[name], stock[name], False))
    f32 = build_family(root / "family-f32", densities=DENSITIES, shapes=dict(SHAPE.tensors()), dtype="F32", seed=5)
    for member in (f32.base, *f32.agents):
        (member / "config.json").write_text(json.dumps(SHAPE.config()))
        (member / "tokenizer.json").unlink()
    f32_configs, f32_stock = {}, {}
    for name in [*sorted(MAGNITUDE | set(VARIANCE_CUT)), *FUSION]:
        f32_configs[name] = root / f"{name}-f32.yml"
        write_config(f32_configs[name], f32, ALL[name])
        f32_stock[name] = root / "mergekit-stock-f32" / name
        jobs.append((f32_configs[name], f32_stock[name], False))
    run_mergekit(jobs, SEED, timeout=1200)
    return Runs(root, fam, configs, outs, stock, f32, f32_configs, f32_stock)


def ramstream_merge(runs: Runs, name: str, *extra: str, out: str | None = None, config: Path | None = None) -> Path:
    """``ramstream merge --config`` with the case's config (or ``config``)."""
    target = runs.root / "ramstream" / (out or name)
    args = ["merge", "--config", str(config or runs.configs[name]), "--out", str(target), "--quiet"]
    args += ["--cache-dir", str(runs.root / "cache"), *extra]
    result = CliRunner().invoke(main, args)
    assert result.exit_code == 0, f"{result.stderr}{result.exception!r}"
    return target


def read_output(directory: Path) -> dict[str, np.ndarray]:
    """name -> raw bf16 bits of an output directory (sharded with an index, or one file)."""
    if (directory / "model.safetensors.index.json").is_file():
        tensors = read_model_dir(directory)
    else:
        tensors = read_safetensors(directory / "model.safetensors")
    out = {}
    for name, (dtype, _shape, raw) in tensors.items():
        assert dtype == "BF16", (directory, name, dtype)
        out[name] = raw
    return out


def ordered(bits: np.ndarray) -> np.ndarray:
    """bf16 bit patterns as integers whose differences count ulps (-0 and +0 both 0)."""
    b = bits.astype(np.int64)
    return np.where(b & 0x8000, -(b & 0x7FFF), b)


@dataclass(frozen=True)
class Comparison:
    total: int
    identical: int
    max_ulp: int  # over the differing elements that are not cancellations
    cancellations: int  # differing elements whose exact value is ~0 (see ``compare``)
    per_tensor: dict[str, int]

    @property
    def share(self) -> float:
        return self.identical / self.total

    def line(self, name: str) -> str:
        tensors = ", ".join(f"{t} {n}" for t, n in sorted(self.per_tensor.items(), key=lambda x: -x[1])[:6])
        return (
            f"{name}: {self.identical}/{self.total} identical ({100 * self.share:.4f} %), "
            f"{self.total - self.identical} differ, max {self.max_ulp} ulp"
            + (f", {self.cancellations} near-zero cancellations" if self.cancellations else "")
            + (f" [{tensors}]" if tensors else "")
        )


def compare(ours: dict[str, np.ndarray], theirs: dict[str, np.ndarray], fam: Family | None = None) -> Comparison:
    """Element by element. With the family, a differing element whose two values lie within a
    float32 rounding of its operands (|base| + sum |tau|) counts as a cancellation, not in ulps:
    where the exact merged value is 0, one float32 order of operations gives 0 and another a
    residue like 2**-33, which bf16 ulps near zero (tiny) would count as thousands."""
    assert set(ours) == set(theirs)
    total = identical = max_ulp = cancellations = 0
    per_tensor = {}
    for name in sorted(ours):
        a, b = ours[name], theirs[name]
        assert a.shape == b.shape, name
        same = a == b
        total += a.size
        identical += int(same.sum())
        if same.all():
            continue
        per_tensor[name] = int((~same).sum())
        ulps = np.abs(ordered(a) - ordered(b))
        if fam is not None:
            base = fam.base_values[name].astype(np.float32).ravel()
            scale = np.abs(base) + sum(np.abs(v[name].astype(np.float32).ravel() - base) for v in fam.agent_values)
            tiny = np.abs(bf16_to_f32(a) - bf16_to_f32(b)) <= np.float32(2.0**-22) * scale
            cancelled = ~same & tiny & (ulps > 1)
            cancellations += int(cancelled.sum())
            ulps = np.where(cancelled, 0, ulps)
        max_ulp = max(max_ulp, int(ulps.max()))
    return Comparison(total, identical, max_ulp, cancellations, per_tensor)


def need(name: str) -> str:
    method = RAMSTREAM_NAME.get(ALL[name][0], ALL[name][0])
    if method not in method_names():
        pytest.skip(f"ramstream has no method {method!r} yet")
    return method


@pytest.mark.parametrize("name", list(DETERMINISTIC))
def test_deterministic_method_matches_mergekit(runs: Runs, name: str, record_property: Any) -> None:
    need(name)
    result = compare(read_output(ramstream_merge(runs, name)), read_output(runs.mergekit[name]), runs.family)
    print("\n" + result.line(name))
    record_property("parity", result.line(name))
    if name in FLOAT32_ITERATES:  # see test_spherical_means_differ_where_mergekit_rounds_in_float32
        assert result.share >= 0.9995, result.line(name)
        return
    assert result.share >= MIN_IDENTICAL, result.line(name)
    assert result.max_ulp <= 1, result.line(name)


# mergekit computes multislerp's and karcher's intermediate vectors (unit vectors, means,
# tangents) as float32 tensors, each rounded per element; ramstream computes their coefficients in
# float64 from exact sums and rounds once. Where the two outputs differ, ramstream's is the float64
# result rounded (checked against tests/reference_sphere.py) and mergekit's is not.
FLOAT32_ITERATES = {"multislerp": [0, 1, 2], "karcher": [-1, 0, 1, 2]}


@pytest.mark.parametrize("name", sorted(FLOAT32_ITERATES))
def test_spherical_means_differ_where_mergekit_rounds_in_float32(runs: Runs, name: str) -> None:
    need(name)
    ours = read_output(ramstream_merge(runs, name))
    theirs = read_output(runs.mergekit[name])
    fam = runs.family
    differ = ours_exact = exact_total = total = 0
    for tensor, raw in ours.items():
        base = fam.base_values[tensor].astype(np.float64).ravel()
        inputs = [
            base if m < 0 else fam.agent_values[m][tensor].astype(np.float64).ravel() for m in FLOAT32_ITERATES[name]
        ]
        if name == "karcher":
            exact = reference_sphere.karcher(inputs)
        else:
            exact = base + reference_sphere.multislerp([v - base for v in inputs], [0.7, 0.5, 1.0])
        want = f32_to_bf16(exact.astype(np.float32))
        apart = raw != theirs[tensor]
        differ += int(apart.sum())
        ours_exact += int((raw[apart] == want[apart]).sum())
        exact_total += int((raw == want).sum())
        total += raw.size
    print(
        f"\n{name}: {differ} differ from mergekit, {ours_exact} of them ours = float64 reference; "
        f"ours = reference on {exact_total}/{total}"
    )
    assert exact_total / total >= MIN_IDENTICAL
    assert ours_exact >= 0.9 * differ


def boundary_values(method: str, tau_abs: np.ndarray, density: float, gamma: float) -> list[float]:
    """The |tau| values at which a sort's order of equal elements decides what is kept: those of a
    cut that falls inside a run of equal values (zeros excluded: dropping a zero changes nothing)."""
    if density >= 1:
        return []
    a = np.sort(tau_abs.ravel())
    n = a.size
    if method == "ties":
        cuts = [n - max(1, int(density * n))]
    else:
        target = int(density * n)
        bottom = max(0, n - target - int(gamma * n))
        cuts = [bottom, bottom + target]
    return [float(a[c]) for c in cuts if 0 < c < n and a[c - 1] == a[c] and a[c] != 0]


def at_a_tie(fam: Family, name: str, tensor: str, index: np.ndarray) -> np.ndarray:
    """Which of ``index`` (flat positions in ``tensor``) hold some agent's value equal to one of its
    threshold values."""
    method, top, per_agent, _ = ALL[name]
    hit = np.zeros(index.size, bool)
    base = fam.base_values[tensor].astype(np.float32).ravel()
    for t, params in enumerate(per_agent):
        if params is None:
            continue
        tau = np.abs(fam.agent_values[t][tensor].astype(np.float32).ravel() - base)
        density = float(params.get("density", top.get("density", 1.0)))
        gamma = float(params.get("gamma", top.get("gamma", 0.01)))
        for v in boundary_values(method, tau, density, gamma):
            hit |= tau[index] == np.float32(v)
    return hit


@pytest.mark.parametrize("name", sorted(MAGNITUDE))
def test_magnitude_method_differs_from_stock_mergekit_only_at_threshold_ties(
    runs: Runs, name: str, record_property: Any
) -> None:
    need(name)
    ours = read_output(ramstream_merge(runs, name))
    theirs = read_output(runs.stock[name])
    result = compare(ours, theirs)
    explained = tied = 0
    for tensor in result.per_tensor:
        index = np.flatnonzero(ours[tensor] != theirs[tensor])
        explained += int(at_a_tie(runs.family, name, tensor, index).sum())
    for tensor in ours:
        tied += int(at_a_tie(runs.family, name, tensor, np.arange(ours[tensor].size)).sum())
    differ = result.total - result.identical
    line = result.line(name + " vs stock mergekit") + f"; {explained} of them at a threshold tie ({tied} tied elements)"
    print("\n" + line)
    record_property("parity-stock", line)
    assert explained == differ, line


@pytest.mark.parametrize("name", sorted(MAGNITUDE))
def test_magnitude_method_matches_stock_mergekit_on_float32_inputs(runs: Runs, name: str, record_property: Any) -> None:
    """With continuous task vectors equal values at a threshold are rare (float32 still has a
    few): unmodified mergekit and ramstream agree on >= 99.99 % of the elements, and every
    difference of more than one ulp is at one of those rare threshold ties."""
    need(name)
    ours = read_output(ramstream_merge(runs, name, out=f"{name}-f32", config=runs.f32_configs[name]))
    theirs = read_output(runs.f32_stock[name])
    result = compare(ours, theirs, runs.f32_family)
    unexplained = 0
    for tensor in result.per_tensor:
        index = np.flatnonzero(np.abs(ordered(ours[tensor]) - ordered(theirs[tensor])) > 1)
        unexplained += int((~at_a_tie(runs.f32_family, name, tensor, index)).sum())
    line = result.line(name + " vs stock mergekit, float32 inputs") + f"; {unexplained} over 1 ulp not at a tie"
    print("\n" + line)
    record_property("parity-stock-f32", line)
    assert result.share >= MIN_IDENTICAL, line
    assert unexplained == 0, line


@pytest.mark.parametrize("name", list(FUSION))
def test_arcee_fusion_differs_from_mergekit_only_where_its_float32_kl_rounds(
    runs: Runs, name: str, record_property: Any
) -> None:
    """mergekit computes each row's KL in float32 (softmaxes, logs, sums): for rows as near the
    base's as fine-tuned ones, the rounding of the softmax normalisations alone moves KL by
    ~1e-7 absolute, 0.1-1 % of it. ramstream's KL is the float64 one rounded once. With mergekit's
    own importance (its ``_compute_importance``, torch float32) the dense reference gives
    mergekit's bytes, with ramstream's (float64 KL) ramstream's: the KL is the only difference.
    Every element that differs lies within 2 % of its threshold, or in a row whose float32 KL
    came out negative (rows barely changed: the exact KL, >= 0, is below its rounding error), which
    mergekit then drops under a threshold of 0 (most importances 0) and ramstream keeps."""
    need(name)
    import torch
    from mergekit.merge_methods.arcee_fusion import _compute_importance

    ours = read_output(ramstream_merge(runs, name, out=f"{name}-f32", config=runs.f32_configs[name]))
    theirs = read_output(runs.f32_stock[name])
    result = compare(ours, theirs, runs.f32_family)
    fam, agent = runs.f32_family, int(name[-1])
    far = negative = 0
    for tensor in ours:
        shape = dict(SHAPE.tensors())[tensor]
        a = fam.base_values[tensor].astype(np.float32).reshape(shape)
        b = fam.agent_values[agent][tensor].astype(np.float32).reshape(shape)
        mine = reference_fusion.importance(a, b, reference_fusion.row_kl(a, b))
        their = _compute_importance(torch.from_numpy(b), torch.from_numpy(a)).numpy()
        assert np.array_equal(f32_to_bf16(reference_fusion.fusion(a, b, mine).ravel()), ours[tensor]), tensor
        assert np.array_equal(f32_to_bf16(reference_fusion.fusion(a, b, their).ravel()), theirs[tensor]), tensor
        differ = ours[tensor] != theirs[tensor]
        negative += int((their.ravel()[differ] < 0).sum())
        limit = reference_fusion.threshold(mine)
        near = np.abs(mine.ravel()[differ] - limit) <= np.float32(0.02) * limit
        far += int((~near & (their.ravel()[differ] >= 0)).sum())
    line = result.line(name + " vs mergekit, float32 inputs") + (
        f"; {negative} where mergekit's float32 KL is negative, {far} others over 2 % from the threshold"
    )
    print("\n" + line)
    record_property("parity-fusion", line)
    assert result.share >= 0.999 and far == 0, line


def at_a_variance_tie(fam: Family, name: str, tensor: str, index: np.ndarray) -> np.ndarray:
    """Which of ``index`` a tie at the cut explains: in a tensor whose cut splits a group of equal
    variances (mergekit's k), the elements of that group (kept or not), and those where two agents
    or more changed (the weights come from the kept squares, which then differ)."""
    topk = ALL[name][1]["select_topk"]
    base = fam.base_values[tensor].astype(np.float32).ravel()
    taus = np.stack([v[tensor].astype(np.float32).ravel() - base for v in fam.agent_values])
    var = reference_sce.welford_variance(taus)
    k = int(np.float32(np.float32(np.count_nonzero(var)) * np.float32(topk)))
    if k == 0:
        return np.zeros(index.size, bool)
    threshold = np.sort(var)[::-1][k - 1]
    if not (var > threshold).sum() < k < (var >= threshold).sum():
        return np.zeros(index.size, bool)
    return (var[index] == threshold) | ((taus[:, index] != 0).sum(axis=0) >= 2)


@pytest.mark.parametrize("name", sorted(VARIANCE_CUT))
@pytest.mark.parametrize("family", ["bf16", "f32"])
def test_sce_top_k_differs_from_mergekit_only_at_variance_ties(
    runs: Runs, name: str, family: str, record_property: Any
) -> None:
    """Every difference of more than one ulp lies in a tensor whose cut splits a group of equal
    variances, at that group or where the weights (from the kept squares, which then differ) mix
    two agents or more. bf16 task vectors hold many equal variances; on the float32 family the two
    agree on >= 99.99 % of the elements."""
    need(name)
    fam, config, theirs_dir = runs.family, runs.configs[name], runs.mergekit[name]
    if family == "f32":
        fam, config, theirs_dir = runs.f32_family, runs.f32_configs[name], runs.f32_stock[name]
    ours = read_output(ramstream_merge(runs, name, out=f"{name}-{family}", config=config))
    theirs = read_output(theirs_dir)
    result = compare(ours, theirs, fam)
    unexplained = 0
    for tensor in result.per_tensor:
        index = np.flatnonzero(np.abs(ordered(ours[tensor]) - ordered(theirs[tensor])) > 1)
        unexplained += int((~at_a_variance_tie(fam, name, tensor, index)).sum())
    line = result.line(f"{name} ({family} family)") + f"; {unexplained} over 1 ulp not at a variance tie"
    print("\n" + line)
    record_property("parity-variance", line)
    assert unexplained == 0, line
    if family == "f32":
        assert result.share >= MIN_IDENTICAL, line


# -- random methods -------------------------------------------------------------------------


def deltas(fam: Family, out: dict[str, np.ndarray]) -> dict[str, np.ndarray]:
    """Each tensor's merged task vector: f32(output) - f32(base)."""
    return {n: bf16_to_f32(raw) - fam.base_values[n].astype(np.float32) for n, raw in out.items()}


def changed_share(fam: Family, delta: dict[str, np.ndarray]) -> tuple[int, int]:
    """(elements changed by the merge, elements some agent changed)."""
    changed = active = 0
    for name, d in delta.items():
        touched = np.zeros(d.size, bool)
        for agent in fam.agent_values:
            touched |= agent[name].astype(np.float32) != fam.base_values[name]
        changed += int((d != 0)[touched].sum())
        active += int(touched.sum())
    return changed, active


def binomial_close(k1: int, n1: int, k2: int, n2: int, sigmas: float = 6.0) -> bool:
    p = (k1 + k2) / (n1 + n2)
    return abs(k1 / n1 - k2 / n2) <= sigmas * np.sqrt(p * (1 - p) * (1 / n1 + 1 / n2)) + 1e-12


@pytest.mark.parametrize("name", list(RANDOM))
def test_random_method_agrees_with_mergekit_in_distribution(runs: Runs, name: str, record_property: Any) -> None:
    need(name)
    fam = runs.family
    ours = deltas(fam, read_output(ramstream_merge(runs, name, "--seed", str(SEED))))
    theirs = deltas(fam, read_output(runs.mergekit[name]))
    k1, n1 = changed_share(fam, ours)
    k2, n2 = changed_share(fam, theirs)
    l1_ours = sum(float(np.abs(d).astype(np.float64).sum()) for d in ours.values())
    l1_theirs = sum(float(np.abs(d).astype(np.float64).sum()) for d in theirs.values())
    line = (
        f"{name}: changed {k1 / n1:.4f} of the touched elements (mergekit {k2 / n2:.4f}); "
        f"L1 of the merged task vector {l1_ours:.4f} (mergekit {l1_theirs:.4f}, ratio {l1_ours / l1_theirs:.4f})"
    )
    print("\n" + line)
    record_property("parity", line)
    assert binomial_close(k1, n1, k2, n2), line
    assert abs(l1_ours / l1_theirs - 1) < 0.02, line


@pytest.mark.parametrize("name", list(SINGLE))
def test_random_method_keeps_and_rescales_like_mergekit(runs: Runs, name: str, record_property: Any) -> None:
    """One agent, weight 1: the output's task vector is that agent's survivors, rescaled."""
    need(name)
    fam = runs.family
    density = ALL[name][1]["density"]
    ours = deltas(fam, read_output(ramstream_merge(runs, name, "--seed", str(SEED))))
    theirs = deltas(fam, read_output(runs.mergekit[name]))
    lines = []
    for label, delta in (("ramstream", ours), ("mergekit", theirs)):
        kept = active = 0
        ratios = []
        for tensor, d in delta.items():
            tau = fam.agent_values[0][tensor].astype(np.float32) - fam.base_values[tensor]
            touched = tau != 0
            kept += int((d != 0)[touched].sum())
            active += int(touched.sum())
            if touched.sum() >= 2000:  # the L1 rescale restores each tensor's L1 mass (up to bf16 rounding)
                ratios.append(float(np.abs(d).sum(dtype=np.float64) / np.abs(tau).sum(dtype=np.float64)))
        lines.append((label, kept, active, min(ratios), max(ratios)))
    text = "; ".join(f"{lb}: kept {k / n:.4f} of {n}, L1 ratio {lo:.4f}..{hi:.4f}" for lb, k, n, lo, hi in lines)
    print(f"\n{name} (density {density}): {text}")
    record_property("parity", text)
    (_, k1, n1, lo1, hi1), (_, k2, n2, lo2, hi2) = lines
    assert binomial_close(k1, n1, k2, n2), text
    if "dare" in name:  # DARE keeps each element with probability density, whatever its magnitude
        assert binomial_close(k1, n1, round(density * n1), n1), text
    for lo, hi in ((lo1, hi1), (lo2, hi2)):
        assert 0.97 < lo <= hi < 1.03, text


def test_random_methods_are_deterministic_in_ramstream(runs: Runs) -> None:
    """Same seed: the same bytes whatever the block size and threads; another seed: other bytes."""
    name = "dare_ties"
    need(name)
    first = read_output(ramstream_merge(runs, name, "--seed", "11", out="det-a"))
    again = read_output(ramstream_merge(runs, name, "--seed", "11", "--memory", "16MiB", "--threads", "1", out="det-b"))
    other = read_output(ramstream_merge(runs, name, "--seed", "12", out="det-c"))
    assert all(np.array_equal(first[n], again[n]) for n in first)
    assert not all(np.array_equal(first[n], other[n]) for n in first)
