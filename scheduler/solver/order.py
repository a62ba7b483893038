"""The order a plan's members are committed in, so that each passes kube's check for one pod.

The model holds hard topology spread on the *final* counts; the commit re-checks members
one at a time (the framework, against the cache with the members before it assumed).
Every other rule holds in any order but one: capacity, pod slots and host ports are sums,
required anti-affinity is pairwise and an affinity group shares one labelled domain; a
*follower* (required affinity to other members, not to itself, nothing placed matching)
passes kube's filter only once one of its anchors is placed, so members go by class rank
(:attr:`~scheduler.solver.problem.GangProblem.rank`) first. Spread does
not: kube admits a pod while ``its domain's count + self - the global minimum <= maxSkew``
(PodTopologySpread's filter, the minimum taken before the pod), so committing
``[a1, a1, b1, b1]`` with maxSkew 1 stops at the second member, while
``[a1, b1, a1, b1]`` passes every step.

:func:`commit_order` lays the members out step by step: among the cells (class, node) with
members left, one that passes the filter for every constraint its class owns, the one
whose domains are least above their minimum first (water-filling), ties to the earliest
member. For one constraint this always finishes: a domain is filled while it is the lowest
with members left, so its count before the step is the minimum or the step stays within
its final skew. Several constraints or classes could still corner it; then the rest
follows in member order and the commit's own per-member fallback takes over, as before.
"""

from __future__ import annotations

import numpy as np

from scheduler.core.snapshot import IntArray
from scheduler.solver.problem import GangProblem, class_ranks


def commit_order(problem: GangProblem, counts: IntArray) -> tuple[tuple[int, int], ...]:
    """(member index, local node) for every member ``counts`` places, in commit order.

    A class's members take its nodes best score first; without spread, member order."""
    p = problem
    cells: list[tuple[int, int]] = []
    for c in range(p.num_classes):
        nodes = np.flatnonzero(counts[c] > 0)
        nodes = nodes[np.lexsort((nodes, -p.score[c, nodes]))]
        cells.extend((c, int(n)) for n in nodes.tolist())
    members = [list(k.members[: int(counts[c].sum())]) for c, k in enumerate(p.classes)]
    rank = class_ranks(p)

    def ranked(steps: list[tuple[int, int]]) -> list[tuple[int, int]]:
        """Anchors before the followers that need them, else member order."""
        return sorted(steps, key=lambda step: (int(rank[p.member_class[step[0]]]), step))

    if not p.spreads:
        out: list[tuple[int, int]] = []
        for c, n in cells:
            out.extend((members[c].pop(0), n) for _ in range(int(counts[c, n])))
        return tuple(ranked(out))

    cls = np.array([c for c, _ in cells], dtype=np.int64)
    node = np.array([n for _, n in cells], dtype=np.int64)
    left = counts[cls, node].astype(np.int64)
    current = [s.existing.copy() for s in p.spreads]
    # Per constraint and cell: its domain, whether the constraint is the cell's class's own,
    # whether a member placed there counts, and kube's self-match (the owner matches itself).
    domain = [s.domain[node] for s in p.spreads]
    owns = [cls == s.cls for s in p.spreads]
    counts_here = [
        np.isin(cls, s.matched) & s.counted[node] & (s.domain[node] >= 0) for s in p.spreads
    ]
    self_match = [int(s.cls in s.matched) for s in p.spreads]
    taken = [0] * p.num_classes
    upcoming = np.array([m[0] if m else 0 for m in members], dtype=np.int64)
    """Per class, its next member's index (ties go to the earliest member)."""
    out = []
    followers = [(g.follower, list(g.anchors)) for g in p.together if g.follower is not None]
    while left.any():
        ok = left > 0
        for follower, anchors in followers:
            if not any(taken[a] for a in anchors):
                ok &= cls != follower  # an anchor goes first
        above = np.full(len(cells), -1, dtype=np.int64)
        for s, spread in enumerate(p.spreads):
            final = current[s]
            if spread.min_zero or not spread.eligible.any():
                low = 0
            else:
                low = int(final[spread.eligible].min())
            d = domain[s]
            here = np.where(d >= 0, final[np.maximum(d, 0)], 0)
            skew = here + self_match[s] - low
            ok &= ~owns[s] | (d < 0) | (skew <= spread.max_skew)
            above = np.maximum(above, np.where(counts_here[s], here - low, -1))
        if not ok.any():
            break  # cornered: the rest in member order (the commit falls back per member)
        first = upcoming[cls]
        candidates = np.flatnonzero(ok)
        pick = int(candidates[np.lexsort((first[candidates], above[candidates]))[0]])
        c, n = cells[pick]
        out.append((members[c][taken[c]], n))
        taken[c] += 1
        upcoming[c] = members[c][taken[c]] if taken[c] < len(members[c]) else 0
        left[pick] -= 1
        for s in range(len(p.spreads)):
            if counts_here[s][pick]:
                current[s][domain[s][pick]] += 1
    if left.any():
        rest: list[tuple[int, int]] = []
        for i, (c, n) in enumerate(cells):
            for _ in range(int(left[i])):
                rest.append((members[c][taken[c]], n))
                taken[c] += 1
        out.extend(ranked(rest))
    return tuple(out)


__all__ = ["commit_order"]
