"""Answers from the index alone: per-agent, per-layer, per-module and per-tensor sparsity and
overlap, plots, and the status of the passes. The checkpoints are never read.

In the order of the architecture:

- ``grouping``: a tensor's layer, module (role) and kind, parsed from its name;
- ``tables``: ``Table``, integer counts per row and agent, with every ratio derived from them;
- ``masks``: a tensor's masks, unpacked or downsampled to an image, one block at a time;
- ``view``: ``IndexView`` (``open_index``), the typed, notebook-facing view of an index;
- ``document``, ``text``: the JSON document of ``inspect --json`` and its text rendering;
- ``plots``: matplotlib figures (optional extra ``plot``);
- ``status``: how far the probe and merge passes have got, with an ETA.
"""

from __future__ import annotations

from ramstream.inspect.tables import Table
from ramstream.inspect.view import IndexView, open_index

__all__ = ["IndexView", "Table", "open_index"]
