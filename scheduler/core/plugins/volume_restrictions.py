"""VolumeRestrictions: inline disks shared with a pod on the node, and ReadWriteOncePod claims
already mounted elsewhere, block the pod (kube 1.34).

Disk conflicts (``isVolumeConflict``): an incoming inline disk conflicts with a volume of
a pod already on the node when both are

* GCE PDs with the same ``pdName``, unless both are read-only;
* AWS EBS volumes with the same ``volumeID`` (compared as written: kube does not normalise
  ``aws://zone/vol-x`` here);
* iSCSI volumes with the same ``iqn`` (portal and lun are not compared), unless both are
  read-only;
* RBD volumes sharing a monitor, with the same pool (default ``rbd``) and image, unless
  both are read-only.

Such a node is Unschedulable "node(s) had no available disk" (deleting the other pod, or
preempting it, frees the disk). The check needs only the snapshot, so it runs with or
without a VolumeState; it walks the pods of candidate nodes that have pods, and of those
only the pods with inline disks of the same source are compared.

ReadWriteOncePod: kube 1.34's PreFilter reads every ``persistentVolumeClaim`` volume's
claim (a missing one rejects the pod: 'persistentvolumeclaim "x" not found') and counts
the pod's ReadWriteOncePod claims that some placed pod already uses (the VolumeState keeps
kube's PVCRefCounts); if any, Filter rejects every node as Unschedulable (preemption of the
holder could help), after the disk check, exactly as kube does.

PreFilter skips the pod when it has no conflict-checked disk and no claim in use, as kube.
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence
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
from scheduler.model.pod import PERSISTENT_VOLUME_CLAIM, StorageVolume
from scheduler.model.volume import READ_WRITE_ONCE_POD

NAME: Final = VOLUME_RESTRICTIONS
REASON_RWOP: Final = (
    "node(s) unavailable due to PersistentVolumeClaim with ReadWriteOncePod access mode "
    "already in-use by another pod"
)
REASON_DISK: Final = "node(s) had no available disk"
GCE_PD: Final = "gcePersistentDisk"
AWS_EBS: Final = "awsElasticBlockStore"
ISCSI: Final = "iscsi"
RBD: Final = "rbd"
CONFLICT_SOURCES: Final = frozenset({GCE_PD, AWS_EBS, ISCSI, RBD})
"""kube's ``needsRestrictionsCheck``: the inline sources whose disks can conflict."""
_STATE: Final = NAME


def disks_conflict(disk: StorageVolume, existing: StorageVolume) -> bool:
    """Whether the incoming ``disk`` cannot share a node with ``existing`` (one volume of a
    pod already there)."""
    if disk.source != existing.source or disk.disk != existing.disk:
        return False
    both_read_only = disk.read_only and existing.read_only
    if disk.source == AWS_EBS:
        return True
    if disk.source in (GCE_PD, ISCSI):
        return not both_read_only
    if disk.source == RBD:
        return (
            disk.pool == existing.pool
            and not disk.monitors.isdisjoint(existing.monitors)
            and not both_read_only
        )
    return False


def conflict_disks(volumes: Iterable[StorageVolume]) -> tuple[StorageVolume, ...]:
    return tuple(v for v in volumes if v.source in CONFLICT_SOURCES)


def conflicts_with(disks: Sequence[StorageVolume], volumes: Iterable[StorageVolume]) -> bool:
    """``!satisfyVolumeConflicts`` for one existing pod's volumes."""
    return any(disks_conflict(d, v) for v in volumes if v.source in CONFLICT_SOURCES for d in disks)


class VolumeRestrictions:
    name: Final = NAME

    def pre_filter(self, cycle: Cycle) -> PreFilterResult:
        volumes, pod = cycle.volumes, cycle.pod
        disks = conflict_disks(pod.storage_volumes)
        conflicting = 0
        if volumes is not None:
            seen: set[str] = set()
            for v in pod.storage_volumes:
                if v.source != PERSISTENT_VOLUME_CLAIM:
                    continue
                pvc = volumes.pvcs.get((pod.namespace, v.claim))
                if pvc is None:
                    return PreFilterResult(
                        Code.UNSCHEDULABLE_AND_UNRESOLVABLE,
                        not_found("persistentvolumeclaim", v.claim),
                    )
                if READ_WRITE_ONCE_POD in pvc.access_modes and pvc.name not in seen:
                    seen.add(pvc.name)
                    conflicting += volumes.claim_in_use(pod.namespace, pvc.name)
        if not disks and not conflicting:
            return PREFILTER_SKIP
        cycle.state[_STATE] = (disks, conflicting)
        return PREFILTER_SUCCESS

    def filter(self, cycle: Cycle, candidates: BoolArray) -> FilterResult | None:
        state: tuple[tuple[StorageVolume, ...], int] | None = cycle.state.get(_STATE)
        if state is None:
            return None
        disks, conflicting = state
        snap = cycle.snapshot
        num_nodes = cycle.num_nodes
        disk_conflict = np.zeros(num_nodes, dtype=np.bool_)
        if disks:
            rows = np.flatnonzero(candidates[:num_nodes] & (snap.pod_counts > 0))
            for row in rows.tolist():
                disk_conflict[row] = any(
                    conflicts_with(disks, p.storage_volumes)
                    for p in snap.pods_on(row)
                    if p.storage_volumes
                )
        if conflicting:
            codes = np.full(num_nodes, np.int8(Code.UNSCHEDULABLE), dtype=np.int8)
            rwop = ~disk_conflict
            reasons = ((REASON_DISK, disk_conflict), (REASON_RWOP, rwop))
            return FilterResult(codes, tuple((r, m) for r, m in reasons if m.any()))
        if not disk_conflict.any():
            return None
        return FilterResult.from_mask(disk_conflict, REASON_DISK, Code.UNSCHEDULABLE)


def new(profile: Profile) -> VolumeRestrictions:
    return VolumeRestrictions()
