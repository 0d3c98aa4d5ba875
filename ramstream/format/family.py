"""A base and its agents, checked against each other before any data is read."""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

from ramstream.errors import ConfigError, MismatchError, UnsupportedDtypeError
from ramstream.format.checkpoint import Checkpoint, open_checkpoint
from ramstream.format.dtypes import UNDECODABLE_FLOATS, is_float
from ramstream.format.fingerprint import checkpoint_fingerprint


@dataclass(frozen=True)
class Family:
    base: Checkpoint
    agents: tuple[Checkpoint, ...]

    @property
    def members(self) -> tuple[Checkpoint, ...]:
        return (self.base, *self.agents)

    @property
    def agent_names(self) -> tuple[str, ...]:
        return tuple(a.name for a in self.agents)

    def fingerprints(self) -> list[dict[str, object]]:
        return [checkpoint_fingerprint(c) for c in self.members]


def open_family(base: str | Path, agents: list[str] | tuple[str | Path, ...], min_agents: int = 1) -> Family:
    """Open and cross-check the checkpoints; raise naming the agent and tensor on any mismatch."""
    if len(agents) < min_agents:
        raise ConfigError(f"need at least {min_agents} agent checkpoint(s), got {len(agents)}")
    base_ckpt = open_checkpoint(base)
    agent_ckpts = tuple(open_checkpoint(a) for a in agents)
    seen = {base_ckpt.path: "the base"}
    for agent in agent_ckpts:
        if agent.path in seen:
            raise ConfigError(f"{agent.path}: given twice (also as {seen[agent.path]}); list each agent once")
        seen[agent.path] = f"agent {agent.name}"
    names = _unique_names([c.name for c in agent_ckpts])
    agent_ckpts = tuple(
        Checkpoint(n, c.path, c.directory, c.headers, c.tensors) for n, c in zip(names, agent_ckpts, strict=True)
    )
    for agent in agent_ckpts:
        _check_agent(base_ckpt, agent)
    return Family(base_ckpt, agent_ckpts)


def _unique_names(names: list[str]) -> list[str]:
    """Agent names are display labels: make repeated directory names distinct (a, a#2, ...)."""
    out: list[str] = []
    for name in names:
        candidate, k = name, 2
        while candidate in out:
            candidate, k = f"{name}#{k}", k + 1
        out.append(candidate)
    return out


def _check_agent(base: Checkpoint, agent: Checkpoint) -> None:
    for name, ref in base.tensors.items():
        other = agent.tensors.get(name)
        if other is None:
            raise MismatchError(f"{agent.path}: tensor {name!r} of the base is missing from agent {agent.name}")
        if other.entry.shape != ref.entry.shape:
            raise MismatchError(
                f"{other.file}: tensor {name!r} has shape {list(other.entry.shape)} "
                f"but the base has {list(ref.entry.shape)}; agents must share the base architecture"
            )
        for r in (ref, other):
            if r.entry.dtype in UNDECODABLE_FLOATS:
                raise UnsupportedDtypeError(
                    f"{r.file}: tensor {name!r} is {r.entry.dtype}, which ramstream cannot decode; "
                    "convert the checkpoint to bf16, f16 or f32 first"
                )
        if is_float(ref.entry.dtype) != is_float(other.entry.dtype):
            raise MismatchError(
                f"{other.file}: tensor {name!r} is {other.entry.dtype} but the base has {ref.entry.dtype}"
            )
    extra = sorted(set(agent.tensors) - set(base.tensors))
    if extra:
        raise MismatchError(f"{agent.path}: tensor {extra[0]!r} of agent {agent.name} is not in the base")
