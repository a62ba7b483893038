"""The reference model: one boolean per member and node, no merging, no domain split.

Used by the tests (the per-node count model must reach the same optimum on small cases)
and by the benchmark (to show why the count model exists: this one grows with members x
nodes). Every rule is written in its plainest pairwise form, independently of
:mod:`scheduler.solver.model`; the objective is the same
:func:`scheduler.solver.check.objective`, so values compare as integers. Build the problem
with ``build_problem(..., merge=False)`` to also check the class merging.
"""

from __future__ import annotations

import time
from collections import defaultdict
from dataclasses import dataclass

import numpy as np
from ortools.sat.python import cp_model

from scheduler.core.snapshot import IntArray
from scheduler.solver.check import objective
from scheduler.solver.model import ModelStatus, configure, status_of
from scheduler.solver.problem import GangProblem, outside_groups


@dataclass(frozen=True, slots=True, eq=False)
class NaiveOutcome:
    status: ModelStatus
    counts: IntArray | None
    objective: int | None
    variables: int
    constraints: int
    wall_s: float


def solve_naive(
    problem: GangProblem, *, time_limit_s: float = 10.0, seed: int = 0, workers: int = 2
) -> NaiveOutcome:
    started = time.perf_counter()
    p = problem
    model = cp_model.CpModel()
    k = p.num_nodes
    x: dict[tuple[int, int], cp_model.IntVar] = {}
    on_node: dict[int, list[int]] = defaultdict(list)
    of_member: dict[int, list[int]] = defaultdict(list)
    closed = outside_groups(p.together, p.num_classes, k)  # affinity groups: labelled only
    for i, c in enumerate(p.member_class):
        for n in np.flatnonzero((p.limit[c] > 0) & ~closed[c]).tolist():
            x[(i, n)] = model.new_bool_var("")
            on_node[n].append(i)
            of_member[i].append(n)
    cls = p.member_class

    def y(i: int, nodes: set[int]) -> cp_model.LinearExpr:
        """Member ``i`` is on one of ``nodes`` (0/1: a member takes one node at most)."""
        return cp_model.LinearExpr.sum([x[(i, n)] for n in of_member[i] if n in nodes])

    for i in of_member:
        model.add(cp_model.LinearExpr.sum([x[(i, n)] for n in of_member[i]]) <= 1)
    for n, members in on_node.items():
        for c in {cls[i] for i in members}:
            same = [x[(i, n)] for i in members if cls[i] == c]
            model.add(cp_model.LinearExpr.sum(same) <= int(p.limit[c, n]))
        for j in range(len(p.resources)):
            users = [i for i in members if p.request[cls[i], j] > 0]
            if users:
                amounts = [int(p.request[cls[i], j]) for i in users]
                used = cp_model.LinearExpr.weighted_sum([x[(i, n)] for i in users], amounts)
                model.add(used <= int(p.free[j, n]))
        model.add(cp_model.LinearExpr.sum([x[(i, n)] for i in members]) <= int(p.free_pods[n]))
        for a in members:
            for b in members:
                if a < b and p.port_conflicts[cls[a], cls[b]]:
                    model.add(x[(a, n)] + x[(b, n)] <= 1)
        if p.device_exclusive[n]:
            users = sorted({cls[i] for i in members if p.classes[cls[i]].topology_active})
            owners = {c: model.new_bool_var("") for c in users}
            for i in members:
                if cls[i] in owners:
                    model.add(x[(i, n)] <= owners[cls[i]])
            model.add(cp_model.LinearExpr.sum(list(owners.values())) <= 1)

    def domains(domain: IntArray) -> dict[int, set[int]]:
        out: dict[int, set[int]] = defaultdict(set)
        for n in range(k):
            if domain[n] >= 0:
                out[int(domain[n])].add(n)
        return out

    def members_of(classes: tuple[int, ...]) -> list[int]:
        return [i for i, c in enumerate(cls) if c in classes]

    for rule in p.anti:
        for nodes in domains(rule.domain).values():
            for i in members_of((rule.cls,)):
                for j in members_of(rule.matched):
                    if i != j:
                        model.add(y(i, nodes) + y(j, nodes) <= 1)
    for group in p.together:
        flags = []
        for nodes in domains(group.domain).values():
            z = model.new_bool_var("")
            flags.append(z)
            for i in members_of(group.classes):
                model.add(y(i, nodes) <= z)
        model.add(cp_model.LinearExpr.sum(flags) <= 1)
        if group.follower is not None:
            # Each follower member needs some anchor member placed.
            anchors = members_of(group.anchors)
            everywhere = set(range(k))
            some = cp_model.LinearExpr.sum([y(j, everywhere) for j in anchors])
            for i in members_of((group.follower,)):
                model.add(y(i, everywhere) <= some)
    for s in p.spreads:
        by_domain = domains(s.domain)
        final = {}
        for d, nodes in by_domain.items():
            counted = {n for n in nodes if s.counted[n]}
            final[d] = int(s.existing[d]) + cp_model.LinearExpr.sum(
                [y(i, counted) for i in members_of(s.matched)]
            )
        low = model.new_int_var(0, len(cls) + int(s.existing.max(initial=0)), "")
        if s.min_zero or not s.eligible.any():
            model.add(low == 0)
        else:
            for d in np.flatnonzero(s.eligible).tolist():
                model.add(low <= (final[d] if d in final else int(s.existing[d])))
        for i in members_of((s.cls,)):
            for d, nodes in by_domain.items():
                for n in nodes:
                    if (i, n) in x:
                        model.add(final[d] - low <= s.max_skew).only_enforce_if(x[(i, n)])
    if p.topology_key is not None:
        flags = []
        for nodes in domains(p.domain).values():
            z = model.new_bool_var("")
            flags.append(z)
            for i in range(len(cls)):
                model.add(y(i, nodes) <= z)
        model.add(cp_model.LinearExpr.sum(flags) <= 1)

    if p.slicing is not None and p.slice_size > 0:
        # Slices: each domain of the slice level holds what its bound slices are short of
        # plus whole new slices; nodes without its label hold nobody.
        size = p.slice_size
        everyone = range(len(cls))
        for d, nodes in domains(p.slicing.domain).items():
            short = int(p.slice_short[d]) if d < len(p.slice_short) else 0
            slices = model.new_int_var(0, len(cls) // size + 1, "")
            model.add(
                cp_model.LinearExpr.sum([y(i, nodes) for i in everyone]) == short + size * slices
            )
        unlabelled = {n for n in range(k) if p.slicing.domain[n] < 0}
        for i in everyone:
            model.add(y(i, unlabelled) == 0)

    w = p.weights
    keys = list(x)
    coefs = [
        w.placed
        + int(p.preferred[cls[i], n]) * w.preferred
        + int(p.score[cls[i], n]) * w.score
        + (int(p.pack[cls[i], n]) * w.pack if p.pack.size else 0)
        for i, n in keys
    ]
    terms: list[cp_model.LinearExpr] = [
        cp_model.LinearExpr.weighted_sum([x[key] for key in keys], coefs)
    ]
    constant = 0
    for n in np.flatnonzero(p.frag_nodes).tolist():
        free = max(int(p.gpu_free[n]), 0)
        row = [int(v) for v in p.keep[n, : free + 1]]
        if not on_node[n]:
            constant += row[0]
            continue
        used = cp_model.LinearExpr.weighted_sum(
            [x[(i, n)] for i in on_node[n]], [int(p.gpus[cls[i]]) for i in on_node[n]]
        )
        index = model.new_int_var(0, free, "")
        model.add(index == used)
        kept = model.new_int_var(min(row), max(row), "")
        model.add_element(index, row, kept)
        terms.append(kept * w.whole)
    terms.append(cp_model.LinearExpr.constant(constant * w.whole))

    def used_flags(domain: IntArray, bound: tuple[int, ...] = ()) -> dict[int, cp_model.IntVar]:
        """A flag per domain, set when some member is on one of its nodes or a bound
        member is in it."""
        out: dict[int, cp_model.IntVar] = {}
        for d, nodes in domains(domain).items():
            out[d] = model.new_bool_var("")
            for i in range(len(cls)):
                model.add(y(i, nodes) <= out[d])
            if d in bound:
                model.add(out[d] == 1)
        return out

    chain = [
        used_flags(level.domain, p.spanned[i] if i < len(p.spanned) else ())
        for i, level in enumerate(p.compact)
    ]
    for level, level_flags, weight in zip(p.compact, chain, w.spans, strict=True):
        spanned = cp_model.LinearExpr.sum(list(level_flags.values()))
        terms.append((level.size - spanned) * weight)
    if p.tight is not None and w.tight:
        tight = chain[-1] if chain else used_flags(p.tight.domain, p.tight_spanned)
        ranks = [int(p.tight_rank[d]) for d in tight]
        spent = cp_model.LinearExpr.weighted_sum(list(tight.values()), ranks)
        terms.append((int(p.tight_rank.sum()) - spent) * w.tight)
    for empty in p.empty if w.whole_domains else ():
        # Per empty domain, kept = untouched or every GPU of it taken.
        touched = used_flags(empty.level.domain)
        for d in empty.ids.tolist():
            nodes = domains(empty.level.domain).get(d, set())
            taken = cp_model.LinearExpr.weighted_sum(
                [x[(i, n)] for n in nodes for i in on_node[n]],
                [int(p.gpus[cls[i]]) for n in nodes for i in on_node[n]],
            )
            whole = model.new_bool_var("")
            model.add(taken >= int(empty.room[d]) * whole)
            if d in touched:
                terms.append((1 + whole - touched[d]) * w.whole_domains)
            else:
                terms.append(cp_model.LinearExpr.constant(w.whole_domains))
    model.maximize(cp_model.LinearExpr.sum(terms))

    solver = cp_model.CpSolver()
    configure(solver, time_limit_s=time_limit_s, seed=seed, workers=workers)
    code = solver.solve(model)
    if code == cp_model.MODEL_INVALID:
        raise RuntimeError(f"CP-SAT rejected the naive model: {model.validate()}")
    status = status_of(solver, code)
    counts: IntArray | None = None
    value: int | None = None
    if status is not ModelStatus.UNKNOWN:
        counts = np.zeros((p.num_classes, k), dtype=np.int64)
        for (i, n), v in x.items():
            counts[cls[i], n] += solver.value(v)
        value = objective(p, counts)
    proto = model.proto
    return NaiveOutcome(
        status,
        counts,
        value,
        len(proto.variables),
        len(proto.constraints),
        time.perf_counter() - started,
    )
