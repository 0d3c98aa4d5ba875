"""Bulk I/O: memory-mapped block views with page release, the output writer, atomic files."""
