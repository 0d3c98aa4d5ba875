"""Statistics: what methods need from passes over the blocks, persisted in the index.

- ``overlap``: RAM's overlap counts (the probe pass, ``probe_pass``, computes them with the
  masks) and their roll-ups per tensor and model;
- ``exact_sums``, ``magnitude``: method statistics (exact sums, |tau| histograms), computed by
  ``stats_pass`` for the blocks that lack them;
- ``context``: what a method sees while it prepares (statistics on demand).

A statistic is computed per block (a partial), stored as one chunk of ``stats/<key>``, and
combined by the method that asked for it (partials are integers or exact sums, so any split
gives the same totals). Methods ask for statistics through a ``StatsContext``, in as many
stages as they need (TIES: a coarse histogram, then a refinement that depends on it).
"""
