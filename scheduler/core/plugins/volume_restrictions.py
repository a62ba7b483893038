"""VolumeRestrictions: a ReadWriteOncePod claim already mounted elsewhere blocks the pod.

kube 1.34's PreFilter reads every ``persistentVolumeClaim`` volume's claim (a missing one
rejects the pod: 'persistentvolumeclaim "x" not found') and counts the pod's
ReadWriteOncePod claims that some placed pod already uses (the VolumeState keeps kube's
PVCRefCounts). None, and no inline disk to check: Skip. Filter then rejects every node as
Unschedulable (preemption of the holder could help), exactly as kube does.

kube's other check here, inline GCE PD / AWS EBS / RBD / iSCSI disks shared with a pod on
the node ("node(s) had no available disk"), needs the disks' identities, which the Pod
model does not carry yet; pods with such disks are still refused by Unsupported.
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
from scheduler.core.profile import VOLUME_RESTRICTIONS, Profile
from scheduler.core.snapshot import BoolArray
from scheduler.core.volumes import not_found
from scheduler.model.pod import PERSISTENT_VOLUME_CLAIM
from scheduler.model.volume import READ_WRITE_ONCE_POD

NAME: Final = VOLUME_RESTRICTIONS
REASON_RWOP: Final = (
    "node(s) unavailable due to PersistentVolumeClaim with ReadWriteOncePod access mode "
    "already in-use by another pod"
)
REASON_DISK: Final = "node(s) had no available disk"
_STATE: Final = NAME


class VolumeRestrictions:
    name: Final = NAME

    def pre_filter(self, cycle: Cycle) -> PreFilterResult:
        volumes, pod = cycle.volumes, cycle.pod
        if volumes is None:
            return PREFILTER_SKIP
        conflicting = 0
        seen: set[str] = set()
        for v in pod.storage_volumes:
            if v.source != PERSISTENT_VOLUME_CLAIM:
                continue
            pvc = volumes.pvcs.get((pod.namespace, v.claim))
            if pvc is None:
                return PreFilterResult(
                    Code.UNSCHEDULABLE_AND_UNRESOLVABLE, not_found("persistentvolumeclaim", v.claim)
                )
            if READ_WRITE_ONCE_POD in pvc.access_modes and pvc.name not in seen:
                seen.add(pvc.name)
                conflicting += volumes.claim_in_use(pod.namespace, pvc.name)
        if not conflicting:
            return PREFILTER_SKIP
        cycle.state[_STATE] = conflicting
        return PREFILTER_SUCCESS

    def filter(self, cycle: Cycle, candidates: BoolArray) -> FilterResult | None:
        if not cycle.state.get(_STATE):
            return None
        every = np.ones(cycle.num_nodes, dtype=np.bool_)
        return FilterResult.from_mask(every, REASON_RWOP, Code.UNSCHEDULABLE)


def new(profile: Profile) -> VolumeRestrictions:
    return VolumeRestrictions()
