"""Storage objects the volume plugins read: PVs, PVCs, StorageClasses, CSINodes, attachments,
CSIDrivers and CSIStorageCapacities.

Each record keeps only what kube-scheduler's VolumeBinding, VolumeZone, VolumeRestrictions
and NodeVolumeLimits look at, parsed once from the API body so a plugin never touches raw
dicts. Capacities and requests are exact :class:`Quantity` values (kube compares them with
``Quantity.Cmp``). A malformed field is an :class:`InvalidObjectError` naming it, like the
other models, so the controller can skip the object and say why.

The helpers below mirror component-helpers' ``storage/volume`` and ``v1helper`` functions
whose exact behaviour the plugins depend on (class lookup with the beta annotation first,
topology selector terms, the zone label splitting of ``LabelZonesToSet``).
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any, Final

from scheduler.model._fields import integer, mapping, object_list, string, string_list, string_map
from scheduler.model.errors import InvalidObjectError
from scheduler.model.quantity import Quantity
from scheduler.model.selectors import LabelSelector, NodeSelector

READ_WRITE_ONCE: Final = "ReadWriteOnce"
READ_ONLY_MANY: Final = "ReadOnlyMany"
READ_WRITE_MANY: Final = "ReadWriteMany"
READ_WRITE_ONCE_POD: Final = "ReadWriteOncePod"
ACCESS_MODES: Final = frozenset(
    {READ_WRITE_ONCE, READ_ONLY_MANY, READ_WRITE_MANY, READ_WRITE_ONCE_POD}
)

FILESYSTEM: Final = "Filesystem"
BLOCK: Final = "Block"

IMMEDIATE: Final = "Immediate"
WAIT_FOR_FIRST_CONSUMER: Final = "WaitForFirstConsumer"

PV_AVAILABLE: Final = "Available"
CLAIM_LOST: Final = "Lost"

BETA_STORAGE_CLASS_ANNOTATION: Final = "volume.beta.kubernetes.io/storage-class"
BIND_COMPLETED: Final = "pv.kubernetes.io/bind-completed"
BOUND_BY_CONTROLLER: Final = "pv.kubernetes.io/bound-by-controller"
SELECTED_NODE: Final = "volume.kubernetes.io/selected-node"
MIGRATED_PLUGINS: Final = "storage.alpha.kubernetes.io/migrated-plugins"
NO_PROVISIONER: Final = "kubernetes.io/no-provisioner"
STORAGE: Final = "storage"

ZONE_LABELS: Final = (
    "failure-domain.beta.kubernetes.io/zone",
    "failure-domain.beta.kubernetes.io/region",
    "topology.kubernetes.io/zone",
    "topology.kubernetes.io/region",
)
"""VolumeZone's topology keys, in kube's order (the beta keys first)."""
GA_LABEL: Final = {
    "failure-domain.beta.kubernetes.io/zone": "topology.kubernetes.io/zone",
    "failure-domain.beta.kubernetes.io/region": "topology.kubernetes.io/region",
}
MULTI_ZONE_DELIMITER: Final = "__"
ZERO: Final = Quantity(0)


def _access_modes(raw: object, path: str) -> tuple[str, ...]:
    modes = string_list(raw, path)
    for i, mode in enumerate(modes):
        if mode not in ACCESS_MODES:
            raise InvalidObjectError(f"{path}[{i}]", mode, "not a known access mode")
    return modes


def _volume_mode(raw: object, path: str) -> str:
    mode = string(raw, path, FILESYSTEM) or FILESYSTEM
    if mode not in (FILESYSTEM, BLOCK):
        raise InvalidObjectError(path, raw, 'must be "Filesystem" or "Block"')
    return mode


def _name(metadata: Mapping[str, Any], kind: str) -> str:
    name = string(metadata.get("name"), "metadata.name")
    if not name:
        raise InvalidObjectError("metadata.name", metadata.get("name"), f"a {kind} needs a name")
    return name


def _class_of(metadata: Mapping[str, Any], spec: Mapping[str, Any]) -> str:
    """``GetPersistentVolume(Claim)Class``: the beta annotation wins over the spec field."""
    annotations = string_map(metadata.get("annotations"), "metadata.annotations")
    if BETA_STORAGE_CLASS_ANNOTATION in annotations:
        return annotations[BETA_STORAGE_CLASS_ANNOTATION]
    return string(spec.get("storageClassName"), "spec.storageClassName")


def _storage(raw: object, path: str) -> Quantity | None:
    resources = mapping(raw, path)
    if resources.get(STORAGE) is None:
        return None
    return Quantity.parse(resources[STORAGE], field=f"{path}.{STORAGE}")


@dataclass(frozen=True, slots=True)
class ClaimRef:
    namespace: str
    name: str
    uid: str = ""


@dataclass(frozen=True)
class PersistentVolume:
    name: str
    storage_class: str = ""
    capacity: Quantity = ZERO
    access_modes: tuple[str, ...] = ()
    volume_mode: str = FILESYSTEM
    node_affinity: NodeSelector | None = None
    """``spec.nodeAffinity.required``; None means any node."""
    claim_ref: ClaimRef | None = None
    phase: str = ""
    deleting: bool = False
    labels: Mapping[str, str] = field(default_factory=dict)
    annotations: Mapping[str, str] = field(default_factory=dict)
    csi_driver: str = ""
    csi_handle: str = ""
    attributes_class: str = ""
    resource_version: str = ""

    @classmethod
    def from_api(cls, body: Mapping[str, Any]) -> PersistentVolume:
        metadata = mapping(body.get("metadata"), "metadata")
        spec = mapping(body.get("spec"), "spec")
        status = mapping(body.get("status"), "status")
        affinity = mapping(spec.get("nodeAffinity"), "spec.nodeAffinity")
        required = None
        if affinity.get("required") is not None:
            required = NodeSelector.from_api(
                affinity["required"], field="spec.nodeAffinity.required"
            )
        ref = None
        if spec.get("claimRef") is not None:
            raw_ref = mapping(spec["claimRef"], "spec.claimRef")
            ref = ClaimRef(
                string(raw_ref.get("namespace"), "spec.claimRef.namespace"),
                string(raw_ref.get("name"), "spec.claimRef.name"),
                string(raw_ref.get("uid"), "spec.claimRef.uid"),
            )
        csi = mapping(spec.get("csi"), "spec.csi")
        capacity = _storage(spec.get("capacity"), "spec.capacity")
        return cls(
            name=_name(metadata, "PersistentVolume"),
            storage_class=_class_of(metadata, spec),
            capacity=capacity if capacity is not None else ZERO,
            access_modes=_access_modes(spec.get("accessModes"), "spec.accessModes"),
            volume_mode=_volume_mode(spec.get("volumeMode"), "spec.volumeMode"),
            node_affinity=required,
            claim_ref=ref,
            phase=string(status.get("phase"), "status.phase"),
            deleting=metadata.get("deletionTimestamp") is not None,
            labels=string_map(metadata.get("labels"), "metadata.labels"),
            annotations=string_map(metadata.get("annotations"), "metadata.annotations"),
            csi_driver=string(csi.get("driver"), "spec.csi.driver"),
            csi_handle=string(csi.get("volumeHandle"), "spec.csi.volumeHandle"),
            attributes_class=string(
                spec.get("volumeAttributesClassName"), "spec.volumeAttributesClassName"
            ),
            resource_version=string(metadata.get("resourceVersion"), "metadata.resourceVersion"),
        )

    def bound_to(self, claim: PersistentVolumeClaim) -> bool:
        """``IsVolumeBoundToClaim``: the claimRef names the claim (and its UID, if set)."""
        ref = self.claim_ref
        if ref is None or ref.name != claim.name or ref.namespace != claim.namespace:
            return False
        return not ref.uid or ref.uid == claim.uid


@dataclass(frozen=True)
class PersistentVolumeClaim:
    namespace: str
    name: str
    uid: str = ""
    storage_class: str = ""
    request: Quantity = ZERO
    """``spec.resources.requests.storage`` (zero when unset, as Go's zero Quantity)."""
    storage_requested: bool = True
    """The request is set: kube's capacity check skips a claim without one."""
    access_modes: tuple[str, ...] = ()
    volume_mode: str = FILESYSTEM
    selector: LabelSelector | None = None
    volume_name: str = ""
    phase: str = ""
    deleting: bool = False
    annotations: Mapping[str, str] = field(default_factory=dict)
    controller_uid: str = ""
    """UID of the owner reference with ``controller: true`` (a generic ephemeral volume's pod)."""
    attributes_class: str = ""
    resource_version: str = ""

    @classmethod
    def from_api(cls, body: Mapping[str, Any]) -> PersistentVolumeClaim:
        metadata = mapping(body.get("metadata"), "metadata")
        spec = mapping(body.get("spec"), "spec")
        status = mapping(body.get("status"), "status")
        resources = mapping(spec.get("resources"), "spec.resources")
        request = _storage(resources.get("requests"), "spec.resources.requests")
        selector = None
        if spec.get("selector") is not None:
            selector = LabelSelector.from_api(spec["selector"], field="spec.selector")
        controller = ""
        for i, ref in enumerate(
            object_list(metadata.get("ownerReferences"), "metadata.ownerReferences")
        ):
            if ref.get("controller") is True:
                controller = string(ref.get("uid"), f"metadata.ownerReferences[{i}].uid")
                break
        return cls(
            namespace=string(metadata.get("namespace"), "metadata.namespace") or "default",
            name=_name(metadata, "PersistentVolumeClaim"),
            uid=string(metadata.get("uid"), "metadata.uid"),
            storage_class=_class_of(metadata, spec),
            request=request if request is not None else ZERO,
            storage_requested=request is not None,
            access_modes=_access_modes(spec.get("accessModes"), "spec.accessModes"),
            volume_mode=_volume_mode(spec.get("volumeMode"), "spec.volumeMode"),
            selector=selector,
            volume_name=string(spec.get("volumeName"), "spec.volumeName"),
            phase=string(status.get("phase"), "status.phase"),
            deleting=metadata.get("deletionTimestamp") is not None,
            annotations=string_map(metadata.get("annotations"), "metadata.annotations"),
            controller_uid=controller,
            attributes_class=string(
                spec.get("volumeAttributesClassName"), "spec.volumeAttributesClassName"
            ),
            resource_version=string(metadata.get("resourceVersion"), "metadata.resourceVersion"),
        )

    @property
    def key(self) -> tuple[str, str]:
        return (self.namespace, self.name)

    @property
    def fully_bound(self) -> bool:
        """``isPVCFullyBound``: a volume name and the PV controller's bind-completed mark."""
        return bool(self.volume_name) and BIND_COMPLETED in self.annotations

    @property
    def selected_node(self) -> str | None:
        return self.annotations.get(SELECTED_NODE)


@dataclass(frozen=True, slots=True)
class TopologyRequirement:
    key: str
    values: tuple[str, ...]


@dataclass(frozen=True, slots=True)
class TopologyTerm:
    """One ``allowedTopologies`` term: every requirement is ``key In values``."""

    requirements: tuple[TopologyRequirement, ...]

    def matches(self, labels: Mapping[str, str]) -> bool:
        # A nil or empty term selects nothing (MatchTopologySelectorTerms).
        return bool(self.requirements) and all(
            labels.get(r.key) in r.values for r in self.requirements
        )


@dataclass(frozen=True)
class StorageClass:
    name: str
    provisioner: str = ""
    binding_mode: str | None = IMMEDIATE
    """None only when the API server did not default it (kube then reports an error)."""
    allowed_topologies: tuple[TopologyTerm, ...] = ()

    @classmethod
    def from_api(cls, body: Mapping[str, Any]) -> StorageClass:
        metadata = mapping(body.get("metadata"), "metadata")
        mode = body.get("volumeBindingMode")
        if mode is not None and mode not in (IMMEDIATE, WAIT_FOR_FIRST_CONSUMER):
            raise InvalidObjectError(
                "volumeBindingMode", mode, 'must be "Immediate" or "WaitForFirstConsumer"'
            )
        terms: list[TopologyTerm] = []
        for i, term in enumerate(object_list(body.get("allowedTopologies"), "allowedTopologies")):
            path = f"allowedTopologies[{i}].matchLabelExpressions"
            reqs = tuple(
                TopologyRequirement(
                    string(expr.get("key"), f"{path}[{j}].key"),
                    string_list(expr.get("values"), f"{path}[{j}].values"),
                )
                for j, expr in enumerate(object_list(term.get("matchLabelExpressions"), path))
            )
            terms.append(TopologyTerm(reqs))
        return cls(
            name=_name(metadata, "StorageClass"),
            provisioner=string(body.get("provisioner"), "provisioner"),
            binding_mode=mode,
            allowed_topologies=tuple(terms),
        )

    @property
    def delays_binding(self) -> bool:
        return self.binding_mode == WAIT_FOR_FIRST_CONSUMER

    @property
    def can_provision(self) -> bool:
        return self.provisioner not in ("", NO_PROVISIONER)


@dataclass(frozen=True)
class CSINode:
    """A node's CSI drivers and their attach limits (``allocatable.count``)."""

    name: str
    drivers: frozenset[str] = frozenset()
    limits: Mapping[str, int] = field(default_factory=dict)
    migrated_plugins: frozenset[str] = frozenset()

    @classmethod
    def from_api(cls, body: Mapping[str, Any]) -> CSINode:
        metadata = mapping(body.get("metadata"), "metadata")
        spec = mapping(body.get("spec"), "spec")
        drivers: set[str] = set()
        limits: dict[str, int] = {}
        for i, driver in enumerate(object_list(spec.get("drivers"), "spec.drivers")):
            path = f"spec.drivers[{i}]"
            name = string(driver.get("name"), f"{path}.name")
            drivers.add(name)
            allocatable = mapping(driver.get("allocatable"), f"{path}.allocatable")
            if allocatable.get("count") is not None:
                limits[name] = integer(
                    allocatable["count"], f"{path}.allocatable.count", default=0, minimum=0
                )
        annotations = string_map(metadata.get("annotations"), "metadata.annotations")
        migrated = annotations.get(MIGRATED_PLUGINS, "")
        return cls(
            name=_name(metadata, "CSINode"),
            drivers=frozenset(drivers),
            limits=limits,
            migrated_plugins=frozenset(migrated.split(",")) if migrated else frozenset(),
        )


@dataclass(frozen=True, slots=True)
class VolumeAttachment:
    """An attach/detach controller's record: NodeVolumeLimits counts it on its node."""

    name: str
    attacher: str
    node_name: str
    pv_name: str | None

    @classmethod
    def from_api(cls, body: Mapping[str, Any]) -> VolumeAttachment:
        metadata = mapping(body.get("metadata"), "metadata")
        spec = mapping(body.get("spec"), "spec")
        source = mapping(spec.get("source"), "spec.source")
        pv = source.get("persistentVolumeName")
        return cls(
            name=_name(metadata, "VolumeAttachment"),
            attacher=string(spec.get("attacher"), "spec.attacher"),
            node_name=string(spec.get("nodeName"), "spec.nodeName"),
            pv_name=None if pv is None else string(pv, "spec.source.persistentVolumeName"),
        )


def _flag(raw: object, path: str) -> bool:
    """An optional boolean (``*bool``): unset is false, as every reader in kube treats it."""
    if raw is None:
        return False
    if not isinstance(raw, bool):
        raise InvalidObjectError(path, raw, "must be true or false")
    return raw


@dataclass(frozen=True, slots=True)
class CSIDriver:
    """A CSI driver's opt-ins the scheduler reads (the object is named after the driver)."""

    name: str
    storage_capacity: bool = False
    """``spec.storageCapacity``: VolumeBinding checks CSIStorageCapacity for its classes."""
    prevent_pod_scheduling_if_missing: bool = False
    """``spec.preventPodSchedulingIfMissing`` (KEP-5030): NodeVolumeLimits rejects nodes
    whose CSINode does not list the driver (VolumeLimitScaling, on from 1.37)."""

    @classmethod
    def from_api(cls, body: Mapping[str, Any]) -> CSIDriver:
        metadata = mapping(body.get("metadata"), "metadata")
        spec = mapping(body.get("spec"), "spec")
        return cls(
            name=_name(metadata, "CSIDriver"),
            storage_capacity=_flag(spec.get("storageCapacity"), "spec.storageCapacity"),
            prevent_pod_scheduling_if_missing=_flag(
                spec.get("preventPodSchedulingIfMissing"), "spec.preventPodSchedulingIfMissing"
            ),
        )


@dataclass(frozen=True)
class CSIStorageCapacity:
    """What a CSI driver can still provision for one StorageClass on the nodes its
    ``nodeTopology`` selects (``storage.k8s.io/v1``)."""

    namespace: str
    name: str
    storage_class: str
    node_topology: LabelSelector | None = None
    """None: the object names no nodes (kube: no node has access)."""
    capacity: Quantity | None = None
    maximum_volume_size: Quantity | None = None

    @classmethod
    def from_api(cls, body: Mapping[str, Any]) -> CSIStorageCapacity:
        metadata = mapping(body.get("metadata"), "metadata")
        topology = body.get("nodeTopology")
        capacity = body.get("capacity")
        largest = body.get("maximumVolumeSize")
        return cls(
            namespace=string(metadata.get("namespace"), "metadata.namespace") or "default",
            name=_name(metadata, "CSIStorageCapacity"),
            storage_class=string(body.get("storageClassName"), "storageClassName"),
            node_topology=(
                None if topology is None else LabelSelector.from_api(topology, field="nodeTopology")
            ),
            capacity=None if capacity is None else Quantity.parse(capacity, field="capacity"),
            maximum_volume_size=(
                None if largest is None else Quantity.parse(largest, field="maximumVolumeSize")
            ),
        )

    @property
    def key(self) -> tuple[str, str]:
        return (self.namespace, self.name)

    @property
    def volume_limit(self) -> Quantity | None:
        """``volumeLimit``: the largest volume it can create, else its whole capacity."""
        if self.maximum_volume_size is not None:
            return self.maximum_volume_size
        return self.capacity


def zone_values(value: str) -> frozenset[str] | None:
    """``LabelZonesToSet``: ``a__b`` is two zones; an empty part makes the label unusable."""
    zones = [part.strip() for part in value.split(MULTI_ZONE_DELIMITER)]
    if any(not zone for zone in zones):
        return None
    return frozenset(zones)
