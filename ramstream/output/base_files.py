"""What the output takes from the base's directory besides the weights: ``config.json`` and the
tokenizer and generation files (``COPIED_FILES``), copied as they are.

Each name is a readable regular file (taken), absent (the output goes without it), or something
else: a dangling symbolic link, a directory, a FIFO, a file that cannot be read. That last is
refused by name before any pass, as a ``config.json`` that is not JSON is: the user meant the
file to be there, and an output quietly without it would look finished. Absence is legitimate (a
base given as one weights file, a checkpoint saved without its tokenizer): the output goes
without, and says so in the model card and in ``ramstream_merge.json`` (``missing``); without a
``config.json`` it is no model transformers can load, so the merge also warns on stderr.
"""

from __future__ import annotations

import os
from dataclasses import dataclass
from pathlib import Path

from ramstream.errors import CorruptFileError, InputError
from ramstream.format.checkpoint import Checkpoint
from ramstream.format.names import CONFIG_FILE, COPIED_FILES
from ramstream.format.regular import kind_of, open_regular

# Any one of these is a tokenizer (tokenizer_config.json alone is not).
TOKENIZER_FILES = ("tokenizer.json", "tokenizer.model", "vocab.json")
TOKENIZER = "tokenizer files"


@dataclass(frozen=True)
class BaseFiles:
    config: Path | None  # the base's config.json, when it has one
    copied: tuple[Path, ...]  # the files copied into the output as they are
    missing: tuple[str, ...]  # CONFIG_FILE and/or TOKENIZER: what a loadable model directory would hold
    single_file: bool  # the base was given as one weights file (no directory to take them from)

    def why(self, base: Checkpoint) -> str:
        """Why the output lacks ``missing``, for the warning and the card."""
        if self.single_file:
            return f"the base {base.path} is a single weights file"
        return f"the base {base.path} has none"


def base_files(base: Checkpoint) -> BaseFiles:
    """The base's metadata files; ``InputError`` naming one that is there but is no readable file."""
    directory = base.directory
    if directory is None:
        return BaseFiles(None, (), (CONFIG_FILE, TOKENIZER), True)
    config = directory / CONFIG_FILE
    has_config = _present(config)
    copied = tuple(directory / name for name in COPIED_FILES if _present(directory / name))
    has_tokenizer = any(path.name in TOKENIZER_FILES for path in copied)
    missing = (() if has_config else (CONFIG_FILE,)) + (() if has_tokenizer else (TOKENIZER,))
    return BaseFiles(config if has_config else None, copied, missing, False)


def read_copied(path: Path) -> bytes:
    """The bytes of a file to copy; ``InputError`` if it went away or broke since it was checked
    (opened non-blocking: a FIFO swapped in meanwhile does not hang finalisation)."""
    fix = "the output copies it from the base: fix it and rerun the same command to finish"
    try:
        with os.fdopen(open_regular(path), "rb") as f:
            return f.read()
    except CorruptFileError:
        raise InputError(f"{path}: is no longer a regular file; {fix}") from None
    except OSError as exc:
        raise InputError(f"{path}: cannot be read ({exc.strerror}); {fix}") from exc


def _present(path: Path) -> bool:
    """True for a readable regular file, False when nothing is there; ``InputError`` for anything else."""
    fix = f"the output copies the base's {path.name}: fix it, or remove it to merge without it"
    try:
        fd = open_regular(path)
    except FileNotFoundError:
        if os.path.islink(path):
            raise InputError(
                f"{path}: is a symbolic link to {os.readlink(path)}, which does not exist; {fix}"
            ) from None
        return False
    except CorruptFileError:
        raise InputError(f"{path}: is {kind_of(os.stat(path).st_mode)}, not a file; {fix}") from None
    except OSError as exc:
        raise InputError(f"{path}: cannot be read ({exc.strerror}); {fix}") from exc
    os.close(fd)
    return True
