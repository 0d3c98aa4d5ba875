"""Record which Numba kernels each method's merge calls, with their argument types, into
``ramstream/backends/numba/kernel_table.py`` (what ``prewarm`` hands to child processes).

Merges the small family of ``tools/bench_compile.py`` with every method (its settings there) in
this process and notes each kernel's first call with each argument types, in order; then merges
it once more with its base's projections quantized to FP8 (as DeepSeek-V3 ships them) and notes,
as ``INPUT_KERNELS``, the kernels that call and no method's did (the dequantization). Rerun it after
changing a kernel's arguments; ``tests/test_prewarm.py`` fails while the table is stale.

    python tools/record_kernels.py            # rewrite the table
    python tools/record_kernels.py --check    # exit 1 if the table differs from a fresh recording
"""

from __future__ import annotations

import argparse
import json
import struct
import sys
import tempfile
import threading
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent))

from bench_compile import METHODS, write_family

REPO = Path(__file__).resolve().parent.parent
TABLE = REPO / "ramstream" / "backends" / "numba" / "kernel_table.py"

HEADER = '''"""The Numba kernels each method's merge calls, in the order it first calls them, with their
argument types (``str`` of Numba's types; ``w`` and ``workers`` last): what ``prewarm`` hands to
child processes to compile. Written by ``tools/record_kernels.py``; do not edit by hand.
"""

# fmt: off
KERNELS: dict[str, list[tuple[str, str, tuple[str, ...]]]] = {
'''

INPUT_HEADER = """# Kernels that decode a block's inputs (an FP8 base's), called before any method's kernel.
INPUT_KERNELS: list[tuple[str, str, tuple[str, ...]]] = [
"""


def record(
    method: str, settings: dict[str, object], family: dict[str, Any], work: Path
) -> list[tuple[str, str, tuple[str, ...]]]:
    from numba import typeof

    from ramstream import api
    from ramstream.backends.numba import workers
    from ramstream.config import RunOptions

    seen: list[tuple[str, str, tuple[str, ...]]] = []
    lock = threading.Lock()

    def note(part: Any, args: tuple[Any, ...]) -> None:
        func = part.py_func
        entry = (func.__module__.rsplit(".", 1)[-1], func.__name__, (*(str(typeof(a)) for a in args), "int64", "int64"))
        with lock:
            if entry not in seen:
                seen.append(entry)

    given = dict(settings)
    agents = family["agents"][: int(given.pop("agents", len(family["agents"])))]  # type: ignore[call-overload]
    workers.before_call(note)
    try:
        api.merge(family["base"], agents, out=work / method, method=method, method_options=given,
                  options=RunOptions(cache_dir=work / "cache", quiet=True))  # fmt: skip
    finally:
        workers.before_call(None)
    return seen


def fp8_base(base: Path, out: Path) -> Path:
    """``base`` with its projections' weights quantized to FP8 E4M3, one float32 scale per 128 x 128
    block (``weight_scale_inv``), and ``quantization_config`` in its config.json."""
    import numpy as np

    from ramstream.blocks.quantized import quantize_bands
    from ramstream.format import codecs
    from ramstream.format.dtypes import FLOAT_CODES

    raw = (base / "model.safetensors").read_bytes()
    size = struct.unpack("<Q", raw[:8])[0]
    tensors: dict[str, tuple[str, list[int], np.ndarray]] = {}
    for name, entry in json.loads(raw[8 : 8 + size]).items():
        if name == "__metadata__":
            continue
        lo, hi = entry["data_offsets"]
        data = np.frombuffer(raw, np.uint8, hi - lo, 8 + size + lo)
        if not name.endswith("proj.weight"):
            tensors[name] = (entry["dtype"], entry["shape"], data)
            continue
        values = codecs.decode(data.view(np.uint16), FLOAT_CODES[entry["dtype"]])
        codes, scales = quantize_bands(values, entry["shape"][1], (128, 128), "F8_E4M3")
        tensors[name] = ("F8_E4M3", entry["shape"], codes)
        tensors[name + "_scale_inv"] = ("F32", list(scales.shape), scales)
    header: dict[str, object] = {"__metadata__": {"format": "pt"}}
    offset = 0
    for name, (dtype, shape, data) in tensors.items():
        header[name] = {"dtype": dtype, "shape": shape, "data_offsets": [offset, offset + data.nbytes]}
        offset += data.nbytes
    text = json.dumps(header).encode()
    text += b" " * (-len(text) % 8)
    out.mkdir(parents=True)
    with open(out / "model.safetensors", "wb") as f:
        f.write(struct.pack("<Q", len(text)) + text + b"".join(d.tobytes() for _, _, d in tensors.values()))
    config = json.loads((base / "config.json").read_text())
    config["quantization_config"] = {"quant_method": "fp8", "fmt": "e4m3", "weight_block_size": [128, 128]}
    (out / "config.json").write_text(json.dumps(config))
    return out


def table_text() -> str:
    lines = [HEADER]
    seen: set[tuple[str, str, tuple[str, ...]]] = set()
    with tempfile.TemporaryDirectory(prefix="record-kernels-") as tmp:
        work = Path(tmp)
        family = write_family(work / "family")
        for label, settings in METHODS.items():
            if "-" in label:  # a second setting of a method: the table keeps its first
                continue
            lines.append(f"    {label!r}: [\n")
            for module, name, types in record(label, settings, family, work):
                lines.append(f"        ({module!r}, {name!r}, {types!r}),\n")
                seen.add((module, name, types))
            lines.append("    ],\n")
        lines.append("}\n\n")
        lines.append(INPUT_HEADER)
        fp8 = dict(family, base=str(fp8_base(Path(str(family["base"])), work / "base-fp8")))
        for module, name, types in record("ram+", METHODS["ram+"], fp8, work / "fp8"):
            if (module, name, types) not in seen:
                lines.append(f"    ({module!r}, {name!r}, {types!r}),\n")
    lines.append("]\n# fmt: on\n")
    return "".join(lines)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--check", action="store_true", help="compare with the table instead of writing it")
    args = parser.parse_args()
    text = table_text()
    if args.check:
        if TABLE.read_text() != text:
            raise SystemExit(f"{TABLE} is stale: run python tools/record_kernels.py")
        print(f"{TABLE} is current")
        return
    TABLE.write_text(text)
    print(f"wrote {TABLE}")


if __name__ == "__main__":
    main()
