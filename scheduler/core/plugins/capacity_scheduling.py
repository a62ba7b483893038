"""CapacityScheduling: scheduler-plugins' ElasticQuota admission, as a PreFilter.

A pod of a namespace with an ElasticQuota is refused, before any node is looked at, when
its quota's use plus its request would pass the quota's ``max``, or the use of all quotas
plus its request would pass the sum of their ``min`` (:func:`scheduler.core.quota.admit`,
nominated pods' room counted as upstream counts it). Pods of other namespaces, and every
pod of a cycle that carries no quotas (``Cycle.quota`` None: simulations, preemption's dry
runs, tests), skip it. The plugin has no Filter of its own: the verdict is the pod's.

The refusal is Unschedulable, as upstream's: every node is then a potential node for the
PostFilter, whose reclaim rules (:mod:`scheduler.core.reclaim`, applied by
:mod:`scheduler.core.preemption` whenever quotas exist) may evict borrowers' pods for a
pod whose quota is below its min, even where nodes still have room; the dry run checks the
quota with the victims gone itself (it skips this PreFilter). When nothing can be
reclaimed, the pod waits for an event that frees quota: a pod of a quota namespace deleted
or finished, or a quota changed.
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
from scheduler.core.profile import CAPACITY_SCHEDULING, Profile
from scheduler.core.quota import admit, charged
from scheduler.core.snapshot import BoolArray

NAME: Final = CAPACITY_SCHEDULING


class CapacityScheduling:
    name: Final = NAME

    def pre_filter(self, cycle: Cycle) -> PreFilterResult:
        context = cycle.quota
        pod = cycle.pod
        if context is None or not context.snapshot.governs(pod.namespace):
            return PREFILTER_SKIP
        verdict = admit(
            context.snapshot,
            pod.namespace,
            charged(pod, cycle.dra),
            priority=pod.priority,
            nominated=context.others(pod.uid),
        )
        if verdict.admitted:
            # Success, not Skip: the verdict was given (and a Skip would name the plugin
            # among those skipped in explanations).
            return PREFILTER_SUCCESS
        return PreFilterResult(Code.UNSCHEDULABLE, verdict.message)

    def filter(self, cycle: Cycle, candidates: BoolArray) -> FilterResult | None:
        return None  # every node passes: the PreFilter judged the pod as a whole


def new(profile: Profile) -> CapacityScheduling:
    return CapacityScheduling()
