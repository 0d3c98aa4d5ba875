"""ramstream: merge fine-tuned checkpoints of one base out of core (RAM / RAM+ and baselines)."""

__version__ = "0.1.0"
