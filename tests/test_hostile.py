"""Reliability II: what hostile use and a review found (docs/reliability.md, second table).

Every case runs real files through the real CLI (in process with click's runner, or as a real
process where a hang, a signal or a resource limit is the point) or the real API, and checks the
outcome a user sees: the right bytes, or one line naming the file or tensor and a non-zero exit.
"""

from __future__ import annotations

import errno
import json
import os
import re
import subprocess
import sys
import threading
import time
from pathlib import Path

import numpy as np
import pytest
from click.testing import CliRunner

from ramstream import api
from ramstream.cli import main
from ramstream.config import RunOptions
from ramstream.errors import (
    ConcurrentRunError,
    ConfigError,
    StoreCorruptError,
    StoreWriteError,
)
from ramstream.index.guard import store_io
from ramstream.io import direct as direct_io
from ramstream.io.lock import hold
from ramstream.io.writer import Placement, ShardLayout, ShardWriter
from ramstream.registry import Registry
from tests.checks import Interrupted, interrupted_after
from tests.families import (
    Family,
    build_family,
    read_model_dir,
    read_safetensors,
    with_raw_value,
    write_safetensors,
)

SHAPES = {
    "model.embed_tokens.weight": (96, 24),
    "model.layers.0.mlp.up_proj.weight": (40, 24),
    "model.norm.weight": (24,),
}


def run(*args: str | Path) -> tuple[int, str, str]:
    """The CLI in process: exit status, stdout, stderr; a traceback fails the test."""
    result = CliRunner().invoke(main, [str(a) for a in args])
    if result.exception is not None and not isinstance(result.exception, SystemExit):
        raise result.exception
    return result.exit_code, result.stdout, result.stderr


def run_process(*args: str | Path, timeout: float = 60) -> tuple[int, str, str]:
    done = subprocess.run(
        [sys.executable, "-m", "ramstream.cli", *map(str, args)], capture_output=True, text=True, timeout=timeout
    )
    return done.returncode, done.stdout, done.stderr


def one_line_error(outcome: tuple[int, str, str], *needles: str) -> str:
    code, _, err = outcome
    assert code != 0, err
    assert "Traceback" not in err and "never retrieved" not in err, err
    lines = [line for line in err.splitlines() if line.strip()]
    assert len(lines) == 1 and lines[0].startswith("error: "), err
    for needle in needles:
        assert needle.lower() in lines[0].lower(), f"{needle!r} not in {lines[0]!r}"
    return lines[0]


def members(fam: Family) -> list[Path]:
    return [fam.base, *fam.agents]


def model_bytes(out: Path) -> dict[str, bytes]:
    return {p.name: p.read_bytes() for p in sorted(out.iterdir()) if p.is_file() and p.name.startswith("model")}


def merged(fam_members: list[Path], out: Path, cache: Path, *extra: str | Path) -> tuple[int, str, str]:
    return run("merge", *fam_members, "--out", out, "--cache-dir", cache, "--quiet", *extra)


def set_mtimes(root: Path, ns: int = 1_000_000_000) -> None:
    """What reproducible builds, Nix, ``tar`` and ``cp -p`` do: every file gets the same mtime."""
    for path in root.rglob("*"):
        os.utime(path, ns=(ns, ns))


@pytest.fixture
def family(tmp_path: Path) -> Family:
    return build_family(tmp_path / "family", shapes=SHAPES, shards=1)


# -- 1. an index or a finished output reused for other data ---------------------------------


def test_two_families_with_equal_names_sizes_headers_and_mtimes_do_not_share_an_index(tmp_path: Path) -> None:
    one = build_family(tmp_path / "one", shapes=SHAPES, seed=1)
    two = build_family(tmp_path / "two", shapes=SHAPES, seed=2)
    set_mtimes(tmp_path / "one")
    set_mtimes(tmp_path / "two")
    cache = tmp_path / "cache"
    assert merged(members(one), tmp_path / "out1", cache)[0] == 0
    code, stdout, err = merged(members(two), tmp_path / "out2", cache)
    assert code == 0, err
    fresh = merged(members(two), tmp_path / "fresh", tmp_path / "fresh-cache")
    assert stdout.split(" (", 1)[1] == fresh[1].split(" (", 1)[1]  # the same lambdas
    assert model_bytes(tmp_path / "out2") == model_bytes(tmp_path / "fresh")


def test_an_agent_edited_in_place_with_its_mtime_restored_is_probed_again(tmp_path: Path, family: Family) -> None:
    cache = tmp_path / "cache"
    assert merged(members(family), tmp_path / "out", cache)[0] == 0
    shard = family.agents[2] / "model.safetensors"
    before = shard.stat()
    tensors = read_safetensors(shard)
    dtype, shape, raw = tensors["model.embed_tokens.weight"]
    raw = raw.copy()
    raw[::3] ^= 0x0040  # many elements change, the size and the header do not
    write_safetensors(shard, {**tensors, "model.embed_tokens.weight": (dtype, shape, raw)})
    os.utime(shard, ns=(before.st_atime_ns, before.st_mtime_ns))
    assert merged(members(family), tmp_path / "again", cache)[0] == 0
    assert merged(members(family), tmp_path / "fresh", tmp_path / "fresh-cache")[0] == 0
    assert model_bytes(tmp_path / "again") == model_bytes(tmp_path / "fresh")
    # The finished output of the old data is not "already merged" for the new data.
    code, stdout, err = merged(members(family), tmp_path / "out", cache)
    assert "already merged" not in stdout
    one_line_error((code, stdout, err), "already holds another merge")


def test_the_same_agents_in_another_order_do_not_reuse_the_index(tmp_path: Path, family: Family) -> None:
    base, a0, a1, a2 = members(family)
    index = tmp_path / "index.zarr"
    assert run("probe", base, a0, a1, a2, "--index", index, "--quiet")[0] == 0
    swapped = [base, a1, a0, a2]
    one_line_error(run("merge", *swapped, "--out", tmp_path / "o", "--index", index), "another order")
    cache = tmp_path / "cache"
    assert merged([base, a0, a1, a2], tmp_path / "first", cache)[0] == 0
    code, stdout, _ = merged(swapped, tmp_path / "swapped", cache)
    fresh = merged(swapped, tmp_path / "fresh", tmp_path / "fresh-cache")
    assert code == 0 and stdout.split(" (", 1)[1] == fresh[1].split(" (", 1)[1]


# -- 2. the same file twice ---------------------------------------------------------------------


def test_the_same_file_under_two_names_is_refused(tmp_path: Path, family: Family) -> None:
    base, a0, a1, _ = members(family)
    out = tmp_path / "out"
    one_line_error(run("merge", base, a0, a1, a0 / "model.safetensors", "--out", out), "twice")
    one_line_error(run("merge", base, base / "model.safetensors", a1, "--out", out), "twice", "the base")
    link = tmp_path / "hard.safetensors"
    os.link(a1 / "model.safetensors", link)
    one_line_error(run("merge", base, a0, a1, link, "--out", out), "twice")
    assert not out.exists() or not any(out.glob("model*"))


# -- 3. non-finite output -----------------------------------------------------------------------


@pytest.mark.parametrize(
    ("args", "needle"),
    [
        (["--method", "ram+", "--r", "1e308"], "--r"),
        (["--method", "task_arithmetic", "--lambda", "1e300"], "--lambda"),
        (["--method", "linear", "--weights", "1e39"], "--weights"),
        (["--method", "linear", "--weights", "3e38,3e38,3e38"], "overflows float32"),
    ],
)
def test_parameters_that_overflow_float32_are_refused(
    tmp_path: Path, family: Family, args: list[str], needle: str
) -> None:
    out = tmp_path / "out"
    one_line_error(merged(members(family), out, tmp_path / "cache", *args), needle)
    assert not (out / "config.json").exists()


def big_family(root: Path, dtype: str) -> list[Path]:
    """Values near f16's largest (65504): base 60000, agents 64000 at some elements."""
    paths = [root / name for name in ("base", "a0", "a1")]
    base = np.full(64, 60000.0, np.float32)
    for k, path in enumerate(paths):
        path.mkdir(parents=True)
        values = base.copy()
        if k:
            values[0 :: 2 * k] = 64000.0  # a1's changes all overlap a0's: a0 has rho 1 under ram+
        raw = values.astype(np.float16).view(np.uint16) if dtype == "F16" else values.view(np.uint32) >> 16
        write_safetensors(path / "model.safetensors", {"w": (dtype, (64,), raw.astype(np.uint16))})
    return paths


@pytest.mark.parametrize(
    ("dtype", "args"),
    [
        ("BF16", ["--method", "task_arithmetic", "--lambda", "2", "--out-dtype", "f16"]),
        ("F16", ["--method", "task_arithmetic", "--lambda", "2"]),  # f16 in, f16 out
        ("F16", ["--method", "ram+", "--r", "1"]),
    ],
)
def test_a_merge_whose_values_leave_the_output_range_is_refused(tmp_path: Path, dtype: str, args: list[str]) -> None:
    paths = big_family(tmp_path / "fam", dtype)
    out = tmp_path / "out"
    message = one_line_error(merged(paths, out, tmp_path / "cache", *args), "'w'", "65504", "f32")
    largest = float(re.search(r"largest merged value, ([-0-9.e+]+),", message).group(1))  # type: ignore[union-attr]
    assert 65504 < largest < 80000  # the largest merged value is named
    assert not (out / "config.json").exists() and not (out / "ramstream_merge.json").exists()
    assert merged(paths, tmp_path / "f32", tmp_path / "cache", *args, "--out-dtype", "f32")[0] == 0


def test_nonfinite_inputs_let_through_are_not_taken_for_overflow(tmp_path: Path, family: Family) -> None:
    bad = with_raw_value(family.agents[0], tmp_path / "bad", "model.norm.weight", 5, 0x7FC0)  # NaN
    out = tmp_path / "out"
    code, _, err = merged([family.base, bad, family.agents[1]], out, tmp_path / "cache", "--method", "linear",
                          "--allow-nonfinite")  # fmt: skip
    assert code == 0, err
    assert read_model_dir(out)["model.norm.weight"][2][5] & 0x7FFF > 0x7F80  # the NaN passed, as asked


# -- 4. counts in a byte ------------------------------------------------------------------------


def test_more_agents_than_the_probe_counts_are_refused(tmp_path: Path) -> None:
    tensors = {"w": ("BF16", (64,), np.zeros(64, np.uint16))}
    write_safetensors(tmp_path / "base.safetensors", tensors)
    agents = []
    for t in range(255):
        path = tmp_path / f"a{t}.safetensors"
        raw = np.zeros(64, np.uint16)
        raw[t % 64] = 0x3F80  # 1.0
        write_safetensors(path, {"w": ("BF16", (64,), raw)})
        agents.append(str(path))
    opts = RunOptions(cache_dir=tmp_path / "cache", quiet=True)
    with pytest.raises(ConfigError, match="at most 254 agents"):
        api.probe(tmp_path / "base.safetensors", agents, options=opts)
    assert not (tmp_path / "cache" / "index").exists() or not any((tmp_path / "cache" / "index").iterdir())


# -- 5. the NaN contract ------------------------------------------------------------------------


def test_a_probe_made_with_allow_nonfinite_does_not_vouch_for_a_later_merge(tmp_path: Path, family: Family) -> None:
    bad = with_raw_value(family.agents[0], tmp_path / "bad", "model.norm.weight", 3, 0x7F80)  # +Inf
    index = tmp_path / "index.zarr"
    inputs = [family.base, bad, family.agents[1]]
    assert run("probe", *inputs, "--index", index, "--allow-nonfinite", "--quiet")[0] == 0
    out = tmp_path / "out"
    one_line_error(run("merge", *inputs, "--out", out, "--index", index, "--quiet"), "model.norm.weight", "inf")
    assert not (out / "config.json").exists()


# -- 6. a FIFO or a device where a checkpoint should be -----------------------------------------


def test_a_fifo_or_a_device_is_refused_at_once(tmp_path: Path, family: Family) -> None:
    fifo = tmp_path / "agent.safetensors"
    os.mkfifo(fifo)
    inside = tmp_path / "dir"
    inside.mkdir()
    os.mkfifo(inside / "model.safetensors")
    out = tmp_path / "out"
    one_line_error(run_process("merge", family.base, family.agents[0], fifo, "--out", out), str(fifo), "FIFO")
    one_line_error(run_process("merge", family.base, family.agents[0], inside, "--out", out), "FIFO")
    one_line_error(run("merge", family.base, family.agents[0], "/dev/zero", "--out", out), "character device")


def test_a_git_lfs_pointer_in_place_of_the_weights_says_to_fetch_them(tmp_path: Path, family: Family) -> None:
    """A repository cloned without Git LFS holds ~130-byte pointers where the weights should be:
    say so, rather than that the header claims exabytes."""
    agent = tmp_path / "cloned"
    agent.mkdir()
    for path in family.agents[0].iterdir():
        (agent / path.name).write_bytes(path.read_bytes())
    pointer = next(agent.glob("*.safetensors"))
    pointer.write_text("version https://git-lfs.github.com/spec/v1\noid sha256:" + "ab" * 32 + "\nsize 123456\n")
    out = tmp_path / "out"
    one_line_error(run("merge", family.base, agent, "--out", out), str(pointer), "Git LFS pointer", "git lfs pull")
    assert not out.exists()


def test_inspect_given_a_model_directory_asks_for_an_index(tmp_path: Path, family: Family) -> None:
    one_line_error(run("inspect", family.base), str(family.base), "not a ramstream index", "give an index's path")


# -- 7. tracebacks a user could cause -----------------------------------------------------------


@pytest.mark.parametrize(
    ("text", "needle"),
    [
        (b"merge_method: [ties]\nbase_model: b\nmodels: [{model: a}]\n", "merge_method"),
        (b"merge_method: {ties: 1}\nbase_model: b\nmodels: [{model: a}]\n", "merge_method"),
        (b"merge_method: ties\nout_dtype: [bfloat16]\nbase_model: b\nmodels: [{model: a}]\n", "out_dtype"),
        (b"merge_method: ties\ntokenizer_source: {a: 1}\nbase_model: b\nmodels: [{model: a}]\n", "tokenizer"),
        (b"merge_method: ties\nbase_model: \xff\xfe\n", "UTF-8"),
    ],
)
def test_a_config_with_the_wrong_kind_of_value_is_one_line(tmp_path: Path, text: bytes, needle: str) -> None:
    config = tmp_path / "merge.yml"
    config.write_bytes(text)
    one_line_error(run("merge", "--config", config, "--out", tmp_path / "out"), str(config), needle)


def test_a_base_config_json_that_is_not_an_object_is_refused_before_the_merge(tmp_path: Path, family: Family) -> None:
    (family.base / "config.json").write_text("[1, 2, 3]")
    out = tmp_path / "out"
    one_line_error(merged(members(family), out, tmp_path / "cache"), "config.json", "not an object")
    assert not out.exists()  # refused before the output (and any pass) was started


def test_a_path_too_long_a_symlink_loop_or_a_file_named_like_the_work_area(tmp_path: Path, family: Family) -> None:
    cache = tmp_path / "cache"
    long = tmp_path / ("x" * 300)
    one_line_error(merged(members(family), long, cache))
    one_line_error(merged([family.base, long, family.agents[0]], tmp_path / "out", cache), "x" * 20)
    one_line_error(run("probe", *members(family), "--index", long / "i.zarr"))
    loop = tmp_path / "loop"
    os.symlink(loop, loop)
    one_line_error(merged(members(family), loop, cache), str(loop))
    out = tmp_path / "out"
    out.mkdir()
    (out / ".ramstream").write_text("mine\n")
    one_line_error(merged(members(family), out, cache, "--force"), ".ramstream")
    assert (out / ".ramstream").read_text() == "mine\n"


LIMITED = (
    "import resource, signal, sys\n"
    "limit = int(sys.argv.pop(1))\n"
    "signal.signal(signal.SIGXFSZ, signal.SIG_IGN)\n"
    "resource.setrlimit(resource.RLIMIT_FSIZE, (limit, limit))\n"
    "from ramstream.cli import main\nmain()\n"
)


def test_a_full_disk_while_taking_the_lock_is_one_line(tmp_path: Path, family: Family) -> None:
    """A 1-byte file-size limit: writing the holder's pid into the lock file fails (EFBIG, the
    path of a full disk), then everything else does; one line, no traceback."""
    argv = ["merge", *map(str, members(family)), "--out", str(tmp_path / "out"), "--cache-dir", str(tmp_path / "c")]
    done = subprocess.run([sys.executable, "-c", LIMITED, "1", *argv], capture_output=True, text=True, timeout=120)
    one_line_error((done.returncode, done.stdout, done.stderr))


# -- 8. messages that say what to do ------------------------------------------------------------


def test_an_index_left_half_made_says_to_delete_it(tmp_path: Path, family: Family) -> None:
    index = tmp_path / "index.zarr"
    assert run("probe", *members(family), "--index", index, "--quiet")[0] == 0
    (index / "zarr.json").unlink()  # deleted during a run, as rm -rf does, in the middle
    one_line_error(run("probe", *members(family), "--index", index), str(index), "delete")


def test_a_shard_listed_twice_under_two_spellings_is_read_once(tmp_path: Path) -> None:
    fam = build_family(tmp_path / "family", shapes=SHAPES, shards=2)
    index_file = fam.agents[0] / "model.safetensors.index.json"
    doc = json.loads(index_file.read_text())
    names = sorted(doc["weight_map"])
    doc["weight_map"][names[0]] = "./" + doc["weight_map"][names[0]]
    doc["weight_map"][names[1]] = "sub/../" + doc["weight_map"][names[1]]
    (fam.agents[0] / "sub").mkdir()
    index_file.write_text(json.dumps(doc))
    code, _, err = merged(members(fam), tmp_path / "out", tmp_path / "cache")
    assert code == 0, err


# -- 9. --force replaces an earlier merge and nothing else --------------------------------------


def test_force_never_deletes_files_no_merge_wrote(tmp_path: Path, family: Family) -> None:
    out = tmp_path / "out"
    out.mkdir()
    mine = {"README.md": "my notes\n", "config.json": "{}", "tokenizer.json": "{}", "vocab.json": "{}"}
    for name, text in mine.items():
        (out / name).write_text(text)
    one_line_error(merged(members(family), out, tmp_path / "cache", "--force"), "no ramstream merge wrote")
    assert {p.name: p.read_text() for p in out.iterdir()} == mine
    # Beside an earlier merge, a file of the user's stops --force too, and the merge stays whole.
    done = tmp_path / "done"
    assert merged(members(family), done, tmp_path / "cache")[0] == 0
    before = sorted(p.name for p in done.iterdir())
    (done / "notes.txt").write_text("mine\n")
    one_line_error(merged(members(family), done, tmp_path / "cache", "--force", "--r", "0.3"), "notes.txt")
    assert sorted(p.name for p in done.iterdir()) == sorted([*before, "notes.txt"])
    (done / "notes.txt").unlink()
    code, _, err = merged(members(family), done, tmp_path / "cache", "--force", "--r", "0.3")
    assert code == 0, err
    record = json.loads((done / "ramstream_merge.json").read_text())
    assert record["params"]["r"] == 0.3 and "ramstream_merge.json" in record["files"]


# -- 10. the lock -------------------------------------------------------------------------------


def test_a_waiter_that_locks_the_file_its_holder_unlinked_does_not_hold_the_lock(tmp_path: Path) -> None:
    """A holds; B waits on the same file; A unlinks and lets go, B gets the old (unlinked) file.
    B must notice and lock the file at the path, so C is refused: one holder at a time."""
    lock = tmp_path / "x.lock"
    got, release = threading.Event(), threading.Event()

    def waiter() -> None:
        with hold(lock, "test", wait=True):
            got.set()
            release.wait(30)

    with hold(lock, "test", wait=False):
        thread = threading.Thread(target=waiter)
        thread.start()
        time.sleep(0.3)  # B is blocked in flock on A's file
    try:
        assert got.wait(10)
        with pytest.raises(ConcurrentRunError), hold(lock, "test", wait=False):
            pass
    finally:
        release.set()
        thread.join(10)


# -- 11. the O_DIRECT fallback from several write-behind threads --------------------------------


def test_o_direct_refused_mid_run_falls_back_once_from_every_thread(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    size = 64 << 20
    layout = ShardLayout(("s",), (b"",), (size,), {"t": Placement(0, 0, "U8", size)})
    writer = ShardWriter(layout, tmp_path)
    direct = os.open(tmp_path / "s.partial", os.O_WRONLY)  # stands for the O_DIRECT descriptor
    writer._direct_fds[0] = direct
    real = direct_io.pwrite_all

    def refusing(fd: int, data: memoryview, offset: int) -> None:
        if fd == direct:  # the file system refuses O_DIRECT from now on (EINVAL), as some do
            time.sleep(0.001)
            raise OSError(errno.EINVAL, "Invalid argument")
        real(fd, data, offset)

    monkeypatch.setattr(direct_io, "pwrite_all", refusing)
    chunk = 2 << 20
    errors: list[BaseException] = []

    def worker(k: int) -> None:
        try:
            for start in range(k * chunk, size, 2 * chunk):
                data = writer.staging(k, "t", start, chunk, np.dtype(np.uint8))
                data[:] = (start // chunk) % 251
                writer.write("t", start, data)
        except BaseException as exc:
            errors.append(exc)

    threads = [threading.Thread(target=worker, args=(k,)) for k in range(2)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    writer.close()
    assert not errors, errors
    written = np.fromfile(tmp_path / "s.partial", np.uint8).reshape(-1, chunk)
    assert (written == (np.arange(len(written)) % 251)[:, None]).all()


# -- 12. the memory budget ----------------------------------------------------------------------


def test_della_refuses_rows_larger_than_the_budget(tmp_path: Path) -> None:
    shapes = {"model.embed_tokens.weight": (64, 24), "model.norm.weight": (1 << 20,)}  # a 1M-element row
    fam = build_family(tmp_path / "family", shapes=shapes)
    out = tmp_path / "out"
    args = ["--method", "della", "--density", "0.5", "--epsilon", "0.1", "--memory", "16MiB"]
    one_line_error(merged(members(fam), out, tmp_path / "cache", *args), "model.norm.weight", "--memory")


def test_a_resume_under_a_smaller_budget_starts_its_blocks_over(
    tmp_path: Path, family: Family, capsys: pytest.CaptureFixture[str]
) -> None:
    big = RunOptions(cache_dir=tmp_path / "cache", quiet=True, block_elems=1024)
    small = RunOptions(cache_dir=tmp_path / "cache", quiet=True, block_elems=256)
    api.merge(family.base, family.agents, out=tmp_path / "reference", options=small)
    out = tmp_path / "out"
    with interrupted_after(2), pytest.raises(Interrupted):
        api.merge(family.base, family.agents, out=out, options=big)
    capsys.readouterr()
    api.merge(family.base, family.agents, out=out, options=small)
    assert "start over at the smaller size" in capsys.readouterr().err
    assert model_bytes(out) == model_bytes(tmp_path / "reference")


def test_an_index_probed_under_a_larger_budget_says_so(
    tmp_path: Path, family: Family, capsys: pytest.CaptureFixture[str]
) -> None:
    """An index keeps its blocks (its partials are per block): reused under a smaller --memory,
    the run says that its passes may exceed the budget, and how to stay within it."""
    big = RunOptions(cache_dir=tmp_path / "cache", quiet=True, block_elems=1024)
    small = RunOptions(cache_dir=tmp_path / "cache", quiet=True, block_elems=256)
    api.probe(family.base, family.agents, options=big)
    capsys.readouterr()
    api.merge(family.base, family.agents, out=tmp_path / "out", method="ties", options=small)
    err = capsys.readouterr().err
    assert "has blocks of 1024 elements, more than --memory allows now (256)" in err
    assert "give another --index" in err


# -- 14. the store guard translates I/O and format errors only ----------------------------------


def test_the_store_guard_translates_io_and_format_errors_and_lets_bugs_through() -> None:
    with pytest.raises(StoreWriteError, match="free space"), store_io("idx", "writing"):
        raise OSError(errno.ENOSPC, "No space left on device")
    with pytest.raises(StoreCorruptError, match="damaged"), store_io("idx", "reading"):
        raise ValueError("Stored and computed checksum do not match")
    for bug in (KeyError("x"), TypeError("x"), AttributeError("x"), AssertionError()):
        with pytest.raises(type(bug)), store_io("idx", "reading"):
            raise bug


# -- 15. a plugin registered first adds to the built-ins ----------------------------------------


class Item:
    def __init__(self, name: str) -> None:
        self.name = name


def test_a_plugin_registered_before_any_lookup_keeps_the_builtins() -> None:
    registry: Registry[Item] = Registry("thing", lambda: [Item("a"), Item("b")])
    registry.register(Item("plugin"))
    assert registry.names() == ["a", "b", "plugin"]
    with pytest.raises(ValueError, match="twice"):
        registry.register(Item("a"))


def test_a_method_plugin_registered_first_keeps_every_builtin_method() -> None:
    code = (
        "from dataclasses import replace\n"
        "from ramstream.methods import linear, registry\n"
        "registry.register(replace(linear.LINEAR, name='my_linear'))\n"
        "print(','.join(registry.method_names()))\n"
    )
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=60)
    assert done.returncode == 0, done.stderr
    names = done.stdout.strip().split(",")
    assert {"ram+", "ties", "della", "model_stock", "my_linear"} <= set(names)
