"""``--scheduler`` addresses where no Dask scheduler answers (issue 21, class 4).

A port that accepts and never speaks, an HTTP server, ``tls://`` without certificates, a closed
port and strings that are no address at all: each ends in one ``error:`` line within
``--scheduler-timeout``, with nothing else on stderr, not even at interpreter exit (every run is
a real process), and the index lock is let go. Every listener is on 127.0.0.1, on a port the
system picks, started and stopped inside its test.
"""

from __future__ import annotations

import http.server
import socket
import subprocess
import sys
import threading
import time
from collections.abc import Callable, Iterator
from contextlib import AbstractContextManager, contextmanager, nullcontext
from pathlib import Path

import pytest

from ramstream.api import probe
from ramstream.config import RunOptions
from ramstream.errors import ClusterError
from ramstream.io.lock import hold
from tests.families import Family, build_family
from tests.loopback import silent_listener
from tests.test_cli import Outcome, one_line_error

pytest.importorskip("distributed")

TIMEOUT = 0.5  # --scheduler-timeout of these runs, seconds
SLACK = 10.0  # the process's own start-up and shutdown, on a loaded CI machine


class _QuietHandler(http.server.BaseHTTPRequestHandler):
    def do_GET(self) -> None:
        self.send_response(200)
        self.end_headers()
        self.wfile.write(b"<html>a dashboard</html>")

    def log_message(self, format: str, *args: object) -> None:
        pass


@contextmanager
def http_server() -> Iterator[int]:
    """An HTTP server (a scheduler's dashboard, say) on loopback."""
    server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), _QuietHandler)
    thread = threading.Thread(target=server.serve_forever, kwargs={"poll_interval": 0.05}, daemon=True)
    thread.start()
    try:
        yield server.server_address[1]
    finally:
        server.shutdown()
        server.server_close()
        thread.join(timeout=5)


@contextmanager
def closed_port() -> Iterator[int]:
    """A loopback port nothing listens on (bound, then let go)."""
    with socket.create_server(("127.0.0.1", 0)) as probe_socket:
        port = probe_socket.getsockname()[1]
    yield port


Place = Callable[[], AbstractContextManager[int]]

# case: (what listens, the address given that port, what the line must say)
CASES: dict[str, tuple[Place, str, str]] = {
    "silent-listener": (silent_listener, "tcp://127.0.0.1:{port}", "within 0.5 s (--scheduler-timeout)"),
    "http-server": (http_server, "tcp://127.0.0.1:{port}", "within 0.5 s (--scheduler-timeout)"),
    "http-url": (http_server, "http://127.0.0.1:{port}", "unknown address scheme 'http'"),
    "tls-without-certificates": (silent_listener, "tls://127.0.0.1:{port}", "needs Dask's TLS settings"),
    "closed-port": (closed_port, "tcp://127.0.0.1:{port}", "Timed out trying to connect"),
    "garbage": (lambda: nullcontext(0), "::::", "not a Dask scheduler address"),
    "unknown-scheme": (lambda: nullcontext(0), "foo://x", "unknown address scheme 'foo'"),
    "empty": (lambda: nullcontext(0), "", "missing port number"),
}


@pytest.fixture(scope="module")
def family(tmp_path_factory: pytest.TempPathFactory) -> Family:
    return build_family(tmp_path_factory.mktemp("scheduler"), densities=(0.1, 0.4))


def run(*args: str | Path) -> tuple[Outcome, float]:
    start = time.monotonic()
    done = subprocess.run(
        [sys.executable, "-m", "ramstream.cli", *map(str, args)], capture_output=True, text=True, timeout=120
    )
    elapsed = time.monotonic() - start
    return Outcome(done.returncode, done.stdout, done.stderr, "Traceback" in done.stderr), elapsed


@pytest.mark.parametrize("case", list(CASES))
def test_an_address_where_no_scheduler_answers_is_one_line_in_bounded_time(
    tmp_path: Path, family: Family, case: str
) -> None:
    place, address, needle = CASES[case]
    index = tmp_path / "index.zarr"
    members = [family.base, *family.agents]
    with place() as port:
        given = address.format(port=port)
        outcome, elapsed = run("probe", *members, "--index", index, "--quiet", "--scheduler", given,
                               "--scheduler-timeout", str(TIMEOUT))  # fmt: skip
    line = one_line_error(outcome, needle)
    assert repr(given) in line or given in line
    assert elapsed < TIMEOUT + SLACK, f"{elapsed:.1f} s"
    if case == "silent-listener":  # the one that held the index lock while it waited
        again, _ = run("probe", *members, "--index", index, "--quiet")
        assert again.code == 0 and again.err == "", "a probe of the same index right after neither waits nor fails"


def test_the_index_lock_is_let_go_in_a_process_that_goes_on(tmp_path: Path, family: Family) -> None:
    """The Python API: the silent listener's error comes back within the timeout, the lock is
    free at once (not at the process's exit), and no finaliser complains later (pytest turns an
    unraisable exception or a resource warning into an error)."""
    index = tmp_path / "index.zarr"
    members = [str(a) for a in family.agents]
    with silent_listener() as port:
        options = RunOptions(quiet=True, scheduler=f"tcp://127.0.0.1:{port}", scheduler_timeout=0.5)
        start = time.monotonic()
        with pytest.raises(ClusterError, match=r"nothing answered as a Dask scheduler within 0\.5 s"):
            probe(family.base, members, index=index, options=options)
        assert time.monotonic() - start < 0.5 + 5
    with hold(index.with_name(index.name + ".lock"), "the index", wait=False):
        pass
