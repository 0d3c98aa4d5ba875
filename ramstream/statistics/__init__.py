"""Statistics that methods need from a pass over the blocks, persisted in the index.

A statistic is computed per block (a partial), stored as one chunk of ``stats/<key>``, and
combined by the method that asked for it (partials are integers or exact sums, so any split
gives the same totals). Methods ask for statistics through a ``StatsContext``, in as many
stages as they need (TIES: a coarse histogram, then a refinement that depends on it).
"""
