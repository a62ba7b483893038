"""NodeName: a pod that names its node (``spec.nodeName``) fits only that node."""

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
from scheduler.core.profile import NODE_NAME, Profile
from scheduler.core.snapshot import BoolArray

NAME: Final = NODE_NAME
REASON: Final = "node(s) didn't match the requested node name"


class NodeName:
    name: Final = NAME

    def pre_filter(self, cycle: Cycle) -> PreFilterResult:
        return PREFILTER_SUCCESS if cycle.pod.node_name else PREFILTER_SKIP

    def filter(self, cycle: Cycle, candidates: BoolArray) -> FilterResult | None:
        other = np.ones(cycle.num_nodes, dtype=np.bool_)
        index = cycle.snapshot.index_of(cycle.pod.node_name)
        if index is not None:
            other[index] = False
        return FilterResult.from_mask(other, REASON, Code.UNSCHEDULABLE_AND_UNRESOLVABLE)


def new(profile: Profile) -> NodeName:
    return NodeName()
