"""The output's shards: their names (``model-00001-of-00003.safetensors``, or ``model.safetensors``
alone, as ``save_pretrained`` names one shard), their headers, and where each tensor's data lies,
all computed before the first block is merged."""

from __future__ import annotations

import json

from ramstream.format.names import SINGLE_FILE
from ramstream.io.writer import Placement, ShardLayout

HEADER_ALIGN = 8


def plan_shards(tensors: list[tuple[str, str, tuple[int, ...], int]], shard_size: int) -> ShardLayout:
    """Assign ``(name, dtype, shape, nbytes)`` tensors, in order, to shards of at most ``shard_size``."""
    groups: list[list[tuple[str, str, tuple[int, ...], int]]] = [[]]
    used = 0
    for item in tensors:
        if groups[-1] and used + item[3] > shard_size:
            groups.append([])
            used = 0
        groups[-1].append(item)
        used += item[3]
    count = len(groups)
    names = shard_file_names(count)
    headers, sizes, placements = [], [], {}
    for shard, group in enumerate(groups):
        doc: dict[str, object] = {"__metadata__": {"format": "pt"}}
        offset = 0
        for name, dtype, shape, nbytes in group:
            doc[name] = {"dtype": dtype, "shape": list(shape), "data_offsets": [offset, offset + nbytes]}
            offset += nbytes
        raw = json.dumps(doc, separators=(",", ":")).encode()
        raw += b" " * (-len(raw) % HEADER_ALIGN)
        header = len(raw).to_bytes(8, "little") + raw
        data_start = len(header)
        for name, dtype, _shape, nbytes in group:
            start = doc[name]["data_offsets"][0]  # type: ignore[index]
            placements[name] = Placement(shard, data_start + start, dtype, nbytes)
        headers.append(header)
        sizes.append(data_start + offset)
    return ShardLayout(names, tuple(headers), tuple(sizes), placements)


def shard_file_names(count: int) -> tuple[str, ...]:
    """``model.safetensors`` for one shard (no shard index is written then), else numbered names."""
    if count == 1:
        return (SINGLE_FILE,)
    return tuple(f"model-{i + 1:05d}-of-{count:05d}.safetensors" for i in range(count))
