"""Which elements of each task vector survive: the keep modes of the kernels that take one
(``gta.gta_merge_block``, ``exact_stats.abs_sums_block``), and what to pass for the arrays a mode
does not read (so every mode shares one compiled signature).

- ``KEEP_ALL``: every element;
- ``KEEP_ARRAY``: element i of agent t survives where ``keep[t, i] != 0`` (a magnitude rank's
  mask, DELLA's draws; ``gta_merge_block`` also takes float32 multipliers);
- ``KEEP_RANDOM``: DARE's draw, element i of agent t survives where
  ``counter_rng.uniform(keys[t], start + i) < density[t]``;
- ``KEEP_CUTS``: magnitude trimming's two cuts per agent, decided from |tau| in the merge tile
  (``gta_merge_block`` only; ``cut_value`` / ``cut_range``).
"""

from __future__ import annotations

import numpy as np

KEEP_ALL = 0
KEEP_ARRAY = 1
KEEP_RANDOM = 2
KEEP_CUTS = 3

NO_KEEP = np.empty((0, 0), np.uint8)
NO_KEYS = np.empty(0, np.uint64)
NO_DENSITY = np.empty(0, np.float32)
NO_CUT_VALUE = np.empty((0, 2), np.uint32)
NO_CUT_RANGE = np.empty((0, 2, 2), np.int64)
