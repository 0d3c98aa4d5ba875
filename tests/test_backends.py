"""The backend seam: every registered backend writes the Numba backend's bytes for every method,
a backend keeps its threads to itself, and the library sets no process-wide state on import."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path
from typing import Any

import numba
import numpy as np
import pytest
from click.testing import CliRunner

from ramstream.api import merge, probe
from ramstream.backends.numba.codecs import decode_array, encode_array
from ramstream.backends.registry import backend_names, load_backend, make_backend
from ramstream.cli import main
from ramstream.config import RunOptions
from ramstream.errors import ConfigError, MissingDependencyError
from ramstream.format import codecs
from ramstream.format.dtypes import FloatCode
from tests.families import Family, build_family

# Every method, with options that exercise its statistics (and both scopes / rules where it has them).
METHODS: list[tuple[str, dict[str, Any]]] = [
    ("ram", {}),
    ("ram+", {}),
    ("ram+", {"rho_scope": "tensor", "lambda_rule": "script"}),
    ("ram+s", {}),
    ("linear", {"weights": [0.5, 1.0, 2.0, 1.5, 1.0]}),
    ("task_arithmetic", {"lambda": 0.7}),
    ("ties", {"density": 0.3}),
    ("ties", {"density": 0.3, "trim_scope": "model", "rescale": "l1"}),
    ("breadcrumbs", {"density": 0.5, "gamma": 0.05}),
    ("breadcrumbs_ties", {"density": 0.5, "gamma": 0.05}),
    ("dare_linear", {"density": 0.5, "seed": 3}),
    ("dare_ties", {"density": 0.5, "seed": 3}),
    ("della", {"density": 0.5, "epsilon": 0.1, "seed": 1}),
    ("della_linear", {"density": 0.5, "epsilon": 0.1, "rescale": "inverse"}),
    ("model_stock", {}),
    ("sce", {}),
    ("sce", {"select_topk": 0.3}),
]


# Each family has an agent equal to the base (c = 0 only) and one with no unique element, so
# c = 0, 1 and >= 2 all occur; the mixed one's agents are decoded to float32 before the kernels.
FAMILIES: dict[str, dict[str, Any]] = {
    "bf16-sharded": {"shards": 2},
    "f16-single-file": {"dtype": "F16", "single_file": True},
    "f32-mixed-agents": {"dtype": "F32", "agent_dtypes": ("F32", "BF16", "F16", "F32", "F32")},
}


@pytest.fixture(scope="module", params=list(FAMILIES))
def family(request: pytest.FixtureRequest, tmp_path_factory: pytest.TempPathFactory) -> Family:
    root = tmp_path_factory.mktemp("backends")
    given = FAMILIES[request.param]
    return build_family(root, identical_agent=True, subset_agent=True, int_tensor=True, seed=5, **given)


def _files(out: Path) -> dict[str, bytes]:
    return {str(p.relative_to(out)): p.read_bytes() for p in sorted(out.rglob("*")) if p.is_file()}


def _merge(
    family: Family,
    out: Path,
    method: str,
    given: dict[str, Any],
    backend: str = "numba",
    agents: int | None = None,
    **run: Any,
) -> dict[str, bytes]:
    """Merge the first ``agents`` agents (None: all) with ``method`` into ``out`` (blocks of 256
    elements; ``run``: more ``RunOptions``)."""
    ram = {k: given[k] for k in ("rho_scope", "lambda_rule") if k in given}
    others = {k: v for k, v in given.items() if k not in ram}
    run = {"block_elems": 256, **run}
    options = RunOptions(cache_dir=out.parent / "cache", quiet=True, backend=backend, **run)
    merge(
        family.base,
        [str(a) for a in family.agents[:agents]],
        out=out,
        method=method,
        method_options=others,
        options=options,
        **ram,
    )
    return _files(out)


class NumbaBytes(dict[tuple[str, str, str], dict[str, bytes]]):
    """The Numba backend's output per (family, method, options), merged once per test module."""

    def __repr__(self) -> str:  # hypothesis prints the arguments of a failing example
        return f"NumbaBytes({len(self)} outputs)"

    def of(self, family: Family, tmp_path: Path, method: str, given: dict[str, Any]) -> dict[str, bytes]:
        """The reference bytes, merged under ``tmp_path`` the first time they are asked for."""
        key = (str(family.base), method, repr(sorted(given.items())))
        if key not in self:
            self[key] = _merge(family, tmp_path / "numba" / "out", method, given, "numba")
        return self[key]


def installed_backends() -> list[str]:
    """The registered backends whose library is installed here (torch is an optional extra)."""
    names = []
    for name in backend_names():
        try:
            load_backend(name)
        except MissingDependencyError:
            continue
        names.append(name)
    return names


@pytest.fixture(scope="module")
def numba_bytes() -> NumbaBytes:
    return NumbaBytes()


# Every method on the bf16 family; on the others (what differs is how inputs decode, which every
# method shares) one method per kernel family: RAM+, TIES, DARE's random keep, DELLA's ranked
# rows, Model Stock's geometry and sce's variance.
SPOT_CHECKS = (1, 6, 11, 12, 14, 16)
CASES = [
    pytest.param(name, method, given, id=f"{name}-{method}-{i}")
    for name in FAMILIES
    for i, (method, given) in enumerate(METHODS)
    if name == "bf16-sharded" or i in SPOT_CHECKS
]


@pytest.mark.parametrize("backend", installed_backends())
@pytest.mark.parametrize(("family", "method", "given"), CASES, indirect=["family"])
def test_every_backend_writes_the_numba_bytes(
    family: Family, tmp_path: Path, backend: str, method: str, given: dict[str, Any], numba_bytes: NumbaBytes
) -> None:
    expected = numba_bytes.of(family, tmp_path, method, given)
    assert any(name.endswith(".safetensors") for name in expected)
    assert _merge(family, tmp_path / backend / "out", method, given, backend) == expected


# nuslerp interpolates two models: per row and per column, with and without the base.
PER_VECTOR: list[tuple[dict[str, Any], int]] = [
    ({"weights": [0.3, 0.9], "nuslerp_flatten": False}, 2),
    ({"weights": [0.3, 0.9], "nuslerp_flatten": False, "nuslerp_row_wise": True}, 2),
    ({"weights": [1.0, 2.0], "nuslerp_flatten": False, "nuslerp_row_wise": True, "no_base": True}, 1),
]


@pytest.mark.parametrize("backend", installed_backends())
@pytest.mark.parametrize(("given", "agents"), PER_VECTOR, ids=["rows", "columns", "columns-no-base"])
def test_every_backend_writes_the_numba_bytes_of_per_vector_nuslerp(
    family: Family, tmp_path: Path, backend: str, given: dict[str, Any], agents: int
) -> None:
    expected = _merge(family, tmp_path / "numba" / "out", "nuslerp", given, "numba", agents, block_elems=192)
    assert _merge(family, tmp_path / backend / "out", "nuslerp", given, backend, agents, block_elems=320) == expected


def test_a_backend_scopes_its_threads_and_leaves_the_callers_setting(family: Family, tmp_path: Path) -> None:
    available = int(numba.config.NUMBA_NUM_THREADS)  # type: ignore[attr-defined]
    numba.set_num_threads(1)
    try:
        options = RunOptions(cache_dir=tmp_path / "cache", quiet=True, threads=available)
        probe(family.base, [str(a) for a in family.agents], options=options)
        merge(family.base, [str(a) for a in family.agents], out=tmp_path / "out", method="ties", options=options)
        assert numba.get_num_threads() == 1
    finally:
        numba.set_num_threads(available)


def test_an_unknown_backend_is_one_line(family: Family, tmp_path: Path) -> None:
    with pytest.raises(ConfigError, match="unknown backend 'cobol'; choose one of numba"):
        make_backend("cobol")
    result = CliRunner().invoke(
        main,
        ["probe", str(family.base), *map(str, family.agents), "--backend", "cobol", "--cache-dir", str(tmp_path)],
    )
    assert result.exit_code == 1
    assert result.output.strip().splitlines() == [
        "error: unknown backend 'cobol'; choose one of " + ", ".join(backend_names())
    ]


def test_importing_the_library_sets_no_environment_variable() -> None:
    code = (
        "import os, sys\n"
        "before = dict(os.environ)\n"
        "import ramstream.api, ramstream.backends.numba.backend, ramstream.methods.registry\n"
        "ramstream.methods.registry.method_names()\n"
        "sys.exit(0 if dict(os.environ) == before else 1)\n"
    )
    env = {k: v for k, v in os.environ.items() if k not in ("OMP_WAIT_POLICY", "OPENBLAS_NUM_THREADS")}
    assert subprocess.run([sys.executable, "-c", code], env=env).returncode == 0


@pytest.mark.parametrize("code", [FloatCode.BF16, FloatCode.F16])
def test_numpy_codecs_decode_every_16_bit_pattern_as_the_kernels_do(code: FloatCode) -> None:
    raw = np.arange(1 << 16, dtype=np.uint32).astype(np.uint16)
    np.testing.assert_array_equal(
        codecs.decode(raw, code).view(np.uint32), decode_array(raw, int(code)).view(np.uint32)
    )


@pytest.mark.parametrize("code", [FloatCode.BF16, FloatCode.F16, FloatCode.F32])
def test_numpy_codecs_encode_as_the_kernels_do(code: FloatCode) -> None:
    rng = np.random.default_rng(0)
    bits = np.concatenate(
        [
            rng.integers(0, 1 << 32, 200_000, dtype=np.uint64).astype(np.uint32),  # any pattern, NaNs included
            np.arange(0x33000000, 0x39000000, 997, dtype=np.uint32),  # f16 subnormals and their edges
            np.array([0, 0x80000000, 0x7F800000, 0xFF800000, 0x477FF000, 0x477FEFFF, 0x7FC00000], np.uint32),
        ]
    )
    values = bits.view(np.float32)
    carrier = np.float32 if code == FloatCode.F32 else np.uint16
    expected = np.empty(values.shape[0], carrier)
    encode_array(values, int(code), expected)
    got = codecs.encode(values, code)
    np.testing.assert_array_equal(got.view(np.uint8), expected.view(np.uint8))
