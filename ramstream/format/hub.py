"""Hugging Face hub ids (``org/name[@revision]``) as checkpoints: a snapshot folder of the cache.

A name that is not an existing path and reads as a repo id is resolved with ``huggingface_hub``
(imported only then) in its cache (``HF_HOME``, ``HF_HUB_CACHE``; ``--hf-cache`` overrides both).
Online, the hub says which commit the revision is and which files that commit holds
(``repo_info``), and only what a merge reads is downloaded, at that commit (``hf_hub_download``,
with its progress bars): the config, tokenizer and generation files, then the weights —
safetensors when the repo has them, else the ``.bin`` files. Each request has ``--hub-timeout``
seconds to answer (``huggingface_hub`` leaves its metadata calls unbounded); a download's
transfer is bounded per read by huggingface_hub's own ``HF_HUB_DOWNLOAD_TIMEOUT``. A hub that
does not answer, or ``HF_HUB_OFFLINE``, falls back to the cache, as ``snapshot_download`` does.

A cache is trusted no further than each repo's folder ``models--org--name/``: ``refs/<revision>``
must lead inside it and hold a commit; the snapshot folder must be one of its ``snapshots/``; every
file read from it (symlinks followed, shard index entries included) must lead inside it, or it is
refused by name, and a link whose blob is gone is "missing". A local path inside a cache is held
to the same rule. The commit of the folder actually read, and the blob each weights file was read
from, are recorded with the merge.
"""

from __future__ import annotations

import os
import re
import sys
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Any

from ramstream.config import DEFAULT_HUB_TIMEOUT
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
_COMMIT = re.compile(r"[0-9a-f]{40}")
DEFAULT_REVISION = "main"
DOWNLOADS = 8  # files fetched at once, as snapshot_download does


@dataclass(frozen=True)
class HubSource:
    """Where a checkpoint came from: the repo, the revision asked for, the commit of the snapshot
    folder read, and the cache blob each weights file was read from."""

    repo_id: str
    revision: str
    commit: str
    blobs: tuple[tuple[str, str], ...] = ()

    def to_dict(self) -> dict[str, Any]:
        blobs = {"blobs": dict(self.blobs)} if self.blobs else {}
        return {"repo_id": self.repo_id, "revision": self.revision, "commit": self.commit, **blobs}


@dataclass
class HubAccess:
    """How one run reaches the hub: the cache, the seconds the hub has to answer a request, and,
    once a request went unanswered, why: the run's later hub ids then go straight to the cache
    (a silent hub costs one timeout per run, not one per model)."""

    cache: Path | None = None
    timeout: float = DEFAULT_HUB_TIMEOUT
    unanswered: BaseException | None = None


@dataclass(frozen=True)
class Snapshot:
    """A snapshot folder ``.../models--org--name/snapshots/<commit>`` and the repo folder (its
    real path) that every file read from it must lead into."""

    folder: Path
    repo_folder: Path
    source: HubSource

    def file(self, path: Path) -> Path:
        """``path``, a file of the snapshot, once it is known to lead to a file inside the repo's folder."""
        real = Path(os.path.realpath(path))
        if not real.is_relative_to(self.repo_folder):
            raise InputError(_outside(path, self.source.repo_id, self.repo_folder, real))
        if not real.exists():
            name = _relative(path, self.folder)
            why = "its blob was deleted" if os.path.islink(path) else "it was never downloaded"
            raise InputError(
                f"{path}: the cached file {name} of {self.source.repo_id} is missing ({why}); "
                f"download it with `hf download {self.source.repo_id} {name} --revision {self.source.commit}`"
            )
        return path

    def blob(self, path: Path) -> str | None:
        """The name of the blob ``path`` leads to (None for a file stored in the snapshot itself)."""
        real = Path(os.path.realpath(path))
        return real.name if real.parent == self.repo_folder / "blobs" else None

    def with_blobs(self, files: tuple[Path, ...]) -> HubSource:
        """The source, with the blob each of ``files`` was read from."""
        blobs = ((_relative(f, self.folder), self.blob(f)) for f in files)
        return replace(self.source, blobs=tuple((name, blob) for name, blob in blobs if blob is not None))


def is_repo_id(text: str) -> bool:
    """True for ``org/name`` or ``org/name@revision`` (the caller has checked it is no path)."""
    return bool(_REPO_ID.match(text)) and ".." not in text.partition("@")[0]


def snapshot_at(directory: Path, revision: str | None = None) -> Snapshot | None:
    """The snapshot a local folder is, when it lies in a Hugging Face cache
    (``.../models--org--name/snapshots/<sha>``), so that it is read and recorded like a hub id;
    None elsewhere. A snapshot folder that leads outside its repo's folder is refused."""
    folder = Path(os.path.abspath(directory))
    kind, _, repo = folder.parent.parent.name.partition("--")
    org, _, name = repo.partition("--")  # an org has no "--"; huggingface_hub allows none in a name either
    if folder.parent.name != "snapshots" or kind != "models" or not org or not name:
        return None
    repo_id = f"{org}/{name}"
    repo_folder = Path(os.path.realpath(folder.parent.parent))
    real = Path(os.path.realpath(folder))
    if real.parent != repo_folder / "snapshots":
        raise InputError(_outside(folder, repo_id, repo_folder, real))
    return Snapshot(folder, repo_folder, HubSource(repo_id, revision or folder.name, real.name))


def resolve_repo(text: str, access: HubAccess) -> Snapshot:
    """The snapshot holding what a merge needs from ``text``'s repo, fetched when missing."""
    repo_id, _, revision = text.partition("@")
    revision = revision or DEFAULT_REVISION
    if ".." in revision or revision.startswith("/") or "\\" in revision or "//" in revision:
        raise InputError(f"{text}: {revision!r} is not a revision; give a branch, tag or commit of {repo_id}")
    hub = _Hub(repo_id, revision, access)
    snapshot = hub.snapshot([CONFIG_FILE, *COPIED_FILES, SHARD_INDEX, SINGLE_FILE, BIN_INDEX])
    folder = snapshot.folder
    index = next((folder / i for i in (SHARD_INDEX, BIN_INDEX) if os.path.lexists(folder / i)), None)
    if index is not None:
        hub.fetch(shard_names(snapshot.file(index)))
    elif not os.path.lexists(folder / SINGLE_FILE):
        hub.fetch([BIN_FILE])
        if not os.path.lexists(folder / BIN_FILE):
            raise InputError(
                f"{repo_id}@{revision}: no {SINGLE_FILE}, {BIN_FILE} or shard index in the repo (nor in its cached "
                f"snapshot {folder}); is it a model repo?"
            )
    return snapshot


class _Hub:
    """One repo and revision: the hub's commit and file list when it answers, else the cache's snapshot."""

    def __init__(self, repo_id: str, revision: str, access: HubAccess) -> None:
        self.hf = _import_hub(repo_id)
        try:
            self.hf.utils.validate_repo_id(repo_id)
        except self.hf.errors.HFValidationError as exc:
            raise InputError(
                f"{repo_id}: not a valid Hugging Face repo id ({_first_line(exc)}), and no such local path"
            ) from None
        self.repo_id, self.revision, self.access = repo_id, revision, access
        self.cache, self.timeout = access.cache, access.timeout
        self.where = f"{repo_id}@{revision}"
        self.cache_dir = Path(self.cache) if self.cache is not None else Path(self.hf.constants.HF_HUB_CACHE)
        self.storage = self.cache_dir / f"models--{repo_id.replace('/', '--')}"
        self.commit: str | None = None  # what the hub says the revision is; None: read the cache
        self.files: frozenset[str] = frozenset()

    def snapshot(self, names: list[str]) -> Snapshot:
        """The revision's snapshot, with those of ``names`` that the repo has."""
        unanswered = self._ask()
        if self.commit is None:
            folder = self._cached(names, unanswered)
        else:
            folder = self.storage / "snapshots" / self.commit
            self.fetch(names)
            self._record_ref()
        if folder != self.storage / "snapshots" / folder.name:  # a ref of ``../..``: not a snapshot of the repo
            raise InputError(_outside(folder, self.repo_id, self.storage, Path(os.path.realpath(folder))))
        snapshot = snapshot_at(folder, self.revision)
        if snapshot is None:  # huggingface_hub names the folder models--org--name: never
            raise InputError(f"{folder}: not a snapshot folder of a Hugging Face cache")
        return snapshot

    def fetch(self, names: list[str]) -> None:
        """Download those of ``names`` the repo has at the commit (none when reading the cache)."""
        wanted = [n for n in names if n in self.files] if self.commit is not None else []
        if not wanted:
            return
        pool = ThreadPoolExecutor(min(DOWNLOADS, len(wanted)), thread_name_prefix="ramstream-download")
        try:
            list(pool.map(self._download, wanted))
        finally:  # after an error (or Ctrl-C) the downloads not yet started are not started
            pool.shutdown(cancel_futures=True)

    def _ask(self) -> str | BaseException | None:
        """Ask the hub for the commit and its files; None when it answered, else why not."""
        if self.hf.constants.HF_HUB_OFFLINE:
            return "HF_HUB_OFFLINE is set"
        if self.access.unanswered is not None:
            return self.access.unanswered
        errors = self.hf.errors
        try:
            info = self.hf.HfApi().repo_info(self.repo_id, revision=self.revision, timeout=self.timeout)
        except errors.RevisionNotFoundError:
            raise InputError(
                f"{self.where}: the hub has no revision {self.revision!r} of {self.repo_id}; give a branch, tag "
                "or commit"
            ) from None
        except _unanswered() as exc:
            if not isinstance(exc, errors.HfHubHTTPError):  # no answer at all (an HTTP error is one)
                self.access.unanswered = exc
            return exc
        if not isinstance(info.sha, str) or not _COMMIT.fullmatch(info.sha):
            raise InputError(f"{self.where}: the hub at {self.hf.constants.ENDPOINT} answered commit {info.sha!r}")
        self.commit = info.sha
        self.files = frozenset(s.rfilename for s in info.siblings or ())
        return None

    def _cached(self, names: list[str], unanswered: str | BaseException | None) -> Path:
        """The cached snapshot of the revision (its ref checked first), or one line saying why there is none."""
        self._check_ref()
        try:
            folder = self.hf.snapshot_download(
                self.repo_id,
                revision=self.revision,
                cache_dir=None if self.cache is None else str(self.cache),
                allow_patterns=names,
                local_files_only=True,
            )
        except (OSError, ValueError) as exc:
            raise InputError(self._not_cached(unanswered, exc)) from None
        return Path(folder)

    def _check_ref(self) -> None:
        """``refs/<revision>`` (what ``snapshot_download`` reads a branch or tag from) must lead
        inside the repo's folder and hold a commit."""
        ref = self.storage / "refs" / self.revision
        if _COMMIT.fullmatch(self.revision) or not os.path.lexists(ref):
            return
        real = Path(os.path.realpath(ref))
        if not real.is_relative_to(os.path.realpath(self.storage)):
            raise InputError(_outside(ref, self.repo_id, self.storage, real))
        try:
            with open(ref, errors="replace") as f:
                held = f.read(100)
        except OSError as exc:
            raise InputError(f"{ref}: cannot read ({exc.strerror}); check the cache's permissions") from exc
        if not _COMMIT.fullmatch(held):
            raise InputError(
                f"{ref}: holds {held!r}, not a commit; the cache is damaged or was tampered with: delete "
                f"{self.storage} and download {self.repo_id} again"
            )

    def _record_ref(self) -> None:
        """Write ``refs/<revision>`` as ``snapshot_download`` would, so the cache answers it offline."""
        if self.revision == self.commit:
            return
        ref = self.storage / "refs" / self.revision
        try:
            if ref.is_file() and ref.read_text() == self.commit:
                return
            ref.parent.mkdir(parents=True, exist_ok=True)
            partial = ref.with_name(f".{ref.name}.{os.getpid()}.partial")
            partial.write_text(str(self.commit))
            partial.replace(ref)
        except OSError:
            pass  # the files are there; only an offline run by revision name would miss the ref

    def _download(self, name: str) -> None:
        errors = self.hf.errors
        try:
            self.hf.hf_hub_download(
                self.repo_id,
                name,
                revision=self.commit,
                cache_dir=None if self.cache is None else str(self.cache),
                etag_timeout=self.timeout,
            )
        except errors.RepositoryNotFoundError:
            raise InputError(self._no_repository()) from None
        except _unanswered() as exc:
            raise InputError(
                f"{self.where}: downloading {name} (commit {self.commit}) from the hub at "
                f"{self.hf.constants.ENDPOINT} failed ({self._reason(exc)}); check the connection and the free "
                f"space in {self.cache_dir}, then rerun"
            ) from None

    def _not_cached(self, unanswered: str | BaseException | None, exc: BaseException) -> str:
        errors = self.hf.errors
        if isinstance(unanswered, errors.RepositoryNotFoundError):
            return self._no_repository()
        incomplete = getattr(errors, "IncompleteSnapshotError", ())  # huggingface_hub >= 1.x
        if isinstance(exc, incomplete) or not isinstance(exc, errors.LocalEntryNotFoundError):
            return (
                f"{self.where}: its snapshot in the Hugging Face cache {self.cache_dir} cannot be used "
                f"({_first_line(exc)}); connect to complete it, {self._other_cache()}"
            )
        if isinstance(unanswered, str):
            why = f" while the hub cannot be reached ({unanswered})"
        else:
            why = f", and the hub at {self.hf.constants.ENDPOINT} {self._reason(unanswered)}"
        return (
            f"{self.where}: no such local path, and not in the Hugging Face cache {self.cache_dir}{why}; check the "
            f"path, connect to download it, {self._other_cache()}"
        )

    def _other_cache(self) -> str:
        """--hf-cache is suggested only to one who did not give it: the cache given is the one named."""
        return "or pass --hf-cache DIR where it is cached" if self.cache is None else "or check --hf-cache"

    def _reason(self, exc: BaseException | None) -> str:
        if isinstance(exc, _timeouts()):
            return f"did not answer within {self.timeout:g} s (--hub-timeout)"
        return f"could not be reached ({_first_line(exc)})" if exc is not None else "could not be reached"

    def _no_repository(self) -> str:
        return (
            f"{self.repo_id}: no such repository on the Hugging Face hub, or it is private or gated (log in with "
            "`hf auth login`), and no such local path"
        )


def _import_hub(repo_id: str) -> Any:
    try:
        import huggingface_hub
        import huggingface_hub.constants
        import huggingface_hub.errors
        import huggingface_hub.utils
    except ImportError:
        raise InputError(
            f"{repo_id}: reading a Hugging Face hub id needs huggingface_hub: pip install huggingface_hub"
        ) from None
    return huggingface_hub


def _unanswered() -> tuple[type[BaseException], ...]:
    """What a request that got no usable answer raises, whichever HTTP library huggingface_hub
    uses: requests' errors and huggingface_hub's HTTP errors are ``OSError``s, httpx's are not; a
    body that is not JSON is a ``ValueError``."""
    return (OSError, ValueError, *_from_http_libraries("HTTPError", "InvalidURL"))


def _timeouts() -> tuple[type[BaseException], ...]:
    requests = sys.modules.get("requests")
    from_requests = (requests.Timeout,) if requests is not None else ()
    return (TimeoutError, *from_requests, *_from_http_libraries("TimeoutException"))


def _from_http_libraries(*names: str) -> tuple[type[BaseException], ...]:
    """Those of ``names`` that the httpx-style libraries huggingface_hub has imported define."""
    modules = [sys.modules.get(m) for m in ("httpx", "httpx2")]
    return tuple(getattr(m, n) for m in modules if m is not None for n in names if hasattr(m, n))


def _outside(path: Path, repo_id: str, repo_folder: Path, real: Path) -> str:
    return (
        f"{path}: leads outside the Hugging Face cache folder of {repo_id} ({repo_folder}), to {real}; refused: "
        f"the cache is damaged or was tampered with: delete {repo_folder} and download {repo_id} again"
    )


def _relative(path: Path, folder: Path) -> str:
    try:
        return Path(os.path.abspath(path)).relative_to(Path(os.path.abspath(folder))).as_posix()
    except ValueError:
        return path.name


def _first_line(exc: BaseException) -> str:
    text = str(exc).strip()
    return text.splitlines()[0] if text else type(exc).__name__
