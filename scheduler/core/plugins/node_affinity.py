"""NodeAffinity: ``spec.nodeSelector`` and required node affinity filter; preferred terms score.

PreFilter skips pods with neither. When every required term pins ``metadata.name`` with
In, PreFilter narrows the candidates to those names (kube's PreFilterResult); nodes outside
are then reported as "node(s) didn't satisfy plugin(s) [NodeAffinity]", and an empty
intersection rejects the pod outright ("pod affinity terms conflict").

Filtering evaluates each requirement as one vector operation over the snapshot's label
columns. Scoring sums the weights of matching preferred terms, scaled to 0..100 by the max.
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
from scheduler.core.plugins._normalize import default_normalize
from scheduler.core.profile import NODE_AFFINITY, Profile
from scheduler.core.snapshot import BoolArray, IntArray
from scheduler.model.selectors import NODE_NAME_FIELD, Operator

NAME: Final = NODE_AFFINITY
REASON: Final = "node(s) didn't match Pod's node affinity/selector"
REASON_CONFLICT: Final = "pod affinity terms conflict"


class NodeAffinity:
    name: Final = NAME

    def pre_filter(self, cycle: Cycle) -> PreFilterResult:
        pod = cycle.pod
        required = pod.required_node_affinity
        if required is None:
            return PREFILTER_SKIP if pod.node_selector is None else PREFILTER_SUCCESS
        if required.raw_term_count == 0 or required.has_empty_term:
            return PREFILTER_SUCCESS
        names: set[str] = set()
        for term in required.terms:
            term_names: set[str] | None = None
            for f in term.match_fields:
                if f.key == NODE_NAME_FIELD and f.operator is Operator.IN:
                    term_names = {f.value} if term_names is None else term_names & {f.value}
            if term_names is None:
                return PREFILTER_SUCCESS
            names |= term_names
        if not names:
            return PreFilterResult(Code.UNSCHEDULABLE_AND_UNRESOLVABLE, REASON_CONFLICT)
        return PreFilterResult(node_names=frozenset(names))

    def filter(self, cycle: Cycle, candidates: BoolArray) -> FilterResult | None:
        matches = cycle.required_node_affinity_mask()
        return FilterResult.from_mask(~matches, REASON, Code.UNSCHEDULABLE_AND_UNRESOLVABLE)

    def score(self, cycle: Cycle, feasible: BoolArray) -> IntArray | None:
        terms = cycle.pod.preferred_node_affinity
        if not terms:
            return None
        snapshot = cycle.snapshot
        raw = np.zeros(cycle.num_nodes, dtype=np.int64)
        for preferred in terms:
            raw += np.where(snapshot.term_mask(preferred.term), preferred.weight, 0)
        return default_normalize(raw, feasible, reverse=False)


def new(profile: Profile) -> NodeAffinity:
    return NodeAffinity()
