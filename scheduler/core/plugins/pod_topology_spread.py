"""PodTopologySpread: the filter enforces DoNotSchedule constraints, the score favours
spreading under ScheduleAnyway constraints.

The semantics are kube-scheduler 1.34's, written out plainly in
:mod:`lattice_dev.core.oracle.pod_topology_spread`, which stays as the test oracle. Each
constraint is a spread term of the snapshot's :class:`~scheduler.graph.AffinityGraph`, whose
index holds the matching live pods of the pod's namespace per node and per domain. When every
node carrying the topology key takes part in counting (the usual case: no node-affinity or
taint policy excludes any), the per-domain index is the answer; otherwise the per-node
counts of the included nodes are summed per domain. Either way the work is whole-column
numpy plus time proportional to the domains or nodes holding matching pods.

Pods without constraints skip at once. Cluster-level default constraints (kube's system
defaulting, which needs Services and ReplicaSets) are not applied.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Final

import numpy as np

from scheduler.core.framework import (
    PREFILTER_SKIP,
    PREFILTER_SUCCESS,
    Code,
    Cycle,
    FilterResult,
    PreFilterResult,
)
from scheduler.core.profile import POD_TOPOLOGY_SPREAD, Profile
from scheduler.core.snapshot import BoolArray, IntArray
from scheduler.graph.terms import TermKey
from scheduler.model.names import LABEL_HOSTNAME
from scheduler.model.pod import (
    InclusionPolicy,
    Pod,
    TopologySpreadConstraint,
    UnsatisfiableAction,
)

NAME: Final = POD_TOPOLOGY_SPREAD
REASON: Final = "node(s) didn't match pod topology spread constraints"
REASON_MISSING_LABEL: Final = REASON + " (missing required label)"
_MAX_INT32: Final = 2**31 - 1


def constraints(pod: Pod, action: UnsatisfiableAction) -> tuple[TopologySpreadConstraint, ...]:
    """The pod's constraints with ``whenUnsatisfiable: action`` (Filter's or Score's)."""
    return tuple(c for c in pod.spread_constraints if c.when_unsatisfiable is action)


@dataclass(frozen=True, slots=True)
class _Hard:
    """One DoNotSchedule constraint after PreFilter: what Filter compares per node."""

    constraint: TopologySpreadConstraint
    has_key: BoolArray
    domain_count: IntArray
    """Per node row, the matching pods counted in the node's domain."""
    min_count: int
    self_match: int


def included_nodes(cycle: Cycle, c: TopologySpreadConstraint, eligible: BoolArray) -> BoolArray:
    """Nodes counted for ``c``: ``eligible`` ones passing its inclusion policies."""
    included = eligible
    if c.node_affinity_policy is InclusionPolicy.HONOR:
        included = included & cycle.required_node_affinity_mask()
    if c.node_taints_policy is InclusionPolicy.HONOR:
        included = included & ~cycle.untolerated_taint_mask()
    return included


def counts_by_value_id(
    cycle: Cycle, c: TopologySpreadConstraint, included: BoolArray, ids: IntArray, size: int
) -> IntArray:
    """Matching pods per value id of ``c``'s key over ``included`` nodes (index ``size`` = 0)."""
    snapshot = cycle.snapshot
    counts = snapshot.affinity_graph.term_counts(TermKey.of_spread(c, cycle.pod.namespace))
    out = np.zeros(size + 1, dtype=np.int64)
    if np.array_equal(included, snapshot.has_label_mask(c.topology_key)):
        column = snapshot.label_column(c.topology_key)
        assert column is not None or not included.any()
        if column is not None:
            for value, count in counts.by_domain.items():
                vid = column.vocab.get(value)
                if vid is not None:
                    out[vid] = count
        return out
    per_node = snapshot.per_node_name(counts.by_node)
    summed = np.bincount(ids[included], weights=per_node[included], minlength=size + 1)
    out[:] = summed[: size + 1].astype(np.int64)
    return out


def value_ids(cycle: Cycle, key: str) -> tuple[IntArray, int]:
    """Per node row, the value id of ``key`` (``size`` when absent), and ``size``."""
    n = cycle.num_nodes
    column = cycle.snapshot.label_column(key)
    if column is None:
        return np.zeros(n, dtype=np.int64), 0
    size = len(column.values)
    ids = column.ids[:n].astype(np.int64)
    ids[ids < 0] = size
    return ids, size


class PodTopologySpread:
    name: Final = NAME

    def pre_filter(self, cycle: Cycle) -> PreFilterResult:
        hard = constraints(cycle.pod, UnsatisfiableAction.DO_NOT_SCHEDULE)
        if not hard:
            return PREFILTER_SKIP
        snapshot, n = cycle.snapshot, cycle.num_nodes
        has_all = np.ones(n, dtype=np.bool_)
        for c in hard:
            has_all &= snapshot.has_label_mask(c.topology_key)
        state: list[_Hard] = []
        for c in hard:
            ids, size = value_ids(cycle, c.topology_key)
            included = included_nodes(cycle, c, has_all)
            per_value = counts_by_value_id(cycle, c, included, ids, size)
            present = np.zeros(size + 1, dtype=np.bool_)
            present[ids[included]] = True
            domains = int(present.sum())
            if domains < c.min_domains:
                min_count = 0
            else:
                min_count = int(per_value[present].min()) if domains else _MAX_INT32
            state.append(
                _Hard(
                    c,
                    snapshot.has_label_mask(c.topology_key),
                    per_value[ids],
                    min_count,
                    1 if c.selector.matches(cycle.pod.labels) else 0,
                )
            )
        cycle.state[NAME] = state
        return PREFILTER_SUCCESS

    def filter(self, cycle: Cycle, candidates: BoolArray) -> FilterResult | None:
        state: list[_Hard] = cycle.state[NAME]
        n = cycle.num_nodes
        missing = np.zeros(n, dtype=np.bool_)
        skewed = np.zeros(n, dtype=np.bool_)
        undecided = candidates.copy()
        # Constraints are checked in order; the first one a node fails names its reason.
        for hard in state:
            lacks = undecided & ~hard.has_key
            missing |= lacks
            undecided &= ~lacks
            skew = hard.domain_count + hard.self_match - hard.min_count
            over = undecided & (skew > hard.constraint.max_skew)
            skewed |= over
            undecided &= ~over
        codes = np.zeros(n, dtype=np.int8)
        codes[skewed] = Code.UNSCHEDULABLE
        codes[missing] = Code.UNSCHEDULABLE_AND_UNRESOLVABLE
        reasons = tuple(
            (reason, mask)
            for reason, mask in ((REASON_MISSING_LABEL, missing), (REASON, skewed))
            if mask.any()
        )
        return FilterResult(codes, reasons) if reasons else None

    def score(self, cycle: Cycle, feasible: BoolArray) -> IntArray | None:
        soft = constraints(cycle.pod, UnsatisfiableAction.SCHEDULE_ANYWAY)
        snapshot, n = cycle.snapshot, cycle.num_nodes
        if not soft or n == 0:
            return None
        has_all = np.ones(n, dtype=np.bool_)
        for c in soft:
            has_all &= snapshot.has_label_mask(c.topology_key)
        scored = feasible & has_all
        total = np.zeros(n, dtype=np.float64)
        for c in soft:
            ids, size = value_ids(cycle, c.topology_key)
            if c.topology_key == LABEL_HOSTNAME:
                domains = int(scored.sum())
                term = TermKey.of_spread(c, cycle.pod.namespace)
                counts = snapshot.affinity_graph.term_counts(term)
                count = snapshot.per_node_name(counts.by_node)
            else:
                present = np.zeros(size + 1, dtype=np.bool_)
                present[ids[scored]] = True
                domains = int(present.sum())
                counted = included_nodes(cycle, c, has_all)
                per_value = counts_by_value_id(cycle, c, counted, ids, size)
                count = per_value[ids]
            weight = math.log(float(domains + 2))
            total += count.astype(np.float64) * weight + float(c.max_skew - 1)
        # Go's math.Round: half away from zero (totals are non-negative).
        floor = np.floor(total)
        raw = np.where(total - floor >= 0.5, floor + 1, floor).astype(np.int64)
        out = np.zeros(n, dtype=np.int64)
        rows = np.flatnonzero(scored)
        if not len(rows):
            return out
        kept = raw[rows]
        low, high = int(kept.min()), int(kept.max())
        if high == 0:
            out[rows] = 100
        else:
            out[rows] = 100 * (high + low - kept) // high
        return out


def new(profile: Profile) -> PodTopologySpread:
    return PodTopologySpread()
