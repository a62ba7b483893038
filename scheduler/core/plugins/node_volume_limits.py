"""NodeVolumeLimits: a node's CSI attach limits bound the unique volumes per driver (kube 1.34).

Each claim of a pod becomes ``driver/handle``: from the bound PV's ``spec.csi``, or, for a
claim without a PV yet, from its StorageClass's provisioner with a handle unique to the
claim (kube's random prefix), an in-tree provisioner counting under its CSI driver once the
node migrates it. For every node whose CSINode lists ``allocatable.count`` for a driver the
pod needs, the volumes of the pods already there and the node's VolumeAttachments are
counted once each (a volume shared with a pod on the node costs nothing more); if any
driver would exceed its count the node is Unschedulable "node(s) exceed max volume count".

Not modelled (as kube, these need csi-translation-lib): in-tree PVs and inline in-tree
disks translated to CSI handles; such PVs are not counted, and pods with inline in-tree
disks are refused by Unsupported.
"""

from __future__ import annotations

from collections import Counter
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
from scheduler.core.profile import NODE_VOLUME_LIMITS, Profile
from scheduler.core.snapshot import BoolArray
from scheduler.core.volumes import VolumeState, ephemeral_owner_error, pod_claims
from scheduler.model.pod import Pod
from scheduler.model.volume import CSINode, PersistentVolumeClaim, VolumeAttachment

NAME: Final = NODE_VOLUME_LIMITS
REASON: Final = "node(s) exceed max volume count"
UNBOUND_PREFIX: Final = "lattice-unbound"
"""Stands for kube's random prefix of unbound claims' handles (never a real handle)."""
_MIGRATED_WITH_CSINODE: Final = {
    "kubernetes.io/aws-ebs": "ebs.csi.aws.com",
    "kubernetes.io/gce-pd": "pd.csi.storage.gke.io",
    "kubernetes.io/azure-disk": "disk.csi.azure.com",
    "kubernetes.io/cinder": "cinder.csi.openstack.org",
}
"""In-tree provisioners whose migration kube takes as on whenever the node has a CSINode."""
_MIGRATED_BY_ANNOTATION: Final = {"kubernetes.io/portworx-volume": "pxd.portworx.com"}
_MIGRATABLE_NEVER_ON: Final = frozenset(
    {"kubernetes.io/azure-file", "kubernetes.io/vsphere-volume"}
)
"""Migratable in kube's translator, but ``isCSIMigrationOn`` is false for them: not counted."""


def _driver_from_class(
    pvc: PersistentVolumeClaim, volumes: VolumeState, csi_node: CSINode | None
) -> str:
    if not pvc.storage_class:
        return ""
    storage_class = volumes.classes.get(pvc.storage_class)
    if storage_class is None:
        return ""
    provisioner = storage_class.provisioner
    if provisioner in _MIGRATED_WITH_CSINODE:
        return _MIGRATED_WITH_CSINODE[provisioner] if csi_node is not None else ""
    if provisioner in _MIGRATED_BY_ANNOTATION:
        migrated = csi_node is not None and provisioner in csi_node.migrated_plugins
        return _MIGRATED_BY_ANNOTATION[provisioner] if migrated else ""
    if provisioner in _MIGRATABLE_NEVER_ON:
        return ""
    return provisioner


def attachable_volumes(
    pod: Pod, volumes: VolumeState, csi_node: CSINode | None, *, incoming: bool
) -> dict[str, str] | str:
    """``filterAttachableVolumes``: unique volume name -> driver, or why the incoming pod
    cannot be counted (its claim is missing or not its own)."""
    out: dict[str, str] = {}
    for claim, ephemeral in pod_claims(pod):
        pvc = volumes.pvcs.get((pod.namespace, claim))
        if pvc is None:
            if incoming:
                return (
                    f"looking up PVC {pod.namespace}/{claim}: "
                    f'persistentvolumeclaim "{claim}" not found'
                )
            continue
        if ephemeral and (error := ephemeral_owner_error(pod, pvc)) is not None:
            if incoming:
                return error
            continue
        pv = volumes.pvs.get(pvc.volume_name) if pvc.volume_name else None
        if pv is None:
            driver = _driver_from_class(pvc, volumes, csi_node)
            handle = f"{UNBOUND_PREFIX}-{pvc.namespace}/{pvc.name}"
        else:
            driver, handle = pv.csi_driver, pv.csi_handle
        if driver and handle:
            out[f"{driver}/{handle}"] = driver
    return out


class NodeVolumeLimits:
    name: Final = NAME

    def pre_filter(self, cycle: Cycle) -> PreFilterResult:
        if cycle.volumes is None or not pod_claims(cycle.pod):
            return PREFILTER_SKIP
        return PREFILTER_SUCCESS

    def _attachments(self, cycle: Cycle, volumes: VolumeState) -> dict[str, list[VolumeAttachment]]:
        def index() -> dict[str, list[VolumeAttachment]]:
            by_node: dict[str, list[VolumeAttachment]] = {}
            for va in volumes.attachments.values():
                by_node.setdefault(va.node_name, []).append(va)
            return by_node

        return cycle.memo(f"{NAME}/attachments", index)

    def filter(self, cycle: Cycle, candidates: BoolArray) -> FilterResult | None:
        volumes = cycle.volumes
        if volumes is None:
            return None
        snap, pod = cycle.snapshot, cycle.pod
        exceeded = np.zeros(snap.num_nodes, dtype=np.bool_)
        unresolvable = np.zeros(snap.num_nodes, dtype=np.bool_)
        messages: dict[str, BoolArray] = {}
        names = snap.node_names
        for row in np.flatnonzero(candidates):
            csi_node = volumes.csi_nodes.get(names[row])
            new = attachable_volumes(pod, volumes, csi_node, incoming=True)
            if isinstance(new, str):
                unresolvable[row] = True
                messages.setdefault(new, np.zeros(snap.num_nodes, dtype=np.bool_))[row] = True
                continue
            if not new or csi_node is None or not csi_node.limits:
                continue
            attached: dict[str, str] = {}
            for existing in snap.pods_on(int(row)):
                found = attachable_volumes(existing, volumes, csi_node, incoming=False)
                assert not isinstance(found, str)
                attached.update(found)
            counts: Counter[str] = Counter(attached.values())
            for name in attached:
                new.pop(name, None)
            on_node: dict[str, str] = {}
            for va in self._attachments(cycle, volumes).get(names[row], ()):
                pv = volumes.pvs.get(va.pv_name) if va.pv_name is not None else None
                if va.attacher and pv is not None and pv.csi_driver:
                    on_node[f"{va.attacher}/{pv.csi_handle}"] = va.attacher
            # kube dedupes attachments against the pods' volumes, not against the new pod's.
            counts.update(d for name, d in on_node.items() if name not in attached)
            wanted = Counter(new.values())
            exceeded[row] = any(
                counts[driver] + count > csi_node.limits[driver]
                for driver, count in wanted.items()
                if driver in csi_node.limits
            )
        if not exceeded.any() and not unresolvable.any():
            return None
        codes = np.where(exceeded, np.int8(Code.UNSCHEDULABLE), np.int8(0))
        codes = np.where(unresolvable, np.int8(Code.UNSCHEDULABLE_AND_UNRESOLVABLE), codes)
        reasons = tuple(messages.items()) + (((REASON, exceeded),) if exceeded.any() else ())
        return FilterResult(codes.astype(np.int8), reasons)


def new(profile: Profile) -> NodeVolumeLimits:
    return NodeVolumeLimits()
