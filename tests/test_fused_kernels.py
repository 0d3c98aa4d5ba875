"""The fused Triton kernels of the torch backend (``backends/torch/fused``), without a GPU.

Their arithmetic runs under triton's interpreter on CPU tensors (``tests/fused_checks.py``, each
check in a fresh process with ``TRITON_INTERPRET=1``): the codecs on every BF16/F16 pattern and on
hard float32 patterns, the RAM merge and the probe on tiles of a base and three agents against a
naive twin of the Numba kernels (the GTA kernel against the torch-op twin), merges through the API
with the Numba backend's bytes, and the streamed loop on a simulated device with late copies.
Every kernel is compiled for sm_90 here too, and its PTX must hold no fused multiply-add, no
approximate or "full" division and no flushed subnormals: the instructions whose rounding would
differ from the Numba kernels'. Skipped where triton is not installed.
"""

from __future__ import annotations

import re
from pathlib import Path
from typing import Any

import pytest

pytest.importorskip("torch")
triton = pytest.importorskip("triton")

from triton.backends.compiler import GPUTarget  # noqa: E402
from triton.compiler import ASTSource  # noqa: E402

from ramstream.backends.base import HIGH_BINS, LOW_BINS  # noqa: E402
from ramstream.backends.torch.fused import (  # noqa: E402
    agreement,
    della,
    fusion,
    gta,
    linear,
    magnitude,
    nearswap,
    probe,
    ram,
    sce,
    sums,
    vector_gram,
    vectors,
)
from ramstream.format.dtypes import TAU32, FloatCode  # noqa: E402

ROOT = Path(__file__).resolve().parent.parent
CODES = [int(c) for c in FloatCode]


@pytest.mark.parametrize(
    "check",
    [
        "codecs", "ram_tiles", "probe_tiles", "gta_tiles", "histogram_tiles", "linear_tiles", "vectors_tiles", "fusion",
        "agreement_merges",
    ],
)  # fmt: skip
def test_the_kernels_give_the_numba_bytes_under_the_interpreter(check: str, interpreted: dict[str, str]) -> None:
    """The tiles' arithmetic (and arcee_fusion's and the agreement's passes through the API); the
    other merges through the API are in test_fused_merges.py and test_fused_gta_merges.py (a file
    each, so that they run beside these)."""
    assert interpreted[check] == "ok", interpreted[check]


# -- the generated code -----------------------------------------------------------------------
SM90 = GPUTarget("cuda", 90, 32)
# what would round differently from one IEEE float32 operation at a time: a fused multiply-add,
# an approximate or "full" (2 ulp) division or reciprocal, subnormals flushed to zero
FORBIDDEN = re.compile(r"\b(fma\.\S+|div\.(?:full|approx)\.\S+|rcp\.approx\S*|\S+\.ftz\S*)")

RAM_SIGNATURE = {"base": "*u8", "agents_at": "i64", "agent_stride": "i64", "m": "i32", "lo": "i64", "eps": "fp32",
                 "lambdas": "*fp32", "out_stride": "i64", "state": "*i64"}  # fmt: skip
OUT_POINTER = {FloatCode.BF16: "*i16", FloatCode.F16: "*i16", FloatCode.F32: "*fp32", FloatCode.F64: "*fp64"}
PROBE_SIGNATURE = {
    "base": "*u8", "agents_at": "i64", "agent_stride": "i64", "m": "i32", "lo": "i64", "eps": "fp32",
    "masks": "*u8", "mask_stride": "i64", "overlap": "*i64", "coverage": "*i64", "first": "*i64",
}  # fmt: skip


def _ptx(fn: Any, signature: dict[str, str], constexprs: dict[str, Any]) -> str:
    source = ASTSource(fn=fn, signature={**signature, **dict.fromkeys(constexprs, "constexpr")}, constexprs=constexprs)
    return str(triton.compile(source, target=SM90, options=ram.EXACT).asm["ptx"])


def test_every_launch_compiles_with_the_checked_options() -> None:
    """The PTX checked here is the PTX launched: every kernel launch in ``fused/`` passes the
    options these checks compile with (triton's defaults contract ``a * b + c`` into ``fma``)."""
    assert ram.EXACT == {"enable_fp_fusion": False}
    folder = ROOT / "ramstream" / "backends" / "torch" / "fused"
    launches = 0
    for path in sorted(folder.glob("*.py")):
        for call in re.findall(r"(?m)^ +\w+\[[^\n]*\]\(\n((?:.*\n)*?) +\)  # fmt: skip", path.read_text()):
            launches += 1
            assert "**EXACT" in call, f"{path.name}: a launch without **EXACT"
    assert launches >= 18  # probe, RAM, GTA, both histograms, the tie search, linear, per-vector, sums, Gram, SCE,
    # DELLA's two, NearSwap, arcee_fusion, agreement, per-vector Gram, the cuts' keep mask


RAM_CASES = [(c, c, c) for c in CODES] + [
    (FloatCode.BF16, TAU32, FloatCode.BF16),
    (FloatCode.F16, FloatCode.F16, FloatCode.F32),
]


@pytest.mark.parametrize(("base", "agent", "out"), RAM_CASES)
def test_the_ram_kernel_compiles_for_sm90_without_contraction_or_approximate_division(
    base: int, agent: int, out: int
) -> None:
    signature = {**RAM_SIGNATURE, "out": OUT_POINTER[FloatCode(out)]}
    constexprs = {"N_AGENTS": 3, "BASE": base, "AGENT": agent, "OUT": out, "BLOCK": ram.BLOCK}
    ptx = _ptx(ram.ram_tile, signature, constexprs)
    assert FORBIDDEN.findall(ptx) == []
    assert "div.rn.f32" in ptx and "mul.rn.f32" in ptx  # the mean's IEEE division, lambda * tau


@pytest.mark.parametrize("code", [*CODES, TAU32])
def test_the_probe_kernel_compiles_for_sm90_without_approximations(code: int) -> None:
    base = FloatCode.F32 if code == TAU32 else code
    ptx = _ptx(probe.probe_tile, PROBE_SIGNATURE, {"N_AGENTS": 3, "BASE": base, "AGENT": code, "BLOCK": probe.BLOCK})
    assert FORBIDDEN.findall(ptx) == []
    assert "atom.global" in ptx  # the counts and the first position: integer atomics


GTA_SIGNATURE = {
    "base": "*u8", "agents_at": "i64", "agent_stride": "i64", "m": "i32", "lo": "i64", "weights": "*fp32",
    "scale": "*fp32", "cut_value": "*i64", "cut_range": "*i64", "keys": "*i64", "density": "*fp32", "start": "i64",
    "keep": "*fp32", "keep_stride": "i64", "total_weight": "*fp32", "lams": "*fp32",
    "out_stride": "i64", "state": "*i64",
}  # fmt: skip
GTA_CASES = [
    (FloatCode.BF16, FloatCode.BF16, gta.KEEP_CUTS, 1, True),
    (FloatCode.BF16, TAU32, gta.KEEP_ALL, 0, False),
    (FloatCode.F16, FloatCode.F16, gta.KEEP_ALL, 1, True),
    (FloatCode.BF16, FloatCode.BF16, gta.KEEP_RANDOM, 1, False),
    (FloatCode.F32, FloatCode.F32, gta.KEEP_RANDOM, 0, True),
    (FloatCode.F32, FloatCode.F32, gta.KEEP_CUTS, 0, True),
    (FloatCode.F64, FloatCode.F64, gta.KEEP_CUTS, 1, False),
    (FloatCode.BF16, FloatCode.BF16, gta.KEEP_MULTIPLIERS, 1, True),
    (FloatCode.F32, TAU32, gta.KEEP_MULTIPLIERS, 0, False),
]


@pytest.mark.parametrize(("base", "agent", "keep", "consensus", "normalize"), GTA_CASES)
def test_the_gta_kernel_compiles_for_sm90_without_contraction_or_approximate_division(
    base: int, agent: int, keep: int, consensus: int, normalize: bool
) -> None:
    signature = {**GTA_SIGNATURE, "out": OUT_POINTER[FloatCode(base)]}
    constexprs = {"N_AGENTS": 3, "BASE": base, "AGENT": agent, "OUT": base, "KEEP": int(keep),
                  "CONSENSUS": consensus, "NORMALIZE": normalize, "BLOCK": gta.BLOCK}  # fmt: skip
    ptx = _ptx(gta.gta_tile, signature, constexprs)
    assert FORBIDDEN.findall(ptx) == []
    assert "mul.rn.f32" in ptx and ("div.rn.f32" in ptx) == normalize


HISTOGRAM_SIGNATURE = {
    "base": "*u8", "agents_at": "i64", "agent_stride": "i64", "m": "i32", "lo": "i64", "scale": "*fp32",
    "row_len": "i64", "row_offset": "i64", "counts": "*i32",
}  # fmt: skip
HISTOGRAM_CASES = [(c, int(magnitude.KEY_ABS)) for c in [*CODES, TAU32]] + [
    (c, int(magnitude.KEY_IMPORTANCE)) for c in (FloatCode.BF16, TAU32)
]


@pytest.mark.parametrize(("code", "key"), HISTOGRAM_CASES)
def test_the_histogram_kernels_compile_for_sm90_with_native_atomics(code: int, key: int) -> None:
    """Integer reductions in the memory system (``red``/``atom`` add), never a compare-and-swap
    loop; and, as every kernel (the tie search's too), no approximation. Of |tau| (three agents)
    and of arcee_fusion's importance (one)."""
    base = FloatCode.F32 if code == TAU32 else code
    agents = 3 if key == magnitude.KEY_ABS else 1
    shared = {"N_AGENTS": agents, "BASE": base, "AGENT": code, "KEY": key, "BLOCK": magnitude.BLOCK}
    high = _ptx(magnitude.high_tile, HISTOGRAM_SIGNATURE, {**shared, "HIGH": HIGH_BINS})
    low_signature = {**HISTOGRAM_SIGNATURE, "targets": "*i32"}
    low_signature["counts"] = low_signature.pop("counts")  # after targets, as the kernel takes them
    low = _ptx(magnitude.low_tile, low_signature, {**shared, "N_CUTS": 2, "LOW": LOW_BINS})
    tie_signature = {"base": "*u8", "agents_at": "i64", "agent_stride": "i64", "m": "i32", "rows": "*i32",
                     "values": "*i64", "ties": "*u8"}  # fmt: skip
    ties = _ptx(magnitude.tie_tile, tie_signature, {"BASE": base, "AGENT": code, "BLOCK": magnitude.BLOCK})
    assert FORBIDDEN.findall(ties) == []
    for ptx in (high, low):
        assert FORBIDDEN.findall(ptx) == []
        assert re.search(r"\b(?:red|atom)\.global\S*\.relaxed\.add\.[su]32", ptx), "no native integer atomic add"
        assert ".cas" not in ptx
        assert key == magnitude.KEY_ABS or "mul.rn.f32" in ptx  # the importance: |d| times its row's factor


LINEAR_SIGNATURE = {
    "base": "*u8", "agents_at": "i64", "agent_stride": "i64", "m": "i32", "lo": "i64", "weights": "*fp32",
    "base_weight": "fp32", "divisor": "fp32",
}  # fmt: skip
LINEAR_CASES = [(c, c, c, True, True) for c in CODES] + [
    (FloatCode.BF16, TAU32, FloatCode.BF16, False, True),
    (FloatCode.F16, FloatCode.F16, FloatCode.F32, True, False),
    (FloatCode.F32, FloatCode.F32, FloatCode.BF16, False, False),
]


@pytest.mark.parametrize(("base", "agent", "out", "uses_base", "normalize"), LINEAR_CASES)
def test_the_linear_kernel_compiles_for_sm90_without_contraction_or_approximate_division(
    base: int, agent: int, out: int, uses_base: bool, normalize: bool
) -> None:
    signature = {**LINEAR_SIGNATURE, "out": OUT_POINTER[FloatCode(out)], "state": "*i64"}
    constexprs = {"N_AGENTS": 3, "BASE": base, "AGENT": agent, "OUT": out, "USES_BASE": uses_base,
                  "NORMALIZE": normalize, "BLOCK": linear.BLOCK}  # fmt: skip
    ptx = _ptx(linear.linear_tile, signature, constexprs)
    assert FORBIDDEN.findall(ptx) == []
    assert "mul.rn.f32" in ptx and ("div.rn.f32" in ptx) == normalize


VECTORS_SIGNATURE = {
    "base": "*u8", "agents_at": "i64", "agent_stride": "i64", "m": "i32", "lo": "i64", "start": "i64", "div": "i64",
    "mod": "i64", "coefs": "*fp32", "coef_stride": "i64",
}  # fmt: skip


@pytest.mark.parametrize(("code", "weights"), [(c, w) for c in [*CODES, TAU32] for w in (True, False)])
def test_the_vectors_kernel_compiles_for_sm90_without_contraction(code: int, weights: bool) -> None:
    base = FloatCode.F32 if code == TAU32 else code
    signature = {**VECTORS_SIGNATURE, "out": OUT_POINTER[FloatCode(base)], "state": "*i64"}
    constexprs = {"N_AGENTS": 3, "BASE": base, "AGENT": code, "OUT": base, "WEIGHTS": weights,
                  "BLOCK": vectors.BLOCK}  # fmt: skip
    ptx = _ptx(vectors.vectors_tile, signature, constexprs)
    assert FORBIDDEN.findall(ptx) == []
    assert "mul.rn.f32" in ptx


SUMS_SIGNATURE = {
    "base": "*u8", "agents_at": "i64", "agent_stride": "i64", "keep_at": "i64", "keep_stride": "i64", "m": "i32",
    "lo": "i64", "keys": "*i64", "density": "*fp32", "start": "i64", "acc": "*i64", "first": "*i64",
}  # fmt: skip
SUMS_CASES = [(c, int(sums.KEEP_RANDOM), False) for c in [*CODES, TAU32]] + [
    (FloatCode.BF16, int(sums.KEEP_ARRAY), True),
    (FloatCode.F32, int(sums.KEEP_ARRAY), False),
    (TAU32, int(sums.KEEP_ALL), True),
]


@pytest.mark.parametrize(("code", "keep", "squares"), SUMS_CASES)
def test_the_sums_kernel_compiles_for_sm90_with_float64_adds_and_native_atomics(
    code: int, keep: int, squares: bool
) -> None:
    base = FloatCode.F32 if code == TAU32 else code
    constexprs = {"N_AGENTS": 3, "AGENTS": 4, "BASE": base, "AGENT": code, "KEEP": keep, "SQUARES": squares,
                  "GROUPS": sums.GROUPS}  # fmt: skip
    ptx = _ptx(sums.sums_tile, SUMS_SIGNATURE, constexprs)
    assert FORBIDDEN.findall(ptx) == []
    assert "add.rn.f64" in ptx  # the groups' sums, one IEEE addition at a time
    assert ("mul.rn.f64" in ptx) == squares
    assert re.search(r"\b(?:red|atom)\.global\S*\.relaxed\.add\.[su]64", ptx) and ".cas" not in ptx


SCE_SIGNATURE = {
    "base": "*u8", "agents_at": "i64", "agent_stride": "i64", "m": "i32", "lo": "i64", "weights": "*fp32",
    "cut_value": "*i64", "cut_range": "*i64", "state": "*i64",
}  # fmt: skip


# the codecs of every format are checked in every format with the RAM kernel; a new kernel's own
# arithmetic on a few
@pytest.mark.parametrize(
    ("code", "merge"), [(FloatCode.BF16, True), (FloatCode.F64, True), (TAU32, False), (FloatCode.F16, False)]
)
def test_the_sce_kernel_compiles_for_sm90_without_contraction_or_approximate_division(code: int, merge: bool) -> None:
    """The variance's float64 divisions are IEEE (``div.rn.f64``), and so is the merge's float32 one."""
    base = FloatCode.F32 if code == TAU32 else code
    out = base if merge else FloatCode.F32
    signature = {**SCE_SIGNATURE, "out": OUT_POINTER[FloatCode(out)]}
    constexprs = {"N_AGENTS": 3, "BASE": base, "AGENT": code, "OUT": out, "MERGE": merge, "BLOCK": sce.BLOCK}
    ptx = _ptx(sce.sce_tile, signature, constexprs)
    assert FORBIDDEN.findall(ptx) == []
    assert "div.rn.f64" in ptx and "mul.rn.f64" in ptx
    assert ("div.rn.f32" in ptx) == merge


DELLA_KEYS_SIGNATURE = {"base": "*u8", "agents_at": "i64", "agent_stride": "i64", "m": "i32", "rows": "i32",
                        "inner": "i32", "keys": "*i64"}  # fmt: skip
DELLA_KEEP_SIGNATURE = {
    "ordered": "*i64", "m": "i32", "rows": "i32", "inner": "i32", "start": "i64", "draw_keys": "*i64", "mode": "*i64",
    "lo_p": "*fp32", "width": "*fp32", "keep": "*fp32",
}  # fmt: skip


@pytest.mark.parametrize("code", [FloatCode.BF16, TAU32])
def test_the_della_keys_kernel_compiles_for_sm90(code: int) -> None:
    base = FloatCode.F32 if code == TAU32 else code
    ptx = _ptx(della.keys_tile, DELLA_KEYS_SIGNATURE, {"BASE": base, "AGENT": code, "BLOCK": della.BLOCK})
    assert FORBIDDEN.findall(ptx) == []


@pytest.mark.parametrize("inverse", [True, False])
def test_the_della_keep_kernel_compiles_for_sm90_without_contraction_or_approximate_division(inverse: bool) -> None:
    """p = lo + (rank / (rows - 1)) * width, one rounding per op; 1/p an IEEE division."""
    ptx = _ptx(della.keep_tile, DELLA_KEEP_SIGNATURE, {"INVERSE": inverse, "BLOCK": della.BLOCK})
    assert FORBIDDEN.findall(ptx) == []
    assert "div.rn.f32" in ptx and "mul.rn.f32" in ptx and "add.rn.f32" in ptx


GRAM_SIGNATURE = {
    "base": "*u8", "agents_at": "i64", "agent_stride": "i64", "m": "i32", "lo": "i64", "acc": "*i64", "first": "*i64",
}  # fmt: skip


@pytest.mark.parametrize(("code", "weights"), [(FloatCode.BF16, True), (FloatCode.F16, False), (TAU32, True)])
def test_the_gram_kernel_compiles_for_sm90_with_exact_float64_products_and_native_atomics(
    code: int, weights: bool
) -> None:
    base = FloatCode.F32 if code == TAU32 else code
    constexprs = {"N_VECTORS": 3 + weights, "VECTORS": 4, "BASE": base, "AGENT": code, "WEIGHTS": weights,
                  "GROUPS": sums.GROUPS}  # fmt: skip
    ptx = _ptx(sums.gram_tile, GRAM_SIGNATURE, constexprs)
    assert FORBIDDEN.findall(ptx) == []
    assert "mul.rn.f64" in ptx and "add.rn.f64" in ptx
    assert re.search(r"\b(?:red|atom)\.global\S*\.relaxed\.add\.[su]64", ptx) and ".cas" not in ptx


CUT_KEEP_SIGNATURE = {
    "base": "*u8", "agents_at": "i64", "agent_stride": "i64", "m": "i32", "lo": "i64", "cut_value": "*i64",
    "cut_range": "*i64", "keep": "*u8",
}  # fmt: skip


@pytest.mark.parametrize("code", [FloatCode.F16, TAU32])
def test_the_cut_keep_kernel_compiles_for_sm90(code: int) -> None:
    base = FloatCode.F32 if code == TAU32 else code
    constexprs = {"N_AGENTS": 3, "BASE": base, "AGENT": code, "BLOCK": magnitude.BLOCK}
    assert FORBIDDEN.findall(_ptx(magnitude.cut_keep_tile, CUT_KEEP_SIGNATURE, constexprs)) == []


AGREEMENT_SIGNATURE = {
    "base": "*u8", "agents_at": "i64", "agent_stride": "i64", "m": "i32", "eps": "fp32", "acc": "*i64",
    "counts": "*i64",
}  # fmt: skip


@pytest.mark.parametrize(("code", "agents"), [(FloatCode.BF16, 3), (TAU32, 4)])
def test_the_agreement_kernel_compiles_for_sm90_with_native_atomics(code: int, agents: int) -> None:
    """The products are integer arithmetic (no float multiply: BF16 and task vectors decode without
    one); the digits' sums are added with native 64-bit atomics, no compare-and-swap loop."""
    base = FloatCode.F32 if code == TAU32 else code
    constexprs = {"N_AGENTS": agents, "AGENTS": 4, "BASE": base, "AGENT": code, "BLOCK": agreement.BLOCK}
    ptx = _ptx(agreement.agreement_tile, AGREEMENT_SIGNATURE, constexprs)
    assert FORBIDDEN.findall(ptx) == [] and "mul.rn.f" not in ptx
    assert re.search(r"\b(?:red|atom)\.global\S*\.relaxed\.add\.[su]64", ptx) and ".cas" not in ptx


VECTOR_GRAM_SIGNATURE = {
    "base": "*u8", "agents_at": "i64", "agent_stride": "i64", "m": "i32", "lo": "i64", "position": "i64",
    "div": "i64", "mod": "i64", "first_vector": "i64", "acc": "*i64", "first": "*i64",
}  # fmt: skip


@pytest.mark.parametrize(("code", "weights"), [(FloatCode.F16, True), (TAU32, False)])
def test_the_vector_gram_kernel_compiles_for_sm90_with_native_atomics(code: int, weights: bool) -> None:
    base = FloatCode.F32 if code == TAU32 else code
    constexprs = {"N_VECTORS": 2 + weights, "VECTORS": 4, "BASE": base, "AGENT": code, "WEIGHTS": weights,
                  "BLOCK": vector_gram.BLOCK}  # fmt: skip
    ptx = _ptx(vector_gram.vector_gram_tile, VECTOR_GRAM_SIGNATURE, constexprs)
    assert FORBIDDEN.findall(ptx) == []
    assert re.search(r"\b(?:red|atom)\.global\S*\.relaxed\.add\.[su]64", ptx) and ".cas" not in ptx


NEARSWAP_SIGNATURE = {"base": "*u8", "agent_at": "i64", "m": "i32", "lo": "i64", "t": "fp32", "state": "*i64"}


@pytest.mark.parametrize("code", [FloatCode.F16, TAU32])
def test_the_nearswap_kernel_compiles_for_sm90_without_contraction_or_approximate_division(code: int) -> None:
    base = FloatCode.F32 if code == TAU32 else code
    signature = {**NEARSWAP_SIGNATURE, "out": OUT_POINTER[FloatCode(base)]}
    ptx = _ptx(nearswap.nearswap_tile, signature, {"BASE": base, "AGENT": code, "OUT": base, "BLOCK": nearswap.BLOCK})
    assert FORBIDDEN.findall(ptx) == []
    assert "div.rn.f32" in ptx and "mul.rn.f32" in ptx


FUSION_SIGNATURE = {
    "base": "*u8", "agent_at": "i64", "m": "i32", "lo": "i64", "scale": "*fp32", "row_len": "i64", "row_offset": "i64",
    "threshold": "fp32",
}  # fmt: skip


@pytest.mark.parametrize("code", [FloatCode.BF16, TAU32])
def test_the_fusion_kernel_compiles_for_sm90_without_contraction(code: int) -> None:
    base = FloatCode.F32 if code == TAU32 else code
    signature = {**FUSION_SIGNATURE, "out": OUT_POINTER[FloatCode(base)], "state": "*i64"}
    ptx = _ptx(fusion.fusion_tile, signature, {"BASE": base, "AGENT": code, "OUT": base, "BLOCK": fusion.BLOCK})
    assert FORBIDDEN.findall(ptx) == []
    assert "mul.rn.f32" in ptx
