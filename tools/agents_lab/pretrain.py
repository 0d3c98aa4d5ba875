"""Pretrain the shared base: supervised next-token training on all its tasks at once, with a
controller that stops feeding a task once its accuracy reaches ``target``.

Every task then sits part-way (30-65 % greedy exact match): room for RL to improve each. The
model trains in float32 with AdamW and is rounded to bfloat16 once, when saved.
"""

from __future__ import annotations

from dataclasses import asdict, dataclass
from pathlib import Path

import numpy as np
import torch
import torch.nn.functional as F

from ramstream.lab.checkpoint import read_tensors, round_bf16_, save_checkpoint
from ramstream.lab.model import AgentsLabLM
from ramstream.lab.tasks import PROMPT_LEN, TASKS, ModelShape, sequences, train_digits, vocab_for
from tools.agents_lab.common import Log, Timer, seed_everything, weights_digest

LOG_EVERY = 50


@dataclass(frozen=True)
class PretrainConfig:
    seed: int = 0
    lr: float = 1e-4
    weight_decay: float = 0.0
    batch_per_task: int = 64
    target: float = 0.45  # a task is fed while its monitor accuracy is below this
    monitor_prompts: int = 256
    max_steps: int = 20_000


def answer_loss(model: AgentsLabLM, seq: torch.Tensor) -> torch.Tensor:
    """Mean cross-entropy of the 7 answer tokens given everything before them."""
    logits = model(seq[:, :-1])[:, PROMPT_LEN - 1 :, :]
    return F.cross_entropy(logits.reshape(-1, logits.shape[-1]), seq[:, PROMPT_LEN:].reshape(-1))


def monitor_accuracy(model: AgentsLabLM, monitor: dict[str, torch.Tensor]) -> dict[str, float]:
    """Greedy exact match on fixed training-distribution prompts (not the evaluation splits).

    Computed in one teacher-forced pass: greedy decoding reproduces the answer exactly when, and
    only when, the answer token is the argmax at each of the 7 answer positions."""
    model.eval()
    with torch.no_grad():
        out = {}
        for task, seq in monitor.items():
            pred = model(seq[:, :-1])[:, PROMPT_LEN - 1 :, :].argmax(-1)
            out[task] = float((pred == seq[:, PROMPT_LEN:]).all(dim=1).float().mean())
    model.train()
    return out


def drop_momentum(opt: torch.optim.Optimizer) -> None:
    """Zero Adam's first moments, so that a task no longer fed stops moving at once (its
    momentum would otherwise carry it tens of points past the target within a few steps)."""
    for state in opt.state.values():
        if "exp_avg" in state:
            state["exp_avg"].zero_()


def warm_start_(model: AgentsLabLM, init: Path) -> None:
    """Copy the checkpoint ``init`` into ``model``, whose vocabulary may be larger: the rows of
    tokens ``init`` lacks (a new task's token) keep their fresh initialisation."""
    with torch.no_grad():
        for name, value in read_tensors(init).items():
            target = model.state_dict()[name]
            target[: value.shape[0]].copy_(value.to(torch.float32))


def pretrain(
    config: PretrainConfig,
    out: Path,
    log: Log,
    shape: ModelShape | None = None,
    tasks: tuple[str, ...] = TASKS,
    init: Path | None = None,
) -> dict[str, object]:
    """Train on ``tasks`` (the lab's three by default; lab II adds ``dec``), whose tokens set the
    vocabulary unless ``shape`` is given; from the checkpoint ``init`` if given (lab II: the
    lab's base, which meets the target on its three tasks already, so mostly ``dec`` is fed)."""
    rng, _ = seed_everything(config.seed)
    model = AgentsLabLM(shape or ModelShape(vocab=vocab_for(tasks)))
    if init is not None:
        warm_start_(model, init)
    opt = torch.optim.AdamW(model.parameters(), lr=config.lr, weight_decay=config.weight_decay)
    monitor = {
        t: torch.from_numpy(
            sequences(t, train_digits(t, config.monitor_prompts, np.random.default_rng([config.seed, 99, i])))
        )
        for i, t in enumerate(tasks)
    }
    timer = Timer()
    trained, fed_steps, fed = 0, dict.fromkeys(tasks, 0), list(tasks)
    for step in range(config.max_steps):
        acc = monitor_accuracy(model, monitor)
        was_fed, fed = fed, [t for t in tasks if acc[t] < config.target]
        if set(was_fed) - set(fed):
            drop_momentum(opt)
        if step % LOG_EVERY == 0 or not fed:
            cells = " ".join(f"{t} {acc[t]:.3f}" for t in tasks)
            log(f"pretrain step {step:5d} {timer():6.1f}s  {cells}  feeding {','.join(fed) or '-'}")
        if not fed:
            break
        for t in fed:
            fed_steps[t] += 1
        trained += 1
        batch = torch.from_numpy(
            np.concatenate([sequences(t, train_digits(t, config.batch_per_task, rng)) for t in fed])
        )
        loss = answer_loss(model, batch)
        opt.zero_grad(set_to_none=True)
        loss.backward()
        opt.step()
    round_bf16_(model)
    final = monitor_accuracy(model, monitor)
    record: dict[str, object] = {
        "role": "base",
        "recipe": asdict(config),
        "steps": trained,
        "fed_steps": fed_steps,
        "monitor_accuracy_bf16": final,
        "seconds": round(timer(), 1),
    }
    if tasks != TASKS:  # the three tasks' records stay as they were
        record["tasks"] = list(tasks)
    if init is not None:
        record["init_sha256"] = weights_digest(init)
    save_checkpoint(model, out, record)
    cells = " ".join(f"{t} {final[t]:.3f}" for t in tasks)
    log(f"pretrain done: {trained} steps, {timer():.1f}s, bf16 monitor accuracy {cells}")
    return record
