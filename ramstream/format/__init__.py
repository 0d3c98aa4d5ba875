"""Formats: the safetensors header, checkpoint discovery, fingerprints. No bulk data access."""
