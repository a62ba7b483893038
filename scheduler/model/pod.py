"""The pod record: everything the scheduling core reads, parsed once from the API body.

Parsing does the work that kube-scheduler spreads over ``PodInfo``, ``GetAffinityTerms``,
``GetHostPorts`` and ``PodRequests``, and applies the API-server defaulting and mutations
that affect scheduling so that raw manifests and server bodies give the same record
(each is idempotent on an already-defaulted body):

* container requests default to limits when unset (``SetDefaults_Pod``);
* with ``hostNetwork`` a port without ``hostPort`` gets ``hostPort = containerPort``;
* ``matchLabelKeys``/``mismatchLabelKeys`` of pod (anti-)affinity terms and the
  ``matchLabelKeys`` of topology spread constraints are merged into the label selectors.

Of volumes and DRA resource claims only what constrains placement is kept (which volume
needs which claim, the identity of inline disks that conflict or count against attach
limits, which resource claims the pod references), so the volume plugins can decide and the
core can refuse pods whose placement it does not decide yet instead of binding them where
they cannot start.

Resource requests are kept in the several integer views kube-scheduler uses (see
:class:`PodResources`). Invalid input raises :class:`InvalidObjectError`.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field
from enum import StrEnum
from types import MappingProxyType
from typing import Any, Final

from scheduler.model._fields import integer, mapping, object_list, string, string_list, string_map
from scheduler.model.declared_features import required_features
from scheduler.model.errors import InvalidObjectError
from scheduler.model.names import CPU, MEMORY, is_dra_extended_resource
from scheduler.model.node import Taint
from scheduler.model.release import DEFAULT_KUBE_MINOR
from scheduler.model.resources import (
    DEFAULT_NON_MISSING,
    NO_POD_STATUS,
    ContainerResources,
    IntResources,
    PodStatusResources,
    RequestInputs,
    ResourceList,
    StatusRules,
    is_pod_level_resource,
    parse_resource_list,
    pod_requests,
    round_resources,
)
from scheduler.model.selectors import (
    NOTHING,
    LabelSelector,
    NodeSelector,
    NodeSelectorTerm,
    Operator,
    PreferredSchedulingTerm,
    Requirement,
)

DEFAULT_SCHEDULER_NAME: Final = "default-scheduler"
DEFAULT_BIND_ALL_HOST_IP: Final = "0.0.0.0"
UNSCHEDULABLE_TAINT_KEY: Final = "node.kubernetes.io/unschedulable"
TERMINAL_PHASES: Final = frozenset({"Succeeded", "Failed"})
"""``status.phase`` values of a finished pod: it holds no node capacity and takes no part in
affinity or spread."""


class UnsatisfiableAction(StrEnum):
    DO_NOT_SCHEDULE = "DoNotSchedule"
    SCHEDULE_ANYWAY = "ScheduleAnyway"


class InclusionPolicy(StrEnum):
    HONOR = "Honor"
    IGNORE = "Ignore"


@dataclass(frozen=True, slots=True)
class Toleration:
    key: str = ""
    operator: str = "Equal"
    value: str = ""
    effect: str = ""

    def tolerates(self, taint: Taint) -> bool:
        """``v1.Toleration.ToleratesTaint``: empty effect/key act as wildcards."""
        if self.effect and self.effect != taint.effect:
            return False
        if self.key and self.key != taint.key:
            return False
        if self.operator in ("", "Equal"):
            return self.value == taint.value
        return self.operator == "Exists"


def tolerates(tolerations: tuple[Toleration, ...], taint: Taint) -> bool:
    return any(t.tolerates(taint) for t in tolerations)


@dataclass(frozen=True, slots=True)
class HostPort:
    """A (hostIP, protocol, hostPort) triple, sanitised like ``HostPortInfo``."""

    host_ip: str
    protocol: str
    port: int


@dataclass(frozen=True, slots=True)
class PodAffinityTerm:
    """A processed ``v1.PodAffinityTerm`` (kube-scheduler's ``fwk.AffinityTerm``).

    ``namespaces`` already holds the owning pod's namespace when the term names neither
    namespaces nor a namespace selector; ``namespace_selector`` is :data:`NOTHING` when nil.
    """

    selector: LabelSelector
    namespaces: frozenset[str]
    namespace_selector: LabelSelector
    topology_key: str


@dataclass(frozen=True, slots=True)
class WeightedPodAffinityTerm:
    weight: int
    term: PodAffinityTerm


@dataclass(frozen=True, slots=True)
class TopologySpreadConstraint:
    max_skew: int
    topology_key: str
    when_unsatisfiable: UnsatisfiableAction
    selector: LabelSelector
    """Label selector with the pod's ``matchLabelKeys`` values merged in."""
    min_domains: int = 1
    node_affinity_policy: InclusionPolicy = InclusionPolicy.HONOR
    node_taints_policy: InclusionPolicy = InclusionPolicy.IGNORE


PERSISTENT_VOLUME_CLAIM: Final = "persistentVolumeClaim"
EPHEMERAL: Final = "ephemeral"
NODE_CONSTRAINED_INLINE_SOURCES: Final = (
    # VolumeRestrictions: one read-write user per disk per node.
    "gcePersistentDisk",
    "awsElasticBlockStore",
    "rbd",
    "iscsi",
    # NodeVolumeLimits: in-tree inline volumes migrated to CSI count against attach limits.
    "azureDisk",
    "azureFile",
    "cinder",
    "portworxVolume",
    "vsphereVolume",
)
"""Inline volume sources whose node kube-scheduler constrains (volumerestrictions and
nodevolumelimits with csi-translation-lib's ``IsInlineMigratable``). Other inline sources
(emptyDir, configMap, secret, projected, downwardAPI, hostPath, csi, nfs, ...) need no
scheduling decision."""


DEFAULT_RBD_POOL: Final = "rbd"
"""``rbd.pool`` when unset (``SetDefaults_RBDVolumeSource``)."""


@dataclass(frozen=True, slots=True)
class StorageVolume:
    """A pod volume whose node a scheduler must decide: a PVC, a generic ephemeral volume
    (its PVC is created by the ephemeral-volume controller) or an inline disk in
    :data:`NODE_CONSTRAINED_INLINE_SOURCES`, with the identity kube-scheduler compares."""

    volume: str
    """``spec.volumes[].name``."""
    source: str
    """The volume source key: ``persistentVolumeClaim``, ``ephemeral``, ``gcePersistentDisk``..."""
    claim: str = ""
    """The PVC's name: ``claimName``, or ``<pod>-<volume>`` for a generic ephemeral volume."""
    disk: str = ""
    """An inline disk's identity: GCE ``pdName``, EBS ``volumeID``, iSCSI ``iqn``, RBD
    ``image``, azureDisk ``diskURI``, cinder and portworx ``volumeID``, vsphere
    ``volumePath``, azureFile ``shareName``."""
    read_only: bool = False
    """``readOnly`` (VolumeRestrictions lets read-only GCE PD, iSCSI and RBD mounts share)."""
    monitors: frozenset[str] = frozenset()
    """RBD ``monitors``: two RBD volumes are one image when they share a monitor..."""
    pool: str = ""
    """... and the ``pool`` (default ``rbd``) and the image."""


@dataclass(frozen=True, slots=True)
class ResourceClaimRef:
    """One ``spec.resourceClaims`` entry (DRA): a claim by name or from a template."""

    name: str
    claim_name: str = ""
    """``resourceClaimName``: an existing ResourceClaim in the pod's namespace."""
    template_name: str = ""
    """``resourceClaimTemplateName``: a claim generated per pod from this template."""


@dataclass(frozen=True, slots=True)
class ContainerRequests:
    """One container's ``resources.requests`` as kube-scheduler reads them to turn a pod's
    DRA-backed extended resources into device requests (``createRequestsAndMappings``)."""

    index: int
    """Position in ``initContainers`` followed by ``containers``."""
    name: str
    short_lived: bool
    """An init container that is not a sidecar: it ends before the others start."""
    names: tuple[str, ...]
    """Every resource the container requests, sorted (a request's name is built from the
    position of its resource in this list)."""
    counts: Mapping[str, int]
    """Whole-number requests of names a DeviceClass may serve (a fractional one asks for
    no device, as ``Quantity.AsInt64`` fails on it)."""


@dataclass(frozen=True)
class PodResources:
    """The integer request views kube-scheduler derives from one pod.

    ``requests`` is what NodeResourcesFit compares against free allocatable (and what
    BalancedAllocation scores); ``accounted`` is what the pod adds to a node's requested
    totals once it is placed (it honours in-place resize status); ``non_zero_*`` feed the
    node's NonZeroRequested used by LeastAllocated/MostAllocated; ``score_requests`` is the
    incoming pod's request for those scorers (100m / 200Mi for unset cpu / memory).
    """

    requests: IntResources
    accounted: IntResources
    non_zero_cpu: int
    non_zero_memory: int
    score_requests: IntResources


EMPTY_RESOURCES: Final = PodResources({}, {}, 0, 0, {})


@dataclass(frozen=True)
class Pod:
    name: str
    namespace: str = "default"
    uid: str = ""
    labels: Mapping[str, str] = field(default_factory=dict)
    node_name: str = ""
    scheduler_name: str = DEFAULT_SCHEDULER_NAME
    priority: int = 0
    scheduling_gates: tuple[str, ...] = ()
    node_selector: Mapping[str, str] | None = None
    required_node_affinity: NodeSelector | None = None
    preferred_node_affinity: tuple[PreferredSchedulingTerm, ...] = ()
    required_affinity: tuple[PodAffinityTerm, ...] = ()
    required_anti_affinity: tuple[PodAffinityTerm, ...] = ()
    preferred_affinity: tuple[WeightedPodAffinityTerm, ...] = ()
    preferred_anti_affinity: tuple[WeightedPodAffinityTerm, ...] = ()
    has_pod_affinity: bool = False
    """``spec.affinity.podAffinity`` or ``podAntiAffinity`` is set (kube's PodsWithAffinity)."""
    tolerations: tuple[Toleration, ...] = ()
    host_ports: tuple[HostPort, ...] = ()
    spread_constraints: tuple[TopologySpreadConstraint, ...] = ()
    resources: PodResources = EMPTY_RESOURCES
    terminating: bool = False
    """``metadata.deletionTimestamp`` is set; PodTopologySpread does not count such pods."""
    phase: str = ""
    nominated_node_name: str = ""
    annotations: Mapping[str, str] = field(default_factory=dict)
    """``metadata.annotations``: Lattice's topology plugin reads its ``lattice.dev/`` keys."""
    exclusive_cpus: int = 0
    """Whole CPUs a kubelet with the static CPU manager pins for this pod (0 if none)."""
    storage_volumes: tuple[StorageVolume, ...] = ()
    """Volumes whose node must be decided with the volume (PVCs, generic ephemeral, disks)."""
    resource_claims: tuple[ResourceClaimRef, ...] = ()
    """``spec.resourceClaims``: DRA claims that must be allocated on the chosen node."""
    generated_claims: Mapping[str, str | None] = field(default_factory=dict)
    """``status.resourceClaimStatuses``: pod claim name -> the ResourceClaim generated from
    its template (None: the controller decided none is needed)."""
    required_features: frozenset[str] = frozenset()
    """Node declared features the spec needs (restart-all-containers rules, hostNetwork with
    user namespaces, bind-mount options): every supported release's, the NodeDeclaredFeatures
    plugin keeps those its release knows. Empty for nearly every pod."""
    container_requests: tuple[ContainerRequests, ...] = ()
    """Every container's requests, kept only when some container asks for a resource a
    DeviceClass may serve (extended resource names, ``deviceclass.resource.kubernetes.io/``):
    empty for the common pod."""

    @property
    def claims_not_generated(self) -> bool:
        """Some template claim has no entry in ``status.resourceClaimStatuses`` yet: the
        pod waits for kube-controller-manager before any attempt (kube's PreEnqueue)."""
        return any(
            r.template_name and r.name not in self.generated_claims for r in self.resource_claims
        )

    def claim_name(self, ref: ResourceClaimRef) -> str | None:
        """The ResourceClaim a pod claim stands for: the name it writes, or the one
        generated from its template (None: not generated yet, or none needed). The one
        rule every reader of a pod's claims uses (kube's ``resourceclaim.Name``)."""
        return ref.claim_name or self.generated_claims.get(ref.name)

    @property
    def key(self) -> str:
        """Cache identity: the UID, like kube-scheduler; namespace/name when absent."""
        return self.uid or f"{self.namespace}/{self.name}"

    @property
    def has_required_anti_affinity(self) -> bool:
        return bool(self.required_anti_affinity)

    @classmethod
    def from_api(cls, body: Mapping[str, Any], *, kube_minor: int = DEFAULT_KUBE_MINOR) -> Pod:
        """Parse an API body; ``kube_minor`` is the release whose rules say what a placed
        pod holds on its node (:class:`~scheduler.model.resources.StatusRules`)."""
        return _parse_pod(body, StatusRules.of(kube_minor))


def _parse_pod(body: Mapping[str, Any], rules: StatusRules) -> Pod:
    if not isinstance(body, Mapping):
        raise InvalidObjectError("pod", body, "must be an object")
    metadata = mapping(body.get("metadata"), "metadata")
    spec = mapping(body.get("spec"), "spec")
    status = mapping(body.get("status"), "status")
    name = string(metadata.get("name"), "metadata.name")
    if not name:
        raise InvalidObjectError("metadata.name", metadata.get("name"), "a pod needs a name")
    namespace = string(metadata.get("namespace"), "metadata.namespace") or "default"
    labels = string_map(metadata.get("labels"), "metadata.labels")

    node_selector: dict[str, str] | None = None
    if spec.get("nodeSelector") is not None:
        node_selector = string_map(spec.get("nodeSelector"), "spec.nodeSelector")

    affinity = mapping(spec.get("affinity"), "spec.affinity")
    node_aff = mapping(affinity.get("nodeAffinity"), "spec.affinity.nodeAffinity")
    required_node_affinity = None
    req_path = "spec.affinity.nodeAffinity.requiredDuringSchedulingIgnoredDuringExecution"
    if node_aff.get("requiredDuringSchedulingIgnoredDuringExecution") is not None:
        required_node_affinity = NodeSelector.from_api(
            node_aff["requiredDuringSchedulingIgnoredDuringExecution"], field=req_path
        )
    preferred_node_affinity = _preferred_node_terms(
        node_aff.get("preferredDuringSchedulingIgnoredDuringExecution"),
        "spec.affinity.nodeAffinity.preferredDuringSchedulingIgnoredDuringExecution",
    )

    pod_aff = affinity.get("podAffinity")
    pod_anti = affinity.get("podAntiAffinity")
    aff = mapping(pod_aff, "spec.affinity.podAffinity")
    anti = mapping(pod_anti, "spec.affinity.podAntiAffinity")
    base = "spec.affinity"
    required_affinity = _affinity_terms(
        aff.get("requiredDuringSchedulingIgnoredDuringExecution"),
        f"{base}.podAffinity.requiredDuringSchedulingIgnoredDuringExecution",
        namespace,
        labels,
    )
    required_anti = _affinity_terms(
        anti.get("requiredDuringSchedulingIgnoredDuringExecution"),
        f"{base}.podAntiAffinity.requiredDuringSchedulingIgnoredDuringExecution",
        namespace,
        labels,
    )
    preferred_affinity = _weighted_terms(
        aff.get("preferredDuringSchedulingIgnoredDuringExecution"),
        f"{base}.podAffinity.preferredDuringSchedulingIgnoredDuringExecution",
        namespace,
        labels,
    )
    preferred_anti = _weighted_terms(
        anti.get("preferredDuringSchedulingIgnoredDuringExecution"),
        f"{base}.podAntiAffinity.preferredDuringSchedulingIgnoredDuringExecution",
        namespace,
        labels,
    )

    tolerations = tuple(
        _toleration(t, f"spec.tolerations[{i}]")
        for i, t in enumerate(object_list(spec.get("tolerations"), "spec.tolerations"))
    )
    host_network = spec.get("hostNetwork") is True
    containers = object_list(spec.get("containers"), "spec.containers")
    init_containers = object_list(spec.get("initContainers"), "spec.initContainers")
    host_ports: list[HostPort] = []
    for i, c in enumerate(init_containers):
        if c.get("restartPolicy") == "Always":
            host_ports.extend(_host_ports(c, f"spec.initContainers[{i}]", host_network))
    for i, c in enumerate(containers):
        host_ports.extend(_host_ports(c, f"spec.containers[{i}]", host_network))

    spread = tuple(
        _spread_constraint(c, f"spec.topologySpreadConstraints[{i}]", labels)
        for i, c in enumerate(
            object_list(spec.get("topologySpreadConstraints"), "spec.topologySpreadConstraints")
        )
    )
    gates = tuple(
        string(g.get("name"), f"spec.schedulingGates[{i}].name")
        for i, g in enumerate(object_list(spec.get("schedulingGates"), "spec.schedulingGates"))
    )
    return Pod(
        name=name,
        namespace=namespace,
        uid=string(metadata.get("uid"), "metadata.uid"),
        labels=MappingProxyType(labels),
        node_name=string(spec.get("nodeName"), "spec.nodeName"),
        scheduler_name=string(spec.get("schedulerName"), "spec.schedulerName")
        or DEFAULT_SCHEDULER_NAME,
        priority=integer(spec.get("priority"), "spec.priority", default=0),
        scheduling_gates=gates,
        node_selector=None if node_selector is None else MappingProxyType(node_selector),
        required_node_affinity=required_node_affinity,
        preferred_node_affinity=preferred_node_affinity,
        required_affinity=required_affinity,
        required_anti_affinity=required_anti,
        preferred_affinity=preferred_affinity,
        preferred_anti_affinity=preferred_anti,
        has_pod_affinity=pod_aff is not None or pod_anti is not None,
        tolerations=tolerations,
        host_ports=tuple(host_ports),
        spread_constraints=spread,
        resources=_resources(_request_inputs(spec, status, containers, init_containers), rules),
        terminating=metadata.get("deletionTimestamp") is not None,
        phase=string(status.get("phase"), "status.phase"),
        nominated_node_name=string(status.get("nominatedNodeName"), "status.nominatedNodeName"),
        annotations=MappingProxyType(
            string_map(metadata.get("annotations"), "metadata.annotations")
        ),
        exclusive_cpus=_exclusive_cpus(spec, containers, init_containers),
        storage_volumes=_storage_volumes(spec, name),
        resource_claims=_resource_claims(spec),
        generated_claims=MappingProxyType(_generated_claims(status)),
        required_features=required_features(spec, containers, init_containers),
        container_requests=_container_request_lists(init_containers, containers),
    )


def _storage_volumes(spec: Mapping[str, Any], pod_name: str) -> tuple[StorageVolume, ...]:
    out: list[StorageVolume] = []
    for i, volume in enumerate(object_list(spec.get("volumes"), "spec.volumes")):
        path = f"spec.volumes[{i}]"
        name = string(volume.get("name"), f"{path}.name")
        if volume.get(PERSISTENT_VOLUME_CLAIM) is not None:
            pvc = mapping(volume[PERSISTENT_VOLUME_CLAIM], f"{path}.{PERSISTENT_VOLUME_CLAIM}")
            claim = string(pvc.get("claimName"), f"{path}.{PERSISTENT_VOLUME_CLAIM}.claimName")
            out.append(StorageVolume(name, PERSISTENT_VOLUME_CLAIM, claim))
        elif volume.get(EPHEMERAL) is not None:
            # ephemeral.VolumeClaimName: the controller names the claim <pod>-<volume>.
            out.append(StorageVolume(name, EPHEMERAL, f"{pod_name}-{name}"))
        else:
            for source in NODE_CONSTRAINED_INLINE_SOURCES:
                if volume.get(source) is not None:
                    out.append(_inline_disk(name, source, volume[source], f"{path}.{source}"))
                    break
    return tuple(out)


_DISK_IDENTITY: Final = {
    "gcePersistentDisk": "pdName",
    "awsElasticBlockStore": "volumeID",
    "rbd": "image",
    "iscsi": "iqn",
    "azureDisk": "diskURI",
    "azureFile": "shareName",
    "cinder": "volumeID",
    "portworxVolume": "volumeID",
    "vsphereVolume": "volumePath",
}
"""The field naming the disk, per inline source."""


def _inline_disk(name: str, source: str, raw: object, path: str) -> StorageVolume:
    body = mapping(raw, path)
    key = _DISK_IDENTITY[source]
    monitors: frozenset[str] = frozenset()
    pool = ""
    if source == "rbd":
        monitors = frozenset(string_list(body.get("monitors"), f"{path}.monitors"))
        pool = string(body.get("pool"), f"{path}.pool") or DEFAULT_RBD_POOL
    return StorageVolume(
        name,
        source,
        disk=string(body.get(key), f"{path}.{key}"),
        read_only=_flag(body.get("readOnly"), f"{path}.readOnly"),
        monitors=monitors,
        pool=pool,
    )


def _flag(raw: object, field: str) -> bool:
    if raw is None:
        return False
    if not isinstance(raw, bool):
        raise InvalidObjectError(field, raw, "must be a boolean")
    return raw


def _resource_claims(spec: Mapping[str, Any]) -> tuple[ResourceClaimRef, ...]:
    field = "spec.resourceClaims"
    return tuple(
        ResourceClaimRef(
            name=string(c.get("name"), f"{field}[{i}].name"),
            claim_name=string(c.get("resourceClaimName"), f"{field}[{i}].resourceClaimName"),
            template_name=string(
                c.get("resourceClaimTemplateName"), f"{field}[{i}].resourceClaimTemplateName"
            ),
        )
        for i, c in enumerate(object_list(spec.get("resourceClaims"), field))
    )


def _container_request_lists(
    init_containers: list[Mapping[str, Any]], containers: list[Mapping[str, Any]]
) -> tuple[ContainerRequests, ...]:
    """:attr:`Pod.container_requests`: empty unless some container requests (or limits) a
    name a DeviceClass may serve; the raw keys decide, so the common pod parses nothing."""
    bodies = [*init_containers, *containers]

    def keys(body: Mapping[str, Any]) -> list[str]:
        resources = body.get("resources")
        if not isinstance(resources, Mapping):
            return []
        return [
            str(k)
            for part in ("requests", "limits")
            if isinstance(resources.get(part), Mapping)
            for k in resources[part]
        ]

    if not any(is_dra_extended_resource(k) for b in bodies for k in keys(b)):
        return ()
    out: list[ContainerRequests] = []
    for index, body in enumerate(bodies):
        init = index < len(init_containers)
        where = (
            f"spec.initContainers[{index}]"
            if init
            else f"spec.containers[{index - len(init_containers)}]"
        )
        requests = _container_requests(body, where)
        out.append(
            ContainerRequests(
                index=index,
                name=string(body.get("name"), f"{where}.name"),
                short_lived=init and body.get("restartPolicy") != "Always",
                names=tuple(sorted(requests)),
                counts=MappingProxyType(
                    {
                        n: q.nanos // 10**9
                        for n, q in requests.items()
                        if is_dra_extended_resource(n) and q.nanos > 0 and q.nanos % 10**9 == 0
                    }
                ),
            )
        )
    return tuple(out)


def _generated_claims(status: Mapping[str, Any]) -> dict[str, str | None]:
    field = "status.resourceClaimStatuses"
    out: dict[str, str | None] = {}
    for i, c in enumerate(object_list(status.get("resourceClaimStatuses"), field)):
        claim = c.get("resourceClaimName")
        name = string(c.get("name"), f"{field}[{i}].name")
        out[name] = None if claim is None else string(claim, f"{field}[{i}].resourceClaimName")
    return out


def _preferred_node_terms(raw: object, field: str) -> tuple[PreferredSchedulingTerm, ...]:
    out: list[PreferredSchedulingTerm] = []
    for i, item in enumerate(object_list(raw, field)):
        path = f"{field}[{i}]"
        weight = integer(item.get("weight"), f"{path}.weight", default=0, minimum=0, maximum=100)
        term = NodeSelectorTerm.from_api(item.get("preference"), field=f"{path}.preference")
        # NewPreferredSchedulingTerms drops zero-weight and empty terms.
        if weight != 0 and not term.is_empty:
            out.append(PreferredSchedulingTerm(weight, term))
    return tuple(out)


def _label_key_requirements(
    keys: tuple[str, ...], operator: Operator, labels: Mapping[str, str]
) -> list[Requirement]:
    return [Requirement(k, operator, (labels[k],)) for k in keys if k in labels]


def _affinity_term(
    body: Mapping[str, Any], field: str, namespace: str, labels: Mapping[str, str]
) -> PodAffinityTerm:
    selector = LabelSelector.from_api(body.get("labelSelector"), field=f"{field}.labelSelector")
    match_keys = string_list(body.get("matchLabelKeys"), f"{field}.matchLabelKeys")
    mismatch_keys = string_list(body.get("mismatchLabelKeys"), f"{field}.mismatchLabelKeys")
    selector = selector.with_requirements(
        _label_key_requirements(match_keys, Operator.IN, labels)
        + _label_key_requirements(mismatch_keys, Operator.NOT_IN, labels)
    )
    raw_ns_selector = body.get("namespaceSelector")
    namespaces = string_list(body.get("namespaces"), f"{field}.namespaces")
    ns_selector = (
        NOTHING
        if raw_ns_selector is None
        else LabelSelector.from_api(raw_ns_selector, field=f"{field}.namespaceSelector")
    )
    if not namespaces and raw_ns_selector is None:
        namespaces = (namespace,)
    topology_key = string(body.get("topologyKey"), f"{field}.topologyKey")
    if not topology_key:
        raise InvalidObjectError(f"{field}.topologyKey", topology_key, "can not be empty")
    return PodAffinityTerm(selector, frozenset(namespaces), ns_selector, topology_key)


def _affinity_terms(
    raw: object, field: str, namespace: str, labels: Mapping[str, str]
) -> tuple[PodAffinityTerm, ...]:
    return tuple(
        _affinity_term(t, f"{field}[{i}]", namespace, labels)
        for i, t in enumerate(object_list(raw, field))
    )


def _weighted_terms(
    raw: object, field: str, namespace: str, labels: Mapping[str, str]
) -> tuple[WeightedPodAffinityTerm, ...]:
    out: list[WeightedPodAffinityTerm] = []
    for i, item in enumerate(object_list(raw, field)):
        path = f"{field}[{i}]"
        weight = integer(item.get("weight"), f"{path}.weight", default=0, minimum=1, maximum=100)
        term = _affinity_term(
            mapping(item.get("podAffinityTerm"), f"{path}.podAffinityTerm"),
            f"{path}.podAffinityTerm",
            namespace,
            labels,
        )
        out.append(WeightedPodAffinityTerm(weight, term))
    return tuple(out)


def _toleration(body: Mapping[str, Any], field: str) -> Toleration:
    operator = string(body.get("operator"), f"{field}.operator", "Equal") or "Equal"
    if operator not in ("Equal", "Exists"):
        raise InvalidObjectError(f"{field}.operator", operator, 'must be "Equal" or "Exists"')
    return Toleration(
        key=string(body.get("key"), f"{field}.key"),
        operator=operator,
        value=string(body.get("value"), f"{field}.value"),
        effect=string(body.get("effect"), f"{field}.effect"),
    )


def _host_ports(container: Mapping[str, Any], field: str, host_network: bool) -> list[HostPort]:
    out: list[HostPort] = []
    for i, p in enumerate(object_list(container.get("ports"), f"{field}.ports")):
        path = f"{field}.ports[{i}]"
        container_port = integer(p.get("containerPort"), f"{path}.containerPort", default=0)
        host_port = integer(p.get("hostPort"), f"{path}.hostPort", default=0)
        if host_network and host_port == 0:
            host_port = container_port
        if host_port <= 0:
            continue
        out.append(
            HostPort(
                host_ip=string(p.get("hostIP"), f"{path}.hostIP") or DEFAULT_BIND_ALL_HOST_IP,
                protocol=string(p.get("protocol"), f"{path}.protocol") or "TCP",
                port=host_port,
            )
        )
    return out


def _spread_constraint(
    body: Mapping[str, Any], field: str, labels: Mapping[str, str]
) -> TopologySpreadConstraint:
    max_skew = integer(body.get("maxSkew"), f"{field}.maxSkew", default=0)
    if max_skew <= 0:
        raise InvalidObjectError(
            f"{field}.maxSkew", body.get("maxSkew"), "must be greater than zero"
        )
    topology_key = string(body.get("topologyKey"), f"{field}.topologyKey")
    if not topology_key:
        raise InvalidObjectError(f"{field}.topologyKey", topology_key, "can not be empty")
    action = body.get("whenUnsatisfiable")
    if action not in [a.value for a in UnsatisfiableAction]:
        raise InvalidObjectError(
            f"{field}.whenUnsatisfiable", action, 'must be "DoNotSchedule" or "ScheduleAnyway"'
        )
    selector = LabelSelector.from_api(body.get("labelSelector"), field=f"{field}.labelSelector")
    match_keys = string_list(body.get("matchLabelKeys"), f"{field}.matchLabelKeys")
    selector = selector.with_requirements(_label_key_requirements(match_keys, Operator.IN, labels))
    min_domains = integer(body.get("minDomains"), f"{field}.minDomains", default=1, minimum=1)
    policies: list[InclusionPolicy] = []
    for key, default in (
        ("nodeAffinityPolicy", InclusionPolicy.HONOR),
        ("nodeTaintsPolicy", InclusionPolicy.IGNORE),
    ):
        raw = body.get(key)
        if raw is None:
            policies.append(default)
        elif raw in [p.value for p in InclusionPolicy]:
            policies.append(InclusionPolicy(raw))
        else:
            raise InvalidObjectError(f"{field}.{key}", raw, 'must be "Honor" or "Ignore"')
    return TopologySpreadConstraint(
        max_skew=max_skew,
        topology_key=topology_key,
        when_unsatisfiable=UnsatisfiableAction(action),
        selector=selector,
        min_domains=min_domains,
        node_affinity_policy=policies[0],
        node_taints_policy=policies[1],
    )


def _container_requests(container: Mapping[str, Any], field: str) -> dict[str, Any]:
    resources = mapping(container.get("resources"), f"{field}.resources")
    requests = parse_resource_list(resources.get("requests"), field=f"{field}.resources.requests")
    limits = parse_resource_list(resources.get("limits"), field=f"{field}.resources.limits")
    for name, q in limits.items():
        requests.setdefault(name, q)  # SetDefaults_Pod: requests default to limits
    return requests


def _exclusive_cpus(
    spec: Mapping[str, Any],
    containers: list[Mapping[str, Any]],
    init_containers: list[Mapping[str, Any]],
) -> int:
    """CPUs the kubelet's static CPU manager would pin: whole-CPU containers of a Guaranteed pod.

    Guaranteed means every container sets cpu and memory limits and requests equal to them
    (``GetPodQOS``). App containers and sidecars hold their CPUs for the pod's life; an init
    container holds its CPUs only while it runs (next to the sidecars started before it), so
    the pod needs the larger of the two phases. Pods with pod-level resources are not pinned
    per container and count as 0.
    """
    if spec.get("resources"):
        return 0
    for body in (*init_containers, *containers):
        res = body.get("resources")
        limits = res.get("limits") if isinstance(res, Mapping) else None
        if not isinstance(limits, Mapping) or CPU not in limits or MEMORY not in limits:
            return 0  # not Guaranteed: the common case, decided without parsing quantities
    app = peak_init = sidecars = 0
    for index, body in enumerate((*init_containers, *containers)):
        is_init = index < len(init_containers)
        where = f"spec.{'initContainers' if is_init else 'containers'}[*]"
        requests = _container_requests(body, where)
        limits = parse_resource_list(
            mapping(body.get("resources"), f"{where}.resources").get("limits"),
            field=f"{where}.resources.limits",
        )
        for resource in (CPU, MEMORY):
            if resource not in limits or requests.get(resource) != limits[resource]:
                return 0
        millis = limits[CPU].milli_value()
        whole = millis // 1000 if millis % 1000 == 0 else 0
        if not is_init:
            app += whole
        elif body.get("restartPolicy") == "Always":
            sidecars += whole
        else:
            peak_init = max(peak_init, sidecars + whole)
    return max(app + sidecars, peak_init)


def _status_list(raw: object, field: str) -> ResourceList | None:
    """A status resource list, None when unset or empty (kube-scheduler sees nil then)."""
    return parse_resource_list(raw, field=field) or None


def _resize_infeasible(status: Mapping[str, Any]) -> bool:
    """``IsPodResizeInfeasible``: the first ``PodResizePending`` condition decides."""
    for c in object_list(status.get("conditions"), "status.conditions"):
        if c.get("type") == "PodResizePending":
            return bool(c.get("reason") == "Infeasible")
    return False


def _request_inputs(
    spec: Mapping[str, Any],
    status: Mapping[str, Any],
    containers: list[Mapping[str, Any]],
    init_containers: list[Mapping[str, Any]],
) -> RequestInputs:
    """Spec, actuated and allocated resources of every container and of the pod, kept
    apart so that each release's rule can combine them."""
    statuses: dict[str, tuple[str, Mapping[str, Any]]] = {}
    for key in ("containerStatuses", "initContainerStatuses"):
        for i, cs in enumerate(object_list(status.get(key), f"status.{key}")):
            statuses[string(cs.get("name"), f"status.{key}[{i}].name")] = (key, cs)

    def build(c: Mapping[str, Any], field: str, sidecar: bool) -> ContainerResources:
        name = string(c.get("name"), f"{field}.name")
        requests = _container_requests(c, field)
        found = statuses.get(name)
        if found is None:
            return ContainerResources(name, requests, sidecar)
        key, cs = found
        where = f"status.{key}[{name}]"
        reported = cs.get("resources") is not None
        res = mapping(cs.get("resources"), f"{where}.resources")
        return ContainerResources(
            name,
            requests,
            sidecar,
            reported=reported,
            actuated=_status_list(res.get("requests"), f"{where}.resources.requests"),
            allocated=_status_list(cs.get("allocatedResources"), f"{where}.allocatedResources"),
        )

    pod_level_body = mapping(spec.get("resources"), "spec.resources")
    pod_status = NO_POD_STATUS
    if status.get("resources") is not None or status.get("allocatedResources") is not None:
        res = mapping(status.get("resources"), "status.resources")
        pod_status = PodStatusResources(
            reported=status.get("resources") is not None,
            actuated=_status_list(res.get("requests"), "status.resources.requests"),
            allocated=_status_list(status.get("allocatedResources"), "status.allocatedResources"),
        )
    return RequestInputs(
        containers=tuple(
            build(c, f"spec.containers[{i}]", False) for i, c in enumerate(containers)
        ),
        init_containers=tuple(
            build(c, f"spec.initContainers[{i}]", c.get("restartPolicy") == "Always")
            for i, c in enumerate(init_containers)
        ),
        pod_level=parse_resource_list(
            pod_level_body.get("requests"), field="spec.resources.requests"
        ),
        overhead=parse_resource_list(spec.get("overhead"), field="spec.overhead"),
        status=pod_status,
        resize_infeasible=_resize_infeasible(status),
    )


def _resources(inputs: RequestInputs, rules: StatusRules) -> PodResources:
    spec_requests = pod_requests(inputs)
    accounted = pod_requests(inputs, rules=rules) if inputs.status_matters else spec_requests
    pod_level_set = any(is_pod_level_resource(n) for n in inputs.pod_level)
    if pod_level_set:
        non_missing = {k: v for k, v in DEFAULT_NON_MISSING.items() if k not in accounted}
    else:
        non_missing = dict(DEFAULT_NON_MISSING)
    non_zero = (
        pod_requests(inputs, rules=rules, non_missing=non_missing) if non_missing else accounted
    )
    if non_missing == DEFAULT_NON_MISSING:
        score = non_zero  # the same computation (most pods name no pod-level resources)
    else:
        score = pod_requests(inputs, rules=rules, non_missing=DEFAULT_NON_MISSING)
    field = "spec.containers[*].resources.requests"
    non_zero_int = round_resources(non_zero, field=field)
    return PodResources(
        requests=MappingProxyType(round_resources(spec_requests, field=field)),
        accounted=MappingProxyType(round_resources(accounted, field=field)),
        non_zero_cpu=non_zero_int.get(CPU, 0),
        non_zero_memory=non_zero_int.get(MEMORY, 0),
        score_requests=MappingProxyType(round_resources(score, field=field)),
    )
