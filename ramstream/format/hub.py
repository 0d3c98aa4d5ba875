"""Hugging Face hub ids (``org/name[@revision]``) as checkpoints: a snapshot directory in the cache.

A name that is not an existing path and reads as a repo id is resolved with ``huggingface_hub``
(imported only then), which keeps its own cache (``HF_HOME``, ``HF_HUB_CACHE``; ``--hf-cache``
overrides both), honours ``HF_HUB_OFFLINE``, downloads with its own progress bars and answers
from the cache when the hub cannot be reached. Only what a merge reads is fetched: the config,
tokenizer and generation files, then the weights — safetensors when the repo has them, else the
``.bin`` files — so a repo holding both formats is not downloaded twice. The snapshot's folder
name is the commit sha the revision resolved to; it is recorded with the merge.
"""

from __future__ import annotations

import os
import re
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from ramstream.errors import InputError
from ramstream.format.names import (
    BIN_FILE,
    BIN_INDEX,
    CONFIG_FILE,
    COPIED_FILES,
    SHARD_INDEX,
    SINGLE_FILE,
    shard_names,
)

# org/name, each a run of letters, digits, '.', '_' and '-' (the hub's rule), optionally @revision.
_REPO_ID = re.compile(r"^[A-Za-z0-9][\w.-]{0,95}/[A-Za-z0-9][\w.-]{0,95}(?:@[^\s@]+)?$")
DEFAULT_REVISION = "main"


@dataclass(frozen=True)
class HubSource:
    """Where a checkpoint came from: the repo, the revision asked for, the commit it resolved to."""

    repo_id: str
    revision: str
    commit: str

    def to_dict(self) -> dict[str, str]:
        return {"repo_id": self.repo_id, "revision": self.revision, "commit": self.commit}


@dataclass(frozen=True)
class ResolvedRepo:
    directory: Path
    source: HubSource


def is_repo_id(text: str) -> bool:
    """True for ``org/name`` or ``org/name@revision`` (the caller has checked it is no path)."""
    return bool(_REPO_ID.match(text)) and ".." not in text.partition("@")[0]


def snapshot_source(directory: Path) -> HubSource | None:
    """The repo and commit of a local path inside a Hugging Face cache
    (``.../models--org--name/snapshots/<sha>``), so that a model given by its cache path is
    recorded like one given by its hub id; None elsewhere."""
    folder = Path(os.path.abspath(directory))
    repo = folder.parent.parent.name.split("--")
    if folder.parent.name != "snapshots" or len(repo) != 3 or repo[0] != "models":
        return None
    return HubSource(f"{repo[1]}/{repo[2]}", folder.name, folder.name)


def resolve_repo(text: str, hf_cache: Path | None) -> ResolvedRepo:
    """The snapshot directory holding what a merge needs from ``text``'s repo, fetched when missing."""
    repo_id, _, revision = text.partition("@")
    revision = revision or DEFAULT_REVISION
    fetch = _Fetcher(repo_id, revision, hf_cache)
    folder = fetch([CONFIG_FILE, *COPIED_FILES, SHARD_INDEX, SINGLE_FILE, BIN_INDEX])
    index = next((folder / i for i in (SHARD_INDEX, BIN_INDEX) if (folder / i).is_file()), None)
    if index is not None:
        fetch(shard_names(index))
    elif not (folder / SINGLE_FILE).is_file():
        fetch([BIN_FILE])
        if not (folder / BIN_FILE).is_file():
            raise InputError(
                f"{repo_id}@{revision}: no {SINGLE_FILE}, {BIN_FILE} or shard index in the repo (nor in its cached "
                f"snapshot {folder}); is it a model repo?"
            )
    return ResolvedRepo(folder, HubSource(repo_id, revision, folder.name))


@dataclass(frozen=True)
class _Fetcher:
    """``snapshot_download`` of one repo and revision, its errors worded as one ``InputError``."""

    repo_id: str
    revision: str
    cache: Path | None

    def __call__(self, patterns: list[str]) -> Path:
        try:
            import huggingface_hub
        except ImportError:
            raise InputError(
                f"{self.repo_id}: reading a Hugging Face hub id needs huggingface_hub: pip install huggingface_hub"
            ) from None
        try:
            folder = huggingface_hub.snapshot_download(
                self.repo_id,
                revision=self.revision,
                cache_dir=None if self.cache is None else str(self.cache),
                allow_patterns=patterns,
            )
        except (OSError, ValueError) as exc:
            raise InputError(self._message(exc)) from None
        return Path(folder)

    def _message(self, exc: Exception) -> str:
        from huggingface_hub import constants
        from huggingface_hub.errors import LocalEntryNotFoundError, RepositoryNotFoundError, RevisionNotFoundError

        where = f"{self.repo_id}@{self.revision}"
        if isinstance(exc, RevisionNotFoundError):
            return f"{where}: the hub has no revision {self.revision!r} of {self.repo_id}; give a branch, tag or commit"
        if isinstance(exc, RepositoryNotFoundError):
            return (
                f"{self.repo_id}: no such repository on the Hugging Face hub, or it is private or gated (log in with "
                "`hf auth login`), and no such local path"
            )
        if isinstance(exc, LocalEntryNotFoundError):
            cache = self.cache or Path(constants.HF_HUB_CACHE)
            offline = " (HF_HUB_OFFLINE is set)" if _offline(constants) else ""
            # --hf-cache is suggested only to one who did not give it: the cache given is the one named.
            other = "or pass --hf-cache DIR where it is cached" if self.cache is None else "or check --hf-cache"
            return (
                f"{where}: no such local path, and not in the Hugging Face cache {cache} while the hub cannot be "
                f"reached{offline}; check the path, connect to download it, {other}"
            )
        if isinstance(exc, ValueError):
            return f"{self.repo_id}: not a valid Hugging Face repo id ({_first_line(exc)}), and no such local path"
        return f"{where}: could not be fetched from the Hugging Face hub ({_first_line(exc)}); check the connection"


def _offline(constants: Any) -> bool:
    return bool(getattr(constants, "HF_HUB_OFFLINE", False))


def _first_line(exc: Exception) -> str:
    text = str(exc).strip()
    return text.splitlines()[0] if text else type(exc).__name__
