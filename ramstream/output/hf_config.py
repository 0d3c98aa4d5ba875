"""The output's ``config.json``: the base's, with its dtype set to what the merge wrote."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

from ramstream.errors import InputError
from ramstream.format.dtypes import TORCH_NAMES
from ramstream.format.family import Family


def merged_config(path: Path | None, family: Family, dtypes: tuple[str, ...]) -> dict[str, Any] | None:
    """The output's config from the base's (``path``; None: the base has none); a broken one is
    an ``InputError`` (the merge calls this before its first block too, so it never fails after
    the long pass)."""
    if path is None:
        return None
    try:
        text = path.read_bytes()
    except OSError as exc:
        raise InputError(f"{path}: cannot be read ({exc.strerror}); fix or remove the base's config.json") from exc
    try:
        config = json.loads(text)
    except ValueError as exc:
        raise InputError(f"{path}: not valid JSON ({exc}); fix or remove the base's config.json") from exc
    if not isinstance(config, dict):
        raise InputError(
            f"{path}: holds a JSON {type(config).__name__}, not an object; fix or remove the base's config.json"
        )
    elements: dict[str, int] = {}
    for dtype, ref in zip(dtypes, family.base.tensors.values(), strict=True):
        if dtype in TORCH_NAMES:
            elements[dtype] = elements.get(dtype, 0) + ref.entry.numel
    if elements:
        # The dtype holding most elements; ties go to the first in TORCH_NAMES order (no set order).
        dominant = max(TORCH_NAMES, key=lambda d: (elements.get(d, -1), -list(TORCH_NAMES).index(d)))
        config["torch_dtype"] = TORCH_NAMES[dominant]
        if "dtype" in config:
            config["dtype"] = TORCH_NAMES[dominant]
    return config
