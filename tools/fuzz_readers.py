"""Fuzz the ``.bin`` reader and the safetensors header parser for longer than the test suite does.

The same mutations and the same rule as ``tests/test_fuzz_readers.py`` (``tests/reader_fuzz.py``):
each mutant of a real file must read as the tensors that were saved, as exactly what the reference
reader (``torch.load(map_location="cpu", weights_only=True)``, ``safetensors.deserialize``) gives
for it, or be refused with one ``RamstreamError`` line naming the file, allocating at most
``BUDGET`` bytes. Hypothesis
draws the mutations (no example database; ``--seed`` repeats a run) and shrinks a failure to a
small one, which is printed with the exception.

    python tools/fuzz_readers.py --examples 20000            # the three fuzzers, 20 000 examples each
    python tools/fuzz_readers.py --examples 5000 --only bin-members --seed 7

Prints how the examples ended (read as saved, read as the reference reads them, refused by which
error) per fuzzer. Exits 1 on the first disallowed outcome. torch is needed for the ``.bin`` fuzzers.
"""

from __future__ import annotations

import argparse
import collections
import sys
import tempfile
import time
from collections.abc import Callable
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from hypothesis import HealthCheck, given, seed, settings  # noqa: E402
from hypothesis import strategies as st  # noqa: E402

from tests.reader_fuzz import (  # noqa: E402
    apply,
    apply_to_members,
    bin_seed,
    byte_edits,
    member_edits,
    outcome,
    safetensors_reference,
    safetensors_seed,
    torch_reference,
)

FUZZERS = ("bin-bytes", "bin-members", "safetensors-bytes")


def fuzzer(name: str, work: Path, counts: collections.Counter[str]) -> Callable[[], None]:
    """The hypothesis test for ``name``, counting outcomes in ``counts``."""
    if name == "safetensors-bytes":
        st_seed = safetensors_seed()

        @given(byte_edits(len(st_seed.data), st_seed.hot))
        def safetensors_bytes(edits: list[tuple[object, ...]]) -> None:
            path = work / st_seed.name
            path.write_bytes(apply(st_seed.data, edits))
            counts[outcome(path, st_seed, safetensors_reference)] += 1

        return safetensors_bytes
    import torch

    bin_file, reference = bin_seed(torch), torch_reference(torch)
    if name == "bin-bytes":

        @given(st.data())
        def bin_bytes(data: st.DataObject) -> None:
            path = work / bin_file.name
            path.write_bytes(apply(bin_file.data, data.draw(byte_edits(len(bin_file.data), bin_file.hot))))
            counts[outcome(path, bin_file, reference)] += 1

        return bin_bytes

    @given(member_edits())
    def bin_members(edits: list[tuple[object, ...]]) -> None:
        counts[outcome(apply_to_members(bin_file, edits, work / bin_file.name), bin_file, reference)] += 1

    return bin_members


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--examples", type=int, default=2000, help="examples per fuzzer [default: 2000]")
    parser.add_argument("--only", choices=FUZZERS, action="append", help="run only this fuzzer (repeatable)")
    parser.add_argument("--seed", type=int, default=None, help="hypothesis seed, to repeat a run")
    args = parser.parse_args()
    failed = False
    for name in args.only or FUZZERS:
        counts: collections.Counter[str] = collections.Counter()
        with tempfile.TemporaryDirectory() as work:
            test = fuzzer(name, Path(work), counts)
            configured = settings(
                max_examples=args.examples,
                deadline=None,
                database=None,
                suppress_health_check=list(HealthCheck),
            )(test)
            if args.seed is not None:
                configured = seed(args.seed)(configured)
            started = time.perf_counter()
            try:
                configured()
            except Exception as exc:  # the shrunk failure, with hypothesis's report above it
                notes = "\n".join(getattr(exc, "__notes__", []))
                print(f"{name}: FAILED: {type(exc).__name__}: {exc}\n{notes}", file=sys.stderr)
                failed = True
        took = time.perf_counter() - started
        print(f"{name}: {sum(counts.values())} examples in {took:.1f} s")
        for kind, n in counts.most_common():
            print(f"  {n:7d}  {kind}")
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
