"""Run one check of ``tests/fused_checks.py`` in a fresh process under triton's interpreter
(``TRITON_INTERPRET=1`` must be set before triton is imported). The checks are spread over
several test files so that pytest-xdist, which hands out whole files, runs them side by side."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent


def run_check(check: str, tmp_path: Path) -> None:
    env = {**os.environ, "TRITON_INTERPRET": "1", "PYTHONPATH": os.pathsep.join([str(ROOT), *sys.path])}
    done = subprocess.run(
        [sys.executable, "-W", "error::UserWarning", "-m", "tests.fused_checks", check, str(tmp_path)],
        cwd=ROOT, env=env, capture_output=True, text=True, timeout=600,
    )  # fmt: skip
    assert done.returncode == 0, done.stdout + done.stderr
    assert done.stdout.strip().endswith(f"{check}: ok")
