"""Merge methods: small frozen specs in one registry (see ``registry.py``)."""
