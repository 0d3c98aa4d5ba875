"""The contract of a merge method.

A method is a frozen spec: a name, its validated parameters, the statistics it needs from the
probe pass, how those statistics become per-tensor constants (e.g. lambda per agent), and the
block kernel that applies them. The merge pass knows nothing else about methods.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from enum import Enum
from typing import Any, Protocol

import numpy as np

from ramstream.stats import OverlapCounts


class Statistic(str, Enum):
    OVERLAP = "overlap"  # RAM's per-agent overlap counts (needs the probe pass)


class MethodParams(Protocol):
    def to_dict(self) -> dict[str, Any]: ...


@dataclass(frozen=True)
class Constants:
    """What a method's kernel receives per tensor: one float32 per agent."""

    per_tensor: np.ndarray  # (tensors, N) float32
    per_agent_model: np.ndarray  # (N,) float64, the model-scope values for reports


@dataclass(frozen=True)
class MethodSpec:
    name: str
    summary: str
    needs: frozenset[Statistic]
    constants: Callable[[Any, OverlapCounts], Constants]
    kernel: Callable[..., None]
