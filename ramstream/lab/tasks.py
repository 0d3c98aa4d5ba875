"""The lab's digit tasks, their prompts and exact-match scoring (numpy only).

A sequence is ``[task token, x1..x7, SEP, y1..y7]``: 16 tokens, the answer is the last 7.

- ``inc``: y_i = (x_i + 1) mod 10
- ``rev``: y = x reversed
- ``srt``: y = x sorted ascending
- ``dec``: y_i = (x_i - 1) mod 10 (lab II only)

``inc``, ``rev`` and ``srt`` (``TASKS``, the lab's and the shipped checkpoints' tasks) each write
their digits with their own ten tokens, so what one agent learns about its digits lives in rows
of the embedding and the output head that the other agents never touch. ``dec`` has a task token
of its own but writes with ``inc``'s digit tokens, so an ``inc`` and a ``dec`` agent pull the
same rows towards opposite answers (lab II's conflicting regime). Its token comes after the
others, so a model of the three tasks (``VOCAB`` = 34) keeps its layout and a model that also
knows ``dec`` has ``vocab_for(ALL_TASKS)`` = 35 tokens.

Evaluation prompts are fixed: ``eval_digits(task, split)`` draws them from a seed of their own;
training draws (``train_digits``) never produce an evaluation prompt.
"""

from __future__ import annotations

from dataclasses import asdict, dataclass
from typing import Literal

import numpy as np

TASKS: tuple[str, ...] = ("inc", "rev", "srt")
ALL_TASKS: tuple[str, ...] = (*TASKS, "dec")
_DIGITS_OF = {"dec": "inc"}  # a task that writes with another task's digit tokens
Split = Literal["test", "validation"]
DIGITS = 7
SEP = 0
TOKENS_PER_TASK = 11  # the task token, then digits 0..9
VOCAB = 1 + TOKENS_PER_TASK * len(TASKS)
PROMPT_LEN = 1 + DIGITS + 1
SEQ_LEN = PROMPT_LEN + DIGITS
SPLITS: tuple[Split, ...] = ("test", "validation")
SPLIT_SIZES: dict[Split, int] = {"test": 1000, "validation": 500}
_SPLIT_SEED = 20260601
MODEL_TYPE = "ramstream-agents-lab"  # config.json's model_type: what marks a lab checkpoint


@dataclass(frozen=True)
class ModelShape:
    """The lab's decoder-only transformer (about 0.6M parameters)."""

    vocab: int = VOCAB
    positions: int = SEQ_LEN
    hidden: int = 128
    layers: int = 3
    heads: int = 4
    intermediate: int = 512
    init_std: float = 0.05

    def to_dict(self) -> dict[str, int | float]:
        return asdict(self)

    @classmethod
    def from_config(cls, config: dict[str, object]) -> ModelShape:
        """Read the shape back from a checkpoint's ``config.json``."""
        keys = {
            "vocab": "vocab_size",
            "positions": "max_position_embeddings",
            "hidden": "hidden_size",
            "layers": "num_hidden_layers",
            "heads": "num_attention_heads",
            "intermediate": "intermediate_size",
            "init_std": "initializer_range",
        }
        values = {field: config[key] for field, key in keys.items()}
        return cls(**values)  # type: ignore[arg-type]

    def config(self) -> dict[str, object]:
        """A Hugging Face style ``config.json`` body."""
        return {
            "architectures": ["AgentsLabLM"],
            "model_type": MODEL_TYPE,
            "vocab_size": self.vocab,
            "max_position_embeddings": self.positions,
            "hidden_size": self.hidden,
            "num_hidden_layers": self.layers,
            "num_attention_heads": self.heads,
            "intermediate_size": self.intermediate,
            "initializer_range": self.init_std,
            "tie_word_embeddings": False,
            "torch_dtype": "bfloat16",
        }


def task_index(task: str) -> int:
    if task not in ALL_TASKS:
        raise ValueError(f"unknown task {task!r}; the lab's tasks are {', '.join(ALL_TASKS)}")
    return ALL_TASKS.index(task)


def task_token(task: str) -> int:
    """The three tasks' tokens start their blocks of 11; tasks after them get one token each."""
    index = task_index(task)
    if index < len(TASKS):
        return 1 + TOKENS_PER_TASK * index
    return VOCAB + index - len(TASKS)


def vocab_for(tasks: tuple[str, ...]) -> int:
    """The vocabulary a model of ``tasks`` needs: up to the largest task or digit token used."""
    return 1 + max(max(task_token(t), int(digit_tokens(t, np.array(9)))) for t in tasks)


def digit_tokens(task: str, digits: np.ndarray) -> np.ndarray:
    """Digits 0..9 written with ``task``'s digit tokens (its own, or those of the task it shares)."""
    return (task_token(_DIGITS_OF.get(task, task)) + 1 + np.asarray(digits)).astype(np.int64)


def answers(task: str, digits: np.ndarray) -> np.ndarray:
    """The correct answer digits, shape (n, 7), for prompt digits of shape (n, 7)."""
    digits = np.asarray(digits)
    name = ALL_TASKS[task_index(task)]
    if name == "inc":
        return (digits + 1) % 10
    if name == "dec":
        return (digits - 1) % 10
    if name == "rev":
        return digits[:, ::-1].copy()
    return np.sort(digits, axis=1)


def prompts(task: str, digits: np.ndarray) -> np.ndarray:
    """Prompt tokens ``[task, x1..x7, SEP]``, shape (n, 9)."""
    digits = np.asarray(digits)
    n = digits.shape[0]
    return np.concatenate(
        [np.full((n, 1), task_token(task), np.int64), digit_tokens(task, digits), np.full((n, 1), SEP, np.int64)],
        axis=1,
    )


def sequences(task: str, digits: np.ndarray) -> np.ndarray:
    """Whole training sequences (prompt then answer), shape (n, 16)."""
    return np.concatenate([prompts(task, digits), digit_tokens(task, answers(task, digits))], axis=1)


def exact_match(task: str, digits: np.ndarray, generated: np.ndarray) -> np.ndarray:
    """Per prompt, whether the 7 generated tokens are exactly the answer's tokens."""
    want = digit_tokens(task, answers(task, digits))
    generated = np.asarray(generated)
    if generated.shape != want.shape:
        raise ValueError(f"generated tokens have shape {generated.shape}, expected {want.shape}")
    return np.all(generated == want, axis=1)


def _as_ints(digits: np.ndarray) -> np.ndarray:
    return np.asarray(digits, np.int64) @ (10 ** np.arange(DIGITS - 1, -1, -1, dtype=np.int64))


def eval_digits(task: str, split: Split = "test") -> np.ndarray:
    """The fixed evaluation prompts of ``split``: distinct, and disjoint across splits."""
    taken: set[int] = set()
    out: dict[str, np.ndarray] = {}
    rng = np.random.default_rng([_SPLIT_SEED, task_index(task)])
    for name in SPLITS:
        size = SPLIT_SIZES[name]
        rows: list[np.ndarray] = []
        while len(rows) < size:
            row = rng.integers(0, 10, DIGITS)
            key = int(_as_ints(row[None])[0])
            if key not in taken:
                taken.add(key)
                rows.append(row)
        out[name] = np.stack(rows)
        if name == split:
            return out[name]
    raise ValueError(f"unknown split {split!r}; choose one of {', '.join(SPLIT_SIZES)}")


_HELD_OUT: dict[str, np.ndarray] = {}


def held_out_keys(task: str) -> np.ndarray:
    if task not in _HELD_OUT:
        _HELD_OUT[task] = np.sort(np.concatenate([_as_ints(eval_digits(task, s)) for s in SPLITS]))
    return _HELD_OUT[task]


def train_digits(task: str, n: int, rng: np.random.Generator) -> np.ndarray:
    """``n`` random prompts for training, never one of the evaluation prompts."""
    held = held_out_keys(task)
    out = rng.integers(0, 10, (n, DIGITS))
    while True:
        clash = np.isin(_as_ints(out), held)
        if not clash.any():
            return out
        out[clash] = rng.integers(0, 10, (int(clash.sum()), DIGITS))
