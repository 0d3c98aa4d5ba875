"""Print pins of the lowest versions pyproject.toml declares for the direct dependencies.

``make test-lowest`` installs ramstream against these (``pip install -c``) and runs the fast
tests, so a floor in ``[project] dependencies`` is a version that was tested, not a guess.
"""

from __future__ import annotations

import re
import sys
from pathlib import Path

try:
    import tomllib
except ModuleNotFoundError:  # Python 3.10
    import tomli as tomllib  # type: ignore[no-redef]

FLOOR = re.compile(r"^\s*([A-Za-z0-9_.\-]+)\s*(?:\[[^\]]*\])?\s*>=\s*([0-9][^,;\s]*)")


def floors(pyproject: Path) -> list[str]:
    """``name==floor`` for every ``name>=floor`` of the runtime dependencies."""
    doc = tomllib.loads(pyproject.read_text())
    pins = []
    for requirement in doc["project"]["dependencies"]:
        match = FLOOR.match(requirement)
        if match is None:
            raise SystemExit(f"{pyproject}: dependency {requirement!r} has no '>=' floor to test")
        pins.append(f"{match.group(1)}=={match.group(2)}")
    return pins


if __name__ == "__main__":
    root = Path(sys.argv[1]) if len(sys.argv) > 1 else Path(__file__).resolve().parents[1]
    print("\n".join(floors(root / "pyproject.toml")))
