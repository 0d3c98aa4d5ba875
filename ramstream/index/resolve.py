"""Find, validate or create the index for a family: explicit ``--index`` or the cache."""

from __future__ import annotations

import json
from pathlib import Path

from ramstream.errors import IndexMismatchError
from ramstream.format.family import Family
from ramstream.format.fingerprint import content_key
from ramstream.index.header import IndexHeader
from ramstream.index.store import (
    SCHEMA_VERSION,
    IndexStore,
    create_index,
    is_unfinished_creation,
    open_index_store,
    remove_index,
)
from ramstream.plan import make_plan


def cache_path(cache_dir: Path, key: str) -> Path:
    return cache_dir / "index" / f"{key}.zarr"


def family_key(family: Family, eps: float) -> str:
    """The inputs' and settings' key. A quantized base read as bf16 or f16 is a setting of its
    own; f32 (and a base stored in floats) keeps the key indexes had before the setting existed."""
    settings: dict[str, object] = {"eps": float(eps), "schema": SCHEMA_VERSION}
    if family.quantized_base_as != "f32":
        settings["quantized_base_as"] = family.quantized_base_as
    return content_key(family.fingerprints(), settings)


def index_path(family: Family, eps: float, path: Path | None, cache_dir: Path) -> Path:
    """Where the index of ``family`` and ``eps`` lives: ``path`` if given, else in the cache."""
    return path if path is not None else cache_path(cache_dir, family_key(family, eps))


def open_or_create(family: Family, eps: float, path: Path | None, cache_dir: Path, block_elems: int) -> IndexStore:
    """The index for ``family`` and ``eps``; an explicit ``path`` built from anything else is refused."""
    key = family_key(family, eps)
    target = index_path(family, eps, path, cache_dir)
    if target.exists() and is_unfinished_creation(target):
        remove_index(target)
    if target.exists():
        store = open_index_store(target)
        if store.header.content_key != key:
            raise IndexMismatchError(f"{target}: {_difference(store.header, family, eps)}")
        return store
    fingerprints = family.fingerprints()
    header = IndexHeader(
        SCHEMA_VERSION,
        key,
        float(eps),
        block_elems,
        family.base.name,
        family.agent_names,
        tuple(fingerprints),
        make_plan(family, block_elems).tensors,
        quantized_base_as=family.quantized_base_as,
    )
    target.parent.mkdir(parents=True, exist_ok=True)
    return create_index(target, header, make_plan(family, block_elems))


def _difference(header: IndexHeader, family: Family, eps: float) -> str:
    if header.eps != float(eps):
        return f"this index was built with eps={header.eps}, not eps={eps}; use --eps {header.eps} or another --index"
    if header.quantized_base_as != family.quantized_base_as:
        return (
            f"this index was built with the quantized base read as {header.quantized_base_as}, not as "
            f"{family.quantized_base_as} (--quantized-base-as); use --quantized-base-as {header.quantized_base_as} "
            "or another --index"
        )
    if len(header.agents) != len(family.agents):
        return f"this index was built for {len(header.agents)} agents, not {len(family.agents)}; use another --index"
    fingerprints = family.fingerprints()
    if sorted(map(_files_key, header.inputs)) == sorted(map(_files_key, fingerprints)):
        return (
            "this index was built from the same checkpoints given in another order (its statistics are per "
            "agent position); give them in the order they were probed, or use another --index"
        )
    for old, new in zip(header.inputs, fingerprints, strict=True):
        if old["files"] != new["files"]:
            return (
                f"this index was built from other inputs ({new['path']} differs from when it was probed: "
                "file identity, size, modification time, header or sampled data); use another --index "
                "or delete this one"
            )
    return "this index was built from other inputs or settings; use another --index or delete this one"


def _files_key(fingerprint: dict[str, object]) -> str:
    return json.dumps(fingerprint.get("files"), sort_keys=True)
