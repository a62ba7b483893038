"""TaintToleration: NoSchedule/NoExecute taints filter, PreferNoSchedule taints score.

Filtering uses the snapshot's node-by-taint matrix: the pod's tolerations are checked once
per *distinct* taint, then one vector operation finds the nodes carrying an untolerated one.
Scoring counts untolerated PreferNoSchedule taints (only tolerations with an empty or
PreferNoSchedule effect count) and normalises in reverse: fewer taints, higher score.
"""

from __future__ import annotations

from typing import Final

from scheduler.core.framework import Code, Cycle, FilterResult
from scheduler.core.plugins._normalize import default_normalize
from scheduler.core.profile import TAINT_TOLERATION, Profile
from scheduler.core.snapshot import BoolArray, IntArray

NAME: Final = TAINT_TOLERATION
REASON: Final = "node(s) had untolerated taint(s)"


class TaintToleration:
    name: Final = NAME

    def filter(self, cycle: Cycle, candidates: BoolArray) -> FilterResult | None:
        untolerated = cycle.untolerated_taint_mask()
        if not untolerated.any():
            return None
        return FilterResult.from_mask(untolerated, REASON, Code.UNSCHEDULABLE_AND_UNRESOLVABLE)

    def score(self, cycle: Cycle, feasible: BoolArray) -> IntArray | None:
        return default_normalize(cycle.untolerated_soft_taint_counts(), feasible, reverse=True)


def new(profile: Profile) -> TaintToleration:
    return TaintToleration()
