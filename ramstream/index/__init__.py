"""The persisted index (Zarr v3): masks, statistics, fingerprints and pass progress.

The format is specified in ``docs/index-format.md``; ``SCHEMA_VERSION`` is bumped on any change.
"""
