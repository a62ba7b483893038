"""One gang, one plan: greedy per sub-model, CP-SAT within the time limit, the best wins.

Theory of operation
-------------------
A problem splits into sub-models: one per domain of ``GangSpec.topology_key`` (all members
must share one; nodes without the label are already out), else one over every node. Each
has a cheap upper bound (every member on its best nodes, every GPU node at its best use).
Sub-models are taken best bound first. One whose bound cannot beat the best answer so far
is skipped, which is also a proof that it holds nothing better; otherwise greedy runs
(valid by construction; when it meets the bound it is proven optimal) and then CP-SAT,
seeded with greedy's answer, with an equal share of the time left (at least
:data:`MIN_SHARE_S`, never past the deadline). Once time is out and an admitted answer
exists, the remaining sub-models are left unsearched.

The model places members in part (``need`` is not a constraint): the objective counts placed
members first, so its optimum says both *whether* the gang fits and *how many* members fit
at best, and a CP-SAT bound below ``need`` members proves the gang does not fit even when
the search runs out of time.

Statuses (the values are Prometheus labels):

========================  ============================================================
``optimal``               admitted; every sub-model solved or pruned: nothing better
``feasible``              admitted with a solver answer better than greedy's, unproven
``timeout_greedy``        admitted with greedy's answer: the solver found nothing better
``infeasible``            proven: no placement of ``need`` members (or minResources)
``timeout_rejected``      greedy fell short and the solver found nothing in time
``greedy``                admitted by greedy alone (``use_solver=False``)
``greedy_rejected``       greedy alone fell short (``use_solver=False``); nothing proven
``invalid_greedy``        admitted with greedy's answer: the solver's broke a rule
``invalid``               the best answer broke a rule and no valid one admits: retried
========================  ============================================================

Every answer that would be committed is held to
:func:`~scheduler.solver.check.violations` first (cheap: numpy over the final counts). A
solver answer that breaks a rule is a bug in the model; it is replaced by greedy's best
when that admits and is valid, and :attr:`GangPlan.rejected` says what it broke, so the
caller can log and count it.

Extra members: when more members fit than ``need``, they are placed too (the top tier of
the objective is the placed count), so a gang whose every pending member fits starts whole.

``solve`` reads only the :class:`~scheduler.solver.problem.GangProblem`, never the
snapshot or pods, so it can run in a worker thread.
"""

from __future__ import annotations

import time
from collections import Counter
from dataclasses import dataclass, replace
from enum import StrEnum
from typing import Final

import numpy as np

from scheduler.core.snapshot import IndexArray, IntArray
from scheduler.solver.check import (
    objective,
    slice_assignment_violations,
    spans,
    violations,
    whole_nodes,
)
from scheduler.solver.domains import domain_rank
from scheduler.solver.greedy import GreedyResult, greedy
from scheduler.solver.model import ModelStatus, solve_counts
from scheduler.solver.order import commit_order
from scheduler.solver.problem import GangProblem, MemberReport
from scheduler.solver.slices import assign_slices


class SolveStatus(StrEnum):
    OPTIMAL = "optimal"
    FEASIBLE = "feasible"
    INFEASIBLE = "infeasible"
    TIMEOUT_GREEDY = "timeout_greedy"
    TIMEOUT_REJECTED = "timeout_rejected"
    GREEDY = "greedy"
    GREEDY_REJECTED = "greedy_rejected"
    INVALID_GREEDY = "invalid_greedy"
    INVALID = "invalid"


MIN_SHARE_S: Final = 0.05
"""Least time a sub-model gets while time is left: CP-SAT needs some to presolve."""

ADMITTED: Final = frozenset(
    {
        SolveStatus.OPTIMAL,
        SolveStatus.FEASIBLE,
        SolveStatus.TIMEOUT_GREEDY,
        SolveStatus.GREEDY,
        SolveStatus.INVALID_GREEDY,
    }
)


@dataclass(frozen=True, slots=True)
class GangPlan:
    status: SolveStatus
    placements: tuple[tuple[int, str], ...]
    """(member index, node name); empty unless admitted. In commit order: each member
    passes kube's one-pod checks once those before it are placed (spread needs it)."""
    admitted: bool
    message: str
    solve_time_s: float
    members: tuple[MemberReport, ...]
    need: int = 0
    placed: int = 0
    """Members placed (``>= need`` when admitted; the best found otherwise)."""
    objective: int | None = None
    score: int = 0
    """Sum of the placed members' framework totals."""
    partial_gpu_nodes: int = 0
    """Nodes the plan leaves partially free of GPUs (among those the gang could use)."""
    variables: int = 0
    constraints: int = 0
    classes: int = 0
    greedy_placed: int = 0
    """Most members greedy placed in one sub-model."""
    domain: str | None = None
    """The ``topology_key`` value chosen."""
    build_time_s: float = 0.0
    slices: tuple[tuple[int, int], ...] = ()
    """(member index, slice) per placement of a gang with slices (empty otherwise): the
    commit writes it as the member's ``lattice.dev/topology-slice`` binding annotation."""
    rejected: tuple[str, ...] = ()
    """Rules the best answer broke (:func:`~scheduler.solver.check.violations`): it was
    replaced by greedy's (``invalid_greedy``) or nothing is admitted (``invalid``)."""


@dataclass(slots=True, eq=False)
class _Sub:
    domain: int | None
    nodes: IndexArray
    max_placed: int
    max_objective: int
    no_fit: bool
    """Proven: this sub-model cannot hold ``need`` members."""
    greedy: GreedyResult | None = None
    """Run when the sub-model is first considered (pruned ones never are)."""
    resolved: bool = False
    """Proven: this sub-model holds nothing better than the best answer."""


@dataclass(slots=True, eq=False)
class _Best:
    value: int
    counts: IntArray
    sub: _Sub
    assignment: tuple[int | None, ...] | None
    """Greedy's own nodes when the answer is greedy's."""
    order: tuple[int, ...] = ()
    """Greedy's placement order (anchors before followers), with :attr:`assignment`."""

    @property
    def placed(self) -> int:
        return int(self.counts.sum())


def solve(
    problem: GangProblem,
    *,
    time_limit_s: float = 1.0,
    seed: int = 0,
    use_solver: bool = True,
    workers: int = 2,
) -> GangPlan:
    """Plan the gang: see the module docstring for statuses and what ``need`` means."""
    started = time.perf_counter()
    p = problem
    if p.rejection is not None:
        message = f"gang {p.gang}: 0/{p.need} members fit: {p.rejection}"
        return _plan(p, SolveStatus.INFEASIBLE, message, started)
    subs = _subs(p)
    if not subs:
        message = f"gang {p.gang}: 0/{p.need} members fit: {_why(p, [], None, proven=True)}"
        nothing = np.zeros((p.num_classes, p.num_nodes), dtype=np.int64)
        return _plan(p, SolveStatus.INFEASIBLE, message, started, objective=objective(p, nothing))
    # Most promising first: good answers early let the bound skip the rest.
    subs.sort(key=lambda s: (-s.max_objective, s.domain or 0))
    best: _Best | None = None
    best_greedy: _Best | None = None
    greedy_best = -1
    variables = constraints = 0
    deadline = started + time_limit_s
    for index, s in enumerate(subs):
        if best is not None and s.max_objective <= best.value:
            s.resolved = True  # cannot beat the best answer: nothing to search here
            continue
        out_of_time = time.perf_counter() >= deadline
        if out_of_time and best is not None and best.placed >= p.need:
            break  # keep the admitted answer; the rest stays unresolved
        s.greedy = _greedy(p, s.nodes, seed)
        value = objective(p, s.greedy.counts)
        greedy_best = max(greedy_best, value)
        if best_greedy is None or value > best_greedy.value:
            best_greedy = _Best(value, s.greedy.counts, s, s.greedy.assignment, s.greedy.order)
        if best is None or value > best.value:
            best = best_greedy
        if value >= s.max_objective:
            s.resolved = True  # greedy met the bound
            continue
        if not use_solver:
            continue
        left = deadline - time.perf_counter()
        if left <= 0:
            continue
        share = max(left / (len(subs) - index), min(left, MIN_SHARE_S))
        outcome = solve_counts(
            p,
            s.nodes,
            s.greedy.counts,
            time_limit_s=share,
            seed=seed,
            workers=workers,
            deadline=deadline,
        )
        variables += outcome.variables
        constraints += outcome.constraints
        found, solved = outcome.counts, outcome.objective
        if found is not None and solved is not None and solved > best.value:
            best = _Best(solved, found, s, None)
        bounded = outcome.bound is not None and outcome.bound <= best.value
        if outcome.status is ModelStatus.OPTIMAL or bounded:
            s.resolved = True
        if outcome.bound is not None and outcome.bound < p.need * p.weights.placed:
            s.no_fit = True
    assert best is not None
    rejected: tuple[str, ...] = ()
    valid = True
    if best.placed >= p.need and (broken := violations(p, best.counts)):
        rejected, valid = tuple(broken), False
        fallback = best_greedy if best_greedy is not best else None
        if (
            fallback is not None
            and fallback.placed >= p.need
            and not violations(p, fallback.counts)
        ):
            best, valid = fallback, True
    placed = best.placed
    admitted = placed >= p.need and valid
    slices: dict[int, int] = {}
    if admitted and p.slicing is not None:
        slices, broken = _slices(p, best)
        if broken:  # the counts passed, the split did not: a bug, refused the same way
            rejected, admitted = tuple(broken), False
    if rejected:
        status = SolveStatus.INVALID_GREEDY if admitted else SolveStatus.INVALID
    elif admitted:
        if not use_solver:
            status = SolveStatus.GREEDY
        elif all(s.resolved for s in subs):
            status = SolveStatus.OPTIMAL
        elif best.value > greedy_best:
            status = SolveStatus.FEASIBLE
        else:
            status = SolveStatus.TIMEOUT_GREEDY
    elif all(s.no_fit or s.resolved for s in subs):
        # Resolved without admitting: its best is at most ours, below ``need`` members.
        status = SolveStatus.INFEASIBLE
    else:
        status = SolveStatus.TIMEOUT_REJECTED if use_solver else SolveStatus.GREEDY_REJECTED
    greedy_placed = max((s.greedy.placed for s in subs if s.greedy is not None), default=0)
    domain = _domain_name(p, best.sub.domain)
    if admitted:
        placements = _placements(p, best)
        used = len({n for _, n in placements})
        where = f" in {p.topology_key}={domain}" if domain is not None else ""
        where += _spans_text(p, best.counts)
        if slices:
            count = len(set(slices.values()))
            where += f", {count} slice{'s' if count != 1 else ''} of {p.slice_size}"
            where += f" each in one {p.slicing.key}" if p.slicing is not None else ""
        message = (
            f"gang {p.gang}: {placed}/{len(p.members)} members placed (need {p.need}) "
            f"on {used} node{'s' if used != 1 else ''}{where} [{status.value}]"
        )
    else:
        placements = ()
        if status is SolveStatus.INVALID:
            head = f"no valid plan: the best one broke a rule ({rejected[0]}); retrying"
        elif status is SolveStatus.INFEASIBLE:
            head = f"{placed}/{p.need} members fit"
        elif status is SolveStatus.TIMEOUT_REJECTED:
            head = (
                f"no placement of {p.need} members found within {time_limit_s:g}s "
                f"(greedy placed {greedy_placed}/{p.need}, best {placed})"
            )
        else:
            head = f"greedy placed {greedy_placed}/{p.need} members"
        why = "" if rejected else _why(p, subs, best, proven=status is SolveStatus.INFEASIBLE)
        message = f"gang {p.gang}: {head}" + (f": {why}" if why else "")
    return _plan(
        p,
        status,
        message,
        started,
        placements=placements,
        counts=best.counts if admitted else None,
        placed=placed,
        objective=best.value,
        variables=variables,
        constraints=constraints,
        greedy_placed=greedy_placed,
        domain=domain if admitted else None,
        rejected=rejected,
        slices=tuple(sorted(slices.items())),
    )


def _slices(p: GangProblem, best: _Best) -> tuple[dict[int, int], list[str]]:
    """The members' slices, and what the split breaks (nothing, when the counts passed)."""
    index = {name: n for n, name in enumerate(p.node_names)}
    pairs = [(i, index[name]) for i, name in _placements(p, best)]
    try:
        slices = assign_slices(p, pairs)
    except ValueError as exc:
        return {}, [str(exc)]
    return slices, slice_assignment_violations(p, pairs, slices)


def _greedy(p: GangProblem, nodes: IndexArray, seed: int) -> GreedyResult:
    """Greedy on the sub-model's nodes; with a preferred level also filling the domains
    :func:`~scheduler.solver.domains.domain_rank` chose first, the better of the two."""
    plain = greedy(p, nodes, seed=seed)
    rank = domain_rank(p, nodes, plain.placed)
    if rank is None:
        return plain
    ranked = greedy(p, nodes, seed=seed, node_rank=rank)
    return ranked if objective(p, ranked.counts) >= objective(p, plain.counts) else plain


def _subs(p: GangProblem) -> list[_Sub]:
    usable = (p.limit > 0).any(axis=0)
    if p.topology_key is None:
        groups: list[tuple[int | None, IndexArray]] = (
            [(None, np.flatnonzero(usable))] if usable.any() else []
        )
    else:
        ids = np.unique(p.domain[usable & (p.domain >= 0)])
        groups = [(int(d), np.flatnonzero(usable & (p.domain == d))) for d in ids.tolist()]
    out = []
    for domain, nodes in groups:
        max_placed, max_value = _upper_bound(p, nodes)
        out.append(_Sub(domain, nodes, max_placed, max_value, max_placed < p.need))
    return out


def _upper_bound(p: GangProblem, nodes: IndexArray) -> tuple[int, int]:
    """Members a sub-model could hold at most, and an objective no placement there beats:
    every member at its best nodes (limits counted), every GPU node there at its best use,
    the others untouched."""
    w = p.weights
    placed = score = pack = 0
    for c, klass in enumerate(p.classes):
        limits = np.minimum(p.limit[c, nodes], klass.size)
        usable = limits > 0
        if not usable.any():
            continue
        scores = np.repeat(p.score[c, nodes][usable], limits[usable])
        top = np.sort(scores)[::-1][: klass.size]
        placed += len(top)
        score += int(top.sum())
        if p.pack.size:
            packs = np.repeat(p.pack[c, nodes][usable], limits[usable])
            pack += int(np.sort(packs)[::-1][: klass.size].sum())
    placed = min(placed, len(p.members))
    untouched = p.keep[:, 0] * p.frag_nodes
    best = p.keep.max(axis=1) * p.frag_nodes
    kept = int(untouched.sum() - untouched[nodes].sum() + best[nodes].sum())
    # A placement uses at least one domain of every level, of tight rank at least the
    # smallest among the sub-model's domains.
    used = 1 if placed else 0
    domains = sum((level.size - used) * wt for level, wt in zip(p.compact, w.spans, strict=True))
    tight = 0
    if p.tight is not None:
        least = int(p.tight_rank[p.tight.domain[nodes]].min(initial=0)) if placed else 0
        tight = (int(p.tight_rank.sum()) - least) * w.tight
    value = placed * (w.placed + w.preferred) + score * w.score + pack * w.pack + kept * w.whole
    whole = sum(len(e.ids) for e in p.empty) * w.whole_domains
    return placed, value + domains + tight + whole


def _placements(p: GangProblem, best: _Best) -> tuple[tuple[int, str], ...]:
    """In an order the commit can re-check one member at a time: greedy's own (it placed
    them so), else :func:`~scheduler.solver.order.commit_order`."""
    names = p.node_names
    if best.assignment is not None:
        nodes = best.assignment
        return tuple((i, names[n]) for i in best.order if (n := nodes[i]) is not None)
    return tuple((i, names[n]) for i, n in commit_order(p, best.counts))


def _spans_text(p: GangProblem, counts: IntArray) -> str:
    """``, over 2 racks (example.com/rack=r1, r2) of 1 example.com/block``: the domains
    the plan spans at each level of the preferred chain, preferred level first."""
    if not p.compact:
        return ""
    used = spans(p, counts)
    level = p.compact[-1]
    bound = set(p.spanned[-1]) if len(p.spanned) == len(p.compact) else set()
    domains = {int(d) for d in set(level.domain[counts.sum(axis=0) > 0])} | bound
    names = sorted(level.name(d) for d in domains)
    text = f", over {used[-1]} {level.key} domain{'s' if used[-1] != 1 else ''}"
    text += f" ({', '.join(names)})"
    for wider, n in zip(p.compact[:-1], used[:-1], strict=True):
        text += f" in {n} {wider.key}"
    return text


def _domain_name(p: GangProblem, domain: int | None) -> str | None:
    if domain is None or domain >= len(p.domain_names):
        return None
    return p.domain_names[domain]


def _plural(n: int, word: str) -> str:
    return f"{n} {word}{'s' if n != 1 else ''}"


def _why(p: GangProblem, subs: list[_Sub], best: _Best | None, *, proven: bool) -> str:
    """Why the rest could not be placed: per-member reasons, then (when proven) joint ones."""
    parts: list[str] = []
    alone: Counter[str] = Counter()
    unlabelled = 0
    for c, klass in enumerate(p.classes):
        if klass.feasible_nodes == 0:
            alone[klass.summary.rstrip(".")] += klass.size
        elif not (p.limit[c] > 0).any():
            unlabelled += klass.size
    for summary, count in sorted(alone.items()):
        parts.append(f"{_plural(count, 'member')} fit no node ({summary})")
    if not proven:
        # The slices' shortfall is a proof by itself (the room per node is an upper bound).
        parts.extend(_slices_short(p, subs, only_short=True))
        return "; ".join(parts)
    if p.topology_key is not None:
        if unlabelled:
            parts.append(
                f"{_plural(unlabelled, 'member')} fit only nodes without label {p.topology_key}"
            )
        if not subs:
            parts.append(f"no feasible node has label {p.topology_key}")
        elif best is not None:
            name = _domain_name(p, best.sub.domain)
            parts.append(
                f"no domain of {p.topology_key} holds {p.need} members together "
                f"(best {p.topology_key}={name}: {int(best.counts.sum())})"
            )
            parts.extend(_gpus_short(p, subs))
    parts.extend(_slices_short(p, subs))
    placeable = sum(k.size for c, k in enumerate(p.classes) if (p.limit[c] > 0).any())
    if placeable >= p.need and p.topology_key is None and p.slicing is None:
        parts.append("not enough room for all members together" + _shortfall(p))
    return "; ".join(parts) if parts else "no feasible node"


def _slices_short(p: GangProblem, subs: list[_Sub], *, only_short: bool = False) -> list[str]:
    """For a gang with slices: the whole slices the domains of the slice level hold (by
    each node's room for members, an upper estimate) against the slices it needs
    (``only_short``: only when they hold fewer)."""
    if p.slicing is None or p.slice_size <= 0 or not subs:
        return []
    level, size = p.slicing, p.slice_size
    nodes = np.unique(np.concatenate([s.nodes for s in subs]))
    nodes = nodes[level.domain[nodes] >= 0]
    per = np.bincount(level.domain[nodes], weights=p.capacity[nodes], minlength=level.size)
    per = per.astype(np.int64)
    needed = -(-p.need // size)
    if not len(nodes):
        return [f"slices of {size} need nodes with label {level.key}; no feasible node has it"]
    top = int(np.argmax(per))
    short = [
        (d, int(n), int(per[d]))
        for d, n in enumerate(p.slice_short.tolist())
        if n > 0 and int(per[d]) < n
    ]
    if short:  # a partial gang: its bound slices must be completed where they are
        return [
            f"its bound slices need {_plural(more, 'more member')} in {level.name(d)}, "
            f"which has room for {room}"
            for d, more, room in short
        ]
    if only_short and int((per // size).sum()) >= needed:
        return []
    return [
        f"needs {needed} slice{'s' if needed != 1 else ''} of {size} members, each in one "
        f"{level.key}; the domains hold {int((per // size).sum())} whole slices "
        f"(the most members in one: {int(per[top])}, {level.name(top)})"
    ]


def _gpus_short(p: GangProblem, subs: list[_Sub]) -> list[str]:
    """For a GPU gang that fits no required domain: the GPUs it needs in one domain
    against the most any domain has free (on the nodes its members may use)."""
    if not p.gpus.any() or not subs:
        return []
    # The ``need`` members asking for the fewest GPUs: exact when members are alike.
    needed = int(np.sort(p.gpus[list(p.member_class)])[: p.need].sum())
    free = {s.domain: int(np.maximum(p.gpu_free[s.nodes], 0).sum()) for s in subs}
    top = max(free, key=lambda d: (free[d], -(d or 0)))
    return [
        f"needs {needed} GPUs in one {p.topology_key}; the most free in one is {free[top]} "
        f"({p.topology_key}={_domain_name(p, top)})"
    ]


def _shortfall(p: GangProblem) -> str:
    """Resources the members ask for in total beyond what their nodes have free."""
    usable = (p.limit > 0).any(axis=0)
    notes = []
    for j, resource in enumerate(p.resources):
        demand = int((p.request[:, j] * p.sizes).sum())
        supply = int(np.maximum(p.free[j, usable], 0).sum())
        if demand > supply:
            notes.append(f"{demand} {resource} requested, {supply} free on their nodes")
    rules = [
        name
        for name, present in (
            ("anti-affinity", bool(p.anti)),
            ("pod affinity", bool(p.together)),
            ("topology spread", bool(p.spreads)),
            ("host ports", bool(p.port_conflicts.any())),
            ("device alignment", bool(p.device_exclusive.any())),
        )
        if present
    ]
    if rules:
        notes.append("with the members' " + ", ".join(rules) + " rules")
    return f" ({'; '.join(notes)})" if notes else ""


def _plan(
    p: GangProblem,
    status: SolveStatus,
    message: str,
    started: float,
    *,
    placements: tuple[tuple[int, str], ...] = (),
    counts: IntArray | None = None,
    placed: int = 0,
    objective: int | None = None,
    variables: int = 0,
    constraints: int = 0,
    greedy_placed: int = 0,
    domain: str | None = None,
    rejected: tuple[str, ...] = (),
    slices: tuple[tuple[int, int], ...] = (),
) -> GangPlan:
    chosen = dict(placements)
    index = {name: n for n, name in enumerate(p.node_names)}
    reports = tuple(
        replace(
            r,
            node=chosen.get(r.index),
            score=int(p.score[r.member_class, index[chosen[r.index]]])
            if r.index in chosen
            else None,
        )
        for r in p.reports
    )
    score = sum(r.score or 0 for r in reports)
    partial = 0
    if counts is not None:
        partial = int(p.frag_nodes.sum()) - whole_nodes(p, counts)
    return GangPlan(
        status=status,
        placements=placements,
        admitted=status in ADMITTED,
        message=message,
        solve_time_s=time.perf_counter() - started,
        members=reports,
        need=p.need,
        placed=placed,
        objective=objective,
        score=score,
        partial_gpu_nodes=partial,
        variables=variables,
        constraints=constraints,
        classes=p.num_classes,
        greedy_placed=greedy_placed,
        domain=domain,
        slices=slices,
        build_time_s=p.build_time_s,
        rejected=rejected,
    )
