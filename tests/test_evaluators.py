"""Evaluators are child processes the sweep owns.

Real evaluator scripts, written by the tests: one that hangs (and ignores SIGTERM), one that
leaves a child holding its stdout, one that double-forks a ``setsid`` daemon (out of its process
group, holding its stdout), one that reads stdin, one that prints megabytes, ones that
print hostile metrics, one that rewrites the weights it was given; a sweep killed by SIGTERM or
Ctrl-C in the middle of an evaluation. Each must end in bounded time with no process of the
evaluator left, and be recorded as the evaluation's own success or failure, never the sweep's.
"""

from __future__ import annotations

import json
import shlex
import signal
import subprocess
import sys
import time
import tracemalloc
from pathlib import Path

import pytest

from ramstream.sweep import child
from ramstream.sweep.evaluate import evaluate
from tests.families import Family, build_family
from tests.test_cli import in_process, one_line_error
from tests.test_sweep import tree

CANDIDATE = "task_arithmetic"


def command(script: Path, *extra: str) -> str:
    return shlex.join([sys.executable, str(script), "{model}", *extra])


def write(tmp: Path, body: str, name: str = "eval.py") -> Path:
    path = tmp / name
    path.write_text(body)
    return path


def alive(pid: int) -> bool:
    """A process that exists and is not a zombie (a container's init may never reap those)."""
    try:
        state = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0]
    except (FileNotFoundError, IndexError):
        return False
    return state not in ("Z", "X")


def pids(path: Path) -> list[int]:
    return [int(x) for x in path.read_text().split()] if path.exists() else []


def wait_for(condition: object, seconds: float = 30.0) -> None:
    deadline = time.monotonic() + seconds
    while not condition():  # type: ignore[operator]
        assert time.monotonic() < deadline, "timed out waiting"
        time.sleep(0.05)


# -- one evaluation, in this process ----------------------------------------------------------

HANGS = """
import os, signal, sys, time
signal.signal(signal.SIGTERM, signal.SIG_IGN)  # the group gets SIGKILL after KILL_AFTER
open(sys.argv[2], "a").write(f"{os.getpid()} ")
time.sleep(600)
"""

LEAVES_A_CHILD = """
import os, subprocess, sys
# A background child that inherits stdout and stderr, then a grandchild forked from it.
child = subprocess.Popen([sys.executable, "-c", "import os, sys, time; pid = os.fork(); time.sleep(600)"])
open(sys.argv[2], "a").write(f"{child.pid} ")
print('{"score": 1}')
"""

READS_STDIN = """
import json, sys
print(json.dumps({"score": len(sys.stdin.read())}))
"""

PRINTS_MUCH = """
import sys
line = "x" * 1023 + "\\n"
for _ in range(8 * 1024):  # 8 MiB, then the result
    sys.stdout.write(line)
print('{"score": 2}')
"""

PRINTS_400_MIB = """
import sys
lines = ("x" * 1023 + "\\n") * 1024  # 1 MiB of lines
for _ in range(400):
    sys.stdout.write(lines)
print('{"score": 4}')
"""

LAST_LINE_TOO_LONG = """
import sys
sys.stdout.write("9" * (1024 * 1024))
"""


@pytest.fixture(params=["supervised", "group-only"])
def owned_as(request: pytest.FixtureRequest, monkeypatch: pytest.MonkeyPatch) -> str:
    """Each way the sweep owns an evaluator: under the supervisor (Linux), and its process group
    alone (where there is no supervisor: what runs on other systems)."""
    if request.param == "supervised" and not child.supervised():
        pytest.skip("the supervisor needs Linux (prctl)")
    if request.param == "group-only":
        monkeypatch.setattr(child, "supervised", lambda: False)
    return str(request.param)


def test_a_hanging_evaluator_is_stopped_at_the_timeout(tmp_path: Path, owned_as: str) -> None:
    started = time.monotonic()
    log = tmp_path / "pids"
    result = evaluate(command(write(tmp_path, HANGS), str(log)), "m", tmp_path, timeout=2)
    assert "did not finish within 2 s (--eval-timeout)" in (result.error or "")
    assert time.monotonic() - started < 2 + child.KILL_AFTER + 3
    assert pids(log) and not any(alive(p) for p in pids(log))


def test_what_an_evaluator_leaves_running_is_killed_when_it_exits(tmp_path: Path, owned_as: str) -> None:
    started = time.monotonic()
    log = tmp_path / "pids"
    result = evaluate(command(write(tmp_path, LEAVES_A_CHILD), str(log)), "m", tmp_path, timeout=60)
    assert result.metrics == {"score": 1.0} and result.error is None
    assert time.monotonic() - started < 10  # not the 600 s its child would hold the pipe
    wait_for(lambda: not any(alive(p) for p in pids(log)), 5)


# A daemon made as daemons are: fork, setsid (a session and group of its own), fork again, the
# middle process exits so the daemon is an orphan; it keeps the evaluator's stdout and sleeps.
ESCAPES = """
import os, sys, time
log, mode = sys.argv[2], sys.argv[3]
middle = os.fork()
if middle == 0:
    os.setsid()
    if os.fork() > 0:
        os._exit(0)
    with open(log, "a") as f:
        f.write(f"{os.getpid()} ")
    time.sleep(600)
    os._exit(0)
os.waitpid(middle, 0)
deadline = time.monotonic() + 30  # the daemon has logged itself before the evaluator goes on (under load
while time.monotonic() < deadline:  # it could be killed first, once the evaluator had exited)
    if os.path.exists(log) and open(log).read().strip():
        break
    time.sleep(0.01)
with open(log, "a") as f:
    f.write(f"{os.getpid()} ")
if mode == "hang":
    time.sleep(600)
print('{"score": 1}')
"""

needs_supervisor = pytest.mark.skipif(not child.supervised(), reason="the supervisor needs Linux (prctl)")


@needs_supervisor
@pytest.mark.parametrize("mode", ["exits", "hang"])
def test_a_daemon_that_left_the_evaluator_s_group_is_killed_too(tmp_path: Path, mode: str) -> None:
    """After the candidate is scored (the evaluator exits), and after the timeout."""
    started = time.monotonic()
    log = tmp_path / "pids"
    result = evaluate(command(write(tmp_path, ESCAPES), str(log), mode), "m", tmp_path, timeout=3)
    if mode == "exits":
        assert result.metrics == {"score": 1.0} and result.error is None, result.error
        assert time.monotonic() - started < 10  # not the 600 s its daemon would hold the pipe
    else:
        assert "did not finish within 3 s" in (result.error or "")
        assert time.monotonic() - started < 3 + child.KILL_AFTER + 3
    assert len(pids(log)) == 2  # the evaluator and its daemon
    assert not any(alive(p) for p in pids(log))  # gone when evaluate returns, not later


def test_an_evaluator_reading_stdin_gets_end_of_file(tmp_path: Path) -> None:
    result = evaluate(command(write(tmp_path, READS_STDIN)), "m", tmp_path, timeout=20)
    assert result.metrics == {"score": 0.0}


def test_megabytes_of_output_are_read_in_bounded_memory(tmp_path: Path) -> None:
    tracemalloc.start()
    try:
        result = evaluate(command(write(tmp_path, PRINTS_MUCH)), "m", tmp_path, timeout=60)
        peak = tracemalloc.get_traced_memory()[1]
    finally:
        tracemalloc.stop()
    assert result.metrics == {"score": 2.0}
    assert peak < 1024**2, f"{peak / 1024**2:.1f} MiB held for 8 MiB of output"
    too_long = evaluate(command(write(tmp_path, LAST_LINE_TOO_LONG)), "m", tmp_path, timeout=60)
    assert too_long.error == f"its last line of output is longer than {child.LINE_BYTES} bytes"


def test_400_mib_of_output_cost_the_sweep_no_more(tmp_path: Path) -> None:
    """400 MiB cost a 1.39 GB peak before the output was read as it comes; now under 1 MiB, in bounded time."""
    started = time.monotonic()
    tracemalloc.start()
    try:
        result = evaluate(command(write(tmp_path, PRINTS_400_MIB)), "m", tmp_path, timeout=120)
        peak = tracemalloc.get_traced_memory()[1]
    finally:
        tracemalloc.stop()
    assert result.metrics == {"score": 4.0}, result.error
    assert peak < 1024**2, f"{peak / 1024**2:.1f} MiB held for 400 MiB of output"
    assert time.monotonic() - started < 60


def test_the_last_line_is_found_across_reads() -> None:
    tail = child.LastLine(limit=16)
    for piece in (b"first\nsec", b"ond\n\n  \nthi", b"rd", b"\n\n"):
        tail.feed(piece)
    assert tail.close() == "third"
    tail = child.LastLine(limit=16)
    for piece in (b"ok\n", b"x" * 10, b"x" * 10, b"\n", b"  \n"):
        tail.feed(piece)
    assert tail.close() is None  # the last non-empty line is 20 bytes: too long
    tail = child.LastLine(limit=16)
    tail.feed(b"a\n" + b"y" * 40 + b"\nlast")
    assert tail.close() == "last"


HOSTILE_LINES = {
    "nan": ("NaN", "metric 'score' is nan, not a finite number"),
    "nan-in-an-object": ('{"acc": NaN, "f1": 0.5}', "metric 'acc' is nan, not a finite number"),
    "infinite": ('{"acc": 1e999}', "metric 'acc' is inf, not a finite number"),
    "400-digit-integer": ("9" * 400, "beyond float64's range"),
    "no-number": ('{"acc": "high", "ok": true}', "reports no numeric metric"),
    "nested-deeply": ("[" * 50_000, "not a JSON object or a number"),
    "a-terminal-escape": ("\x1b[2J\x1b[31mred", "not a JSON object or a number: '\\x1b[2J"),
}


@pytest.mark.parametrize("case", list(HOSTILE_LINES))
def test_a_hostile_metric_is_a_recorded_failure_with_its_reason(tmp_path: Path, case: str) -> None:
    line, reason = HOSTILE_LINES[case]
    (tmp_path / "line").write_text(line + "\n")
    prints = write(tmp_path, "import sys; sys.stdout.write(open(sys.argv[1] + '/line').read())")
    result = evaluate(command(prints), "m", tmp_path, timeout=20)
    assert result.metrics == {} and reason in (result.error or ""), result.error
    assert (result.error or "").isprintable() and len(result.error or "") < 400


def test_a_failing_evaluator_s_message_is_escaped(tmp_path: Path) -> None:
    fails = write(tmp_path, "import sys; sys.stderr.write('\\x1b[2Jboom\\rerror: forged\\n'); sys.exit(3)")
    result = evaluate(command(fails), "m", tmp_path, timeout=20)
    assert result.error is not None and result.error.startswith("exit status 3: ")
    assert result.error.isprintable() and "\\x1b[2J" in result.error


# -- a sweep: interrupted mid-evaluation, names printed, weights rewritten, --select ------------


@pytest.fixture(scope="module")
def family(tmp_path_factory: pytest.TempPathFactory) -> Family:
    return build_family(tmp_path_factory.mktemp("evaluators"), densities=(0.2, 0.45), seed=31)


def members(family: Family) -> list[str]:
    return [str(family.base), *map(str, family.agents)]


def sweep(family: Family, out: Path, *extra: object) -> tuple[int, str, str]:
    done = in_process("sweep", *members(family), "--out", out, "--grid", CANDIDATE, "--quiet", *extra)
    return done.code, done.out, done.err


@pytest.fixture(scope="module")
def swept(family: Family, tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A sweep of one candidate, merged: each test below only evaluates it."""
    out = tmp_path_factory.mktemp("swept") / "sweep"
    code, _, err = sweep(family, out)
    assert code == 0, err
    return out


@pytest.mark.parametrize("sig", [signal.SIGTERM, signal.SIGINT], ids=["sigterm", "ctrl-c"])
def test_a_sweep_stopped_mid_evaluation_leaves_no_evaluator_process(
    family: Family, swept: Path, tmp_path: Path, sig: signal.Signals
) -> None:
    log = tmp_path / "pids"
    hangs = write(
        tmp_path,
        "import os, subprocess, sys, time\n"
        "kid = subprocess.Popen([sys.executable, '-c', 'import time; time.sleep(600)'])\n"
        "open(sys.argv[2], 'a').write(f'{os.getpid()} {kid.pid} ')\n"
        "time.sleep(600)\n",
    )
    argv = [sys.executable, "-m", "ramstream.cli", "sweep", *members(family), "--out", str(swept)]
    argv += ["--grid", CANDIDATE, "--quiet", "--eval", command(hangs, str(log))]
    proc = subprocess.Popen(argv, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    try:
        wait_for(lambda: len(pids(log)) == 2, 60)
        proc.send_signal(sig)
        _, err = proc.communicate(timeout=20)
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()
    assert proc.returncode == 130, err
    assert "interrupted" in err and "Traceback" not in err, err
    wait_for(lambda: not any(alive(p) for p in pids(log)), 5)


def test_eval_timeout_on_the_command_line(family: Family, swept: Path, tmp_path: Path) -> None:
    started = time.monotonic()
    hangs = command(write(tmp_path, HANGS), str(tmp_path / "pids"))
    code, out, err = sweep(family, swept, "--eval", hangs, "--eval-timeout", "2")
    assert code == 0, err
    assert time.monotonic() - started < 20
    assert "did not finish within 2 s" in out
    recorded = json.loads((swept / "sweep.json").read_text())["eval"]["candidates"][CANDIDATE]
    assert recorded["metrics"] == {} and "did not finish within 2 s" in recorded["error"]
    refused = in_process("sweep", *members(family), "--out", swept, "--grid", CANDIDATE, "--eval-timeout", "0")
    assert refused.code == 2 and "--eval-timeout" in refused.err


def test_metric_names_are_printed_escaped(family: Family, swept: Path, tmp_path: Path) -> None:
    (tmp_path / "line").write_text('{"\\u001b[2Jacc\\nerror: forged": 0.5}\n')
    prints = write(tmp_path, "import sys; sys.stdout.write(open(sys.argv[2]).read())")
    code, out, err = sweep(family, swept, "--eval", command(prints, str(tmp_path / "line")))
    assert code == 0, err
    assert "\x1b" not in out and not any(line.startswith("error: forged") for line in out.splitlines()), out
    assert "\\x1b[2Jacc\\nerror: forged" in out


def test_select_naming_an_unreported_metric_says_which_were(family: Family, swept: Path, tmp_path: Path) -> None:
    prints = write(tmp_path, 'print(\'{"acc": 0.5, "f1": 0.25}\')')
    args = ("--out", swept, "--grid", CANDIDATE, "--quiet", "--eval", command(prints), "--select", "accuracy")
    done = in_process("sweep", *members(family), *args)
    one_line_error(done, "--select 'accuracy'", "they reported 'acc', 'f1'")
    recorded = json.loads((swept / "sweep.json").read_text())["eval"]["candidates"][CANDIDATE]
    assert recorded["metrics"] == {"acc": 0.5, "f1": 0.25}


REWRITES = """
import sys
from pathlib import Path
weights = Path(sys.argv[1]) / "model.safetensors"
data = bytearray(weights.read_bytes())
data[len(data) // 2] ^= 0x40  # one element of the data, in place, the file keeping its size
weights.write_bytes(bytes(data))
print('{"score": 1}')
"""


@pytest.mark.parametrize("what", ["weights", "config"])
def test_a_candidate_whose_files_changed_is_merged_again(family: Family, tmp_path: Path, what: str) -> None:
    out = tmp_path / "sweep"
    code, _, err = sweep(family, out)
    assert code == 0, err
    merged = tree(out / CANDIDATE)
    rewrites_config = "import sys, pathlib; (pathlib.Path(sys.argv[1]) / 'config.json').write_text('{}')"
    body = REWRITES if what == "weights" else rewrites_config
    code, _, err = sweep(family, out, "--eval", command(write(tmp_path, body)))
    assert code == 0, err
    assert tree(out / CANDIDATE) != merged
    code, printed, err = sweep(family, out, "--eval", command(write(tmp_path, "print(3)", "plain.py")))
    assert code == 0, err
    assert "changed since it was merged; merging it again" in err
    assert f"merged: {out / CANDIDATE}" in printed
    assert tree(out / CANDIDATE) == merged
    scores = json.loads((out / "sweep.json").read_text())["eval"]["candidates"][CANDIDATE]
    assert scores["metrics"] == {"score": 3.0}  # evaluated again, as merged again
    code, printed, err = sweep(family, out)
    assert code == 0 and err == "" and "already merged" in printed


@needs_supervisor
@pytest.mark.parametrize("sig", [signal.SIGTERM, signal.SIGINT, signal.SIGKILL], ids=["sigterm", "ctrl-c", "sigkill"])
def test_a_sweep_stopped_mid_evaluation_leaves_no_daemon_of_the_evaluator(
    family: Family, swept: Path, tmp_path: Path, sig: signal.Signals
) -> None:
    """The daemon left the evaluator's group; it is still the supervisor's to end, even when the
    sweep itself is SIGKILLed (the supervisor gets SIGTERM when its parent dies)."""
    log = tmp_path / "pids"
    argv = [sys.executable, "-m", "ramstream.cli", "sweep", *members(family), "--out", str(swept)]
    argv += ["--grid", CANDIDATE, "--quiet", "--eval", command(write(tmp_path, ESCAPES), str(log), "hang")]
    proc = subprocess.Popen(argv, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    try:
        wait_for(lambda: len(pids(log)) == 2, 60)
        proc.send_signal(sig)
        _, err = proc.communicate(timeout=20)
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()
    if sig != signal.SIGKILL:
        assert proc.returncode == 130, err
        assert "interrupted" in err and "Traceback" not in err, err
        assert not any(alive(p) for p in pids(log))  # ended before the sweep exited
    wait_for(lambda: not any(alive(p) for p in pids(log)), 5)
