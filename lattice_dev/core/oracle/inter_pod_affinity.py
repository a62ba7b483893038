"""Reference semantics of InterPodAffinity (filter and score), after kube-scheduler v1.34.

Terms are matched with ``AffinityTerm.Matches`` semantics:

* a term *of the incoming pod* matches an existing pod when the existing pod's namespace is
  in the term's namespaces, or its namespace's labels match the term's namespaceSelector,
  and its labels match the label selector. kube-scheduler evaluates the selector part with
  ``Matches(pod, nil)`` after copying selected namespaces into the term, so a namespace
  selector that matches an *empty* label set (``{}``, NotIn, DoesNotExist) matches every
  namespace. We reproduce that quirk.
* a term *of an existing pod* matches the incoming pod when the incoming pod's namespace is
  in the term's namespaces or the incoming namespace's labels match the namespaceSelector.

Required affinity counts existing pods that match *all* of the incoming pod's affinity terms,
per (topologyKey, value) of the node they run on; a node passes when, for every term, its
value for the term's key has a positive count. If no such pod exists anywhere and the incoming
pod matches all its own terms, it may go anywhere that has the topology keys (the first pod
of a group). Anti-affinity works per term. Existing pods' required anti-affinity terms that
match the incoming pod forbid their whole topology domain.
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Iterable, Mapping, Sequence
from typing import Final

# The reasons, the PreFilter state and the incoming-term rule are the plugin's (the runtime
# never imports this reference); the loops below are the reference.
from scheduler.core.plugins.inter_pod_affinity import (
    REASON_AFFINITY,
    REASON_ANTI_AFFINITY,
    REASON_EXISTING_ANTI_AFFINITY,
    RequiredState,
    TopologyPair,
    incoming_term_matches,
)
from scheduler.core.snapshot import Snapshot
from scheduler.model.pod import Pod, PodAffinityTerm, WeightedPodAffinityTerm

_NO_LABELS: Final[Mapping[str, str]] = {}


def existing_term_matches(
    term: PodAffinityTerm, incoming: Pod, incoming_namespace_labels: Mapping[str, str]
) -> bool:
    """Whether a term of an existing pod selects the incoming pod."""
    if incoming.namespace not in term.namespaces and not term.namespace_selector.matches(
        incoming_namespace_labels
    ):
        return False
    return term.selector.matches(incoming.labels)


def _namespace_labels(snapshot: Snapshot, namespace: str) -> Mapping[str, str]:
    return snapshot.namespace_labels(namespace) or _NO_LABELS


def required_state(snapshot: Snapshot, pod: Pod) -> RequiredState:
    affinity: Counter[TopologyPair] = Counter()
    anti: Counter[TopologyPair] = Counter()
    existing_anti: Counter[TopologyPair] = Counter()
    ns_labels = _namespace_labels(snapshot, pod.namespace)
    for existing, i in snapshot.pods_with_required_anti_affinity():
        node_labels = snapshot.node(i).labels
        for term in existing.required_anti_affinity:
            if term.topology_key in node_labels and existing_term_matches(term, pod, ns_labels):
                existing_anti[(term.topology_key, node_labels[term.topology_key])] += 1
    if pod.required_affinity or pod.required_anti_affinity:
        for i in range(snapshot.num_nodes):
            node_labels = snapshot.node(i).labels
            for existing in snapshot.pods_on(i):
                if pod.required_affinity and all(
                    incoming_term_matches(t, existing, snapshot) for t in pod.required_affinity
                ):
                    for t in pod.required_affinity:
                        if t.topology_key in node_labels:
                            affinity[(t.topology_key, node_labels[t.topology_key])] += 1
                for t in pod.required_anti_affinity:
                    if t.topology_key in node_labels and incoming_term_matches(
                        t, existing, snapshot
                    ):
                        anti[(t.topology_key, node_labels[t.topology_key])] += 1
    self_match = bool(pod.required_affinity) and all(
        incoming_term_matches(t, pod, snapshot) for t in pod.required_affinity
    )
    return RequiredState(
        affinity,
        anti,
        existing_anti,
        self_match,
        bool(pod.required_affinity or pod.required_anti_affinity),
    )


def filter_node(state: RequiredState, pod: Pod, node_labels: Mapping[str, str]) -> str | None:
    """The rejection reason for one node, or None when the node passes (kube's order)."""
    if not _satisfies_affinity(state, pod, node_labels):
        return REASON_AFFINITY
    if state.anti_affinity_counts:
        for term in pod.required_anti_affinity:
            value = node_labels.get(term.topology_key)
            if value is not None and state.anti_affinity_counts[(term.topology_key, value)] > 0:
                return REASON_ANTI_AFFINITY
    if state.existing_anti_affinity_counts:
        for pair in node_labels.items():
            if state.existing_anti_affinity_counts[pair] > 0:
                return REASON_EXISTING_ANTI_AFFINITY
    return None


def _satisfies_affinity(state: RequiredState, pod: Pod, node_labels: Mapping[str, str]) -> bool:
    pods_exist = True
    for term in pod.required_affinity:
        value = node_labels.get(term.topology_key)
        if value is None:
            return False
        if state.affinity_counts[(term.topology_key, value)] <= 0:
            pods_exist = False
    if pods_exist:
        return True
    # No matching pod anywhere yet: the pod may start the group if it matches its own terms.
    return not state.affinity_counts and state.pod_matches_own_affinity


def preferred_topology_scores(
    snapshot: Snapshot,
    pod: Pod,
    *,
    hard_pod_affinity_weight: int,
    ignore_preferred_terms_of_existing_pods: bool,
) -> dict[str, Counter[str]] | None:
    """Score contributions per topology key and value; None when PreScore would Skip.

    Mirrors ``processExistingPod``: for every existing pod on a labelled node, the incoming
    pod's preferred (anti-)affinity terms that select it, the existing pod's required
    affinity terms (weighted by ``hard_pod_affinity_weight``) and preferred (anti-)affinity
    terms that select the incoming pod add their weight to the existing pod's topology domain.
    """
    has_constraints = bool(pod.preferred_affinity or pod.preferred_anti_affinity)
    if ignore_preferred_terms_of_existing_pods and not has_constraints:
        return None
    ns_labels = _namespace_labels(snapshot, pod.namespace)
    scores: dict[str, Counter[str]] = {}

    def bump(term: PodAffinityTerm, labels: Mapping[str, str], delta: int) -> None:
        if term.topology_key in labels:
            key = term.topology_key
            scores.setdefault(key, Counter())[labels[key]] += delta

    def incoming(
        terms: Iterable[WeightedPodAffinityTerm], target: Pod, labels: Mapping[str, str], sign: int
    ) -> None:
        for wt in terms:
            if incoming_term_matches(wt.term, target, snapshot):
                bump(wt.term, labels, sign * wt.weight)

    def existing(
        terms: Iterable[WeightedPodAffinityTerm], labels: Mapping[str, str], sign: int
    ) -> None:
        for wt in terms:
            if existing_term_matches(wt.term, pod, ns_labels):
                bump(wt.term, labels, sign * wt.weight)

    if has_constraints:
        located: Sequence[tuple[Pod, int]] = [
            (p, i) for i in range(snapshot.num_nodes) for p in snapshot.pods_on(i)
        ]
    else:
        located = snapshot.pods_with_affinity()
    for other, i in located:
        labels = snapshot.node(i).labels
        if not labels:
            continue
        incoming(pod.preferred_affinity, other, labels, +1)
        incoming(pod.preferred_anti_affinity, other, labels, -1)
        if hard_pod_affinity_weight > 0:
            for term in other.required_affinity:
                if existing_term_matches(term, pod, ns_labels):
                    bump(term, labels, hard_pod_affinity_weight)
        # kube-scheduler applies existing pods' preferred terms even when
        # IgnorePreferredTermsOfExistingPods is set; the flag only enables the Skip above.
        existing(other.preferred_affinity, labels, +1)
        existing(other.preferred_anti_affinity, labels, -1)
    return scores or None


def node_score(scores: Mapping[str, Counter[str]], node_labels: Mapping[str, str]) -> int:
    return sum(values[node_labels[key]] for key, values in scores.items() if key in node_labels)


def normalize(raw: Sequence[int]) -> list[int]:
    """InterPodAffinity.NormalizeScore: min-max scaled to 0..100 with Go's float rounding."""
    if not raw:
        return []
    low, high = min(raw), max(raw)
    spread = high - low
    if spread <= 0:
        return [0] * len(raw)
    return [int(100.0 * (float(s - low) / float(spread))) for s in raw]
