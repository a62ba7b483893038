"""Greedy's choice of network domains for a gang with a preferred topology level.

Theory of operation
-------------------
CP-SAT weighs domains through the objective (:mod:`scheduler.solver.check`); greedy, its
seed and its fallback, chooses them up front, as Kueue's and KAI's topology placement do:

1. Capacity per domain of the preferred level: the members its nodes hold, each node on
   its own (:attr:`~scheduler.solver.problem.GangProblem.capacity`). An estimate: members
   of several classes may share a node's room.
2. The fewest domains whose capacities reach the target (the members greedy places
   anywhere): largest first, as for any covering by sums.
3. Compact at the wider levels, widest first: when one domain of the wider level holds
   that many preferred domains that reach the target, the search goes inside the fullest
   such domain (its capacity the smallest), and so on down the chain.
4. Tightest fit (BestFit): the domains are taken smallest capacity first, each the smallest
   that still lets the rest reach the target with the count fixed, so whole domains stay
   free for the next big gang.

The answer is a rank per node (chosen domains in order, every other node after them):
greedy fills the nodes in that order, falling back to the others only when the estimate
was too high.
"""

from __future__ import annotations

from collections.abc import Mapping

import numpy as np

from scheduler.core.snapshot import IndexArray, IntArray
from scheduler.solver.problem import GangProblem


def fewest(caps: Mapping[int, int], target: int) -> int | None:
    """The fewest domains whose capacities reach ``target`` (None: all of them do not)."""
    total = count = 0
    for cap in sorted(caps.values(), reverse=True):
        if total >= target:
            break
        total += cap
        count += 1
    return count if total >= target else None


def tightest(caps: Mapping[int, int], target: int) -> list[int]:
    """``fewest`` domains reaching ``target``, each the smallest that still lets the rest
    reach it (BestFit); every domain, largest first, when none reach it."""
    count = fewest(caps, target)
    if count is None:
        return sorted(caps, key=lambda d: (-caps[d], d))
    remaining = sorted(caps, key=lambda d: (caps[d], d))
    chosen: list[int] = []
    left = target
    for i in range(count):
        after = count - i - 1
        largest = sorted((caps[d] for d in remaining), reverse=True)
        for d in remaining:
            # The ``after`` largest of the others (one copy of d's value taken out when it
            # is among the top ``after``).
            if after and caps[d] >= largest[after - 1]:
                others = sum(largest[: after + 1]) - caps[d]
            else:
                others = sum(largest[:after])
            if caps[d] + others >= left:
                chosen.append(d)
                remaining.remove(d)
                left -= caps[d]
                break
    return chosen


def domain_rank(problem: GangProblem, nodes: IndexArray, target: int) -> IntArray | None:
    """Per local node, the order greedy fills it in (see the module docstring); None when
    the gang has no preferred level or nothing to place."""
    p = problem
    if not p.compact or target <= 0 or not len(nodes):
        return None
    level = p.compact[-1].domain
    pool = nodes
    for wider in p.compact[:-1]:
        caps = _caps(level, p.capacity, pool)
        count = fewest(caps, target)
        if count is None:
            break
        inside: dict[int, int] = {}
        for w in np.unique(wider.domain[pool]).tolist():
            part = pool[wider.domain[pool] == w]
            part_caps = _caps(level, p.capacity, part)
            if fewest(part_caps, target) == count:
                inside[int(w)] = sum(part_caps.values())
        if not inside:
            break  # no single wider domain holds the fewest: CP-SAT weighs the rest
        home = min(inside, key=lambda w: (inside[w], w))
        pool = pool[wider.domain[pool] == home]
    chosen = tightest(_caps(level, p.capacity, pool), target)
    rank = np.full(p.num_nodes, len(chosen), dtype=np.int64)
    for i, d in enumerate(chosen):
        rank[pool[level[pool] == d]] = i
    # A partial gang's rest fills its bound members' domains first (they are spanned
    # already, as CP-SAT's tiers count them).
    bound = p.spanned[-1] if len(p.spanned) == len(p.compact) else ()
    rank[np.isin(level, np.asarray(bound, dtype=np.int64))] = -1
    return rank


def _caps(level: IntArray, capacity: IntArray, nodes: IndexArray) -> dict[int, int]:
    """Members each domain of ``level`` among ``nodes`` holds (an estimate; not capped at
    the gang's size, so that of two domains that hold it the fuller one stays known)."""
    per = np.bincount(level[nodes], weights=capacity[nodes], minlength=0)
    return {int(d): int(per[d]) for d in np.unique(level[nodes]).tolist() if per[d] > 0}


__all__ = ["domain_rank", "fewest", "tightest"]
