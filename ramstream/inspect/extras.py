"""Optional dependencies (matplotlib, pandas): imported on use, with a one-line error if absent."""

from __future__ import annotations

import importlib
from types import ModuleType

from ramstream.errors import MissingDependencyError


def require(module: str, extra: str) -> ModuleType:
    """Import ``module`` or say which extra of ramstream installs it."""
    try:
        return importlib.import_module(module)
    except ImportError:
        top = module.split(".")[0]
        raise MissingDependencyError(
            f"this needs {top}, which is not installed: pip install 'ramstream[{extra}]' (or pip install {top})"
        ) from None
