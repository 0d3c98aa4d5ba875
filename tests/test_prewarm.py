"""Kernels compiled ahead in child processes (``backends.numba.prewarm``): the recorded table is
current and parses, a child's kernels are loaded from the cache rather than compiled again, the
bytes are those of a merge without children, a run starts children only when it compiles (not
when it has nothing to do, nor for cached kernels)."""

from __future__ import annotations

import hashlib
import json
import os
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest

from ramstream import api
from ramstream.backends.numba import prewarm
from ramstream.backends.numba.kernel_table import INPUT_KERNELS, KERNELS
from ramstream.config import RunOptions
from tests.families import Family, build_family

REPO = Path(__file__).resolve().parent.parent

# Run in a fresh process with an empty Numba cache: start the children for ram+ at once, let them
# finish, then merge and say which kernels this process compiled itself.
_CHILD = """
import json, sys
from pathlib import Path
from numba.core import event
compiled = []
class Noted(event.Listener):
    def on_start(self, ev):
        pass
    def on_end(self, ev):
        compiled.append(ev.data["dispatcher"].py_func.__name__)
event.register("numba:compile", Noted())
from ramstream import api
from ramstream.backends.numba import prewarm
from ramstream.config import RunOptions
base, agents, out, cache = sys.argv[1], sys.argv[2].split(","), sys.argv[3], sys.argv[4]
stop = prewarm.start("ram+", now=True)
children = prewarm.wait()
api.merge(base, agents, out=out, options=RunOptions(cache_dir=Path(cache), quiet=True))
stop()
print(json.dumps({"children": children, "compiled": compiled}))
"""


def _run_fresh(script: str, fam: Family, tmp_path: Path) -> Any:
    """Run ``script`` on ``fam`` in a fresh process with an empty Numba cache; what its last line says."""
    env = dict(os.environ, NUMBA_CACHE_DIR=str(tmp_path / "numba"), PYTHONPATH=str(REPO))
    done = subprocess.run(
        [sys.executable, "-c", script, str(fam.base), ",".join(map(str, fam.agents)), str(tmp_path / "out"),
         str(tmp_path / "index")],
        env=env,
        cwd=tmp_path,
        capture_output=True,
        text=True,
        timeout=600,
        check=False,
    )  # fmt: skip
    assert done.returncode == 0, done.stderr[-3000:]
    return json.loads(done.stdout.strip().splitlines()[-1])


def _digest(directory: Path) -> str:
    h = hashlib.sha256()
    for path in sorted(directory.glob("*.safetensors")):
        h.update(path.read_bytes())
    return h.hexdigest()


def test_every_recorded_type_parses_back_to_itself() -> None:
    texts = {t for entries in [*KERNELS.values(), INPUT_KERNELS] for _, _, types in entries for t in types}
    assert texts
    for text in texts:
        assert str(prewarm.numba_type(text)) == text
    with pytest.raises(ValueError, match="not a recorded argument type"):
        prewarm.numba_type("pyobject_of_some_kind")


def test_every_recorded_kernel_exists() -> None:
    for method in KERNELS:
        for kernel in prewarm.kernels(method):
            assert hasattr(kernel.dispatcher, "compile")
    assert INPUT_KERNELS
    for entry in INPUT_KERNELS:
        assert hasattr(prewarm.Kernel.of(*entry).dispatcher, "compile")


@pytest.mark.slow
def test_the_table_is_what_the_methods_call() -> None:
    done = subprocess.run(
        [sys.executable, str(REPO / "tools" / "record_kernels.py"), "--check"],
        capture_output=True,
        text=True,
        timeout=900,
        check=False,
    )
    assert done.returncode == 0, done.stdout + done.stderr


def test_a_childs_kernels_are_loaded_not_compiled_and_the_bytes_agree(tmp_path: Path) -> None:
    fam = build_family(tmp_path / "fam")
    report = _run_fresh(_CHILD, fam, tmp_path)
    assert report["children"] == 1 if (os.cpu_count() or 1) <= 2 else report["children"] >= 1
    assert "_probe_part" in report["compiled"]  # the first kernel: this process's own
    assert "_merge_ram_part" not in report["compiled"]  # the child's: loaded from the cache
    assert "_count_exponent_part" not in report["compiled"]
    api.merge(fam.base, fam.agents, out=tmp_path / "plain", options=RunOptions(cache_dir=tmp_path / "i2", quiet=True))
    assert _digest(tmp_path / "out") == _digest(tmp_path / "plain")


# A CLI-like run: armed before the merge, the children start at its first kernel call.
_ARMED = """
import json, sys
from pathlib import Path
from ramstream import api
from ramstream.backends.numba import prewarm
from ramstream.config import RunOptions
base, agents, out, cache = sys.argv[1], sys.argv[2].split(","), sys.argv[3], sys.argv[4]
counts = []
for _ in range(2):  # the second run has nothing to do: already merged
    stop = api.prepare("ram+")
    api.merge(base, agents, out=out, options=RunOptions(cache_dir=Path(cache), quiet=True))
    counts.append(prewarm.wait())
    stop()
print(json.dumps(counts))
"""


def test_children_start_at_the_first_kernel_call_and_only_then(tmp_path: Path) -> None:
    first, already_merged = _run_fresh(_ARMED, build_family(tmp_path / "fam"), tmp_path)
    assert first >= 1
    assert already_merged == 0


# Only quantized tensors: the run's first kernel call decodes the FP8 base's first block.
_ONLY_FP8 = {
    "model.layers.0.self_attn.q_proj.weight": ((300, 200), True),
    "model.layers.0.mlp.down_proj.weight": ((130, 260), True),
}


def test_a_first_call_decoding_an_fp8_base_hands_out_the_methods_kernels(tmp_path: Path) -> None:
    pytest.importorskip("torch")  # writes the FP8 family (make test-lowest has no torch)
    from tests.quantized_families import build_fp8_family

    fam, _ = build_fp8_family(tmp_path / "fam", shapes=_ONLY_FP8, trained_from="bf16")
    first, already_merged = _run_fresh(_ARMED, fam, tmp_path)
    assert first >= 1
    assert already_merged == 0
    api.merge(fam.base, fam.agents, out=tmp_path / "plain", options=RunOptions(cache_dir=tmp_path / "i2", quiet=True))
    assert _digest(tmp_path / "out") == _digest(tmp_path / "plain")


def test_cached_kernels_are_not_handed_out(tmp_path: Path) -> None:
    fam = build_family(tmp_path / "fam")
    api.merge(fam.base, fam.agents, out=tmp_path / "out", options=RunOptions(cache_dir=tmp_path / "i", quiet=True))
    stop = prewarm.start("ram+", now=True)  # this process compiled (or loaded) every ram+ kernel just now
    try:
        assert prewarm.wait() == 0
    finally:
        stop()
    stop = api.prepare("ram+")  # armed: its first call finds the later kernels cached
    try:
        api.merge(
            fam.base, fam.agents, out=tmp_path / "again", options=RunOptions(cache_dir=tmp_path / "i", quiet=True)
        )
        assert prewarm.wait() == 0
    finally:
        stop()


def test_turned_off_or_unknown_starts_nothing(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("RAMSTREAM_PREWARM", "0")
    stop = prewarm.start("ties", now=True)
    assert prewarm.wait() == 0
    stop()
    monkeypatch.delenv("RAMSTREAM_PREWARM")
    stop = api.prepare("no_such_method")
    assert prewarm.wait() == 0
    stop()
    api.prepare("ram+", backend="torch")()  # a backend that prepares nothing
