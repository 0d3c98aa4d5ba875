"""The layout of a block's agreement sums (``Backend.agreement``): how the agents' updates relate.

Over the active elements (eps < |tau| < Inf, as the probe's masks; tau = f32(agent) - f32(base),
float32) of one block, for every pair i < j in ``agent_pairs`` order ((0, 1), (0, 2), ...,
(1, 2), ...), P pairs in all, and every agent t of N:

    counts[p] = (both, agree)      both: elements where i and j are active; agree: those of them
                                   where sign(tau_i) == sign(tau_j)
    sums[3 p + 0]  sum tau_i tau_j     over the elements active in both
    sums[3 p + 1]  sum tau_i tau_i     likewise
    sums[3 p + 2]  sum tau_j tau_j     likewise
    sums[3 P + 2 t + 0]  sum tau_t^2   over the elements active in t alone (unique)
    sums[3 P + 2 t + 1]  sum tau_t^2   over the elements active in t and >= 1 other agent (shared)

Every sum is exact, in ``backends.vector_sums``' format (DIGITS int64 digits, normalised): a
product of two float32 values fits it without rounding, so every backend, block cut, thread
count and executor gives the same digits, and partials add up without overflow.
"""

from __future__ import annotations


def agent_pairs(n_agents: int) -> list[tuple[int, int]]:
    """The pairs i < j, in the order of the counts and sums."""
    return [(i, j) for i in range(n_agents) for j in range(i + 1, n_agents)]


def sum_rows(n_agents: int) -> int:
    """Accumulators of a block: three per pair, two per agent."""
    return 3 * len(agent_pairs(n_agents)) + 2 * n_agents


def agent_row(n_agents: int, agent: int, shared: bool) -> int:
    """The accumulator of ``agent``'s sum of squares over its unique (or ``shared``) elements."""
    return 3 * len(agent_pairs(n_agents)) + 2 * agent + int(shared)
