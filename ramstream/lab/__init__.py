"""The agents lab's shared core: digit tasks, the tiny model and its evaluator.

``ramstream.lab.tasks`` is plain numpy. ``model``, ``checkpoint`` and ``evaluate`` need torch
(the ``torch`` extra) and import it at module level, so import them only after
:func:`torch_available` says yes. The training commands live in ``tools/agents_lab``.
"""

from __future__ import annotations


def torch_available() -> bool:
    """Whether torch can be imported here (the demo prints accuracies only then)."""
    try:
        import torch  # noqa: F401
    except ImportError:
        return False
    return True
