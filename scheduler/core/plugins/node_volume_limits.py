"""NodeVolumeLimits: CSI attach limits bound the unique volumes per driver (kube 1.35-1.37).

Each claim of a pod becomes ``driver/handle``: from the bound PV's ``spec.csi``, or, for a
claim without a PV yet, from its StorageClass's provisioner with a handle unique to the
claim (kube's random prefix), an in-tree provisioner counting under its CSI driver once the
node migrates it. An inline in-tree disk counts too once its plugin is migrated on the node
(``isCSIMigrationOn``: GCE PD, AWS EBS, Azure Disk and Cinder whenever the node has a
CSINode; Portworx too from 1.36, in 1.35 only when the CSINode lists
``kubernetes.io/portworx-volume`` in its ``storage.alpha.kubernetes.io/migrated-plugins``
annotation; never azureFile, vsphereVolume, rbd or iscsi), under csi-translation-lib's
handle: ``projects/UNSPECIFIED/zones/UNSPECIFIED/disks/<pdName>``, the EBS volume ID
without its ``aws://<zone>/`` prefix, the azureDisk ``diskURI``, the cinder or portworx
``volumeID``. For every node whose CSINode
lists ``allocatable.count`` for a driver the pod needs, the volumes of the pods already
there and the node's VolumeAttachments are counted once each (a volume shared with a pod on
the node costs nothing more); if any driver would exceed its count the node is
Unschedulable "node(s) exceed max volume count".

From 1.37 (VolumeLimitScaling, KEP-5030: alpha and off in 1.35-1.36, beta and on in 1.37),
before the limits: a node whose CSINode (if any) does not list a driver of the pod's new
volumes is Unschedulable "<driver> CSI driver is not installed on the node" when that
driver's CSIDriver sets ``preventPodSchedulingIfMissing``; a driver without a CSIDriver
object, or without the flag, is let through as before. kube names the first such driver in
map order; Lattice the first in the pod's volume order.

An EBS ``volumeID`` kube cannot translate (``aws://`` with no ``vol-...`` ID) is an error
in kube that aborts the pod's whole attempt; here every candidate node rejects the pod
(UnschedulableAndUnresolvable) with kube's message, so it is never bound either.

Not modelled (as kube, these need csi-translation-lib): in-tree PVs translated to CSI
handles; such PVs are not counted.
"""

from __future__ import annotations

import re
from collections import Counter
from dataclasses import dataclass
from typing import Final
from urllib.parse import unquote

import numpy as np

from scheduler.core.framework import (
    PREFILTER_SKIP,
    PREFILTER_SUCCESS,
    Code,
    Cycle,
    FilterResult,
    PreFilterResult,
)
from scheduler.core.profile import DEFAULT_KUBE_MINOR, NODE_VOLUME_LIMITS, Profile
from scheduler.core.snapshot import BoolArray
from scheduler.core.volumes import VolumeState, ephemeral_owner_error, pod_claims
from scheduler.model.pod import EPHEMERAL, Pod, StorageVolume
from scheduler.model.volume import CSINode, PersistentVolumeClaim, VolumeAttachment

NAME: Final = NODE_VOLUME_LIMITS
REASON: Final = "node(s) exceed max volume count"
VOLUME_LIMIT_SCALING_SINCE: Final = 37
"""VolumeLimitScaling is beta and on from 1.37 (alpha and off in 1.35-1.36)."""
UNBOUND_PREFIX: Final = "lattice-unbound"
"""Stands for kube's random prefix of unbound claims' handles (never a real handle)."""
_MIGRATED_WITH_CSINODE: Final = {
    "kubernetes.io/aws-ebs": "ebs.csi.aws.com",
    "kubernetes.io/gce-pd": "pd.csi.storage.gke.io",
    "kubernetes.io/azure-disk": "disk.csi.azure.com",
    "kubernetes.io/cinder": "cinder.csi.openstack.org",
}
"""In-tree provisioners whose migration kube takes as on whenever the node has a CSINode."""
PORTWORX_PLUGIN: Final = "kubernetes.io/portworx-volume"
_MIGRATED_BY_ANNOTATION: Final = {PORTWORX_PLUGIN: "pxd.portworx.com"}
_MIGRATABLE_NEVER_ON: Final = frozenset(
    {"kubernetes.io/azure-file", "kubernetes.io/vsphere-volume"}
)
"""Migratable in kube's translator, but ``isCSIMigrationOn`` is false for them: not counted."""
INLINE_PLUGINS: Final = {
    "gcePersistentDisk": "kubernetes.io/gce-pd",
    "awsElasticBlockStore": "kubernetes.io/aws-ebs",
    "azureDisk": "kubernetes.io/azure-disk",
    "cinder": "kubernetes.io/cinder",
    "portworxVolume": PORTWORX_PLUGIN,
}
"""Inline sources ``isCSIMigrationOn`` can be true for, by in-tree plugin name (azureFile,
vsphereVolume, rbd and iscsi never count: kube skips them before translating)."""
GCE_HANDLE_PREFIX: Final = "projects/UNSPECIFIED/zones/UNSPECIFIED/disks/"
_EBS_ID: Final = re.compile(r"^vol-[^/]*$")


class TranslationError(ValueError):
    """kube's ``TranslateInTreeInlineVolumeToCSI`` fails for this volume."""


PORTWORX_ALWAYS_SINCE: Final = 36
"""From 1.36 ``isCSIMigrationOn`` takes Portworx as migrated on every node with a CSINode (the
CSIMigrationPortworx gate and the migrated-plugins annotation check are gone)."""


def _migration_on(plugin: str, csi_node: CSINode | None, kube_minor: int) -> bool:
    """``isCSIMigrationOn`` of the release."""
    if csi_node is None:
        return False
    if plugin in _MIGRATED_WITH_CSINODE:
        return True
    if plugin not in _MIGRATED_BY_ANNOTATION:
        return False
    return kube_minor >= PORTWORX_ALWAYS_SINCE or plugin in csi_node.migrated_plugins


def ebs_volume_id(kubernetes_id: str) -> str:
    """``KubernetesVolumeIDToEBSVolumeID``: ``aws://<zone>/vol-x`` and ``aws:///vol-x`` are
    ``vol-x``; anything else not starting with ``aws://`` is taken as the bare ID."""
    if not kubernetes_id.startswith("aws://"):
        return kubernetes_id
    _, _, path = kubernetes_id[len("aws://") :].partition("/")
    aws_id = unquote(path).strip("/")
    if not _EBS_ID.match(aws_id):
        raise TranslationError(
            "failed to translate Kubernetes ID to EBS Volume ID "
            f"Invalid format for AWS volume ({kubernetes_id})"
        )
    return aws_id


def inline_csi_volume(
    volume: StorageVolume, csi_node: CSINode | None, kube_minor: int = DEFAULT_KUBE_MINOR
) -> tuple[str, str] | None:
    """``checkAttachableInlineVolume``: (driver, handle) of an inline disk that counts on the
    node, None when it does not. Raises :class:`TranslationError` with kube's message."""
    plugin = INLINE_PLUGINS.get(volume.source)
    if plugin is None or not _migration_on(plugin, csi_node, kube_minor):
        return None
    driver = _MIGRATED_WITH_CSINODE.get(plugin) or _MIGRATED_BY_ANNOTATION[plugin]
    handle = volume.disk
    if volume.source == "gcePersistentDisk":
        handle = GCE_HANDLE_PREFIX + volume.disk
    elif volume.source == "awsElasticBlockStore":
        try:
            handle = ebs_volume_id(volume.disk)
        except TranslationError as e:
            raise TranslationError(
                f"converting volume({volume.volume}) from inline to csi: {e}"
            ) from None
    return driver, handle


def may_count_inline(pod: Pod) -> bool:
    """The pod has an inline disk some node could count (kube's PreFilter looks for any
    migratable one; those that can never count are left out, to the same effect)."""
    return any(v.source in INLINE_PLUGINS for v in pod.storage_volumes)


def _driver_from_class(
    pvc: PersistentVolumeClaim, volumes: VolumeState, csi_node: CSINode | None, kube_minor: int
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
        migrated = _migration_on(provisioner, csi_node, kube_minor)
        return _MIGRATED_BY_ANNOTATION[provisioner] if migrated else ""
    if provisioner in _MIGRATABLE_NEVER_ON:
        return ""
    return provisioner


def attachable_volumes(
    pod: Pod,
    volumes: VolumeState,
    csi_node: CSINode | None,
    *,
    incoming: bool,
    kube_minor: int = DEFAULT_KUBE_MINOR,
) -> dict[str, str] | str:
    """``filterAttachableVolumes``: unique volume name -> driver, or why the incoming pod
    cannot be counted (its claim is missing or not its own). An inline disk kube cannot
    translate raises :class:`TranslationError`."""
    out: dict[str, str] = {}
    for volume in pod.storage_volumes:
        if volume.source in INLINE_PLUGINS:
            found = inline_csi_volume(volume, csi_node, kube_minor)
            if found is not None:
                out[f"{found[0]}/{found[1]}"] = found[0]
            continue
        if not volume.claim:
            continue
        claim, ephemeral = volume.claim, volume.source == EPHEMERAL
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
            driver = _driver_from_class(pvc, volumes, csi_node, kube_minor)
            handle = f"{UNBOUND_PREFIX}-{pvc.namespace}/{pvc.name}"
        else:
            driver, handle = pv.csi_driver, pv.csi_handle
        if driver and handle:
            out[f"{driver}/{handle}"] = driver
    return out


def driver_missing(driver: str) -> str:
    """kube's reason for a node without a driver that must be there (Unschedulable)."""
    return f"{driver} CSI driver is not installed on the node"


class NodeVolumeLimits:
    name: Final = NAME

    def __init__(self, *, kube_minor: int = DEFAULT_KUBE_MINOR) -> None:
        self.kube_minor = kube_minor
        self.drivers_required = kube_minor >= VOLUME_LIMIT_SCALING_SINCE

    def pre_filter(self, cycle: Cycle) -> PreFilterResult:
        if cycle.volumes is None or not (pod_claims(cycle.pod) or may_count_inline(cycle.pod)):
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
        snap = cycle.snapshot
        exceeded = np.zeros(snap.num_nodes, dtype=np.bool_)
        messages: dict[str, BoolArray] = {}
        missing: dict[str, BoolArray] = {}
        for row in np.flatnonzero(candidates).tolist():
            try:
                verdict = self._node_verdict(cycle, volumes, row)
            except TranslationError as e:
                # kube: an Error status, which ends the whole attempt at the first such node.
                rejected = np.array(candidates[: snap.num_nodes], dtype=np.bool_)
                return FilterResult.from_mask(rejected, str(e), Code.UNSCHEDULABLE_AND_UNRESOLVABLE)
            if isinstance(verdict, _Missing):
                mask = missing.setdefault(verdict.reason, np.zeros(snap.num_nodes, dtype=np.bool_))
                mask[row] = True
            elif isinstance(verdict, str):
                messages.setdefault(verdict, np.zeros(snap.num_nodes, dtype=np.bool_))[row] = True
            else:
                exceeded[row] = verdict
        unschedulable = exceeded.copy()
        for mask in missing.values():
            unschedulable |= mask
        unresolvable = np.zeros(snap.num_nodes, dtype=np.bool_)
        for mask in messages.values():
            unresolvable |= mask
        if not unschedulable.any() and not unresolvable.any():
            return None
        codes = np.where(unschedulable, np.int8(Code.UNSCHEDULABLE), np.int8(0))
        codes = np.where(unresolvable, np.int8(Code.UNSCHEDULABLE_AND_UNRESOLVABLE), codes)
        reasons = (
            tuple(messages.items())
            + tuple(missing.items())
            + (((REASON, exceeded),) if exceeded.any() else ())
        )
        return FilterResult(codes.astype(np.int8), reasons)

    def _node_verdict(self, cycle: Cycle, volumes: VolumeState, row: int) -> bool | str | _Missing:
        """Whether the pod's new volumes exceed a driver's count on the node at ``row``, a
        driver that must be on the node and is not (Unschedulable), or why the pod's claims
        cannot be counted (UnschedulableAndUnresolvable there)."""
        snap, pod = cycle.snapshot, cycle.pod
        name = snap.node_names[row]
        csi_node = volumes.csi_nodes.get(name)
        new = attachable_volumes(pod, volumes, csi_node, incoming=True, kube_minor=self.kube_minor)
        if isinstance(new, str):
            return new
        if not new:
            return False
        if self.drivers_required:
            for driver in dict.fromkeys(new.values()):
                if self._driver_missing(volumes, driver, csi_node):
                    return _Missing(driver_missing(driver))
        if csi_node is None or not csi_node.limits:
            return False
        attached: dict[str, str] = {}
        for existing in snap.pods_on(row):
            found = attachable_volumes(
                existing, volumes, csi_node, incoming=False, kube_minor=self.kube_minor
            )
            assert not isinstance(found, str)
            attached.update(found)
        counts: Counter[str] = Counter(attached.values())
        for unique in attached:
            new.pop(unique, None)
        on_node: dict[str, str] = {}
        for va in self._attachments(cycle, volumes).get(name, ()):
            pv = volumes.pvs.get(va.pv_name) if va.pv_name is not None else None
            if va.attacher and pv is not None and pv.csi_driver:
                on_node[f"{va.attacher}/{pv.csi_handle}"] = va.attacher
        # kube dedupes attachments against the pods' volumes, not against the new pod's.
        counts.update(d for unique, d in on_node.items() if unique not in attached)
        wanted = Counter(new.values())
        return any(
            counts[driver] + count > csi_node.limits[driver]
            for driver, count in wanted.items()
            if driver in csi_node.limits
        )

    @staticmethod
    def _driver_missing(volumes: VolumeState, driver: str, csi_node: CSINode | None) -> bool:
        """``checkCSIDriverOnNode``: the driver opted in and the node's CSINode (if any)
        does not list it. No CSIDriver object: maybe not a CSI driver, so allowed."""
        csi_driver = volumes.csi_drivers.get(driver)
        if csi_driver is None or not csi_driver.prevent_pod_scheduling_if_missing:
            return False
        return csi_node is None or driver not in csi_node.drivers


@dataclass(frozen=True, slots=True)
class _Missing:
    """A node lacks a driver the pod's volumes must have there."""

    reason: str


def new(profile: Profile) -> NodeVolumeLimits:
    return NodeVolumeLimits(kube_minor=profile.kube_minor)
