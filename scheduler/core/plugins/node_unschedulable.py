"""NodeUnschedulable: cordoned nodes (``spec.unschedulable``) reject pods.

A pod passes anyway if it tolerates the ``node.kubernetes.io/unschedulable:NoSchedule``
taint; kube-scheduler checks this per node, we check it once (PreFilter Skip).
"""

from __future__ import annotations

from typing import Final

from scheduler.core.framework import (
    PREFILTER_SKIP,
    PREFILTER_SUCCESS,
    Code,
    Cycle,
    FilterResult,
    PreFilterResult,
)
from scheduler.core.profile import NODE_UNSCHEDULABLE, Profile
from scheduler.core.snapshot import BoolArray

NAME: Final = NODE_UNSCHEDULABLE
REASON: Final = "node(s) were unschedulable"


class NodeUnschedulable:
    name: Final = NAME

    def pre_filter(self, cycle: Cycle) -> PreFilterResult:
        return PREFILTER_SKIP if cycle.tolerates_unschedulable() else PREFILTER_SUCCESS

    def filter(self, cycle: Cycle, candidates: BoolArray) -> FilterResult | None:
        cordoned = cycle.snapshot.unschedulable
        if not cordoned.any():
            return None
        return FilterResult.from_mask(cordoned.copy(), REASON, Code.UNSCHEDULABLE_AND_UNRESOLVABLE)


def new(profile: Profile) -> NodeUnschedulable:
    return NodeUnschedulable()
