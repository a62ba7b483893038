"""PodTopologySpread: the filter enforces DoNotSchedule constraints, the score favours
spreading under ScheduleAnyway constraints.

The semantics live in :mod:`scheduler.core.oracle.pod_topology_spread` (plain loops); this
module adapts them to the vectorised framework and skips pods without constraints at once.
The inclusion policies reuse the cycle's node-affinity and untolerated-taint vectors.
Cluster-level default constraints (kube's system defaulting, which needs Services and
ReplicaSets) are not applied.
"""

from __future__ import annotations

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
from scheduler.core.oracle import pod_topology_spread as oracle
from scheduler.core.plugins._normalize import scatter
from scheduler.core.profile import POD_TOPOLOGY_SPREAD, Profile
from scheduler.core.snapshot import BoolArray, IntArray
from scheduler.model.pod import UnsatisfiableAction

NAME: Final = POD_TOPOLOGY_SPREAD
REASON: Final = oracle.CONSTRAINTS_NOT_MATCH
REASON_MISSING_LABEL: Final = oracle.NODE_LABEL_NOT_MATCH


def _policy_vectors(cycle: Cycle) -> tuple[list[bool], list[bool]]:
    affinity_ok = cycle.required_node_affinity_mask().tolist()
    taints_ok = (~cycle.untolerated_taint_mask()).tolist()
    return affinity_ok, taints_ok


class PodTopologySpread:
    name: Final = NAME

    def pre_filter(self, cycle: Cycle) -> PreFilterResult:
        if not any(
            c.when_unsatisfiable is UnsatisfiableAction.DO_NOT_SCHEDULE
            for c in cycle.pod.spread_constraints
        ):
            return PREFILTER_SKIP
        affinity_ok, taints_ok = _policy_vectors(cycle)
        state = oracle.filter_state(cycle.snapshot, cycle.pod, affinity_ok, taints_ok)
        if state is None:
            return PREFILTER_SKIP
        cycle.state[NAME] = state
        return PREFILTER_SUCCESS

    def filter(self, cycle: Cycle, candidates: BoolArray) -> FilterResult | None:
        state: oracle.FilterState = cycle.state[NAME]
        n = cycle.num_nodes
        missing = np.zeros(n, dtype=np.bool_)
        skewed = np.zeros(n, dtype=np.bool_)
        for i in np.flatnonzero(candidates).tolist():
            verdict = oracle.filter_node(state, cycle.pod, cycle.snapshot.node(i).labels)
            if verdict is not None:
                (missing if verdict[1] else skewed)[i] = True
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
        if not any(
            c.when_unsatisfiable is UnsatisfiableAction.SCHEDULE_ANYWAY
            for c in cycle.pod.spread_constraints
        ):
            return None
        affinity_ok, taints_ok = _policy_vectors(cycle)
        rows = np.flatnonzero(feasible)
        scores = oracle.scores(cycle.snapshot, cycle.pod, rows.tolist(), affinity_ok, taints_ok)
        return None if scores is None else scatter(scores, rows, cycle.num_nodes)


def new(profile: Profile) -> PodTopologySpread:
    return PodTopologySpread()
