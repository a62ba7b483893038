"""Greedy placement: members in arrival order (followers after their anchors), each to its
best node that still has room.

This is what placing the members one by one would do (kube-scheduler's view of a gang):
the node ranking is the framework's (not passed over by a preference first, then the
weighted total, ties broken by a seeded permutation), and "room" is every rule of the model
given the members placed before: capacity, pod slots, Topology limits, host ports,
anti-affinity, affinity groups, spread and the one-domain key. Each member costs a few numpy
operations over its class's candidate nodes, so greedy stays cheap at thousands of nodes.

It seeds the solver (a complete hint, valid by construction) and is the fallback when the
time limit passes. It places as many members as it can; the gang fits when that reaches
``need``. A greedy miss does not prove anything: members that arrive early can take the
room later ones needed (see the tests' 4/2/2 GPU case).
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from scheduler.core.snapshot import BoolArray, IndexArray, IntArray
from scheduler.solver.problem import GangProblem, class_ranks


@dataclass(frozen=True, slots=True, eq=False)
class GreedyResult:
    counts: IntArray
    """(classes, local nodes) members placed."""
    assignment: tuple[int | None, ...]
    """Local node per member, None when it found no room."""
    order: tuple[int, ...] = ()
    """Members placed, in the order greedy placed them (a valid commit order)."""

    @property
    def placed(self) -> int:
        return int(self.counts.sum())


def _lookup(values: IntArray, domain: IntArray) -> IntArray:
    """``values[domain]`` with 0 where the domain is -1 (label absent)."""
    padded = np.concatenate([values, np.zeros(1, dtype=values.dtype)])
    out: IntArray = padded[domain]  # -1 reads the trailing 0
    return out


def _size(domain: IntArray) -> int:
    return int(domain.max(initial=-1)) + 1


def greedy(
    problem: GangProblem,
    nodes: IndexArray | None = None,
    *,
    seed: int = 0,
    node_rank: IntArray | None = None,
) -> GreedyResult:
    """Place members in arrival order on ``nodes`` (local indices; all when None).
    ``node_rank`` (per local node, lower first) ranks nodes before everything else: the
    network domains :func:`~scheduler.solver.domains.domain_rank` chose, in fill order."""
    p = problem
    num_c, k = p.num_classes, p.num_nodes
    counts = np.zeros((num_c, k), dtype=np.int64)
    assignment: list[int | None] = [None] * len(p.members)
    if num_c == 0 or k == 0:
        return GreedyResult(counts, tuple(assignment))
    allowed = np.zeros(k, dtype=np.bool_)
    allowed[np.arange(k) if nodes is None else nodes] = True
    rank = np.empty(k, dtype=np.int64)
    rank[np.random.default_rng(seed).permutation(k)] = np.arange(k)
    order: list[IndexArray] = []
    for c in range(num_c):
        cand = np.flatnonzero((p.limit[c] > 0) & allowed)
        # Equal scores: the node in the fullest domains below the tight level first, then
        # the one with the fewest free GPUs (best fit, less fragmentation), then the seeded
        # permutation.
        fit = p.gpu_free[cand] if p.gpus[c] > 0 else np.zeros(len(cand), dtype=np.int64)
        pack = p.pack[c, cand] if p.pack.size else np.zeros(len(cand), dtype=np.int64)
        keys: list[IntArray] = [
            rank[cand],
            fit,
            -pack,
            -p.score[c, cand],
            -p.preferred[c, cand].astype(np.int64),
        ]
        if node_rank is not None:
            keys.append(node_rank[cand])
        order.append(cand[np.lexsort(keys)])

    free = p.free.copy()
    pods = p.free_pods.copy()
    anti_mine = [np.zeros(_size(r.domain), dtype=np.int64) for r in p.anti]
    anti_others = [np.zeros(_size(r.domain), dtype=np.int64) for r in p.anti]
    chosen = [-1] * len(p.together)
    spread_final = [s.existing.copy() for s in p.spreads]
    spread_cls = [np.zeros(len(s.existing), dtype=np.int64) for s in p.spreads]
    device_user = np.full(k, -1, dtype=np.int64)
    gang_domain = -1
    # Slices: one open slice at a time, its domain fixed by its first member; slices
    # bound members left short are completed first.
    slicing = p.slicing.domain if p.slicing is not None and p.slice_size > 0 else None
    size = p.slice_size
    short = [(d, int(n)) for d, n in enumerate(p.slice_short.tolist()) if n > 0]
    slice_domain, slice_left = short.pop(0) if slicing is not None and short else (-1, 0)
    slice_members: list[int] = []
    active = [c.topology_active for c in p.classes]
    ports = [bool(p.port_conflicts[c].any()) for c in range(num_c)]

    # Anchors before the followers that need them (rank), else arrival order.
    rank = class_ranks(p)
    sequence = sorted(range(len(p.member_class)), key=lambda m: (int(rank[p.member_class[m]]), m))
    placed_order: list[int] = []
    for i in sequence:
        c = p.member_class[i]
        cand = order[c]
        if not len(cand):
            continue
        ok: BoolArray = counts[c, cand] < p.limit[c, cand]
        for j in np.flatnonzero(p.request[c] > 0):
            ok &= free[j, cand] >= p.request[c, j]
        ok &= pods[cand] >= 1
        if ports[c]:
            ok &= (p.port_conflicts[c].astype(np.int64) @ counts[:, cand]) == 0
        for r, rule in enumerate(p.anti):
            d = rule.domain[cand]
            if rule.cls == c:
                blocked = _lookup(anti_others[r], d) > 0
                if c in rule.matched:
                    blocked |= _lookup(anti_mine[r], d) > 0
                ok &= ~blocked
            elif c in rule.matched:
                ok &= _lookup(anti_mine[r], d) == 0
        for g, group in enumerate(p.together):
            if c in group.classes:
                d = group.domain[cand]
                ok &= (d >= 0) & ((chosen[g] < 0) | (d == chosen[g]))
            if group.follower == c and not counts[list(group.anchors)].any():
                ok &= False  # no anchor placed: kube's filter would reject it everywhere
        for s, spread in enumerate(p.spreads):
            matched = c in spread.matched
            if spread.cls != c and not matched:
                continue
            d = spread.domain[cand]
            known = d >= 0
            final = spread_final[s]
            inc = (spread.counted[cand] & matched).astype(np.int64)
            new = _lookup(final, d) + inc
            if spread.min_zero or not spread.eligible.any():
                low_after: IntArray | int = 0
            else:
                low = int(final[spread.eligible].min())
                unique_low = int((final[spread.eligible] == low).sum()) == 1
                eligible = _lookup(spread.eligible.astype(np.int64), d) > 0
                at_low = eligible & (_lookup(final, d) == low) & known
                low_after = low + (inc * (at_low & unique_low)).astype(np.int64)
            present = (_lookup(spread_cls[s], d) > 0) | (spread.cls == c)
            ok &= ~known | ~present | (new - low_after <= spread.max_skew)
        if active[c]:
            dev = device_user[cand]
            ok &= ~p.device_exclusive[cand] | (dev < 0) | (dev == c)
        if p.topology_key is not None:
            d = p.domain[cand]
            ok &= (d >= 0) & ((gang_domain < 0) | (d == gang_domain))
        if slicing is not None:
            d = slicing[cand]
            if slice_left:
                ok &= d == slice_domain
            else:  # a new slice: only in a domain with room for all of it
                room = _room(p, c, cand, free, pods, counts)
                per = np.bincount(np.maximum(d, 0), weights=room * (d >= 0))
                ok &= (d >= 0) & (per[np.maximum(d, 0)] >= size)
        hits = np.flatnonzero(ok)
        if not len(hits):
            continue
        n = int(cand[hits[0]])
        assignment[i] = n
        placed_order.append(i)
        counts[c, n] += 1
        free[:, n] -= p.request[c]
        pods[n] -= 1
        for r, rule in enumerate(p.anti):
            d0 = int(rule.domain[n])
            if d0 < 0:
                continue
            if rule.cls == c:
                anti_mine[r][d0] += 1
            elif c in rule.matched:
                anti_others[r][d0] += 1
        for g, group in enumerate(p.together):
            if c in group.classes:
                chosen[g] = int(group.domain[n])
        for s, spread in enumerate(p.spreads):
            d0 = int(spread.domain[n])
            if d0 < 0:
                continue
            if c in spread.matched and spread.counted[n]:
                spread_final[s][d0] += 1
            if spread.cls == c:
                spread_cls[s][d0] += 1
        if active[c] and p.device_exclusive[n]:
            device_user[n] = c
        if p.topology_key is not None:
            gang_domain = int(p.domain[n])
        if slicing is not None:
            if not slice_left:
                slice_domain, slice_left = int(slicing[n]), size
                slice_members = []
            slice_members.append(i)
            slice_left -= 1
            if not slice_left and short:
                slice_domain, slice_left = short.pop(0)
                slice_members = []
    if slicing is not None and slice_left:
        # The open slice stays short: its members go (they are the last ones placed, so
        # what is left is a state greedy passed through, valid as it was).
        for i in slice_members:
            at = assignment[i]
            assert at is not None
            counts[p.member_class[i], at] -= 1
            assignment[i] = None
        placed_order = placed_order[: len(placed_order) - len(slice_members)]
    return GreedyResult(counts, tuple(assignment), tuple(placed_order))


def _room(
    p: GangProblem, c: int, cand: IndexArray, free: IntArray, pods: IntArray, counts: IntArray
) -> IntArray:
    """Members of class ``c`` each candidate node still holds on its own."""
    room = np.minimum(pods[cand], p.limit[c, cand] - counts[c, cand])
    for j in np.flatnonzero(p.request[c] > 0).tolist():
        room = np.minimum(room, free[j, cand] // int(p.request[c, j]))
    out: IntArray = np.maximum(room, 0)
    return out
