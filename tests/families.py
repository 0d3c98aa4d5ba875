"""Test-side checkpoint writing and reading, independent of ramstream's own I/O code.

Families are real safetensors files on disk (bf16 by default) whose agents carry sparse task
vectors derived from the base. The raw arrays written are returned too, so the dense reference
works from exactly what is on disk without going through ramstream's reader.
"""

from __future__ import annotations

import json
import shutil
import struct
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np

NP_OF = {
    "F32": np.float32,
    "F16": np.float16,
    "F64": np.float64,
    "I64": np.int64,
    "I32": np.int32,
    "U8": np.uint8,
    "F8_E4M3": np.uint8,
    "F8_E5M2": np.uint8,
}


def f32_to_bf16(values: np.ndarray) -> np.ndarray:
    """Round-to-nearest-even float32 -> bfloat16 bits (NaN kept quiet)."""
    bits = np.ascontiguousarray(values, dtype=np.float32).view(np.uint32).astype(np.uint64)
    rounded = ((bits + 0x7FFF + ((bits >> 16) & 1)) >> 16).astype(np.uint16)
    nan = np.isnan(values)
    rounded[nan] = ((bits[nan] >> 16) | 0x40).astype(np.uint16)
    return rounded


def bf16_to_f32(bits: np.ndarray) -> np.ndarray:
    return (bits.astype(np.uint32) << 16).view(np.float32)


def encode(values: np.ndarray, dtype: str) -> np.ndarray:
    """float32 values -> the raw array stored for ``dtype``."""
    if dtype == "BF16":
        return f32_to_bf16(values)
    return values.astype(NP_OF[dtype])


def decode(raw: np.ndarray, dtype: str) -> np.ndarray:
    """Raw stored array -> float32."""
    if dtype == "BF16":
        return bf16_to_f32(raw)
    return raw.astype(np.float32)


def write_safetensors(path: Path, tensors: dict[str, tuple[str, tuple[int, ...], np.ndarray]]) -> None:
    """Write ``name -> (dtype, shape, raw array)`` in the safetensors format, by hand."""
    header: dict[str, object] = {"__metadata__": {"format": "pt"}}
    offset = 0
    blobs = []
    for name, (dtype, shape, raw) in tensors.items():
        blob = np.ascontiguousarray(raw).tobytes()
        header[name] = {"dtype": dtype, "shape": list(shape), "data_offsets": [offset, offset + len(blob)]}
        offset += len(blob)
        blobs.append(blob)
    text = json.dumps(header).encode()
    text += b" " * (-len(text) % 8)
    with open(path, "wb") as f:
        f.write(struct.pack("<Q", len(text)))
        f.write(text)
        for blob in blobs:
            f.write(blob)


def read_safetensors(path: Path) -> dict[str, tuple[str, tuple[int, ...], np.ndarray]]:
    """Read every tensor of a safetensors file as its raw array (uint16 for BF16)."""
    data = Path(path).read_bytes()
    (n,) = struct.unpack("<Q", data[:8])
    header = json.loads(data[8 : 8 + n])
    header.pop("__metadata__", None)
    out = {}
    for name, spec in header.items():
        lo, hi = spec["data_offsets"]
        carrier = np.uint16 if spec["dtype"] == "BF16" else NP_OF[spec["dtype"]]
        raw = np.frombuffer(data[8 + n + lo : 8 + n + hi], dtype=carrier)
        out[name] = (spec["dtype"], tuple(spec["shape"]), raw)
    return out


def read_model_dir(path: Path) -> dict[str, tuple[str, tuple[int, ...], np.ndarray]]:
    """All tensors of an output model directory (through its shard index, or its one
    ``model.safetensors``, which then has no index beside it)."""
    if not (Path(path) / "model.safetensors.index.json").is_file():
        assert not list(Path(path).glob("model-*.safetensors")), "numbered shards without an index"
        return read_safetensors(Path(path) / "model.safetensors")
    index = json.loads((Path(path) / "model.safetensors.index.json").read_text())
    tensors = {}
    for shard in sorted(set(index["weight_map"].values())):
        tensors.update(read_safetensors(Path(path) / shard))
    assert set(tensors) == set(index["weight_map"])
    return tensors


@dataclass
class Family:
    """A family on disk, and the float32 values of what was written (for the reference)."""

    base: Path
    agents: list[Path]
    base_values: dict[str, np.ndarray] = field(default_factory=dict)
    agent_values: list[dict[str, np.ndarray]] = field(default_factory=list)
    dtypes: dict[str, str] = field(default_factory=dict)
    shapes: dict[str, tuple[int, ...]] = field(default_factory=dict)
    copied: dict[str, tuple[str, np.ndarray]] = field(default_factory=dict)
    # per agent, its task vectors when they are given rather than agent minus base (a LoRA agent)
    given_taus: list[dict[str, np.ndarray] | None] = field(default_factory=list)

    def task_vector(self, t: int, name: str) -> np.ndarray:
        """Agent t's float32 task vector of ``name`` (flat): given, or f32(agent) - f32(base)."""
        given = self.given_taus[t] if t < len(self.given_taus) else None
        if given is not None:
            return given[name].astype(np.float32).ravel()
        base = self.base_values[name].astype(np.float32).ravel()
        return (self.agent_values[t][name].astype(np.float32).ravel() - base).astype(np.float32)

    def agent_weights(self, t: int, name: str) -> np.ndarray:
        """Agent t's float32 weights of ``name`` (flat): f32(base) + tau for a given task vector."""
        given = self.given_taus[t] if t < len(self.given_taus) else None
        if given is not None:
            return (self.base_values[name].astype(np.float32).ravel() + self.task_vector(t, name)).astype(np.float32)
        return self.agent_values[t][name].astype(np.float32).ravel()


DEFAULT_SHAPES: dict[str, tuple[int, ...]] = {
    "model.embed_tokens.weight": (96, 24),
    "model.layers.0.self_attn.q_proj.weight": (24, 24),
    "model.layers.0.mlp.down_proj.weight": (24, 40),
    "model.layers.0.input_layernorm.weight": (24,),
    "model.layers.1.mlp.up_proj.weight": (40, 24),
    "model.norm.weight": (24,),
    "lm_head.weight": (96, 24),
}


def build_family(
    root: Path,
    *,
    densities: tuple[float, ...] = (0.03, 0.4, 0.55),
    dtype: str = "BF16",
    agent_dtypes: tuple[str, ...] | None = None,
    shapes: dict[str, tuple[int, ...]] | None = None,
    identical_agent: bool = False,
    subset_agent: bool = False,
    shards: int = 1,
    single_file: bool = False,
    int_tensor: bool = False,
    seed: int = 0,
) -> Family:
    """Write a base and agents with sparse task vectors under ``root``.

    identical_agent adds an agent equal to the base (no active element); subset_agent adds one
    whose changes all lie where agent 0 also changed (no unique element).
    """
    rng = np.random.default_rng(seed)
    shapes = shapes or DEFAULT_SHAPES
    n = len(densities) + int(identical_agent) + int(subset_agent)
    agent_dtypes = agent_dtypes or (dtype,) * n
    fam = Family(root / ("base.safetensors" if single_file else "base"), [])
    agent_raw: list[dict[str, tuple[str, tuple[int, ...], np.ndarray]]] = [{} for _ in range(n)]
    base_raw: dict[str, tuple[str, tuple[int, ...], np.ndarray]] = {}
    fam.agent_values = [{} for _ in range(n)]
    for name, shape in shapes.items():
        numel = int(np.prod(shape))
        base = decode(encode(rng.standard_normal(numel).astype(np.float32) * 0.05, dtype), dtype)
        base_raw[name] = (dtype, shape, encode(base, dtype))
        fam.base_values[name], fam.dtypes[name], fam.shapes[name] = base, dtype, shape
        masks = [rng.random(numel) < d for d in densities]
        if subset_agent:
            masks.append(masks[0] & (rng.random(numel) < 0.5))
        if identical_agent:
            masks.append(np.zeros(numel, dtype=bool))
        for t, mask in enumerate(masks):
            delta = rng.standard_normal(numel).astype(np.float32) * np.float32(0.01)
            raw = encode(np.where(mask, base + delta, base).astype(np.float32), agent_dtypes[t])
            agent_raw[t][name] = (agent_dtypes[t], shape, raw)
            fam.agent_values[t][name] = decode(raw, agent_dtypes[t])
    if int_tensor:
        ids = np.arange(32, dtype=np.int64)
        base_raw["model.position_ids"] = ("I64", (32,), ids)
        fam.copied["model.position_ids"] = ("I64", ids)
        for t in range(n):
            agent_raw[t]["model.position_ids"] = ("I64", (32,), ids + 7)
    _write(fam.base, base_raw, shards, single_file)
    for t in range(n):
        path = root / (f"agent{t}.safetensors" if single_file else f"agent{t}")
        _write(path, agent_raw[t], shards, single_file)
        fam.agents.append(path)
    return fam


def _write(
    path: Path, tensors: dict[str, tuple[str, tuple[int, ...], np.ndarray]], shards: int, single_file: bool
) -> None:
    if single_file:
        write_safetensors(path, tensors)
        return
    path.mkdir(parents=True, exist_ok=True)
    (path / "config.json").write_text(json.dumps({"model_type": "qwen2", "torch_dtype": "bfloat16"}))
    (path / "tokenizer.json").write_text("{}")
    if shards == 1:
        write_safetensors(path / "model.safetensors", tensors)
        return
    names = list(tensors)
    groups = [names[i::shards] for i in range(shards)]
    weight_map = {}
    for k, group in enumerate(groups):
        fname = f"model-{k + 1:05d}-of-{shards:05d}.safetensors"
        write_safetensors(path / fname, {n: tensors[n] for n in group})
        weight_map.update({n: fname for n in group})
    (path / "model.safetensors.index.json").write_text(json.dumps({"metadata": {}, "weight_map": weight_map}))


def write_safetensors_chunked(
    path: Path,
    specs: list[tuple[str, str, tuple[int, ...]]],
    chunk: Callable[[str, int, int], np.ndarray],
    chunk_elems: int = 1 << 22,
) -> None:
    """Write ``(name, dtype, shape)`` tensors whose raw data ``chunk(name, start, stop)`` yields
    a piece at a time, so a tensor larger than memory is never held whole."""
    header: dict[str, object] = {"__metadata__": {"format": "pt"}}
    offset = 0
    for name, dtype, shape in specs:
        nbytes = int(np.prod(shape)) * np.dtype(np.uint16 if dtype == "BF16" else NP_OF[dtype]).itemsize
        header[name] = {"dtype": dtype, "shape": list(shape), "data_offsets": [offset, offset + nbytes]}
        offset += nbytes
    text = json.dumps(header).encode()
    text += b" " * (-len(text) % 8)
    with open(path, "wb") as f:
        f.write(struct.pack("<Q", len(text)))
        f.write(text)
        for name, _dtype, shape in specs:
            numel = int(np.prod(shape))
            for start in range(0, numel, chunk_elems):
                f.write(np.ascontiguousarray(chunk(name, start, min(start + chunk_elems, numel))).tobytes())


def read_elements(path: Path, name: str, indices: np.ndarray) -> np.ndarray:
    """The raw stored values of tensor ``name`` at flat ``indices`` (uint16 for BF16), read one
    element at a time so a large file is never loaded."""
    with open(path, "rb") as f:
        (n,) = struct.unpack("<Q", f.read(8))
        spec = json.loads(f.read(n))[name]
        carrier = np.dtype(np.uint16 if spec["dtype"] == "BF16" else NP_OF[spec["dtype"]])
        data = 8 + n + spec["data_offsets"][0]
        out = np.empty(len(indices), carrier)
        for k, i in enumerate(np.asarray(indices, dtype=np.int64)):
            f.seek(data + int(i) * carrier.itemsize)
            out[k] = np.frombuffer(f.read(carrier.itemsize), carrier)[0]
    return out


def model_file_of(directory: Path, name: str) -> Path:
    """The file of a model directory (sharded or not) that holds tensor ``name``."""
    index = Path(directory) / "model.safetensors.index.json"
    if index.is_file():
        return Path(directory) / json.loads(index.read_text())["weight_map"][name]
    return Path(directory) / "model.safetensors"


def with_raw_value(agent: Path, dest: Path, tensor: str, element: int, bits: int) -> Path:
    """A copy at ``dest`` of the one-file model directory ``agent`` whose 16-bit ``tensor`` holds
    the raw ``bits`` at flat index ``element`` (0x7FC0: a bf16 NaN, 0x7F80: +Inf)."""
    shutil.copytree(agent, dest)
    tensors = read_safetensors(dest / "model.safetensors")
    dtype, shape, raw = tensors[tensor]
    raw = raw.copy()
    raw[element] = bits
    write_safetensors(dest / "model.safetensors", {**tensors, tensor: (dtype, shape, raw)})
    return dest
