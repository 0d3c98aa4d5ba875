"""mergekit YAML configurations: the subset ramstream runs, as the arguments of ``api.merge``.

A config names a method, a base, the models and their parameters, as mergekit 0.1.5 reads it:

    merge_method: ties
    base_model: ./base
    models:
      - model: ./agent1
        parameters: {weight: 1.0, density: 0.5}
      - model: ./agent2
        parameters: {weight: 0.5, density: 0.2}
    parameters: {lambda: 1.0}
    dtype: float32
    out_dtype: bfloat16

``load`` returns a ``ConfigMerge``: the base, the agents, and ``settings``, the flat mapping of
option names that the CLI also collects from its flags (``method``, ``weights``, ``density``,
``eps``, ``out_dtype`` ...), so that a config and flags meet in one place (``combine``) and
reach ``api.merge`` through one function (``api_arguments``).

mergekit's semantics are kept: a model's own ``parameters`` override the top-level ones, and a
model that gives no value for a per-model parameter that others give takes mergekit's default;
parameters nobody gives are left to the method, whose defaults are mergekit's (the parity tests
check that), except where the mergekit method implies other values (``ramplus_tl``: rho per
tensor, alpha 0.2). The base model may be listed in ``models``: for ``linear`` it is an input
like any other (mergekit adds ``base_model`` to linear's inputs when it is not listed; ramstream
passes its weight as ``base_weight``), for the other methods it is the base. Relative paths are
relative to the working directory, as in mergekit; a model that is no existing path and reads as
``org/name[@revision]`` is a Hugging Face hub id, resolved when the checkpoints are opened.
Gradients (lists of values over the layers) and filters (``{filter: self_attn, value: ...}``)
are read for the parameters ramstream varies per tensor (slerp's and nearswap's ``t``, the
spherical and GTA methods' ``weight``, the GTA methods' ``lambda``; see
``methods.tensor_settings``). nuslerp, multislerp and karcher run without a base_model as
mergekit does: the first model becomes ramstream's BASE, a model like the others (``no_base``).
A LoRA agent is its adapter directory, or mergekit's ``base_model+adapter`` (a LoRA on any other
model is refused). ``slices`` are read when they are what ``models`` says (one slice whose
sources span every layer: the form many slerp configs use). Everything else is refused by name,
in one line: other slices (outside passthrough), modules, gradients and filters of other parameters,
tokenizer merging, parameters the method does not read, and any ``dtype`` other than float32
(ramstream's arithmetic is float32, always; see docs/methods.md).

``merge_method: passthrough`` merges nothing: it stacks layer ranges of models (frankenmerges)
or copies one model, optionally scaled. ``load`` returns a ``ConfigStack`` for it (``parse_stack``),
which ``api.stack`` runs; its slices may be any number, one source each.
"""

from __future__ import annotations

import os
import stat
from collections.abc import Mapping
from pathlib import Path

from ramstream.errors import ConfigError
from ramstream.mergekit_config import safe_yaml
from ramstream.mergekit_config.merge import RUN_SETTINGS, ConfigMerge, api_arguments, combine, config_refusal, parse
from ramstream.mergekit_config.stack import ConfigStack, StackSlice, parse_stack, stack_arguments
from ramstream.mergekit_config.tables import FLAGS, METHODS, PASSTHROUGH

__all__ = [
    "FLAGS",
    "METHODS",
    "RUN_SETTINGS",
    "ConfigMerge",
    "ConfigStack",
    "StackSlice",
    "api_arguments",
    "combine",
    "config_refusal",
    "load",
    "parse",
    "parse_stack",
    "read_text",
    "stack_arguments",
]


def load(path: str | Path) -> ConfigMerge | ConfigStack:
    """Read and translate a mergekit YAML file: a merge, or a passthrough's stack of layers
    (``parse_stack``); ``ConfigError`` names what cannot be run."""
    path = Path(path)
    doc = safe_yaml.load(read_text(path), path)
    if isinstance(doc, Mapping) and doc.get("merge_method") == PASSTHROUGH:
        return parse_stack(doc, path)
    return parse(doc, path)


def read_text(path: Path) -> str:
    """A config file's text; unreadable, not UTF-8 or not a regular file is one line."""
    try:
        return _read_regular(path).decode("utf-8")
    except OSError as exc:
        raise ConfigError(f"{path}: cannot read the config ({exc.strerror or exc})") from None
    except UnicodeDecodeError as exc:
        raise ConfigError(f"{path}: not UTF-8 text (byte {exc.start}); save the config as UTF-8") from None


def _read_regular(path: Path) -> bytes:
    """The file's bytes; a FIFO or device is refused at once (a FIFO would block ``open``), and
    a file larger than any config is refused before it is read."""
    fd = os.open(path, os.O_RDONLY | os.O_NONBLOCK | os.O_CLOEXEC)
    with os.fdopen(fd, "rb") as f:
        if not stat.S_ISREG(os.fstat(fd).st_mode):
            raise ConfigError(f"{path}: not a regular file; give the path of a YAML config")
        data = f.read(safe_yaml.MAX_BYTES + 1)
    if len(data) > safe_yaml.MAX_BYTES:
        raise ConfigError(
            f"{path}: larger than {safe_yaml.MAX_BYTES // 1024**2} MiB, more than any config; check the path"
        )
    return data
