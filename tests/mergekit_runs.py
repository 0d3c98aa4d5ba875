"""mergekit 0.1.5 run on a list of configs in one process, each as ``mergekit-yaml CONFIG OUT``
runs it: importing torch, transformers and mergekit is most of a run's time, so a test module
pays it once, not once per config.

With ``stable``, torch.argsort and torch.sort (called by mergekit's magnitude trimming) are
pinned to stable sorts for that job.
"""

from __future__ import annotations

import json
import subprocess
import sys
from collections.abc import Sequence
from pathlib import Path

_SCRIPT = """
import json, sys, yaml, torch
from mergekit.config import MergeConfiguration
from mergekit.merge import run_merge
from mergekit.options import MergeOptions
unstable = torch.argsort, torch.sort
def stable_argsort(input, dim=-1, descending=False, stable=False):
    return unstable[0](input, dim=dim, descending=descending, stable=True)
def stable_sort(input, dim=-1, descending=False, stable=False, **kwargs):
    return unstable[1](input, dim=dim, descending=descending, stable=True, **kwargs)
for config, out, stable in json.loads(sys.argv[1]):
    torch.argsort, torch.sort = (stable_argsort, stable_sort) if stable else unstable
    source = open(config, encoding="utf-8").read()
    options = MergeOptions(random_seed=int(sys.argv[2]), quiet=True, write_model_card=False)
    options.apply_global_options()
    run_merge(MergeConfiguration.model_validate(yaml.safe_load(source)), out, options=options, config_source=source)
"""


def run_mergekit(jobs: Sequence[tuple[Path, Path, bool]], seed: int, timeout: float) -> None:
    """Each (config, out, stable) job merged by mergekit into ``out``; fails the test on an error."""
    listed = json.dumps([[str(config), str(out), stable] for config, out, stable in jobs])
    done = subprocess.run(
        [sys.executable, "-c", _SCRIPT, listed, str(seed)], capture_output=True, text=True, timeout=timeout
    )
    assert done.returncode == 0, f"mergekit failed:\n{done.stderr[-4000:]}"
