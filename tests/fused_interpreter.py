"""Run the checks of ``tests/fused_checks.py`` under triton's interpreter (``TRITON_INTERPRET=1``
must be set before triton is imported), in one fresh process per test module: the checks a
module's tests name run one after another there (one start-up of torch, triton and Numba, 3 s,
instead of one per check; pytest-xdist hands out whole files, so they ran one after another
anyway), each test then asserting its own check's result. The checks are spread over several
test files so that xdist runs those processes side by side.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
TIMEOUT = 1200  # seconds for a module's checks


def run_checks(checks: list[str], scratch: Path) -> dict[str, str]:
    """Each check's result ("ok", or what failed), run in one fresh interpreted process."""
    env = {**os.environ, "TRITON_INTERPRET": "1", "PYTHONPATH": os.pathsep.join([str(ROOT), *sys.path])}
    results = scratch / "results.json"
    command = [sys.executable, "-W", "error::UserWarning", "-m", "tests.fused_checks", "--all", str(results),
               str(scratch), *checks]  # fmt: skip
    done = subprocess.run(command, cwd=ROOT, env=env, capture_output=True, text=True, timeout=TIMEOUT)
    found: dict[str, str] = json.loads(results.read_text()) if results.exists() else {}
    lost = done.stdout + done.stderr  # a process that died mid-check: its output says why
    return {check: found.get(check, f"the check did not finish (exit {done.returncode}):\n{lost}") for check in checks}


def checks_of(session: object, module: object) -> list[str]:
    """The checks (their ``check`` parameter) of ``module``'s selected tests, in order, once each."""
    checks = [
        item.callspec.params["check"]
        for item in getattr(session, "items", [])
        if item.module is module and "check" in getattr(getattr(item, "callspec", None), "params", {})
    ]
    return list(dict.fromkeys(checks))
