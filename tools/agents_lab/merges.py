"""Every merge of the quality table, asked of ramstream by name, with the lab's own dense code
for plain averaging and task arithmetic while ramstream lacks them.

``METHODS`` is the one list of what the table compares. A method is run by
``ramstream.api.merge(base, agents, out=..., method=NAME, method_options=params)``; when this ramstream does
not register NAME, the row says "not available in this ramstream" (or, for averaging and task
arithmetic, falls back to ``dense_task_arithmetic``, labelled as the lab's code). Parameters
not given take ramstream's defaults, which are mergekit 0.1.5's.
"""

from __future__ import annotations

import inspect
from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import torch
from safetensors.torch import save_file

from ramstream import api
from ramstream.config import RunOptions
from ramstream.errors import RamstreamError
from ramstream.lab.checkpoint import read_tensors
from ramstream.methods.registry import method_names

RAMSTREAM = "ramstream"
LAB_DENSE = "lab dense code"
NOT_AVAILABLE = "not available in this ramstream"


class NotAvailable(Exception):
    """This ramstream has no such method (or no way to pass its parameters)."""


class MergeFailed(Exception):
    """ramstream has the method but refused or failed this merge."""


@dataclass(frozen=True)
class MethodRun:
    key: str  # short name: directory names, JSON keys
    label: str  # the table's row label
    method: str  # ramstream's method name
    params: dict[str, Any] = field(default_factory=dict)
    dense_lambda: float | None = None  # the lab's fallback: base + lambda * sum(tau); None: no fallback
    grid: tuple[str, tuple[float, ...]] | None = None  # (parameter, values): the value chosen on validation


# lambda = 1/N is filled in for the family at hand.
AVERAGE = -1.0
TA_GRID = (0.2, 0.4, 0.6, 0.8, 1.0, 1.2, 1.4)

METHODS: tuple[MethodRun, ...] = (
    MethodRun("average", "averaging (λ = 1/N)", "linear", {}, dense_lambda=AVERAGE),
    MethodRun("ta1", "task arithmetic, λ = 1", "task_arithmetic", {"lambda": 1.0}, dense_lambda=1.0),
    MethodRun(
        "ta_val", "task arithmetic, λ on validation", "task_arithmetic", {}, dense_lambda=1.0, grid=("lambda", TA_GRID)
    ),
    MethodRun("ties", "TIES (top 20 % per tensor)", "ties", {"density": 0.2}),
    MethodRun("ties_model", "TIES (top 20 % of the model)", "ties", {"density": 0.2, "trim_scope": "model"}),
    MethodRun("dare_linear", "DARE linear (keep 50 %)", "dare_linear", {"density": 0.5, "seed": 0}),
    MethodRun("dare_ties", "DARE-TIES (keep 50 %)", "dare_ties", {"density": 0.5, "seed": 0}),
    MethodRun("breadcrumbs", "breadcrumbs (keep 90 %, drop top 1 %)", "breadcrumbs", {"density": 0.9, "gamma": 0.01}),
    MethodRun("della", "DELLA (keep 50 %)", "della", {"density": 0.5, "seed": 0}),
    MethodRun("model_stock", "model stock", "model_stock", {}),
    MethodRun("ram", "RAM", "ram", {}),
    MethodRun("ram+", "RAM+ (r = 0.1, α = 2)", "ram+", {}),
    MethodRun("ram+s", "RAM+s (r = 0.1)", "ram+s", {}),
)


def available(run: MethodRun) -> bool:
    return run.method in method_names()


def ramstream_merge(
    run: MethodRun,
    base: Path,
    agents: Sequence[Path],
    out: Path,
    index: Path,
    cache_dir: Path,
    params: dict[str, Any] | None = None,
) -> Path:
    """Merge with ramstream; ``NotAvailable`` when this ramstream lacks the method, ``MergeFailed``
    when it refuses the merge."""
    if not available(run):
        raise NotAvailable(NOT_AVAILABLE)
    params = dict(run.params if params is None else params)
    if params and "method_options" not in inspect.signature(api.merge).parameters:
        raise NotAvailable(f"this ramstream's merge() takes no method_options (needed: {params})")
    options = RunOptions(quiet=True, cache_dir=cache_dir)
    extra: dict[str, Any] = {"method_options": params} if params else {}
    try:
        api.merge(base, [str(a) for a in agents], out=out, method=run.method, index=index, options=options, **extra)
    except RamstreamError as exc:
        raise MergeFailed(f"{run.method} {params}: {exc}") from exc
    return out


def dense_task_arithmetic(base: Path, agents: Sequence[Path], lam: float, out: Path) -> Path:
    """The lab's own dense merge: bf16(base + lam * sum_t (agent_t - base)), sums in float32."""
    base_tensors = read_tensors(base)
    total = {k: torch.zeros_like(v, dtype=torch.float32) for k, v in base_tensors.items()}
    for agent in agents:
        for k, v in read_tensors(agent).items():
            total[k] += v.to(torch.float32) - base_tensors[k].to(torch.float32)
    merged = {k: (v.to(torch.float32) + lam * total[k]).to(torch.bfloat16) for k, v in base_tensors.items()}
    out.mkdir(parents=True, exist_ok=True)
    save_file(merged, str(out / "model.safetensors"), metadata={"format": "pt"})
    (out / "config.json").write_text((base / "config.json").read_text())
    return out
