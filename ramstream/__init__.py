"""ramstream: merge fine-tuned checkpoints of one base out of core (RAM / RAM+ and baselines)."""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from ramstream.version import __version__

__all__ = ["__version__", "open_index"]

if TYPE_CHECKING:
    from ramstream.inspect.view import open_index


def __getattr__(name: str) -> Any:
    # Imported on first use, so that ``import ramstream`` stays cheap.
    if name == "open_index":
        from ramstream.inspect.view import open_index

        return open_index
    raise AttributeError(f"module 'ramstream' has no attribute {name!r}")
