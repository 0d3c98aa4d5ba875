"""The agents lab: tiny RL agents trained here, the demo's built-in data, and the quality table.

Commands (``python -m tools.agents_lab --help``): ``pretrain``, ``train``, ``evaluate``,
``rebuild`` (base + the three shipped agents) and ``table`` (every method over several RL seeds,
written into docs/agents_lab.md). Needs torch (``pip install torch``). See docs/agents_lab.md.
"""
