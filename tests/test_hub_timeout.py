"""Online hub calls are bounded (issue 21, class 2): a hub that accepts and never answers gives one
line within ``--hub-timeout``, or the cache's copy when it has one; models download from a hub
(only the files a merge reads, at the commit the revision resolved to) and are read offline
afterwards.

Every run is a real ``ramstream`` process whose ``HF_ENDPOINT`` is a server of
``tests/loopback.py`` on 127.0.0.1, started and stopped by the test; nothing leaves the machine.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import time
from pathlib import Path

import pytest

from tests.families import Family, build_family
from tests.loopback import Hub, Repo, hub_server, silent_listener
from tests.test_cli import Outcome, in_process, ok, one_line_error
from tests.test_hub import COMMITS, cache_repo, weights

TIMEOUT = 1.0  # --hub-timeout of these runs, seconds
# recent huggingface_hub versions first ask the hub for an agent registry (3 s at most), and
# the process starts and stops: time the line may take beyond --hub-timeout on a loaded machine
SLACK = 3.0 + 10.0


@pytest.fixture(scope="module")
def family(tmp_path_factory: pytest.TempPathFactory) -> Family:
    return build_family(tmp_path_factory.mktemp("hub-timeout") / "family", densities=(0.1, 0.4))


def start(endpoint: str | None, hf_home: Path, *args: str | Path) -> subprocess.Popen[str]:
    """A ramstream process whose hub is ``endpoint`` (None: ``HF_HUB_OFFLINE=1``)."""
    env = {k: v for k, v in os.environ.items() if not k.startswith(("HF_", "TRANSFORMERS_"))}
    env.update(HF_HOME=str(hf_home), HF_HUB_DISABLE_PROGRESS_BARS="1")
    env.update({"HF_ENDPOINT": endpoint} if endpoint is not None else {"HF_HUB_OFFLINE": "1"})
    command = [sys.executable, "-m", "ramstream.cli", *map(str, args), "--hub-timeout", str(TIMEOUT), "--quiet"]
    return subprocess.Popen(command, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, env=env)


def finish(process: subprocess.Popen[str]) -> Outcome:
    try:
        out, err = process.communicate(timeout=120)
    except subprocess.TimeoutExpired:
        process.kill()
        out, err = process.communicate()
    return Outcome(process.returncode, out, err, "Traceback" in err)


def test_a_hub_that_never_answers_is_one_line_within_the_timeout_or_the_cache(tmp_path: Path, family: Family) -> None:
    hf_home = tmp_path / "hf"
    cache_repo(hf_home / "hub", "org/base", family.base, COMMITS["org/base"])
    cache_repo(hf_home / "hub", "org/agent0", family.agents[0], COMMITS["org/agent0"])
    with silent_listener() as port:
        endpoint = f"http://127.0.0.1:{port}"
        began = time.monotonic()
        missing = start(endpoint, hf_home, "probe", "org/base", "org/missing", "--index", tmp_path / "a.zarr")
        cached = start(endpoint, hf_home, "probe", "org/base", "org/agent0", "--index", tmp_path / "b.zarr")
        refused, fell_back = finish(missing), finish(cached)
        elapsed = time.monotonic() - began
    one_line_error(refused, "org/missing@main", f"the hub at {endpoint} did not answer within 1 s (--hub-timeout)")
    assert ok(fell_back).out.startswith("index: ")  # the cache's copy, as huggingface_hub's own fallback
    assert elapsed < TIMEOUT + SLACK, f"{elapsed:.1f} s"


def test_models_download_from_a_hub_and_are_read_offline_afterwards(tmp_path: Path, family: Family) -> None:
    agent = Repo.of(family.agents[0], "e" * 40)
    agent.files["pytorch_model.bin"] = b"the same weights in the other format: never fetched"
    hub = Hub({"org/base": Repo.of(family.base, "d" * 40), "org/agent0": agent})
    ok(in_process("merge", family.base, family.agents[0], "--out", tmp_path / "local", "--quiet"))
    hf_home = tmp_path / "hf"
    args = ["merge", "org/base", "org/agent0", "--out", tmp_path / "out", "--cache-dir", tmp_path / "index"]
    with hub_server(hub) as endpoint:
        ok(finish(start(endpoint, hf_home, *args)))
    assert weights(tmp_path / "out") == weights(tmp_path / "local")
    assert (tmp_path / "out" / "tokenizer.json").is_file()
    record = json.loads((tmp_path / "out" / "ramstream_merge.json").read_text())
    assert [i["hub"]["commit"] for i in record["inputs"]] == ["d" * 40, "e" * 40]
    repo = hf_home / "hub" / "models--org--agent0"
    assert (repo / "refs" / "main").read_text() == "e" * 40  # as snapshot_download leaves it
    assert (repo / "snapshots" / ("e" * 40) / "model.safetensors").is_symlink()
    assert not [seen for seen in hub.seen if "pytorch_model.bin" in seen]
    # offline, the cache answers the same names: the same merge, already done
    assert ok(finish(start(None, hf_home, *args))).out.startswith("already merged")
