"""InterPodAffinity: required pod affinity / anti-affinity filter, preferred terms score.

The semantics are kube-scheduler 1.34's, written out plainly in
:mod:`lattice_dev.core.oracle.inter_pod_affinity`, which stays as the test oracle. This module
gets the same numbers from the snapshot's :class:`~scheduler.graph.AffinityGraph` instead of
looping over pods:

* the incoming pod's terms: matching placed pods per topology domain are the term vertex's
  index (one pod must match *all* required affinity terms, which the graph intersects);
* placed pods' terms that select the incoming pod: declarations per domain, aggregated per
  distinct term, so a thousand replicas with one anti-affinity term cost one check.

PreFilter and PreScore therefore cost time proportional to the domains and distinct terms
involved, and Filter and Score are whole-column lookups of each node's domain. The cheap
paths are unchanged: a pod without required terms, in a cluster without pods carrying
required anti-affinity, skips the filter, and the score is skipped when neither the pod nor
any placed pod has pod (anti-)affinity.
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Mapping
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
from scheduler.core.profile import INTER_POD_AFFINITY, InterPodAffinityArgs, Profile
from scheduler.core.snapshot import BoolArray, IntArray, Snapshot
from scheduler.graph.affinity import (
    PREFERRED_AFFINITY,
    PREFERRED_ANTI_AFFINITY,
    REQUIRED_AFFINITY,
    REQUIRED_ANTI_AFFINITY,
    AffinityGraph,
)
from scheduler.graph.terms import TermKey
from scheduler.model.pod import Pod, PodAffinityTerm

NAME: Final = INTER_POD_AFFINITY
REASON_AFFINITY: Final = "node(s) didn't match pod affinity rules"
REASON_ANTI_AFFINITY: Final = "node(s) didn't match pod anti-affinity rules"
REASON_EXISTING_ANTI_AFFINITY: Final = "node(s) didn't satisfy existing pods anti-affinity rules"
_CODES: Final = {
    REASON_AFFINITY: Code.UNSCHEDULABLE_AND_UNRESOLVABLE,
    REASON_ANTI_AFFINITY: Code.UNSCHEDULABLE,
    REASON_EXISTING_ANTI_AFFINITY: Code.UNSCHEDULABLE,
}
_EXISTING_ANTI: Final = frozenset({REQUIRED_ANTI_AFFINITY})
_PREFERRED: Final = frozenset({PREFERRED_AFFINITY, PREFERRED_ANTI_AFFINITY})
_PREFERRED_AND_HARD: Final = _PREFERRED | {REQUIRED_AFFINITY}

TopologyPair = tuple[str, str]
_NO_LABELS: Final[Mapping[str, str]] = {}


@dataclass(frozen=True, slots=True)
class RequiredState:
    """PreFilter state: match counts per topology pair (kube's topologyToMatchedTermCount)."""

    affinity_counts: Counter[TopologyPair]
    anti_affinity_counts: Counter[TopologyPair]
    existing_anti_affinity_counts: Counter[TopologyPair]
    pod_matches_own_affinity: bool
    has_terms: bool

    @property
    def has_work(self) -> bool:
        """False when kube-scheduler's PreFilter would return Skip."""
        return bool(self.existing_anti_affinity_counts) or self.has_terms


def incoming_term_matches(term: PodAffinityTerm, pod: Pod, snapshot: Snapshot) -> bool:
    """Whether a term of the incoming pod selects ``pod`` (an existing pod, or itself).

    Pod by pod, as the oracle and the gang solver ask; the plugin itself reads the graph's
    index of the same rule (:func:`scheduler.graph.terms.selects`).
    """
    selector = term.namespace_selector
    namespace_ok = pod.namespace in term.namespaces or selector.matches(_NO_LABELS)
    if not namespace_ok and not selector.selects_nothing:
        labels = snapshot.namespace_labels(pod.namespace)
        namespace_ok = labels is not None and selector.matches(labels)
    return namespace_ok and term.selector.matches(pod.labels)


def required_state(graph: AffinityGraph, pod: Pod) -> RequiredState:
    """kube's PreFilter state (``topologyToMatchedTermCount`` x3) from the graph's indexes."""
    affinity: Counter[TopologyPair] = Counter()
    anti: Counter[TopologyPair] = Counter()
    existing: Counter[TopologyPair] = Counter()
    for declared in graph.declared_selecting(pod, _EXISTING_ANTI):
        key = declared.term.topology_key
        for value, count in declared.by_domain.items():
            existing[(key, value)] += count
    affinity_terms = [TermKey.of_affinity(t) for t in pod.required_affinity]
    if len(affinity_terms) == 1:
        term = affinity_terms[0]
        for value, count in graph.term_counts(term).by_domain.items():
            affinity[(term.topology_key, value)] += count
    elif affinity_terms:
        per_term = graph.count_selecting_all(affinity_terms)
        for term, counts in zip(affinity_terms, per_term, strict=True):
            for value, count in counts.items():
                affinity[(term.topology_key, value)] += count
    for t in pod.required_anti_affinity:
        term = TermKey.of_affinity(t)
        for value, count in graph.term_counts(term).by_domain.items():
            anti[(term.topology_key, value)] += count
    self_match = bool(affinity_terms) and all(graph.selects_pod(t, pod) for t in affinity_terms)
    has_terms = bool(pod.required_affinity or pod.required_anti_affinity)
    return RequiredState(affinity, anti, existing, self_match, has_terms)


def topology_scores(
    graph: AffinityGraph,
    pod: Pod,
    *,
    hard_pod_affinity_weight: int,
    ignore_preferred_terms_of_existing_pods: bool,
) -> dict[str, Counter[str]] | None:
    """kube's PreScore ``topologyScore`` (see the oracle's ``preferred_topology_scores``)."""
    has_constraints = bool(pod.preferred_affinity or pod.preferred_anti_affinity)
    if ignore_preferred_terms_of_existing_pods and not has_constraints:
        return None
    scores: dict[str, Counter[str]] = {}

    def add(key: str, counts: Mapping[str, int], delta: int) -> None:
        if not counts:
            return
        per_value = scores.get(key)
        if per_value is None:
            per_value = scores[key] = Counter()
        for value, count in counts.items():
            per_value[value] += delta * count

    for weighted in pod.preferred_affinity:
        term = TermKey.of_affinity(weighted.term)
        add(term.topology_key, graph.term_counts(term).by_domain, weighted.weight)
    for weighted in pod.preferred_anti_affinity:
        term = TermKey.of_affinity(weighted.term)
        add(term.topology_key, graph.term_counts(term).by_domain, -weighted.weight)
    kinds = _PREFERRED_AND_HARD if hard_pod_affinity_weight > 0 else _PREFERRED
    for declared in graph.declared_selecting(pod, kinds):
        if declared.kind == REQUIRED_AFFINITY:
            delta = hard_pod_affinity_weight
        elif declared.kind == PREFERRED_AFFINITY:
            delta = declared.weight
        else:
            delta = -declared.weight
        add(declared.term.topology_key, declared.by_domain, delta)
    return scores or None


DomainCounts = tuple[tuple[str, Mapping[str, int]], ...]
"""(topology key, matching pods per value of it) per term; every count is positive."""


@dataclass(frozen=True, slots=True)
class _Required:
    """The plugin's own PreFilter state: :class:`RequiredState`'s counts per term, as the
    graph's index holds them (live views, read before the next patch: within the cycle),
    so Filter turns each into a row mask in one numpy lookup instead of re-keying every
    domain into (key, value) pairs and back (``required_state``'s Counters stay for the
    oracle comparison, preemption and the gang solver)."""

    affinity: DomainCounts
    anti_affinity: DomainCounts
    existing_anti_affinity: DomainCounts
    pod_matches_own_affinity: bool


def _required(graph: AffinityGraph, pod: Pod) -> _Required | None:
    """:func:`required_state` per term; None where kube's PreFilter would Skip."""
    existing = tuple(
        (declared.term.topology_key, declared.by_domain)
        for declared in graph.declared_selecting(pod, _EXISTING_ANTI)
        if declared.by_domain
    )
    if not (existing or pod.required_affinity or pod.required_anti_affinity):
        return None
    affinity_terms = [TermKey.of_affinity(t) for t in pod.required_affinity]
    affinity: DomainCounts = ()
    if len(affinity_terms) == 1:
        term = affinity_terms[0]
        affinity = ((term.topology_key, graph.term_counts(term).by_domain),)
    elif affinity_terms:
        per_term = graph.count_selecting_all(affinity_terms)
        affinity = tuple(
            (term.topology_key, counts)
            for term, counts in zip(affinity_terms, per_term, strict=True)
        )
    anti = tuple(
        (term.topology_key, graph.term_counts(term).by_domain)
        for term in (TermKey.of_affinity(t) for t in pod.required_anti_affinity)
    )
    self_match = bool(affinity_terms) and all(graph.selects_pod(t, pod) for t in affinity_terms)
    return _Required(affinity, anti, existing, self_match)


def _any_domain(snapshot: Snapshot, terms: DomainCounts) -> BoolArray:
    """Nodes in a domain where one of the terms counts a pod."""
    hit = np.zeros(snapshot.num_nodes, dtype=np.bool_)
    for key, counts in terms:
        if counts:
            hit |= snapshot.per_label_value(key, counts) > 0
    return hit


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
        state = _required(snapshot.affinity_graph, pod)
        if state is None:
            return PREFILTER_SKIP
        cycle.state[NAME] = state
        return PREFILTER_SUCCESS

    def filter(self, cycle: Cycle, candidates: BoolArray) -> FilterResult | None:
        state: _Required = cycle.state[NAME]
        pod, snapshot, n = cycle.pod, cycle.snapshot, cycle.num_nodes
        undecided = candidates.copy()
        masks: dict[str, BoolArray] = {}
        if pod.required_affinity:
            # Per key, a domain any term of that key counts a pod in (counts are positive,
            # so "the terms' summed count > 0" is "some term's count > 0").
            keys = {t.topology_key for t in pod.required_affinity}
            has_keys = np.ones(n, dtype=np.bool_)
            pods_exist = np.ones(n, dtype=np.bool_)
            for key in keys:
                has_keys &= snapshot.has_label_mask(key)
                pods_exist &= _any_domain(snapshot, tuple(t for t in state.affinity if t[0] == key))
            # No matching pod anywhere yet: the pod may start the group if it matches itself.
            none_yet = not any(counts for _, counts in state.affinity)
            first_of_group = none_yet and state.pod_matches_own_affinity
            satisfied = has_keys & (pods_exist | first_of_group)
            masks[REASON_AFFINITY] = undecided & ~satisfied
            undecided &= satisfied
        if any(counts for _, counts in state.anti_affinity):
            rejected = _any_domain(snapshot, state.anti_affinity)
            masks[REASON_ANTI_AFFINITY] = undecided & rejected
            undecided &= ~rejected
        if state.existing_anti_affinity:
            rejected = _any_domain(snapshot, state.existing_anti_affinity)
            masks[REASON_EXISTING_ANTI_AFFINITY] = undecided & rejected
        codes = np.zeros(n, dtype=np.int8)
        reasons: list[tuple[str, BoolArray]] = []
        for reason, code in _CODES.items():
            hit = masks.get(reason)
            if hit is not None and hit.any():
                codes[hit] = code
                reasons.append((reason, hit))
        return FilterResult(codes, tuple(reasons)) if reasons else None

    def score(self, cycle: Cycle, feasible: BoolArray) -> IntArray | None:
        pod, snapshot = cycle.pod, cycle.snapshot
        if not (pod.preferred_affinity or pod.preferred_anti_affinity) and (
            self.args.ignore_preferred_terms_of_existing_pods or not snapshot.has_pods_with_affinity
        ):
            return None
        raw = _preferred_raw(
            snapshot,
            pod,
            hard_pod_affinity_weight=self.args.hard_pod_affinity_weight,
            ignore_preferred_terms_of_existing_pods=self.args.ignore_preferred_terms_of_existing_pods,
        )
        return None if raw is None else _normalize(raw, feasible)


def _preferred_raw(
    snapshot: Snapshot,
    pod: Pod,
    *,
    hard_pod_affinity_weight: int,
    ignore_preferred_terms_of_existing_pods: bool,
) -> IntArray | None:
    """Per node row, the sum :func:`topology_scores` gives the node's domains (None where
    it is None), built term by term from the index's counts: the sum is linear, so each
    term's domain counts go to rows in one lookup, without the per-key Counters."""
    graph = snapshot.affinity_graph
    has_constraints = bool(pod.preferred_affinity or pod.preferred_anti_affinity)
    if ignore_preferred_terms_of_existing_pods and not has_constraints:
        return None
    raw = np.zeros(snapshot.num_nodes, dtype=np.int64)
    counted = False
    for weighted in pod.preferred_affinity:
        term = TermKey.of_affinity(weighted.term)
        counts = graph.term_counts(term).by_domain
        if counts:
            raw += weighted.weight * snapshot.per_label_value(term.topology_key, counts)
            counted = True
    for weighted in pod.preferred_anti_affinity:
        term = TermKey.of_affinity(weighted.term)
        counts = graph.term_counts(term).by_domain
        if counts:
            raw -= weighted.weight * snapshot.per_label_value(term.topology_key, counts)
            counted = True
    kinds = _PREFERRED_AND_HARD if hard_pod_affinity_weight > 0 else _PREFERRED
    for declared in graph.declared_selecting(pod, kinds):
        if not declared.by_domain:
            continue
        if declared.kind == REQUIRED_AFFINITY:
            delta = hard_pod_affinity_weight
        elif declared.kind == PREFERRED_AFFINITY:
            delta = declared.weight
        else:
            delta = -declared.weight
        raw += delta * snapshot.per_label_value(declared.term.topology_key, declared.by_domain)
        counted = True
    return raw if counted else None


def _normalize(raw: IntArray, feasible: BoolArray) -> IntArray:
    """The oracle's min-max scaling to 0..100 (Go's float rounding) over feasible rows."""
    out = np.zeros(raw.shape, dtype=np.int64)
    rows = np.flatnonzero(feasible)
    if not len(rows):
        return out
    kept = raw[rows]
    low, high = int(kept.min()), int(kept.max())
    spread = high - low
    if spread > 0:
        out[rows] = (100.0 * ((kept - low).astype(np.float64) / float(spread))).astype(np.int64)
    return out


def new(profile: Profile) -> InterPodAffinity:
    return InterPodAffinity(profile.inter_pod_affinity)
