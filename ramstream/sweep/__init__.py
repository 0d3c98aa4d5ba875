"""Sweeps: K candidate merges of one family from one read of its inputs (docs/sweep.md)."""
