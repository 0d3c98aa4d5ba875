"""NearSwap, as mergekit's ``nearswap``: the base, taking the agent's value where the two are near.

The base and exactly one agent; ``t`` (required) per tensor, gradients and filters allowed. Per
element, in float32, with a = f32(base) and b = f32(agent) (a LoRA agent: f32(base) + tau):

    w      = clamp(t / max(|a - b|, 1e-6), 0, 1)
    merged = w b + (1 - w) a

In exact arithmetic (t >= 0, |a - b| >= 1e-6) this is a + clamp(b - a, -t, t): where the agent
lies within t of the base it is taken whole, further away the base moves towards it by t, so the
agent's small changes are kept and its large ones cut down to t. t = 0 gives the base, a t above
every difference the agent. ``t / d`` is computed as mergekit's torch computes it, ``(1 / d) * t``
(see ``backends/numba/nearswap.py``), so the float32 values are mergekit's to the bit.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np

from ramstream.backends.base import Backend
from ramstream.blocks import BlockArrays
from ramstream.errors import ConfigError
from ramstream.methods import tensor_settings as ts
from ramstream.methods.base import MethodSpec, Prepared, refuse_unknown
from ramstream.methods.combination import tensor_names
from ramstream.plan import Block
from ramstream.statistics.context import StatsContext


@dataclass(frozen=True)
class NearswapParams:
    t: ts.Setting

    def to_dict(self) -> dict[str, Any]:
        return {"t": ts.to_json(self.t)}


def parse_nearswap(given: Mapping[str, Any], n_agents: int) -> NearswapParams:
    refuse_unknown("nearswap", given, {"t"})
    if n_agents != 1:
        raise ConfigError(f"nearswap merges the base and ONE agent; got {n_agents} agents")
    if "t" not in given:
        raise ConfigError(
            "--t is required with --method nearswap (the distance |base - agent| up to which the agent is taken whole)"
        )
    return NearswapParams(ts.parse("t", given["t"]))


def prepare_nearswap(params: NearswapParams, ctx: StatsContext) -> Prepared:
    # float32 per tensor, +0.0 for -0.0 (so that no backend's choice between the zeros shows)
    t = ts.resolve(params.t, tensor_names(ctx)).astype(np.float32) + np.float32(0.0)

    def merge_block(arrays: BlockArrays, block: Block, out: np.ndarray, out_code: int, backend: Backend) -> int:
        return backend.merge_nearswap(arrays, t[block.tensor], out, out_code)

    return Prepared(merge_block)


def check_nearswap(params: NearswapParams, names: Sequence[str]) -> None:
    ts.check([params.t], names)


NEARSWAP = MethodSpec(
    "nearswap",
    "the base, taking the agent's value where the two differ by less than t (mergekit's nearswap)",
    parse_nearswap,
    prepare_nearswap,
    task_vectors=False,
    check=check_nearswap,
)
