"""Configs that attack the parser: alias bombs, keys given twice, huge values in messages,
candidates named like the sweep's own files.

A 570-byte YAML of nested aliases used to take 33 s and 1.66 GB and end in a ``MemoryError``
traceback whose message quoted the expanded value. Every config here is a real file read by
``merge --config`` and ``sweep --config`` (in process), and by the loader under ``tracemalloc``:
each is one line, at once, in a few MiB. The alias bomb is also read by the real CLI in a process
whose address space the system limits (``RLIMIT_AS``) to what the CLI needs plus a margin: far
less than the expansion would take, so a parser that expanded it would fail there.
"""

from __future__ import annotations

import os
import resource
import subprocess
import sys
import time
import tracemalloc
from pathlib import Path

import pytest

from ramstream import mergekit_config
from ramstream.errors import ConfigError, excerpt
from ramstream.mergekit_config import safe_yaml
from ramstream.sweep import config as sweep_config
from tests.families import Family, build_family
from tests.test_cli import Outcome, in_process, one_line_error


@pytest.fixture(scope="module")
def family(tmp_path_factory: pytest.TempPathFactory) -> Family:
    return build_family(tmp_path_factory.mktemp("hostile-configs"), densities=(0.2, 0.45), seed=5)


def head(family: Family, method: str = "linear") -> str:
    models = "".join(f"  - model: {a}\n    parameters: {{weight: 1.0}}\n" for a in family.agents)
    return f"merge_method: {method}\nbase_model: {family.base}\nmodels:\n{models}"


def laughs(levels: int = 9) -> str:
    """The classic: nine levels of nine aliases, 9**9 (387 M) strings once expanded; ~600 bytes."""
    lines = ['a0: &a0 ["lol","lol","lol","lol","lol","lol","lol","lol","lol"]']
    for k in range(1, levels):
        lines.append(f"a{k}: &a{k} [" + ",".join([f"*a{k - 1}"] * 9) + "]")
    return "\n".join(lines) + "\n"


def merge_key_bomb(levels: int = 24) -> str:
    """Merge keys copying mappings into mappings: each level doubles the keys it holds."""
    lines = ["m0: &m0 {x0: 1}"]
    for k in range(1, levels):
        lines.append(f"m{k}: &m{k} {{<<: [*m{k - 1}], y{k}: {{<<: *m{k - 1}}}, z{k}: {{<<: *m{k - 1}}}}}")
    return "\n".join(lines) + "\n"


HOSTILE = {
    "billion-laughs": (laughs(), "expand to more"),
    "merge-key-bomb": (merge_key_bomb(), "expand to more"),
    "contains-itself": ("parameters: &p {weight: *p}\n", "contains itself"),
    "nested-too-deep": ("parameters: " + "[" * 5000 + "]" * 5000 + "\n", "nested"),
    "integer-of-5000-digits": ("parameters: {weight: " + "9" * 5000 + "}\n", "cannot read the integer"),
}


def run_config(path: Path, out: Path, command: str) -> Outcome:
    return in_process(command, "--config", path, "--out", out, "--quiet")


@pytest.mark.parametrize("command", ["merge", "sweep"])
@pytest.mark.parametrize("case", list(HOSTILE))
def test_a_hostile_yaml_is_one_line_at_once(family: Family, tmp_path: Path, case: str, command: str) -> None:
    text, needle = HOSTILE[case]
    path = tmp_path / "config.yml"
    path.write_text(head(family) + text)
    out = tmp_path / "out"
    started = time.monotonic()
    message = one_line_error(run_config(path, out, command), str(path), needle)
    assert time.monotonic() - started < 10
    assert len(message) < 400, message
    assert not out.exists()


@pytest.mark.parametrize("case", ["billion-laughs", "merge-key-bomb"])
def test_an_alias_bomb_is_refused_before_it_is_expanded(family: Family, tmp_path: Path, case: str) -> None:
    """Measured inside the process: the loader allocates a few MiB at most (it was 1.66 GB)."""
    path = tmp_path / "bomb.yml"
    path.write_text(head(family) + HOSTILE[case][0])
    assert len(path.read_bytes()) < 2000
    tracemalloc.start()
    try:
        with pytest.raises(ConfigError, match="expand to more than"):
            mergekit_config.load(path)
        peak = tracemalloc.get_traced_memory()[1]
    finally:
        tracemalloc.stop()
    assert peak < 8 * 1024**2, f"{peak / 1024**2:.1f} MiB"


# Run as ``python -c``: the CLI as ``python -m ramstream.cli`` runs it, then its peak address
# space (VmPeak) written to the file named first.
MEASURED_CLI = """
import atexit, runpy, sys
def peak(path=sys.argv.pop(1)):
    lines = open("/proc/self/status").read().splitlines()
    open(path, "w").write(next(line.split()[1] for line in lines if line.startswith("VmPeak:")))
atexit.register(peak)
sys.argv[0] = "ramstream"
runpy.run_module("ramstream.cli", run_name="__main__", alter_sys=True)
"""
AS_MARGIN = 128 * 1024**2  # above the measured peak of an ordinary refusal


def cli_under_limit(args: list[str], limit: int | None) -> tuple[subprocess.CompletedProcess[str], float]:
    """``args`` run by the CLI in a process whose address space is limited to ``limit`` bytes;
    one BLAS and Numba thread, so that the imports' own reservations do not scale with cores."""

    def limited() -> None:
        if limit is not None:
            resource.setrlimit(resource.RLIMIT_AS, (limit, limit))

    env = {**os.environ, "OPENBLAS_NUM_THREADS": "1", "OMP_NUM_THREADS": "1", "NUMBA_NUM_THREADS": "1"}
    started = time.monotonic()
    done = subprocess.run(args, capture_output=True, text=True, env=env, preexec_fn=limited, timeout=120)
    return done, time.monotonic() - started


@pytest.mark.skipif(not sys.platform.startswith("linux"), reason="VmPeak and RLIMIT_AS as Linux keeps them")
@pytest.mark.parametrize("command", ["merge", "sweep"])
def test_an_alias_bomb_is_refused_under_an_address_space_limit(family: Family, tmp_path: Path, command: str) -> None:
    """The limit: the peak address space of the same command refusing an ordinary config (measured
    here, in a process like the bomb's) plus ``AS_MARGIN``. The bomb's 9**9 values, expanded, would
    take 9**9 references of 8 bytes: 2.9 GiB, beyond it."""
    ordinary = tmp_path / "ordinary.yml"
    ordinary.write_text(head(family))  # refused after it is read: base_model needs a weight for linear
    peak_file = tmp_path / "peak"
    argv = [command, "--config", str(ordinary), "--out", str(tmp_path / "ordinary"), "--quiet"]
    measured, _ = cli_under_limit([sys.executable, "-c", MEASURED_CLI, str(peak_file), *argv], None)
    assert measured.returncode == 1 and measured.stderr.startswith("error: "), measured.stderr
    limit = int(peak_file.read_text()) * 1024 + AS_MARGIN
    assert 9**9 * 8 > 2 * limit, f"a limit of {limit / 1024**2:.0f} MiB would not stop an expansion"
    enforced, _ = cli_under_limit([sys.executable, "-c", f"bytearray({limit})"], limit)
    assert enforced.returncode != 0 and "MemoryError" in enforced.stderr, "the system does not enforce RLIMIT_AS"

    bomb = tmp_path / "bomb.yml"
    bomb.write_text(head(family) + laughs())
    out = tmp_path / "out"
    argv = [sys.executable, "-m", "ramstream.cli", command, "--config", str(bomb), "--out", str(out), "--quiet"]
    done, seconds = cli_under_limit(argv, limit)
    assert done.returncode == 1, (done.returncode, done.stderr)
    assert "Traceback" not in done.stderr and "MemoryError" not in done.stderr, done.stderr
    lines = done.stderr.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith(f"error: {bomb}: ") and "expand to more than" in lines[0], lines
    assert seconds < 30, f"{seconds:.1f} s"
    assert not out.exists()


def test_ordinary_aliases_and_merge_keys_still_read(family: Family, tmp_path: Path) -> None:
    """What configs do with anchors (one parameter block shared by several models) is unchanged."""
    text = (
        f"merge_method: ties\nbase_model: {family.base}\nmodels:\n"
        f"  - model: {family.agents[0]}\n    parameters: &p {{weight: 1.0, density: 0.4}}\n"
        f"  - model: {family.agents[1]}\n    parameters: {{<<: *p, weight: 0.5}}\n"
    )
    path = tmp_path / "config.yml"
    path.write_text(text)
    parsed = mergekit_config.load(path)
    assert isinstance(parsed, mergekit_config.ConfigMerge)
    assert parsed.settings["weights"] == [1.0, 0.5]
    assert parsed.settings["density"] == [0.4, 0.4]


DUPLICATES = {
    "top-level": ("merge_method: ties\n", "'merge_method'", "lines 1 and "),
    "parameters": ("parameters:\n  lambda: 0.5\n  lambda: 2.0\n", "'lambda'", "given twice"),
    "a-model's-parameters": (None, "'weight'", "given twice"),
}


@pytest.mark.parametrize("command", ["merge", "sweep"])
@pytest.mark.parametrize("case", list(DUPLICATES))
def test_a_key_given_twice_is_refused_by_name(family: Family, tmp_path: Path, case: str, command: str) -> None:
    extra, key, needle = DUPLICATES[case]
    if extra is None:
        text = head(family).replace("parameters: {weight: 1.0}", "parameters: {weight: 1.0, weight: 0.3}", 1)
    elif case == "top-level":
        text = extra + head(family)
    else:
        text = head(family) + extra
    path = tmp_path / "config.yml"
    path.write_text(text)
    one_line_error(run_config(path, tmp_path / "out", command), str(path), key, needle, "keep one")


def test_a_huge_value_is_quoted_as_a_short_excerpt(family: Family, tmp_path: Path) -> None:
    long_name = "x" * 200_000
    path = tmp_path / "config.yml"
    for text in (
        head(family).replace("merge_method: linear", f"merge_method: {long_name}"),
        head(family) + "parameters: {weight: [" + ", ".join(["[1, 2]"] * 20_000) + "]}\n",
        head(family) + f"dtype: {long_name}\n",
        head(family) + f"{long_name}: 1\n",
    ):
        path.write_text(text)
        message = one_line_error(in_process("merge", "--config", path, "--out", tmp_path / "out"), str(path))
        assert "x" * 100 not in message and "[1, 2], [1, 2], [1, 2], [1, 2], [1, 2]" not in message, message[:1000]
        assert len(message) < 600, message[:1000]  # the path, an excerpt, and what ramstream accepts


def test_excerpt_is_short_and_one_line_whatever_the_value() -> None:
    nested: list[object] = []
    for _ in range(50):
        nested = [nested] * 9  # shared: 9**50 leaves, walked only to a bounded depth
    for value in ("x" * 10**6, nested, {"k" * 1000: list(range(10**5))}, "a\nb\x1b[2J", 10**4000 // 10**3999):
        started = time.monotonic()
        text = excerpt(value)
        assert time.monotonic() - started < 0.1
        assert len(text) <= 80 and text.isprintable(), text


@pytest.mark.parametrize("name", ["sweep.json", "SWEEP.JSON"])
def test_a_candidate_named_like_the_sweep_s_own_file_is_refused(family: Family, tmp_path: Path, name: str) -> None:
    out = tmp_path / "out"
    one_line_error(
        run_config(named_config(family, tmp_path, name), out, "sweep"), name, "sweep's own file", "another name"
    )
    assert not out.exists()
    grid = in_process("sweep", family.base, *family.agents, "--out", out, "--grid", name, "--quiet")
    one_line_error(grid, name, "sweep's own file")
    assert not out.exists()


@pytest.mark.parametrize("name", [".ramstream", ".ramstream.lock", ".hidden"])
def test_a_candidate_named_like_the_sweep_s_work_area_or_lock_is_refused(
    family: Family, tmp_path: Path, name: str
) -> None:
    """The sweep's work area and lock start with a dot: no candidate name may."""
    out = tmp_path / "out"
    one_line_error(
        run_config(named_config(family, tmp_path, f"'{name}'"), out, "sweep"), name, "starts with a dot", "another name"
    )
    assert not out.exists()


def named_config(family: Family, tmp_path: Path, name: str) -> Path:
    """A sweep config of one task arithmetic candidate named ``name`` (as YAML text)."""
    path = tmp_path / "sweep.yml"
    models = ", ".join(f"{{model: {a}, parameters: {{weight: 1.0}}}}" for a in family.agents)
    method = f"merge_method: task_arithmetic, base_model: {family.base}"
    path.write_text(f"- {{name: {name}, {method}, models: [{models}]}}\n")
    return path


def test_a_sweep_config_reads_through_the_same_loader(tmp_path: Path) -> None:
    path = tmp_path / "sweep.yml"
    path.write_text("merge_method: linear\n---\nmerge_method: ties\nmerge_method: linear\n")
    with pytest.raises(ConfigError, match="'merge_method' is given twice in one mapping \\(lines 3 and 4\\)"):
        sweep_config.load(path)
    assert safe_yaml.load_all("a: 1\n---\nb: [1, 2]\n", "x") == [{"a": 1}, {"b": [1, 2]}]


def flow_laughs(levels: int = 9) -> str:
    """``laughs`` in YAML flow syntax, as a flag's value: 9**9 strings once expanded."""
    items = ["&a0 [lol, lol, lol, lol, lol, lol, lol, lol, lol]"]
    for k in range(1, levels):
        items.append(f"&a{k} [" + ", ".join([f"*a{k - 1}"] * 9) + "]")
    return "[" + ", ".join(items) + "]"


def test_a_flag_value_is_read_with_the_configs_bounds(family: Family, tmp_path: Path) -> None:
    """Flags take YAML flow syntax too (gradients, filters): an alias bomb there is refused before
    it is expanded, a key given twice is refused by name; both as click's usage errors (exit 2),
    quoting an excerpt of the value."""
    members = (family.base, *family.agents)
    value = flow_laughs()
    started = time.monotonic()
    bomb = in_process("merge", *members, "--out", tmp_path / "a", "--method", "task_arithmetic", "--lambda", value)
    assert time.monotonic() - started < 10
    assert bomb.code == 2 and not bomb.crashed and "expand to more" in bomb.err and value not in bomb.err
    twice = "[{filter: mlp, filter: attn, value: 1}, {value: 0.5}]"
    repeated = in_process("merge", *members, "--out", tmp_path / "b", "--method", "task_arithmetic", "--lambda", twice)
    assert repeated.code == 2 and not repeated.crashed and "'filter' is given twice" in repeated.err
    assert not (tmp_path / "a").exists() and not (tmp_path / "b").exists()


def test_a_number_with_an_exponent_is_a_number(family: Family, tmp_path: Path) -> None:
    """YAML 1.1 reads ``1e-1`` as text; a flag means the number."""
    from ramstream.cli.types import SettingList, SettingValue

    assert SettingValue().convert("1e-1", None, None) == 0.1
    assert SettingValue().convert("[1E2, -2.5e-3, {filter: mlp, value: 3e0}]", None, None) == [
        100.0,
        -0.0025,
        {"filter": "mlp", "value": 3.0},
    ]
    assert SettingList().convert("[1e0, 2e0], 5e-1", None, None) == [[1.0, 2.0], 0.5]
    members = (family.base, *family.agents)
    common = ("--method", "task_arithmetic", "--quiet", "--cache-dir", tmp_path / "cache")
    for out, lam in (("a", "1e-1"), ("b", "0.1")):
        done = in_process("merge", *members, "--out", tmp_path / out, *common, "--lambda", lam)
        assert done.code == 0, done.err
    files = sorted(p.name for p in (tmp_path / "a").glob("*.safetensors"))
    assert files and all((tmp_path / "a" / f).read_bytes() == (tmp_path / "b" / f).read_bytes() for f in files)
