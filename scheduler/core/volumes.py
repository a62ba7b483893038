"""VolumeState: what the controller keeps next to the Snapshot for the volume plugins.

Like :class:`~scheduler.core.topology.state.TopologyState`, the Snapshot stays as it is and
storage lives here, handed to each cycle (``Cycle(..., volumes=state)``):

* PersistentVolumes by name, PersistentVolumeClaims by (namespace, name), StorageClasses,
  CSINodes by node name, VolumeAttachments, CSIDrivers by name, CSIStorageCapacities by
  (namespace, name) and by StorageClass;
* which placed pods use which claims (``persistentVolumeClaim`` sources only, as kube's
  ``PVCRefCounts``): VolumeRestrictions asks "is this ReadWriteOncePod claim in use?" once
  per pod instead of scanning every node;
* :meth:`assume`, the analogue of kube's assume cache: a chosen node's volume plan is
  applied here at once, so the next cycle does not offer the same PV to another claim
  before the API server's echo arrives.

Not thread-safe, like the Snapshot: the controller owns it and the core reads it.
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, field, replace
from typing import Any, Final

import numpy as np

from scheduler.core.snapshot import BoolArray, Snapshot
from scheduler.model.errors import InvalidObjectError
from scheduler.model.pod import EPHEMERAL, PERSISTENT_VOLUME_CLAIM, Pod
from scheduler.model.selectors import Operator, Requirement
from scheduler.model.volume import (
    BOUND_BY_CONTROLLER,
    READ_WRITE_ONCE_POD,
    SELECTED_NODE,
    ClaimRef,
    CSIDriver,
    CSINode,
    CSIStorageCapacity,
    PersistentVolume,
    PersistentVolumeClaim,
    StorageClass,
    TopologyTerm,
    VolumeAttachment,
)

ClaimKey = tuple[str, str]
PERSISTENT_VOLUME: Final = "PersistentVolume"
PERSISTENT_VOLUME_CLAIM_KIND: Final = "PersistentVolumeClaim"


@dataclass(frozen=True, slots=True)
class StaticBinding:
    """Bind an existing PV to a claim: kube's PreBind writes the PV's claimRef."""

    pv: str
    claim_namespace: str
    claim_name: str
    claim_uid: str
    claim_resource_version: str
    pv_resource_version: str
    set_bound_by_controller: bool
    """True unless the PV already named the claim (a user's pre-binding)."""

    def patch(self) -> dict[str, Any]:
        """A merge patch for the PV; ``metadata.resourceVersion`` makes it conditional
        (409 on a stale PV) as kube's Update is."""
        metadata: dict[str, Any] = {"resourceVersion": self.pv_resource_version}
        if self.set_bound_by_controller:
            metadata["annotations"] = {BOUND_BY_CONTROLLER: "yes"}
        return {
            "metadata": metadata,
            "spec": {
                "claimRef": {
                    "kind": PERSISTENT_VOLUME_CLAIM_KIND,
                    "apiVersion": "v1",
                    "namespace": self.claim_namespace,
                    "name": self.claim_name,
                    "uid": self.claim_uid,
                    "resourceVersion": self.claim_resource_version,
                }
            },
        }


@dataclass(frozen=True, slots=True)
class Provisioning:
    """Ask the claim's provisioner for a volume on the node: the selected-node annotation."""

    claim_namespace: str
    claim_name: str
    node: str
    claim_resource_version: str

    def patch(self) -> dict[str, Any]:
        return {
            "metadata": {
                "resourceVersion": self.claim_resource_version,
                "annotations": {SELECTED_NODE: self.node},
            }
        }


@dataclass(frozen=True, slots=True)
class VolumePatch:
    kind: str
    """``PersistentVolume`` (cluster-scoped) or ``PersistentVolumeClaim``."""
    namespace: str
    name: str
    body: dict[str, Any]
    """A JSON merge patch."""


@dataclass(frozen=True)
class VolumePlan:
    """What must be written, in this order, before the pod's binding (kube's PreBind)."""

    node: str
    static: tuple[StaticBinding, ...] = ()
    provisions: tuple[Provisioning, ...] = ()
    claims: tuple[ClaimKey, ...] = field(default=())
    """The pod's claims to wait for (fully bound) before binding the pod."""

    @property
    def empty(self) -> bool:
        return not self.static and not self.provisions

    def patches(self) -> list[VolumePatch]:
        """PV claimRefs first, then PVC annotations, as kube's bindAPIUpdate orders them."""
        out = [VolumePatch(PERSISTENT_VOLUME, "", s.pv, s.patch()) for s in self.static]
        out += [
            VolumePatch(PERSISTENT_VOLUME_CLAIM_KIND, p.claim_namespace, p.claim_name, p.patch())
            for p in self.provisions
        ]
        return out


class VolumeState:
    def __init__(self) -> None:
        self.pvs: dict[str, PersistentVolume] = {}
        self.pvcs: dict[ClaimKey, PersistentVolumeClaim] = {}
        self.classes: dict[str, StorageClass] = {}
        self.csi_nodes: dict[str, CSINode] = {}
        self.attachments: dict[str, VolumeAttachment] = {}
        self.csi_drivers: dict[str, CSIDriver] = {}
        self.capacities: dict[ClaimKey, CSIStorageCapacity] = {}
        self._capacities_by_class: dict[str, dict[ClaimKey, CSIStorageCapacity]] = {}
        self._pod_claims: dict[str, tuple[ClaimKey, ...]] = {}
        self._claim_users: Counter[ClaimKey] = Counter()
        self._pvs_by_class: dict[str, dict[str, PersistentVolume]] = {}
        self._assumed_pvs: dict[str, PersistentVolume] = {}
        """PV name -> the object as it was before :meth:`assume` (for :meth:`forget`)."""
        self._assumed_pvcs: dict[ClaimKey, PersistentVolumeClaim] = {}

    # ------------------------------------------------------------------ objects
    def set_pv(self, pv: PersistentVolume) -> None:
        """A PV from the API. While assumed, the version the assumption started from (a
        re-list, a late echo) is ignored, as kube's assume cache ignores older objects; any
        other version replaces the assumption."""
        before = self._assumed_pvs.get(pv.name)
        if before is not None:
            if pv.resource_version == before.resource_version:
                return
            del self._assumed_pvs[pv.name]
        self._put_pv(pv)

    def _put_pv(self, pv: PersistentVolume) -> None:
        self.remove_pv(pv.name)
        self.pvs[pv.name] = pv
        self._pvs_by_class.setdefault(pv.storage_class, {})[pv.name] = pv

    def remove_pv(self, name: str) -> None:
        old = self.pvs.pop(name, None)
        if old is not None:
            self._pvs_by_class.get(old.storage_class, {}).pop(name, None)

    def pvs_of_class(self, storage_class: str) -> Iterable[PersistentVolume]:
        """``pvCache.ListPVs(class)``: every PV of the class, bound or not."""
        return self._pvs_by_class.get(storage_class, {}).values()

    def set_pvc(self, pvc: PersistentVolumeClaim) -> None:
        """A claim from the API; an assumed claim is kept as :meth:`set_pv` keeps a PV."""
        before = self._assumed_pvcs.get(pvc.key)
        if before is not None:
            if pvc.resource_version == before.resource_version:
                return
            del self._assumed_pvcs[pvc.key]
        self.pvcs[pvc.key] = pvc

    def remove_pvc(self, namespace: str, name: str) -> None:
        self.pvcs.pop((namespace, name), None)

    def set_class(self, storage_class: StorageClass) -> None:
        self.classes[storage_class.name] = storage_class

    def remove_class(self, name: str) -> None:
        self.classes.pop(name, None)

    def set_csi_node(self, csi_node: CSINode) -> None:
        self.csi_nodes[csi_node.name] = csi_node

    def remove_csi_node(self, name: str) -> None:
        self.csi_nodes.pop(name, None)

    def set_attachment(self, attachment: VolumeAttachment) -> None:
        self.attachments[attachment.name] = attachment

    def remove_attachment(self, name: str) -> None:
        self.attachments.pop(name, None)

    def set_csi_driver(self, driver: CSIDriver) -> None:
        self.csi_drivers[driver.name] = driver

    def remove_csi_driver(self, name: str) -> None:
        self.csi_drivers.pop(name, None)

    def set_capacity(self, capacity: CSIStorageCapacity) -> None:
        self.remove_capacity(*capacity.key)
        self.capacities[capacity.key] = capacity
        self._capacities_by_class.setdefault(capacity.storage_class, {})[capacity.key] = capacity

    def remove_capacity(self, namespace: str, name: str) -> None:
        old = self.capacities.pop((namespace, name), None)
        if old is not None:
            self._capacities_by_class.get(old.storage_class, {}).pop(old.key, None)

    def capacities_of_class(self, storage_class: str) -> list[CSIStorageCapacity]:
        """The class's CSIStorageCapacities by (namespace, name). kube walks its lister in
        map order, so when several have room for a claim on a node it takes any of them;
        this order makes the choice (and the score that reads it) repeatable."""
        found = self._capacities_by_class.get(storage_class, {})
        return [found[key] for key in sorted(found)]

    # ------------------------------------------------------------- pods' claims
    def add_pod(self, pod: Pod) -> None:
        """A pod placed on a node (call beside ``Snapshot.add_pod``)."""
        self.remove_pod(pod.key)
        claims = tuple(
            (pod.namespace, v.claim)
            for v in pod.storage_volumes
            if v.source == PERSISTENT_VOLUME_CLAIM
        )
        if claims:
            self._pod_claims[pod.key] = claims
            self._claim_users.update(claims)

    def remove_pod(self, pod_key: str) -> None:
        claims = self._pod_claims.pop(pod_key, ())
        self._claim_users.subtract(claims)
        for claim in claims:
            if self._claim_users[claim] <= 0:
                del self._claim_users[claim]

    def claim_in_use(self, namespace: str, name: str) -> bool:
        """``StorageInfos().IsPVCUsedByPods``: some placed pod mounts the claim."""
        return self._claim_users[(namespace, name)] > 0

    # ------------------------------------------------------------------ assume
    def assume(self, plan: VolumePlan) -> None:
        """Apply a chosen plan at once (kube's AssumePodVolumes on its assume cache), so
        the next cycle does not offer the same PV again before the writes' echo arrives."""
        for s in plan.static:
            pv = self.pvs.get(s.pv)
            if pv is None:
                continue
            annotations = dict(pv.annotations)
            if s.set_bound_by_controller:
                annotations[BOUND_BY_CONTROLLER] = "yes"
            ref = ClaimRef(s.claim_namespace, s.claim_name, s.claim_uid)
            self._assumed_pvs.setdefault(pv.name, pv)
            self._put_pv(replace(pv, claim_ref=ref, annotations=annotations))
        for p in plan.provisions:
            key = (p.claim_namespace, p.claim_name)
            pvc = self.pvcs.get(key)
            if pvc is None:
                continue
            self._assumed_pvcs.setdefault(key, pvc)
            self.pvcs[key] = replace(pvc, annotations={**pvc.annotations, SELECTED_NODE: p.node})

    def forget(self, plan: VolumePlan) -> None:
        """Undo :meth:`assume` when the writes or the binding failed (kube's Unreserve)."""
        for s in plan.static:
            before = self._assumed_pvs.pop(s.pv, None)
            if before is not None:
                self._put_pv(before)
        for p in plan.provisions:
            key = (p.claim_namespace, p.claim_name)
            claim = self._assumed_pvcs.pop(key, None)
            if claim is not None:
                self.pvcs[key] = claim


@dataclass
class BuiltVolumes:
    state: VolumeState
    skipped: list[str] = field(default_factory=list)


def _label(body: Mapping[str, Any]) -> str:
    meta = body.get("metadata") or {}
    ns = meta.get("namespace")
    return f"{ns}/{meta.get('name')}" if ns else str(meta.get("name"))


def volume_state_from_api(
    *,
    pvs: Iterable[Mapping[str, Any]] = (),
    pvcs: Iterable[Mapping[str, Any]] = (),
    classes: Iterable[Mapping[str, Any]] = (),
    csi_nodes: Iterable[Mapping[str, Any]] = (),
    attachments: Iterable[Mapping[str, Any]] = (),
    csi_drivers: Iterable[Mapping[str, Any]] = (),
    capacities: Iterable[Mapping[str, Any]] = (),
    placed_pods: Iterable[Pod] = (),
) -> BuiltVolumes:
    """A one-off VolumeState from raw lists (explain, tests); unreadable objects are listed."""
    built = BuiltVolumes(VolumeState())
    state = built.state
    sources: tuple[tuple[str, Iterable[Mapping[str, Any]], Any], ...] = (
        ("persistentvolume", pvs, lambda b: state.set_pv(PersistentVolume.from_api(b))),
        ("persistentvolumeclaim", pvcs, lambda b: state.set_pvc(PersistentVolumeClaim.from_api(b))),
        ("storageclass", classes, lambda b: state.set_class(StorageClass.from_api(b))),
        ("csinode", csi_nodes, lambda b: state.set_csi_node(CSINode.from_api(b))),
        (
            "volumeattachment",
            attachments,
            lambda b: state.set_attachment(VolumeAttachment.from_api(b)),
        ),
        ("csidriver", csi_drivers, lambda b: state.set_csi_driver(CSIDriver.from_api(b))),
        (
            "csistoragecapacity",
            capacities,
            lambda b: state.set_capacity(CSIStorageCapacity.from_api(b)),
        ),
    )
    for kind, bodies, add in sources:
        for body in bodies:
            try:
                add(body)
            except InvalidObjectError as exc:
                built.skipped.append(f"{kind}/{_label(body)}: {exc}")
    for pod in placed_pods:
        state.add_pod(pod)
    return built


# ---------------------------------------------------------------- shared by plugins
def pv_affinity_mask(snapshot: Snapshot, pv: PersistentVolume) -> BoolArray:
    """``CheckNodeAffinity`` over every node.

    kube builds a node of labels only for this check, so a ``matchFields`` term on
    ``metadata.name`` sees an empty name (In never matches, NotIn always does).
    """
    n = snapshot.num_nodes
    if pv.node_affinity is None:
        return np.ones(n, dtype=np.bool_)
    mask = np.zeros(n, dtype=np.bool_)
    for term in pv.node_affinity.terms:
        if not all(f.matches("") for f in term.match_fields):
            continue
        hit = np.ones(n, dtype=np.bool_)
        for req in term.match_expressions:
            hit &= snapshot.requirement_mask(req)
        mask |= hit
    return mask


def topology_mask(snapshot: Snapshot, terms: tuple[TopologyTerm, ...]) -> BoolArray:
    """``MatchTopologySelectorTerms`` over every node: no terms allow every node."""
    n = snapshot.num_nodes
    if not terms:
        return np.ones(n, dtype=np.bool_)
    mask = np.zeros(n, dtype=np.bool_)
    for term in terms:
        if not term.requirements:
            continue
        hit = np.ones(n, dtype=np.bool_)
        for r in term.requirements:
            hit &= snapshot.requirement_mask(Requirement(r.key, Operator.IN, r.values))
        mask |= hit
    return mask


def pod_claims(pod: Pod) -> list[tuple[str, bool]]:
    """The pod's claim names in volume order, each with "is a generic ephemeral volume"."""
    return [
        (v.claim, v.source == EPHEMERAL)
        for v in pod.storage_volumes
        if v.source in (PERSISTENT_VOLUME_CLAIM, EPHEMERAL)
    ]


def not_found(kind: str, name: str) -> str:
    """The lister's NotFound error text, which kube puts in the status verbatim."""
    return f'{kind} "{name}" not found'


def ephemeral_owner_error(pod: Pod, pvc: PersistentVolumeClaim) -> str | None:
    """``ephemeral.VolumeIsForPod``: a generic ephemeral volume's claim is the pod's own."""
    if pvc.namespace != pod.namespace or not pvc.controller_uid or pvc.controller_uid != pod.uid:
        return (
            f"PVC {pvc.namespace}/{pvc.name} was not created for pod "
            f"{pod.namespace}/{pod.name} (pod is not owner)"
        )
    return None


GANG_CLAIMS_ADVICE: Final = (
    "Lattice places a gang's members only with bound claims and no inline disks (the "
    "joint placement does not choose volumes)"
)


def gang_volume_refusal(members: Sequence[Pod], volumes: VolumeState) -> str | None:
    """Why a gang cannot be placed with its volumes, or None.

    The gang solver judges one member per class on the snapshot, so it sees each member's
    volumes alone: fine for claims already bound (their PV's node affinity and zone are a
    per-node filter, the same for every member), not for what depends on the members
    together: a WaitForFirstConsumer claim (which PV, chosen for which member's node), a
    ReadWriteOncePod claim two members share, an inline disk's conflicts. Those are refused
    with this reason; it names the first member and volume at fault."""
    rwop: dict[ClaimKey, str] = {}
    for pod in members:
        label = f"{pod.namespace}/{pod.name}"
        for v in pod.storage_volumes:
            if v.source not in (PERSISTENT_VOLUME_CLAIM, EPHEMERAL):
                return (
                    f'member {label}: inline {v.source} volume "{v.volume}"; {GANG_CLAIMS_ADVICE}'
                )
        for claim, _ in pod_claims(pod):
            key = (pod.namespace, claim)
            pvc = volumes.pvcs.get(key)
            if pvc is None:
                return f'member {label}: persistentvolumeclaim "{claim}" not found'
            if not pvc.fully_bound:
                return f'member {label}: claim "{claim}" is not bound; {GANG_CLAIMS_ADVICE}'
            if READ_WRITE_ONCE_POD in pvc.access_modes:
                if key in rwop:
                    return (
                        f"members {rwop[key]} and {label} share the ReadWriteOncePod claim "
                        f'"{claim}"'
                    )
                rwop[key] = label
    return None
