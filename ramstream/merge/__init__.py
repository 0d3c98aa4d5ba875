"""The merge pass: what to compute and persist per block, run on an executor."""
