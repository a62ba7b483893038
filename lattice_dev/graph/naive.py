"""The pre-graph InterPodAffinity and PodTopologySpread plugins: the naive baseline.

They adapt :mod:`lattice_dev.core.oracle` to the framework node by node, looping over every
placed pod each cycle, as the core did before the affinity graph (and as kube-scheduler
recomputes its PreFilter state). The benchmark measures the graph-backed plugins against
them and the differential tests require identical decisions. Not used in production.
"""

from __future__ import annotations

from typing import Final

import numpy as np

from lattice_dev.core.oracle import inter_pod_affinity as ipa
from lattice_dev.core.oracle import pod_topology_spread as pts
from scheduler.core.framework import (
    PREFILTER_SKIP,
    PREFILTER_SUCCESS,
    Code,
    Cycle,
    FilterResult,
    PreFilterResult,
)
from scheduler.core.plugins._normalize import scatter
from scheduler.core.plugins.inter_pod_affinity import (
    REASON_AFFINITY,
    REASON_ANTI_AFFINITY,
    REASON_EXISTING_ANTI_AFFINITY,
    RequiredState,
)
from scheduler.core.plugins.pod_topology_spread import REASON, REASON_MISSING_LABEL
from scheduler.core.profile import (
    INTER_POD_AFFINITY,
    POD_TOPOLOGY_SPREAD,
    InterPodAffinityArgs,
    Profile,
)
from scheduler.core.registry import IN_TREE, PluginFactory, Registry
from scheduler.core.snapshot import BoolArray, IntArray
from scheduler.model.pod import UnsatisfiableAction

_IPA_CODES: Final = {
    REASON_AFFINITY: Code.UNSCHEDULABLE_AND_UNRESOLVABLE,
    REASON_ANTI_AFFINITY: Code.UNSCHEDULABLE,
    REASON_EXISTING_ANTI_AFFINITY: Code.UNSCHEDULABLE,
}


class NaiveInterPodAffinity:
    name: Final = INTER_POD_AFFINITY

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
        state = ipa.required_state(snapshot, pod)
        if not state.has_work:
            return PREFILTER_SKIP
        cycle.state[self.name] = state
        return PREFILTER_SUCCESS

    def filter(self, cycle: Cycle, candidates: BoolArray) -> FilterResult | None:
        state: RequiredState = cycle.state[self.name]
        n = cycle.num_nodes
        masks = {reason: np.zeros(n, dtype=np.bool_) for reason in _IPA_CODES}
        for i in np.flatnonzero(candidates).tolist():
            reason = ipa.filter_node(state, cycle.pod, cycle.snapshot.node(i).labels)
            if reason is not None:
                masks[reason][i] = True
        codes = np.zeros(n, dtype=np.int8)
        reasons: list[tuple[str, BoolArray]] = []
        for reason, mask in masks.items():
            if mask.any():
                codes[mask] = _IPA_CODES[reason]
                reasons.append((reason, mask))
        return FilterResult(codes, tuple(reasons)) if reasons else None

    def score(self, cycle: Cycle, feasible: BoolArray) -> IntArray | None:
        pod, snapshot = cycle.pod, cycle.snapshot
        if not (pod.preferred_affinity or pod.preferred_anti_affinity) and (
            self.args.ignore_preferred_terms_of_existing_pods or not snapshot.has_pods_with_affinity
        ):
            return None
        scores = ipa.preferred_topology_scores(
            snapshot,
            pod,
            hard_pod_affinity_weight=self.args.hard_pod_affinity_weight,
            ignore_preferred_terms_of_existing_pods=self.args.ignore_preferred_terms_of_existing_pods,
        )
        if scores is None:
            return None
        rows = np.flatnonzero(feasible)
        raw = [ipa.node_score(scores, snapshot.node(i).labels) for i in rows.tolist()]
        return scatter(ipa.normalize(raw), rows, cycle.num_nodes)


def _policy_vectors(cycle: Cycle) -> tuple[list[bool], list[bool]]:
    affinity_ok = cycle.required_node_affinity_mask().tolist()
    taints_ok = (~cycle.untolerated_taint_mask()).tolist()
    return affinity_ok, taints_ok


class NaivePodTopologySpread:
    name: Final = POD_TOPOLOGY_SPREAD

    def pre_filter(self, cycle: Cycle) -> PreFilterResult:
        if not any(
            c.when_unsatisfiable is UnsatisfiableAction.DO_NOT_SCHEDULE
            for c in cycle.pod.spread_constraints
        ):
            return PREFILTER_SKIP
        affinity_ok, taints_ok = _policy_vectors(cycle)
        state = pts.filter_state(cycle.snapshot, cycle.pod, affinity_ok, taints_ok)
        if state is None:
            return PREFILTER_SKIP
        cycle.state[self.name] = state
        return PREFILTER_SUCCESS

    def filter(self, cycle: Cycle, candidates: BoolArray) -> FilterResult | None:
        state: pts.FilterState = cycle.state[self.name]
        n = cycle.num_nodes
        missing = np.zeros(n, dtype=np.bool_)
        skewed = np.zeros(n, dtype=np.bool_)
        for i in np.flatnonzero(candidates).tolist():
            verdict = pts.filter_node(state, cycle.pod, cycle.snapshot.node(i).labels)
            if verdict is not None:
                (missing if verdict[1] else skewed)[i] = True
        codes = np.zeros(n, dtype=np.int8)
        codes[skewed] = Code.UNSCHEDULABLE
        codes[missing] = Code.UNSCHEDULABLE_AND_UNRESOLVABLE
        reasons = tuple(
            (reason, mask)
            for reason, mask in (
                (REASON_MISSING_LABEL, missing),
                (REASON, skewed),
            )
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
        scores = pts.scores(cycle.snapshot, cycle.pod, rows.tolist(), affinity_ok, taints_ok)
        return None if scores is None else scatter(scores, rows, cycle.num_nodes)


def _new_ipa(profile: Profile) -> NaiveInterPodAffinity:
    return NaiveInterPodAffinity(profile.inter_pod_affinity)


def _new_pts(profile: Profile) -> NaivePodTopologySpread:
    return NaivePodTopologySpread()


def naive_registry() -> Registry:
    """The default registry with the two inter-pod plugins replaced by the naive ones."""
    naive: dict[str, PluginFactory] = {INTER_POD_AFFINITY: _new_ipa, POD_TOPOLOGY_SPREAD: _new_pts}
    registry = Registry()
    for name, factory in IN_TREE:
        registry.register(name, naive.get(name, factory))
    return registry
