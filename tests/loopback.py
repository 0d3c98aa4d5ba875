"""Servers for tests, on 127.0.0.1 at a port the system picks, started and stopped by a ``with``:
a port that accepts and never answers, an HTTP server, and a small Hugging Face hub.

The hub answers what ``huggingface_hub`` asks when it resolves and downloads a model: the repo's
commit and file list (``/api/models/<repo>/revision/<rev>``) and each file's metadata and bytes
(``HEAD``/``GET /<repo>/resolve/<commit>/<file>``); anything else is a 404. A path listed in
``silent`` is accepted and never answered, until the server stops.
"""

from __future__ import annotations

import hashlib
import http.server
import json
import socket
import threading
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field
from pathlib import Path
from urllib.parse import unquote, urlparse


@contextmanager
def silent_listener() -> Iterator[int]:
    """A port that accepts connections and never sends a byte."""
    server = socket.create_server(("127.0.0.1", 0))
    accepted: list[socket.socket] = []

    def accept() -> None:
        while True:
            try:
                accepted.append(server.accept()[0])
            except OSError:  # closed: the test is over
                return

    thread = threading.Thread(target=accept, daemon=True)
    thread.start()
    try:
        yield server.getsockname()[1]
    finally:
        server.shutdown(socket.SHUT_RDWR)
        server.close()
        thread.join(timeout=5)
        for conn in accepted:
            conn.close()


@dataclass
class Repo:
    commit: str
    files: dict[str, bytes]

    @classmethod
    def of(cls, directory: Path, commit: str) -> Repo:
        return cls(commit, {p.name: p.read_bytes() for p in sorted(directory.iterdir())})


@dataclass
class Hub:
    """The repos a hub serves, the paths it leaves unanswered, and the requests it saw."""

    repos: dict[str, Repo]
    silent: set[str] = field(default_factory=set)
    seen: list[str] = field(default_factory=list)
    release: threading.Event = field(default_factory=threading.Event)


class _Handler(http.server.BaseHTTPRequestHandler):
    hub: Hub

    def do_GET(self) -> None:
        self._answer(body=True)

    def do_HEAD(self) -> None:
        self._answer(body=False)

    def _answer(self, body: bool) -> None:
        path = unquote(urlparse(self.path).path)
        self.hub.seen.append(f"{self.command} {path}")
        if path in self.hub.silent:
            self.hub.release.wait(60)
            return
        found = self._find(path)
        if found is None:
            self.send_response(404)
            self.send_header("Content-Length", "0")
            self.end_headers()
            return
        data, headers = found
        self.send_response(200)
        for key, value in {**headers, "Content-Length": str(len(data))}.items():
            self.send_header(key, value)
        self.end_headers()
        if body:
            self.wfile.write(data)

    def _find(self, path: str) -> tuple[bytes, dict[str, str]] | None:
        parts = path.strip("/").split("/")
        if parts[:2] == ["api", "models"] and len(parts) == 6 and parts[4] == "revision":
            repo = self.hub.repos.get(f"{parts[2]}/{parts[3]}")
            if repo is None or parts[5] not in ("main", repo.commit):
                return None
            info = {"id": f"{parts[2]}/{parts[3]}", "sha": repo.commit, "siblings": []}
            info["siblings"] = [{"rfilename": name} for name in repo.files]
            return json.dumps(info).encode(), {"Content-Type": "application/json"}
        if len(parts) == 5 and parts[2] == "resolve":
            repo = self.hub.repos.get(f"{parts[0]}/{parts[1]}")
            if repo is None or parts[3] != repo.commit or parts[4] not in repo.files:
                return None
            data = repo.files[parts[4]]
            etag = f'"{hashlib.sha256(data).hexdigest()}"'
            return data, {"ETag": etag, "X-Repo-Commit": repo.commit, "Content-Type": "application/octet-stream"}
        return None

    def log_message(self, format: str, *args: object) -> None:
        pass


@contextmanager
def hub_server(hub: Hub) -> Iterator[str]:
    """``hub`` served over HTTP; yields its endpoint (for ``HF_ENDPOINT``)."""
    handler = type("Handler", (_Handler,), {"hub": hub})
    server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), handler)
    server.daemon_threads = True
    thread = threading.Thread(target=server.serve_forever, kwargs={"poll_interval": 0.05}, daemon=True)
    thread.start()
    try:
        yield f"http://127.0.0.1:{server.server_address[1]}"
    finally:
        hub.release.set()
        server.shutdown()
        server.server_close()
        thread.join(timeout=5)
