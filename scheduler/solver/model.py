"""The CP-SAT model over per-node member counts.

Theory of operation
-------------------
One integer variable ``x[c, n]`` per member class ``c`` and node ``n`` the class may use,
bounded by the class's per-node limit (capacity, pod slots, ports, Topology), so a node one
class alone can use needs no capacity row at all. Rows are added only where they can bind:

* class size: ``sum_n x[c, n] <= |c|`` (the gang may be placed in part; the objective's top
  tier counts placed members, so the answer places ``need`` whenever anything can);
* capacity and pod slots on nodes two or more classes share; host-port clashes;
  one Topology-using class on a device-exclusive node (one boolean per class there);
* anti-affinity per domain: with ``mine`` the term owner's members there and ``others``
  the selected ones, ``others <= U * (1 - mine)`` when the owner selects itself (then
  ``mine <= 1``), else through one boolean;
* affinity groups: no variable on a node without the group's key (kube: such a node
  satisfies no required affinity term), one boolean per domain, at most one set; a
  follower's members ``<= |follower| * (anchors' members)``;
* hard spread: the final count per domain is a linear expression; a variable ``low`` is
  below every eligible domain's count, and where the owner class has members
  ``count - low <= maxSkew``;
* fragmentation: per GPU node, the GPUs the gang uses there index the node's row of
  :attr:`~scheduler.solver.problem.GangProblem.keep` (an element constraint): the GPUs the
  request mix can still use after the gang, the objective's last tier.

The objective is :func:`scheduler.solver.check.objective` as a linear expression (plus the
constant of nodes outside the sub-model), so solver, greedy and naive values compare
directly. The solution hint is greedy's placement with every auxiliary variable set to
match, a complete feasible start.
"""

from __future__ import annotations

import importlib.util
import math
import sys
import time
from collections import defaultdict
from collections.abc import Sequence
from dataclasses import dataclass
from enum import StrEnum
from types import ModuleType
from typing import TYPE_CHECKING, Any

import numpy as np

from scheduler.core.snapshot import BoolArray, IndexArray, IntArray
from scheduler.solver.check import objective
from scheduler.solver.problem import EmptyDomains, GangProblem, outside_groups


class ModelStatus(StrEnum):
    OPTIMAL = "optimal"
    FEASIBLE = "feasible"
    UNKNOWN = "unknown"


@dataclass(frozen=True, slots=True, eq=False)
class ModelOutcome:
    status: ModelStatus
    counts: IntArray | None
    """(classes, local nodes) of the best solution found (None: none)."""
    objective: int | None
    bound: int | None
    """Upper bound on the objective CP-SAT proved (None when it proved nothing)."""
    variables: int
    constraints: int
    wall_s: float
    reported: int | None = None
    """CP-SAT's own objective value (tests check it equals :attr:`objective`)."""


def _lazy(name: str) -> ModuleType:
    """``name`` imported on first attribute access (the standard library's LazyLoader
    recipe): CP-SAT's module pulls in pandas, 0.7 s of CPU and tens of MiB that every
    start-up paid, though only a gang's solve uses it."""
    found = sys.modules.get(name)
    if found is not None:
        return found
    spec = importlib.util.find_spec(name)
    if spec is None or spec.loader is None:
        raise ModuleNotFoundError(name)
    loader = importlib.util.LazyLoader(spec.loader)
    spec.loader = loader
    module = importlib.util.module_from_spec(spec)
    sys.modules[name] = module
    loader.exec_module(module)
    return module


if TYPE_CHECKING:
    from ortools.sat.python import cp_model
else:
    cp_model = _lazy("ortools.sat.python.cp_model")

MAX_OBJECTIVE = 2**62
"""Objective magnitudes at or above this are not handed to CP-SAT (int64 headroom)."""

_STATUS = {
    "OPTIMAL": ModelStatus.OPTIMAL,
    "FEASIBLE": ModelStatus.FEASIBLE,
}
"""By CP-SAT's status name (its codes would import the module)."""


def status_of(solver: cp_model.CpSolver, code: Any) -> ModelStatus:
    """A solve's outcome (anything but optimal or feasible is unknown)."""
    return _STATUS.get(solver.status_name(code), ModelStatus.UNKNOWN)


def configure(solver: cp_model.CpSolver, *, time_limit_s: float, seed: int, workers: int) -> None:
    """Solver parameters shared by the count model and the naive one."""
    params: Any = solver.parameters
    params.max_time_in_seconds = max(time_limit_s, 1e-9)
    params.num_workers = max(1, workers)
    params.random_seed = seed
    # The same answer for a seed whatever the thread timing (when solved within the limit).
    params.interleave_search = workers > 1
    params.log_search_progress = False


class _Builder:
    def __init__(self, problem: GangProblem, nodes: IndexArray, hint: IntArray) -> None:
        self.p = problem
        self.nodes = nodes
        self.hint = hint
        self.model = cp_model.CpModel()
        self.x: dict[tuple[int, int], cp_model.IntVar] = {}
        self.by_node: dict[int, list[int]] = defaultdict(list)
        self.by_class: dict[int, list[int]] = defaultdict(list)
        self.magnitude = 0
        """Largest objective value the variables allow (CP-SAT refuses 2**63 and above)."""
        self.domain_terms: list[tuple[cp_model.LinearExprT, int]] = []
        """(expression, weight) of the topology tiers: domains and tight ranks left unused."""

    def var(self, ub: int, hint: int) -> cp_model.IntVar:
        v = self.model.new_int_var(0, ub, "")
        self.model.add_hint(v, hint)
        return v

    def flag(self, hint: bool) -> cp_model.IntVar:
        v = self.model.new_bool_var("")
        self.model.add_hint(v, int(hint))
        return v

    def ub(self, c: int, n: int) -> int:
        return int(min(self.p.limit[c, n], self.p.classes[c].size))

    def build(self) -> int:
        """Add everything; return the objective's constant part."""
        p = self.p
        # An affinity group's classes never use nodes without its key, whatever the limits.
        open_ = (p.limit > 0) & ~outside_groups(p.together, p.num_classes, p.num_nodes)
        for c in range(p.num_classes):
            for n in self.nodes[open_[c, self.nodes]].tolist():
                self.x[(c, n)] = self.var(self.ub(c, n), int(self.hint[c, n]))
                self.by_node[n].append(c)
                self.by_class[c].append(n)
        self._class_sizes()
        self._nodes()
        self._anti_affinity()
        self._together()
        self._spreads()
        self._slices()
        self._domains()
        return self._objective()

    def _sum(self, pairs: Sequence[tuple[int, int]]) -> cp_model.LinearExpr:
        return cp_model.LinearExpr.sum([self.x[k] for k in pairs])

    def _class_sizes(self) -> None:
        for c, nodes in self.by_class.items():
            size = self.p.classes[c].size
            if sum(self.ub(c, n) for n in nodes) > size:
                self.model.add(self._sum([(c, n) for n in nodes]) <= size)

    def _nodes(self) -> None:
        p = self.p
        active = [k.topology_active for k in p.classes]
        for n, cs in self.by_node.items():
            if len(cs) < 2:
                continue
            for j in range(len(p.resources)):
                users = [c for c in cs if p.request[c, j] > 0]
                if sum(int(p.request[c, j]) * self.ub(c, n) for c in users) > p.free[j, n]:
                    expr = cp_model.LinearExpr.weighted_sum(
                        [self.x[(c, n)] for c in users], [int(p.request[c, j]) for c in users]
                    )
                    self.model.add(expr <= int(p.free[j, n]))
            if sum(self.ub(c, n) for c in cs) > p.free_pods[n]:
                self.model.add(self._sum([(c, n) for c in cs]) <= int(p.free_pods[n]))
            for i, a in enumerate(cs):
                for b in cs[i + 1 :]:
                    if p.port_conflicts[a, b]:
                        self.model.add(self.x[(a, n)] + self.x[(b, n)] <= 1)
            users = [c for c in cs if active[c]]
            if p.device_exclusive[n] and len(users) >= 2:
                flags = []
                for c in users:
                    u = self.flag(self.hint[c, n] > 0)
                    self.model.add(self.x[(c, n)] <= self.ub(c, n) * u)
                    flags.append(u)
                self.model.add(cp_model.LinearExpr.sum(flags) <= 1)

    def _by_domain(
        self, domain: IntArray, classes: Sequence[int], nodes_mask: BoolArray | None = None
    ) -> dict[int, list[tuple[int, int]]]:
        out: dict[int, list[tuple[int, int]]] = defaultdict(list)
        for c in classes:
            for n in self.by_class.get(c, []):
                d = int(domain[n])
                if d >= 0 and (nodes_mask is None or nodes_mask[n]):
                    out[d].append((c, n))
        return out

    def _hint_of(self, pairs: Sequence[tuple[int, int]]) -> int:
        return int(sum(int(self.hint[k]) for k in pairs))

    def _ubs(self, pairs: Sequence[tuple[int, int]]) -> int:
        return sum(self.ub(c, n) for c, n in pairs)

    def _anti_affinity(self) -> None:
        for rule in self.p.anti:
            mine = self._by_domain(rule.domain, [rule.cls])
            others = self._by_domain(rule.domain, [m for m in rule.matched if m != rule.cls])
            selects_itself = rule.cls in rule.matched
            for d, own in mine.items():
                own_sum = self._sum(own)
                if selects_itself and self._ubs(own) > 1:
                    self.model.add(own_sum <= 1)
                theirs = others.get(d)
                if not theirs:
                    continue
                cap = self._ubs(theirs)
                if selects_itself:
                    self.model.add(self._sum(theirs) <= cap * (1 - own_sum))
                else:
                    b = self.flag(self._hint_of(own) > 0)
                    self.model.add(own_sum <= self._ubs(own) * b)
                    self.model.add(self._sum(theirs) <= cap * (1 - b))

    def _together(self) -> None:
        for group in self.p.together:
            if group.follower is not None:
                self._anchored(group.follower, group.anchors)
            domains = self._by_domain(group.domain, group.classes)
            if len(domains) < 2:
                continue
            flags = []
            for pairs in domains.values():
                z = self.flag(self._hint_of(pairs) > 0)
                self.model.add(self._sum(pairs) <= self._ubs(pairs) * z)
                flags.append(z)
            self.model.add(cp_model.LinearExpr.sum(flags) <= 1)

    def _anchored(self, follower: int, anchors: Sequence[int]) -> None:
        """No member of ``follower`` without one of ``anchors`` (the group's one-domain
        rule puts them together)."""
        mine = [(follower, n) for n in self.by_class.get(follower, [])]
        if not mine:
            return
        theirs = [(a, n) for a in anchors for n in self.by_class.get(a, [])]
        if not theirs:
            self.model.add(self._sum(mine) == 0)
            return
        self.model.add(self._sum(mine) <= self._ubs(mine) * self._sum(theirs))

    def _spreads(self) -> None:
        for s in self.p.spreads:
            owner = self._by_domain(s.domain, [s.cls])
            if not owner:
                continue
            counted = self._by_domain(s.domain, s.matched, s.counted)
            final: dict[int, cp_model.LinearExpr] = {}
            final_hint: dict[int, int] = {}
            for d, pairs in counted.items():
                final[d] = int(s.existing[d]) + self._sum(pairs)
                final_hint[d] = int(s.existing[d]) + self._hint_of(pairs)
            if s.min_zero or not s.eligible.any():
                low = self.model.new_constant(0)
            else:
                eligible = np.flatnonzero(s.eligible).tolist()
                constant = [int(s.existing[d]) for d in eligible if d not in final]
                top = (
                    min(constant)
                    if constant
                    else max(final_hint.values(), default=0)
                    + sum(self._ubs(pairs) for pairs in counted.values())
                )
                varying = [d for d in final if s.eligible[d]]
                low_hint = min([top, *(final_hint[d] for d in varying)])
                low = self.var(top, low_hint)
                for d in varying:
                    self.model.add(low <= final[d])
            for d, pairs in owner.items():
                has = self.flag(self._hint_of(pairs) > 0)
                self.model.add(self._sum(pairs) <= self._ubs(pairs) * has)
                count = final[d] if d in final else int(s.existing[d])
                self.model.add(count - low <= s.max_skew).only_enforce_if(has)

    def _slices(self) -> None:
        """Slices of ``N``: the members in each domain of the slice level are what its
        bound slices are short of plus ``N`` times a whole number of new slices (members
        then split into slices of one domain each;
        :func:`~scheduler.solver.slices.assign_slices`)."""
        p = self.p
        if p.slicing is None or p.slice_size <= 0:
            return
        size = p.slice_size
        for d, pairs in sorted(self._by_domain(p.slicing.domain, range(p.num_classes)).items()):
            short = int(p.slice_short[d]) if d < len(p.slice_short) else 0
            most = max(self._ubs(pairs) - short, 0) // size
            hint = max(self._hint_of(pairs) - short, 0) // size
            k = self.var(most, hint)
            self.model.add(self._sum(pairs) == short + size * k)

    def _used(
        self, level_domain: IntArray, spanned: Sequence[int] = ()
    ) -> dict[int, cp_model.IntVar]:
        """One boolean per domain the sub-model's variables reach, set when it has members
        (always, for a domain bound members span)."""
        out: dict[int, cp_model.IntVar] = {}
        for d, pairs in sorted(self._by_domain(level_domain, range(self.p.num_classes)).items()):
            u = self.flag(d in spanned or self._hint_of(pairs) > 0)
            self.model.add(self._sum(pairs) <= self._ubs(pairs) * u)
            if d in spanned:
                self.model.add(u == 1)
            out[d] = u
        return out

    def _domains(self) -> None:
        """The topology tiers: per level of the preferred chain, ``size - domains used``;
        for the tight level, ``sum of ranks - ranks of the domains used`` (domains out of
        the sub-model count as unused: constants)."""
        p, w = self.p, self.p.weights
        used_at: dict[int, dict[int, cp_model.IntVar]] = {}
        for i, level in enumerate(p.compact):
            spanned = p.spanned[i] if i < len(p.spanned) else ()
            used = used_at[id(level)] = self._used(level.domain, spanned)
            # Bound members' domains out of the sub-model's reach are spanned all the same.
            beyond = len(set(spanned) - set(used))
            expr = level.size - beyond - cp_model.LinearExpr.sum(list(used.values()))
            self.domain_terms.append((expr, w.spans[i]))
            self.magnitude += level.size * w.spans[i]
        for empty in p.empty if w.whole_domains else ():
            self._kept_whole(empty, used_at.get(id(empty.level)))
        if p.tight is not None and w.tight:
            used = used_at.get(id(p.tight)) or self._used(p.tight.domain, p.tight_spanned)
            ranks = [int(p.tight_rank[d]) for d in used]
            total = int(p.tight_rank.sum())
            total -= sum(int(p.tight_rank[d]) for d in set(p.tight_spanned) - set(used))
            expr = total - cp_model.LinearExpr.weighted_sum(list(used.values()), ranks)
            self.domain_terms.append((expr, w.tight))
            self.magnitude += total * w.tight

    def _kept_whole(self, empty: EmptyDomains, used: dict[int, cp_model.IntVar] | None) -> None:
        """Per empty domain: 1 when the gang leaves it untouched or takes all its GPUs."""
        p, w = self.p, self.p.weights
        used = used if used is not None else self._used(empty.level.domain)
        gpu_classes = [c for c in range(p.num_classes) if p.gpus[c] > 0]
        by_domain = self._by_domain(empty.level.domain, gpu_classes)
        ids = empty.ids.tolist()
        terms: list[cp_model.LinearExprT] = []
        for d in ids:
            pairs = by_domain.get(d, [])
            room = int(empty.room[d])
            if d not in used or not pairs:
                terms.append(1)  # out of reach: kept whole
                continue
            gpus = cp_model.LinearExpr.weighted_sum(
                [self.x[k] for k in pairs], [int(p.gpus[c]) for c, _ in pairs]
            )
            hint_gpus = sum(int(self.hint[c, n]) * int(p.gpus[c]) for c, n in pairs)
            full = self.flag(hint_gpus >= room)
            self.model.add(gpus >= room * full)
            terms.append(1 - used[d] + full)
        self.domain_terms.append((cp_model.LinearExpr.sum(terms), w.whole_domains))
        self.magnitude += len(ids) * w.whole_domains

    def _objective(self) -> int:
        p, w = self.p, self.p.weights
        keys = list(self.x)
        coefs = [
            w.placed
            + int(p.preferred[c, n]) * w.preferred
            + int(p.score[c, n]) * w.score
            + (int(p.pack[c, n]) * w.pack if p.pack.size else 0)
            for c, n in keys
        ]
        terms: list[cp_model.LinearExprT] = [
            cp_model.LinearExpr.weighted_sum([self.x[k] for k in keys], coefs)
        ]
        self.magnitude = sum(coef * self.ub(c, n) for coef, (c, n) in zip(coefs, keys, strict=True))
        self.magnitude += int(p.keep.max(axis=1).sum()) * w.whole
        constant = 0
        gpu_classes = [c for c in range(p.num_classes) if p.gpus[c] > 0]
        for n in np.flatnonzero(p.frag_nodes).tolist():
            users = [c for c in gpu_classes if (c, n) in self.x]
            free = max(int(p.gpu_free[n]), 0)
            row = [int(v) for v in p.keep[n, : free + 1]]
            if not users:
                constant += row[0]
                continue
            used = cp_model.LinearExpr.weighted_sum(
                [self.x[(c, n)] for c in users], [int(p.gpus[c]) for c in users]
            )
            used_hint = min(sum(int(p.gpus[c]) * int(self.hint[c, n]) for c in users), free)
            index = self.model.new_int_var(0, free, "")
            self.model.add(index == used)
            self.model.add_hint(index, used_hint)
            value = self.model.new_int_var(min(row), max(row), "")
            self.model.add_element(index, row, value)
            self.model.add_hint(value, row[used_hint])
            terms.append(value * w.whole)
        terms.extend(expr * weight for expr, weight in self.domain_terms)
        self.model.maximize(cp_model.LinearExpr.sum(terms) + constant * w.whole)
        return constant * w.whole


def distinct_nodes(problem: GangProblem, nodes: IndexArray, keep_first: IndexArray) -> IndexArray:
    """``nodes`` without interchangeable copies beyond what a placement could use.

    Two nodes are interchangeable when every number the model reads about them is equal
    (limits, scores, preferences, free capacity and GPUs, flags) and they sit in the same
    domain of every rule's key, or each alone among the local nodes in its domain (then
    the domain's existing and eligible figures must match too): swapping them maps any
    placement onto one of equal objective that breaks no rule. A placement uses at most one
    node per member, so each group keeps ``len(members)`` nodes, ``keep_first`` (greedy's,
    so the hint stays complete) before the others. The answer is unchanged; the model and
    CP-SAT's symmetry work shrink (a large cluster has few distinct node states).
    """
    p = problem
    limit = len(p.members)
    if len(nodes) <= limit:
        return nodes
    rows: list[IntArray] = [
        p.limit[:, nodes],
        p.score[:, nodes],
        p.preferred[:, nodes].astype(np.int64),
        p.pack[:, nodes] if p.pack.size else np.zeros((0, len(nodes)), np.int64),
        p.free[:, nodes],
        np.stack(
            [
                p.free_pods[nodes],
                p.gpu_alloc[nodes],
                p.gpu_free[nodes],
                p.frag_nodes[nodes].astype(np.int64),
                p.device_exclusive[nodes].astype(np.int64),
                p.domain[nodes],
            ]
        ),
    ]

    def token(domain: IntArray) -> IntArray:
        """The domain id, or -2 for a domain holding no other of these nodes."""
        ids = domain[nodes]
        known = ids >= 0
        sizes = np.bincount(ids[known], minlength=int(ids.max(initial=-1)) + 2)
        alone = known & (sizes[np.maximum(ids, 0)] == 1)
        out: IntArray = np.where(alone, -2, ids)
        return out

    for domain in [r.domain for r in p.anti] + [g.domain for g in p.together]:
        rows.append(token(domain)[None, :])
    for level in p.compact:
        rows.append(token(level.domain)[None, :])
    for empty in p.empty:
        rows.append(token(empty.level.domain)[None, :])
    if p.slicing is not None:
        rows.append(p.slicing.domain[nodes][None, :])  # a lone node's domain still counts
    if p.tight is not None:
        rows.append(token(p.tight.domain)[None, :])
        rows.append(p.tight_rank[p.tight.domain[nodes]][None, :])
    for s in p.spreads:
        tok = token(s.domain)
        ids = np.maximum(s.domain[nodes], 0)
        existing = np.where(s.domain[nodes] >= 0, s.existing[ids] if len(s.existing) else 0, -1)
        eligible = np.where(s.domain[nodes] >= 0, s.eligible[ids] if len(s.eligible) else 0, -1)
        rows.append(np.stack([tok, existing, eligible, s.counted[nodes].astype(np.int64)]))
    features = np.concatenate(rows, axis=0)
    _, group = np.unique(features, axis=1, return_inverse=True)
    group = group.reshape(-1)
    preferred = np.isin(nodes, keep_first)
    order = np.lexsort((np.arange(len(nodes)), ~preferred, group))
    kept = np.zeros(len(nodes), dtype=np.bool_)
    start = 0
    sorted_groups = group[order]
    while start < len(order):
        end = int(np.searchsorted(sorted_groups, sorted_groups[start], side="right"))
        kept[order[start : min(end, start + limit)]] = True
        start = end
    reduced: IndexArray = nodes[kept]
    return reduced


def model_size(problem: GangProblem, nodes: IndexArray, hint: IntArray) -> tuple[int, int]:
    """(variables, constraints) of the count model over ``nodes``, built but not solved."""
    nodes = distinct_nodes(problem, nodes, np.flatnonzero(hint.any(axis=0)))
    builder = _Builder(problem, nodes, hint)
    builder.build()
    return len(builder.model.proto.variables), len(builder.model.proto.constraints)


def solve_counts(
    problem: GangProblem,
    nodes: IndexArray,
    hint: IntArray,
    *,
    time_limit_s: float,
    seed: int = 0,
    workers: int = 2,
    reduce: bool = True,
    deadline: float | None = None,
) -> ModelOutcome:
    """Maximise the objective over ``nodes`` (local indices) within the time limit.

    ``reduce``: drop interchangeable nodes first (:func:`distinct_nodes`; same answer).
    ``deadline`` (``time.perf_counter()`` clock): the search also stops there, so building
    the model counts against the caller's budget."""
    started = time.perf_counter()
    if reduce:
        nodes = distinct_nodes(problem, nodes, np.flatnonzero(hint.any(axis=0)))
    builder = _Builder(problem, nodes, hint)
    builder.build()
    proto = builder.model.proto
    size = (len(proto.variables), len(proto.constraints))
    if deadline is not None:
        time_limit_s = min(time_limit_s, deadline - time.perf_counter())
    if builder.magnitude >= MAX_OBJECTIVE or time_limit_s <= 0:
        # No time left, or an astronomically large gang (keep greedy's answer rather than
        # overflow int64).
        return ModelOutcome(
            ModelStatus.UNKNOWN, None, None, None, *size, time.perf_counter() - started
        )
    solver = cp_model.CpSolver()
    configure(solver, time_limit_s=time_limit_s, seed=seed, workers=workers)
    code = solver.solve(builder.model)
    if code == cp_model.MODEL_INVALID:
        raise RuntimeError(f"CP-SAT rejected the gang model: {builder.model.validate()}")
    status = status_of(solver, code)
    counts: IntArray | None = None
    value: int | None = None
    bound: int | None = None
    if status is not ModelStatus.UNKNOWN:
        counts = np.zeros((problem.num_classes, problem.num_nodes), dtype=np.int64)
        for (c, n), v in builder.x.items():
            counts[c, n] = solver.value(v)
        value = objective(problem, counts)
        bound = value if status is ModelStatus.OPTIMAL else _ceil(solver.best_objective_bound)
    reported = round(solver.objective_value) if counts is not None else None
    return ModelOutcome(
        status, counts, value, bound, *size, time.perf_counter() - started, reported
    )


def _ceil(value: float) -> int | None:
    """An integer upper bound from CP-SAT's float bound (one unit of slack for rounding)."""
    return math.ceil(value) + 1 if math.isfinite(value) else None
