"""Record which Numba kernels each method's merge calls, with their argument types, into
``ramstream/backends/numba/kernel_table.py`` (what ``prewarm`` hands to child processes).

Merges the small family of ``tools/bench_compile.py`` with every method (its settings there) in
this process and notes each kernel's first call with each argument types, in order. Rerun it after
changing a kernel's arguments; ``tests/test_prewarm.py`` fails while the table is stale.

    python tools/record_kernels.py            # rewrite the table
    python tools/record_kernels.py --check    # exit 1 if the table differs from a fresh recording
"""

from __future__ import annotations

import argparse
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


def table_text() -> str:
    lines = [HEADER]
    with tempfile.TemporaryDirectory(prefix="record-kernels-") as tmp:
        work = Path(tmp)
        family = write_family(work / "family")
        for label, settings in METHODS.items():
            if "-" in label:  # a second setting of a method: the table keeps its first
                continue
            lines.append(f"    {label!r}: [\n")
            for module, name, types in record(label, settings, family, work):
                lines.append(f"        ({module!r}, {name!r}, {types!r}),\n")
            lines.append("    ],\n")
    lines.append("}\n# fmt: on\n")
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
