"""Failure behaviour: a full disk (a real OS write failure) in the index and in the output, a
damaged index chunk, two runs on the same output or index, NaN/Inf inputs, and a fuzzed index
header. Each case ends in one line naming the store, a non-zero exit, nothing that looks
finished, and (for a full disk) the same bytes once the command is rerun with space.
"""

from __future__ import annotations

import json
import subprocess
import sys
import threading
import time
from pathlib import Path

import numpy as np
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from ramstream import api
from ramstream.config import RunOptions
from ramstream.errors import NonFiniteWeightError, RamstreamError
from ramstream.index.header import IndexHeader
from ramstream.io.lock import hold
from tests.families import Family, build_family, read_model_dir, read_safetensors, write_safetensors

# Runs the CLI with a per-file size limit: writes past it fail with EFBIG (a real OS error, the
# same path as a full disk), SIGXFSZ being ignored so the process sees the error.
LIMITED = r"""
import resource, signal, sys
limit = int(sys.argv.pop(1))
signal.signal(signal.SIGXFSZ, signal.SIG_IGN)
resource.setrlimit(resource.RLIMIT_FSIZE, (limit, limit))
from ramstream.cli import main
main()
"""


SHARDS = ("--shard-size", "40KB")  # two shards, each larger than the output's size limit below


def cli(*args: str | Path, limit: int | None = None, timeout: float = 120) -> subprocess.CompletedProcess[str]:
    prefix = [sys.executable, "-c", LIMITED, str(limit)] if limit else [sys.executable, "-m", "ramstream.cli"]
    return subprocess.run([*prefix, *map(str, args)], capture_output=True, text=True, timeout=timeout)


def one_line_error(done: subprocess.CompletedProcess[str], *needles: str) -> str:
    assert done.returncode != 0, done.stdout
    assert "Traceback" not in done.stderr, done.stderr
    lines = [line for line in done.stderr.splitlines() if line.strip()]
    assert len(lines) == 1 and lines[0].startswith("error:"), done.stderr
    for needle in needles:
        assert needle in lines[0], lines[0]
    return lines[0]


def model_bytes(out: Path) -> dict[str, bytes]:
    return {p.name: p.read_bytes() for p in sorted(out.iterdir()) if p.is_file() and not p.name.startswith(".")}


def looks_finished(out: Path) -> bool:
    return (out / "config.json").exists() or (out / "ramstream_merge.json").exists()


@pytest.fixture(scope="module")
def family(tmp_path_factory: pytest.TempPathFactory) -> Family:
    shapes = {"model.embed_tokens.weight": (256, 64), "model.layers.0.mlp.up_proj.weight": (128, 64)}
    return build_family(tmp_path_factory.mktemp("reliability"), shapes=shapes, shards=2)


@pytest.fixture(scope="module")
def reference(family: Family, tmp_path_factory: pytest.TempPathFactory) -> dict[str, bytes]:
    root = tmp_path_factory.mktemp("reliability-ref")
    out = root / "out"
    done = cli("merge", *members(family), "--out", out, "--cache-dir", root / "cache", "--quiet", *SHARDS)
    assert done.returncode == 0, done.stderr
    return model_bytes(out)


def members(family: Family) -> list[str | Path]:
    return [family.base, *family.agents]


def test_disk_full_while_writing_the_output_then_resume(tmp_path: Path, family: Family, reference: dict) -> None:
    index, out = tmp_path / "index.zarr", tmp_path / "out"
    assert cli("probe", *members(family), "--index", index, "--quiet").returncode == 0
    merge = ["merge", *members(family), "--out", out, "--index", index, "--quiet", *SHARDS]
    one_line_error(cli(*merge, limit=30_000), str(out), "rerun")
    assert not looks_finished(out)
    done = cli(*merge)
    assert done.returncode == 0, done.stderr
    assert model_bytes(out) == reference


def test_disk_full_while_writing_the_index_then_resume(tmp_path: Path, family: Family, reference: dict) -> None:
    index, out = tmp_path / "index.zarr", tmp_path / "out"
    merge = ["merge", *members(family), "--out", out, "--index", index, "--quiet", *SHARDS]
    # Big enough for the index's metadata, too small for the header attribute of the group.
    message = one_line_error(cli(*merge, limit=1_500), str(index))
    assert "free space" in message or "rerun" in message
    assert not looks_finished(out)
    done = cli(*merge)
    assert done.returncode == 0, done.stderr
    assert model_bytes(out) == reference


@pytest.mark.parametrize("damage", ["truncate", "alter"])
def test_damaged_index_chunk_is_detected(tmp_path: Path, family: Family, damage: str) -> None:
    index = tmp_path / "index.zarr"
    assert cli("probe", *members(family), "--index", index, "--quiet").returncode == 0
    chunk = next((index / "stats" / "tensor_overlap" / "c").rglob("*"))
    while chunk.is_dir():
        chunk = next(chunk.iterdir())
    data = bytearray(chunk.read_bytes())
    if damage == "truncate":
        chunk.write_bytes(bytes(data[: len(data) // 2]))
    else:
        data[0] ^= 0x01
        chunk.write_bytes(bytes(data))
    out = tmp_path / "out"
    # The merge takes its lambdas from the per-tensor roll-up, so it must notice.
    message = one_line_error(cli("merge", *members(family), "--out", out, "--index", index, "--quiet"), str(index))
    assert "damaged" in message
    assert not looks_finished(out)


def test_second_merge_into_the_same_output_is_refused(tmp_path: Path, family: Family) -> None:
    out = tmp_path / "out"
    with hold(out / ".ramstream.lock", "test", wait=False):
        done = cli("merge", *members(family), "--out", out, "--cache-dir", tmp_path / "cache", "--quiet")
    one_line_error(done, "another ramstream process", str(out))
    assert not looks_finished(out)


def test_second_writer_of_an_index_waits_with_a_message(tmp_path: Path, family: Family) -> None:
    index = tmp_path / "index.zarr"
    lock = tmp_path / "index.zarr.lock"
    release = threading.Event()

    def holder() -> None:
        with hold(lock, "test", wait=False):
            release.wait(30)

    thread = threading.Thread(target=holder)
    thread.start()
    time.sleep(0.2)
    proc = subprocess.Popen(
        [sys.executable, "-m", "ramstream.cli", "probe", *map(str, members(family)), "--index", str(index), "--quiet"],
        stderr=subprocess.PIPE,
        stdout=subprocess.PIPE,
        text=True,
    )
    # The message is written once it finds the lock held (however long it takes to start on a
    # loaded machine); it must still be waiting then. Lines before it (a warning) are kept.
    assert proc.stderr is not None
    first = ""
    while "waiting for another ramstream process" not in first:
        line = proc.stderr.readline()
        assert line, f"the second writer ended or closed stderr without the message:\n{first}"
        first += line
    assert proc.poll() is None, "the second writer did not wait"
    release.set()
    thread.join()
    out, err = proc.communicate(timeout=120)
    assert proc.returncode == 0, first + err
    assert out.strip() == f"index: {index}"


def test_nan_is_refused_by_default_and_let_through_on_request(tmp_path: Path, family: Family) -> None:
    bad = tmp_path / "bad"
    bad.mkdir()
    tensors = read_safetensors(next(family.agents[0].glob("model-00001-*.safetensors")))
    name = next(iter(tensors))
    dtype, shape, raw = tensors[name]
    raw = raw.copy()
    raw[5] = 0x7FC0  # a bf16 NaN
    tensors = {**tensors, name: (dtype, shape, raw)}
    for path in family.agents[0].iterdir():
        (bad / path.name).write_bytes(path.read_bytes())
    write_safetensors(next(bad.glob("model-00001-*.safetensors")), tensors)
    opts = RunOptions(cache_dir=tmp_path / "cache", quiet=True)
    agents = [str(bad), *map(str, family.agents[1:])]
    with pytest.raises(NonFiniteWeightError, match=name):
        api.merge(family.base, agents, out=tmp_path / "out", options=opts)
    assert not looks_finished(tmp_path / "out")
    api.merge(family.base, agents, out=tmp_path / "out2", options=opts, allow_nonfinite=True)
    merged = read_model_dir(tmp_path / "out2")[name][2]
    base = read_safetensors(next(family.base.glob("model-00001-*.safetensors")))[name][2]
    assert np.isfinite((merged.astype(np.uint32) << 16).view(np.float32)).all()
    assert merged[5] != 0x7FC0 and base is not None


@settings(max_examples=200, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(
    st.recursive(
        st.none() | st.booleans() | st.integers() | st.floats() | st.text(max_size=8),
        lambda children: st.lists(children, max_size=4) | st.dictionaries(st.text(max_size=8), children, max_size=6),
        max_leaves=30,
    )
)
def test_fuzzed_index_header_raises_only_ramstream_errors(doc: object) -> None:
    try:
        IndexHeader.from_dict(doc)  # type: ignore[arg-type]
    except RamstreamError:
        pass


@settings(max_examples=100, deadline=None)
@given(st.data())
def test_fuzzed_fields_of_a_real_header_raise_only_ramstream_errors(data: st.DataObject) -> None:
    doc = json.loads(json.dumps(REAL_HEADER))
    key = data.draw(st.sampled_from(sorted(doc)))
    doc[key] = data.draw(st.none() | st.integers() | st.text(max_size=4) | st.lists(st.integers(), max_size=3))
    try:
        IndexHeader.from_dict(doc)
    except RamstreamError:
        pass


REAL_HEADER = {
    "schema_version": 2,
    "content_key": "abc",
    "eps": 1e-5,
    "block_elems": 65536,
    "base": "base",
    "agents": ["a", "b"],
    "inputs": [],
    "tensors": [{"name": "w", "shape": [4, 4], "dtypes": ["BF16", "BF16", "BF16"]}],
}


def test_undecodable_float_dtype_is_refused_by_name(tmp_path: Path) -> None:
    raw = np.zeros(16, np.uint8)
    for name in ("base", "agent"):
        (tmp_path / name).mkdir()
        write_safetensors(tmp_path / name / "model.safetensors", {"w.fp8": ("F8_E4M3", (16,), raw)})
    done = cli("merge", tmp_path / "base", tmp_path / "agent", "--out", tmp_path / "out", "--quiet")
    one_line_error(done, "w.fp8", "F8_E4M3", "convert")
    assert not looks_finished(tmp_path / "out")


def test_allow_nonfinite_flag_on_the_command_line(tmp_path: Path, family: Family) -> None:
    bad = tmp_path / "bad"
    bad.mkdir()
    for path in family.agents[0].iterdir():
        (bad / path.name).write_bytes(path.read_bytes())
    shard = next(bad.glob("model-00001-*.safetensors"))
    tensors = read_safetensors(shard)
    name = next(iter(tensors))
    dtype, shape, raw = tensors[name]
    raw = raw.copy()
    raw[3] = 0x7F80  # +Inf in bf16
    write_safetensors(shard, {**tensors, name: (dtype, shape, raw)})
    args = ["merge", family.base, bad, *family.agents[1:], "--cache-dir", tmp_path / "cache", "--quiet"]
    one_line_error(cli(*args, "--out", tmp_path / "refused"), name, "fix the checkpoint", "or pass --allow-nonfinite")
    probe = ["probe", family.base, bad, *family.agents[1:], "--index", tmp_path / "refused.idx", "--quiet"]
    one_line_error(cli(*probe), name, "or pass --allow-nonfinite")
    ties = one_line_error(cli(*args, "--out", tmp_path / "ties", "--method", "ties"), name, "fix the checkpoint")
    assert "ties cannot merge NaN/Inf weights" in ties  # and no flag suggested that it would refuse
    done = cli(*args, "--out", tmp_path / "allowed", "--allow-nonfinite")
    assert done.returncode == 0, done.stderr
    assert looks_finished(tmp_path / "allowed")


@pytest.mark.parametrize("stop", ["SIGINT", "SIGTERM"])
def test_ctrl_c_says_how_to_resume_and_the_rerun_finishes(
    tmp_path: Path, family: Family, reference: dict, stop: str
) -> None:
    """SIGINT (Ctrl-C) or SIGTERM (timeout, a batch scheduler, docker stop) mid-merge: exit 130
    with one line saying to rerun; the rerun resumes."""
    import signal

    index, out = tmp_path / "index.zarr", tmp_path / "out"
    assert cli("probe", *members(family), "--index", index, "--quiet").returncode == 0
    args = ["merge", *map(str, members(family)), "--out", str(out), "--index", str(index), "--quiet", *SHARDS]
    # Slow the merge down (a sleep in each block write, announced by a file) so the interrupt
    # lands inside the pass: sent once a write has begun, not after a guessed delay.
    writing = tmp_path / "writing"
    # Python leaves SIGINT ignored when it starts with it ignored (a job started in the
    # background by a non-interactive shell): the merge gets Python's usual Ctrl-C handler back.
    slow = (
        "import signal; signal.signal(signal.SIGINT, signal.default_int_handler)\n"
        "import time, sys; from ramstream.io import writer; w = writer.ShardWriter.write_runs\n"
        f"def slow(self, *a, **k):\n    open({str(writing)!r}, 'w').close(); time.sleep(2.0); return w(self, *a, **k)\n"
        "writer.ShardWriter.write_runs = slow\nfrom ramstream.cli import main; main()"
    )
    proc = subprocess.Popen([sys.executable, "-c", slow, *args], stderr=subprocess.PIPE, text=True)
    deadline = time.monotonic() + 60
    while not writing.exists() and time.monotonic() < deadline:
        time.sleep(0.05)
    time.sleep(0.2)  # inside the first block's (slowed) write
    proc.send_signal(getattr(signal, stop))
    _, err = proc.communicate(timeout=60)
    assert proc.returncode == 130, err
    assert "Traceback" not in err and "rerun the same command" in err
    assert not looks_finished(out)
    done = cli(*args)
    assert done.returncode == 0, done.stderr
    assert model_bytes(out) == reference


@pytest.mark.parametrize("method", ["ties", "breadcrumbs", "della"])
def test_allow_nonfinite_is_refused_by_magnitude_methods(tmp_path: Path, family: Family, method: str) -> None:
    args = ["merge", *members(family), "--out", tmp_path / "out", "--method", method, "--allow-nonfinite"]
    one_line_error(cli(*args, "--cache-dir", tmp_path / "cache", "--quiet"), "--allow-nonfinite", method)
    assert not (tmp_path / "out").exists()


def test_an_agent_that_changes_nothing_is_noted(tmp_path: Path, family: Family) -> None:
    """The base given again as an agent (or an eps above every update) merges as if it were not
    there: the merge says so on stderr, naming it, and still succeeds; a family whose agents all
    differ from the base gets no note."""
    copy = tmp_path / "base-copy"
    copy.mkdir()
    for path in family.base.iterdir():
        (copy / path.name).write_bytes(path.read_bytes())
    args = ["--cache-dir", tmp_path / "cache", "--quiet"]
    done = cli("merge", family.base, family.agents[0], copy, "--out", tmp_path / "with-copy", *args)
    assert done.returncode == 0, done.stderr
    notes = [line for line in done.stderr.splitlines() if line.startswith("note: ")]
    assert len(notes) == 1 and "agent base-copy differs from the base nowhere above --eps 1e-05" in notes[0]
    plain = cli("merge", *members(family), "--out", tmp_path / "plain", *args)
    assert plain.returncode == 0 and "note:" not in plain.stderr, plain.stderr
