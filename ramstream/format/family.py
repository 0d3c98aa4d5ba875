"""A base and its agents, checked against each other before any data is read."""

from __future__ import annotations

import os
from collections.abc import Callable
from dataclasses import dataclass, replace
from functools import cached_property
from pathlib import Path

from ramstream.config import DEFAULT_HUB_TIMEOUT
from ramstream.errors import ConfigError, InputError, MismatchError, UnsupportedDtypeError
from ramstream.format.checkpoint import Checkpoint, DeltaRef, QuantRef, open_checkpoint
from ramstream.format.dtypes import UNDECODABLE_FLOATS, is_merged
from ramstream.format.fingerprint import checkpoint_fingerprint
from ramstream.format.hub import HubAccess
from ramstream.format.lora import is_adapter, open_adapter
from ramstream.format.quantized import QuantizedBaseAs, checked_base_as, resolved_base_as, with_quantization
from ramstream.format.tied_heads import reconcile_head, untie_base


@dataclass(frozen=True)
class Family:
    """A base and its agents. ``quantized_base_as`` is what the base's quantized tensors are read
    as (``format.quantized.resolved_base_as``): f32, their dequantized values, or bf16 / f16,
    those rounded to that dtype (and back to float32); always f32 for a base stored in floats."""

    base: Checkpoint
    agents: tuple[Checkpoint, ...]
    quantized_base_as: str = "f32"

    @property
    def members(self) -> tuple[Checkpoint, ...]:
        return (self.base, *self.agents)

    @property
    def agent_names(self) -> tuple[str, ...]:
        return tuple(a.name for a in self.agents)

    def fingerprints(self) -> list[dict[str, object]]:
        """Each member's fingerprint, taken once (they read a few ranges of every tensor)."""
        return self._fingerprints

    @cached_property
    def _fingerprints(self) -> list[dict[str, object]]:
        return [checkpoint_fingerprint(c) for c in self.members]


def open_family(
    base: str | Path,
    agents: list[str] | tuple[str | Path, ...],
    min_agents: int = 1,
    hf_cache: Path | None = None,
    hub_timeout: float = DEFAULT_HUB_TIMEOUT,
    quantized_base_as: QuantizedBaseAs = "auto",
) -> Family:
    """Open and cross-check the checkpoints (paths, or hub ids resolved in ``hf_cache``, the hub
    answering each request within ``hub_timeout`` seconds); raise naming the agent and tensor on
    any mismatch. An agent that is a PEFT adapter directory is a LoRA agent (``format.lora``).
    ``quantized_base_as`` says what a quantized base's values are (``Family``; auto: the agents'
    dtype where they all share bf16 or f16)."""
    asked = checked_base_as(quantized_base_as)
    if len(agents) < min_agents:
        raise ConfigError(f"need at least {min_agents} agent checkpoint(s), got {len(agents)}")
    hub = HubAccess(hf_cache, hub_timeout)
    base_ckpt = with_quantization(open_checkpoint(base, hub))
    opened = [None if is_adapter(a) else with_quantization(open_checkpoint(a, hub)) for a in agents]
    base_ckpt = untie_base(base_ckpt)  # a LoRA agent is read against the tensors the base keeps
    agent_ckpts = tuple(
        open_adapter(a, base_ckpt, str(base)) if c is None else c for a, c in zip(agents, opened, strict=True)
    )
    _refuse_shared_files(base_ckpt, agent_ckpts)
    names = _unique_names([c.name for c in agent_ckpts])
    agent_ckpts = tuple(_reconciled(base_ckpt, replace(c, name=n)) for n, c in zip(names, agent_ckpts, strict=True))
    for agent in agent_ckpts:
        _check_agent(base_ckpt, agent)
    return Family(base_ckpt, agent_ckpts, resolved_base_as(base_ckpt, agent_ckpts, asked))


def _reconciled(base: Checkpoint, agent: Checkpoint) -> Checkpoint:
    """A LoRA agent was read against the base's tensors already; other agents' heads are matched
    to the base's (``tied_heads``)."""
    return agent if agent.described_by else reconcile_head(base, agent)


def _refuse_shared_files(base: Checkpoint, agents: tuple[Checkpoint, ...]) -> None:
    """Refuse a file that belongs to two members, however it was named (a directory and the
    ``model.safetensors`` inside it, a symlink, a hard link): files are compared by identity."""
    seen: dict[tuple[int, int], str] = {}
    for role, member in [("the base", base), *((f"agent {i + 1} ({a.path})", a) for i, a in enumerate(agents))]:
        for file in member.files:
            try:
                st = os.stat(file)
            except OSError as exc:
                raise InputError(f"{file}: cannot read ({exc.strerror})") from exc
            other = seen.setdefault((st.st_dev, st.st_ino), role)
            if other != role:
                raise ConfigError(f"{member.path}: given twice (its file {file} is also {other}); list each agent once")


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
        if name in agent.deltas:  # a LoRA agent's task vector, checked against the base when read
            continue
        other = agent.tensors.get(name)
        if other is None:
            raise MismatchError(f"{agent.path}: tensor {name!r} of the base is missing from agent {agent.name}")
        if other.entry.shape != ref.entry.shape:
            raise MismatchError(
                f"{other.file}: tensor {name!r} has shape {list(other.entry.shape)} "
                f"but the base has {list(ref.entry.shape)}; agents must share the base architecture"
            )
        for r, member in ((ref, base), (other, agent)):
            if r.entry.dtype in UNDECODABLE_FLOATS and name not in member.quantized:
                raise UnsupportedDtypeError(
                    f"{r.file}: tensor {name!r} is {r.entry.dtype}, which ramstream cannot decode; "
                    "convert the checkpoint to bf16, f16 or f32 first"
                )
        if is_merged(ref.entry.dtype) != is_merged(other.entry.dtype):
            raise MismatchError(
                f"{other.file}: tensor {name!r} is {other.entry.dtype} but the base has {ref.entry.dtype}"
            )
    extra = sorted((set(agent.tensors) | set(agent.deltas)) - set(base.tensors))
    if extra:
        raise MismatchError(f"{agent.path}: tensor {extra[0]!r} of agent {agent.name} is not in the base")


def with_absolute_paths(family: Family) -> Family:
    """The same family with every path absolute, for a process whose working directory differs
    (a cluster's worker); paths already absolute are kept as they are."""

    def absolute(path: Path) -> Path:
        return path if path.is_absolute() else Path.cwd() / path

    def member(ckpt: Checkpoint) -> Checkpoint:
        return replace(
            ckpt,
            path=absolute(ckpt.path),
            directory=None if ckpt.directory is None else absolute(ckpt.directory),
            headers=tuple(replace(h, path=absolute(h.path)) for h in ckpt.headers),
            tensors={k: replace(ref, file=absolute(ref.file)) for k, ref in ckpt.tensors.items()},
            deltas={k: _absolute_delta(d, absolute) for k, d in ckpt.deltas.items()},
            quantized={k: _absolute_quant(q, absolute) for k, q in ckpt.quantized.items()},
            described_by=tuple(absolute(p) for p in ckpt.described_by),
        )

    return Family(member(family.base), tuple(member(a) for a in family.agents), family.quantized_base_as)


def _absolute_quant(quant: QuantRef, absolute: Callable[[Path], Path]) -> QuantRef:
    return replace(
        quant,
        weight=replace(quant.weight, file=absolute(quant.weight.file)),
        scale=replace(quant.scale, file=absolute(quant.scale.file)),
    )


def _absolute_delta(delta: DeltaRef, absolute: Callable[[Path], Path]) -> DeltaRef:
    a, b = (None if f is None else replace(f, file=absolute(f.file)) for f in (delta.a, delta.b))
    return replace(delta, a=a, b=b)
