"""InterPodAffinity: required pod affinity / anti-affinity filter, preferred terms score.

The semantics live in :mod:`scheduler.core.oracle.inter_pod_affinity` (plain loops over
pods); this module adapts them to the vectorised framework. The cheap path matters: a pod
without required terms, in a cluster without pods carrying required anti-affinity, skips
the filter at once, and the score is skipped when neither the pod nor any placed pod has
pod (anti-)affinity.
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
from scheduler.core.oracle import inter_pod_affinity as oracle
from scheduler.core.plugins._normalize import scatter
from scheduler.core.profile import INTER_POD_AFFINITY, InterPodAffinityArgs, Profile
from scheduler.core.snapshot import BoolArray, IntArray

NAME: Final = INTER_POD_AFFINITY
REASON_AFFINITY: Final = oracle.AFFINITY_RULES_NOT_MATCH
REASON_ANTI_AFFINITY: Final = oracle.ANTI_AFFINITY_RULES_NOT_MATCH
REASON_EXISTING_ANTI_AFFINITY: Final = oracle.EXISTING_ANTI_AFFINITY_NOT_MATCH
_CODES: Final = {
    REASON_AFFINITY: Code.UNSCHEDULABLE_AND_UNRESOLVABLE,
    REASON_ANTI_AFFINITY: Code.UNSCHEDULABLE,
    REASON_EXISTING_ANTI_AFFINITY: Code.UNSCHEDULABLE,
}


class InterPodAffinity:
    name: Final = NAME

    def __init__(self, args: InterPodAffinityArgs) -> None:
        self.args = args

    def pre_filter(self, cycle: Cycle) -> PreFilterResult:
        pod, snapshot = cycle.pod, cycle.snapshot
        if not (
            pod.required_affinity
            or pod.required_anti_affinity
            or snapshot.has_pods_with_required_anti_affinity
        ):
            return PREFILTER_SKIP
        state = oracle.required_state(snapshot, pod)
        if not state.has_work:
            return PREFILTER_SKIP
        cycle.state[NAME] = state
        return PREFILTER_SUCCESS

    def filter(self, cycle: Cycle, candidates: BoolArray) -> FilterResult | None:
        state: oracle.RequiredState = cycle.state[NAME]
        n = cycle.num_nodes
        masks = {reason: np.zeros(n, dtype=np.bool_) for reason in _CODES}
        for i in np.flatnonzero(candidates).tolist():
            reason = oracle.filter_node(state, cycle.pod, cycle.snapshot.node(i).labels)
            if reason is not None:
                masks[reason][i] = True
        codes = np.zeros(n, dtype=np.int8)
        reasons: list[tuple[str, BoolArray]] = []
        for reason, mask in masks.items():
            if mask.any():
                codes[mask] = _CODES[reason]
                reasons.append((reason, mask))
        return FilterResult(codes, tuple(reasons)) if reasons else None

    def score(self, cycle: Cycle, feasible: BoolArray) -> IntArray | None:
        pod, snapshot = cycle.pod, cycle.snapshot
        if not (pod.preferred_affinity or pod.preferred_anti_affinity) and (
            self.args.ignore_preferred_terms_of_existing_pods or not snapshot.has_pods_with_affinity
        ):
            return None
        scores = oracle.preferred_topology_scores(
            snapshot,
            pod,
            hard_pod_affinity_weight=self.args.hard_pod_affinity_weight,
            ignore_preferred_terms_of_existing_pods=self.args.ignore_preferred_terms_of_existing_pods,
        )
        if scores is None:
            return None
        rows = np.flatnonzero(feasible)
        raw = [oracle.node_score(scores, snapshot.node(i).labels) for i in rows.tolist()]
        return scatter(oracle.normalize(raw), rows, cycle.num_nodes)


def new(profile: Profile) -> InterPodAffinity:
    return InterPodAffinity(profile.inter_pod_affinity)
