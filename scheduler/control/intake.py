"""The event intake: server-side filtered LIST + WATCH streams, delivered in coalesced batches.

Theory of operation
-------------------
Each :class:`Stream` follows one collection (a :class:`Resource`: path plus field/label
selectors) with plain kubernetes-asyncio requests in raw mode (``_preload_content=False``)
and parses each line with orjson, so the API server filters and nothing is deserialised
into client models:

1. **List.** One paged LIST (``limit`` + ``continue``). The pages after the first are
   served at the first page's resourceVersion (the continue token carries it), so the
   list is one consistent set at that RV. A 410 on a continue token (it expired under
   compaction) restarts the list. The list is delivered as a :class:`Relisted` value:
   the *whole* set, so a consumer replaces what it held and drops what is missing. The
   first one marks the stream :attr:`Stream.synced`. A :attr:`Resource.paged` stream
   (the bound pods: 30 000 of them at scale) hands over each page as it is read
   (:class:`Page`) and closes the list with an empty ``paged`` :class:`Relisted`, the
   initial list and every re-list alike, so no list is ever held whole.
2. **Watch** from the list's RV with ``allowWatchBookmarks=true``. Every object and
   bookmark advances the stream's RV; a connection the server closes (``timeoutSeconds``)
   or that breaks is resumed from that RV, never re-listed. Only 410 Gone (HTTP, or an
   ``ERROR`` event with code 410: the RV fell out of the watch cache's window) re-lists,
   and that re-list is again a :class:`Relisted` reconcile. (Measured on 1.34: the 410
   comes as HTTP 200 + ``ERROR`` "too old resource version"; etcd compaction alone does
   not cause it while the watch cache still covers the RV.)
3. **Missing resources.** A 404 (the CRD is not installed) or 403 (no grant) on the list
   is reported once as :class:`Unavailable` (the set is empty, the stream counts as
   synced so start-up does not wait for an optional resource) and retried slowly; when
   the resource appears, the next list is an ordinary :class:`Relisted`.

Batching. The reader never hands events to the consumer one by one. It appends everything
one socket read returned to the stream's pending :class:`Batch`, coalesced by uid (see
:func:`coalesce`), and wakes the consumer; whatever arrives while the consumer is busy
joins the same pending batch. Memory is thus bounded by the number of distinct objects,
not events. If even that passes ``max_pending`` objects the reader stops reading, so TCP
pushes back on the API server (which may then close the watch; the stream resumes, or
re-lists on 410). A :class:`Relisted` supersedes everything pending before it.

:meth:`Intake.get` returns, for every stream with news, its pending :class:`Relisted` or
:class:`Unavailable` first (if any) and then its :class:`Batch`. Streams are independent:
nothing orders one stream's events relative to another's.

Pods move between the two pod streams. The pending stream selects
``spec.schedulerName=<ours>,spec.nodeName=``; the assigned stream
``spec.nodeName!=,status.phase!=Succeeded,status.phase!=Failed``. When a pod is bound it
stops matching the first and starts matching the second: the pending stream reports it
DELETED (with its *previous*, unbound body: the watch cache sends the last matching
state) and the assigned stream ADDED. The two may arrive in either order, and a lagging
pending stream may still deliver older MODIFIED events of a pod the assigned stream has
already shown bound, or even deleted. :class:`PodTracker` holds the rule that makes this
safe; see its docstring.

Fingerprints. :func:`pod_fingerprint` and :func:`node_fingerprint` pick out of a raw body
exactly what the snapshot, the affinity graph and the topology ledger read, as a tuple of
references into the body (no copies); equal fingerprints mean re-parsing would give the
same record, so heartbeats and status-only changes of bound pods can be skipped without
parsing; the echo of our own binding is recognised with :func:`bound_fingerprint`.

Errors: I/O errors, 5xx and 429 are retried with backoff inside the stream; a stream task
that dies (a bug) is raised from :meth:`Intake.get` / :meth:`Intake.wait_synced`.
Shutdown: :meth:`Intake.close` cancels and awaits every stream task; nothing outlives it.
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass
from enum import Enum
from types import MappingProxyType
from typing import Any, Final, Literal, TypedDict, cast

import aiohttp
import orjson
import structlog
from kubernetes_asyncio import client

from scheduler.model.pod import TERMINAL_PHASES

log = structlog.get_logger("lattice.intake")

# -- raw bodies ---------------------------------------------------------------------------


class ObjectMeta(TypedDict, total=False):
    """The ``metadata`` keys the intake reads; the body keeps every other key as sent."""

    name: str
    namespace: str
    uid: str
    resourceVersion: str
    generation: int
    labels: dict[str, str]
    annotations: dict[str, str]
    deletionTimestamp: str


class RawObject(TypedDict, total=False):
    """An API object exactly as the server sent it (orjson-parsed)."""

    apiVersion: str
    kind: str
    metadata: ObjectMeta
    spec: dict[str, Any]
    status: dict[str, Any]


class _ListMeta(TypedDict, total=False):
    resourceVersion: str
    # "continue" is a keyword: read with .get("continue").


class _ListBody(TypedDict, total=False):
    metadata: _ListMeta
    items: list[RawObject]


class _StatusBody(TypedDict, total=False):
    kind: str
    code: int
    reason: str
    message: str


class _WatchLine(TypedDict):
    type: str
    object: RawObject


# -- resources ----------------------------------------------------------------------------


@dataclass(frozen=True, slots=True, kw_only=True)
class Resource:
    """One collection to follow: which objects, filtered by the API server."""

    key: str
    """The stream's name in :meth:`Intake.get` results and logs, e.g. ``pods/pending``."""
    group: str
    """API group; ``""`` for the core group."""
    version: str
    plural: str
    field_selector: str = ""
    label_selector: str = ""
    slim: Callable[[RawObject], None] | None = None
    """Drops, in place, what no reader of this stream needs from each listed object as
    its page is decoded: at 30 000 pods the full bodies of one list were most of the peak
    RSS. Watch events pass whole (most are dropped after a fingerprint; whoever keeps
    one slims it)."""
    paged: bool = False
    """Deliver the initial list page by page (:class:`Page`), for the consumer to apply as
    it arrives. Only the first attempt: a list cut short by an error is read again whole,
    so that its :class:`Relisted` can drop what an earlier page showed and is gone."""

    @property
    def path(self) -> str:
        """The cluster-wide collection path: the same for cluster-scoped resources and for
        namespaced ones listed across all namespaces."""
        if self.group:
            return f"/apis/{self.group}/{self.version}/{self.plural}"
        return f"/api/{self.version}/{self.plural}"


PENDING_PODS: Final = "pods/pending"
ASSIGNED_PODS: Final = "pods/assigned"
NODES: Final = "nodes"
NAMESPACES: Final = "namespaces"
PDBS: Final = "poddisruptionbudgets.policy"
PVS: Final = "persistentvolumes"
PVCS: Final = "persistentvolumeclaims"
STORAGE_CLASSES: Final = "storageclasses.storage.k8s.io"
CSI_NODES: Final = "csinodes.storage.k8s.io"
CSI_DRIVERS: Final = "csidrivers.storage.k8s.io"
CSI_STORAGE_CAPACITIES: Final = "csistoragecapacities.storage.k8s.io"
VOLUME_ATTACHMENTS: Final = "volumeattachments.storage.k8s.io"
DEVICE_CLASSES: Final = "deviceclasses.resource.k8s.io"
RESOURCE_CLAIMS: Final = "resourceclaims.resource.k8s.io"
RESOURCE_SLICES: Final = "resourceslices.resource.k8s.io"
DEVICE_TAINT_RULES: Final = "devicetaintrules.resource.k8s.io"


_POD_STATUS_KEPT: Final = frozenset(
    {
        "phase",
        "nominatedNodeName",
        "startTime",
        "conditions",
        "resourceClaimStatuses",
        "resources",
        "allocatedResources",
    }
)
_POD_CONDITIONS_KEPT: Final = frozenset({"PodScheduled", "PodResizePending", "DisruptionTarget"})
_CONTAINER_KEPT: Final = (
    "name",
    "resources",
    "ports",
    "restartPolicy",
    "restartPolicyRules",
    "volumeMounts",
)
_CONTAINER_STATUS_KEPT: Final = ("name", "resources", "allocatedResources")
_NODE_STATUS_KEPT: Final = ("allocatable", "capacity", "declaredFeatures")


def _keep(obj: Mapping[str, Any], keys: Iterable[str]) -> dict[str, Any]:
    return {k: obj[k] for k in keys if k in obj}


def slim_pod(raw: RawObject) -> None:
    """Keep only what :func:`pod_fingerprint`, ``Pod.from_api``, the reporter (PodScheduled)
    and preemption (start time, nominated node, DisruptionTarget) read: no managedFields,
    no annotations but ``lattice.dev/`` ones (``last-applied-configuration`` repeats the
    whole spec), containers without images, commands, env, probes or volume mounts (but
    those with bind-mount options), no container states or IPs. Everything left is what a
    decision reads, so fingerprints are unchanged."""
    meta = cast(dict[str, Any], raw.get("metadata") or {})
    meta.pop("managedFields", None)
    annotations = meta.get("annotations")
    if annotations:
        meta["annotations"] = {
            k: v for k, v in annotations.items() if k.startswith(LATTICE_ANNOTATION_PREFIX)
        }
    spec = raw.get("spec")
    if isinstance(spec, dict):
        for key in ("containers", "initContainers"):
            containers = spec.get(key)
            if isinstance(containers, list):
                spec[key] = [_slim_container(c) if isinstance(c, dict) else c for c in containers]
    status = raw.get("status")
    if isinstance(status, dict):
        kept = {k: v for k, v in status.items() if k in _POD_STATUS_KEPT}
        conditions = kept.get("conditions")
        if isinstance(conditions, list):
            kept["conditions"] = [
                c
                for c in conditions
                if isinstance(c, dict) and c.get("type") in _POD_CONDITIONS_KEPT
            ]
        for key in ("containerStatuses", "initContainerStatuses"):
            statuses = status.get(key)
            if isinstance(statuses, list):
                kept[key] = [
                    _keep(c, _CONTAINER_STATUS_KEPT) if isinstance(c, dict) else c for c in statuses
                ]
        raw["status"] = kept


def _slim_container(c: Mapping[str, Any]) -> dict[str, Any]:
    kept = _keep(c, _CONTAINER_KEPT)
    mounts = kept.pop("volumeMounts", None)
    if isinstance(mounts, list):
        mounts = _with_bind_options(mounts) or None
    if mounts is not None:  # those with bind-mount options, or a malformed value whole
        kept["volumeMounts"] = mounts
    return kept


def slim_node(raw: RawObject) -> None:
    """Keep metadata (less managedFields), spec, allocatable/capacity and declaredFeatures:
    not images, conditions, addresses or nodeInfo, which :func:`node_fingerprint` skips too."""
    meta = cast(dict[str, Any], raw.get("metadata") or {})
    meta.pop("managedFields", None)
    status = raw.get("status")
    if isinstance(status, dict):
        raw["status"] = _keep(status, _NODE_STATUS_KEPT)


def pending_pods(scheduler_name: str) -> Resource:
    """Unbound pods that name us: the only pods we may schedule."""
    return Resource(
        key=PENDING_PODS,
        group="",
        version="v1",
        plural="pods",
        field_selector=f"spec.schedulerName={scheduler_name},spec.nodeName=",
        slim=slim_pod,
    )


def assigned_pods() -> Resource:
    """Every bound pod that still holds its node (any scheduler's): what capacity,
    affinity and spread count. Finished pods leave the stream (as DELETED)."""
    return Resource(
        key=ASSIGNED_PODS,
        group="",
        version="v1",
        plural="pods",
        field_selector="spec.nodeName!=,status.phase!=Succeeded,status.phase!=Failed",
        slim=slim_pod,
        paged=True,
    )


def nodes() -> Resource:
    return Resource(key=NODES, group="", version="v1", plural="nodes", slim=slim_node)


def namespaces() -> Resource:
    return Resource(key=NAMESPACES, group="", version="v1", plural="namespaces")


def pod_disruption_budgets() -> Resource:
    """``policy/v1`` PodDisruptionBudgets in every namespace: preemption spends their
    ``status.disruptionsAllowed``, as kube-scheduler's does."""
    return Resource(key=PDBS, group="policy", version="v1", plural="poddisruptionbudgets")


def storage() -> list[Resource]:
    """What the volume plugins read: PVs, claims (every namespace), StorageClasses,
    CSINodes (attach limits), VolumeAttachments (volumes attached to a node), CSIDrivers
    (capacity tracking, drivers that must be installed) and CSIStorageCapacities (every
    namespace: what a driver can still provision where)."""
    return [
        Resource(key=PVS, group="", version="v1", plural="persistentvolumes"),
        Resource(key=PVCS, group="", version="v1", plural="persistentvolumeclaims"),
        Resource(
            key=STORAGE_CLASSES, group="storage.k8s.io", version="v1", plural="storageclasses"
        ),
        Resource(key=CSI_NODES, group="storage.k8s.io", version="v1", plural="csinodes"),
        Resource(
            key=VOLUME_ATTACHMENTS, group="storage.k8s.io", version="v1", plural="volumeattachments"
        ),
        Resource(key=CSI_DRIVERS, group="storage.k8s.io", version="v1", plural="csidrivers"),
        Resource(
            key=CSI_STORAGE_CAPACITIES,
            group="storage.k8s.io",
            version="v1",
            plural="csistoragecapacities",
        ),
    ]


def dynamic_resources(*, taint_rules: bool = False) -> list[Resource]:
    """What DynamicResources reads (``resource.k8s.io/v1``, GA in 1.34): DeviceClasses,
    ResourceClaims in every namespace (every written allocation uses devices up, whoever
    wrote it) and ResourceSlices; with ``taint_rules``, DeviceTaintRules too (v1 since
    1.37, where kube-scheduler applies their taints to the slices' devices; the caller
    passes it where discovery finds them served, so 1.35 and 1.36 get no stream that can
    only ever answer 404)."""
    out = [
        Resource(key=DEVICE_CLASSES, group="resource.k8s.io", version="v1", plural="deviceclasses"),
        Resource(
            key=RESOURCE_CLAIMS, group="resource.k8s.io", version="v1", plural="resourceclaims"
        ),
        Resource(
            key=RESOURCE_SLICES, group="resource.k8s.io", version="v1", plural="resourceslices"
        ),
    ]
    if taint_rules:
        out.append(
            Resource(
                key=DEVICE_TAINT_RULES,
                group="resource.k8s.io",
                version="v1",
                plural="devicetaintrules",
            )
        )
    return out


def custom(
    group: str, version: str, plural: str, *, key: str | None = None, label_selector: str = ""
) -> Resource:
    """A custom resource (cluster-scoped, or namespaced across all namespaces):
    LatticeScheduler, NodeTopology, PodGroup, NodeResourceTopology."""
    return Resource(
        key=key or f"{plural}.{group}",
        group=group,
        version=version,
        plural=plural,
        label_selector=label_selector,
    )


# -- events, batches, coalescing ----------------------------------------------------------


class EventType(Enum):
    ADDED = "ADDED"
    MODIFIED = "MODIFIED"
    DELETED = "DELETED"


@dataclass(frozen=True, slots=True)
class Event:
    """One object's net change within a batch (after coalescing)."""

    type: EventType
    uid: str
    obj: RawObject
    """The latest body (for DELETED: the last state the stream matched)."""


@dataclass(frozen=True, slots=True)
class Batch:
    """What one stream delivered since the consumer last took from it, coalesced by uid,
    in the order of each object's last event."""

    stream: str
    events: tuple[Event, ...]
    resource_version: str
    """The stream's RV after these events (bookmarks included)."""


@dataclass(frozen=True, slots=True)
class Relisted:
    """The stream's whole set at ``resource_version``: the initial list (``initial``) or
    the re-list after 410 Gone. Replace what the stream showed before; drop what is missing.

    ``paged``: the list came before this, page by page (:class:`Page`), and ``items`` is
    empty; the set is the union of the pages since the last ``first`` one: drop what
    the stream showed before and no such page did."""

    stream: str
    items: tuple[RawObject, ...]
    resource_version: str
    initial: bool
    paged: bool = False


@dataclass(frozen=True, slots=True)
class Page:
    """One page of a :attr:`Resource.paged` stream's list (the initial one or a re-list
    after 410 Gone), delivered as it is read so that 30 000 pods are never all held as
    bodies at once; a ``paged`` :class:`Relisted` closes the list. Apply as upserts and
    remember what the pages showed: the closing value drops the rest.

    ``first``: a list starts here; pages of an earlier attempt (cut short by an expired
    continue token) no longer count."""

    stream: str
    items: tuple[RawObject, ...]
    resource_version: str
    first: bool = False


@dataclass(frozen=True, slots=True)
class Unavailable:
    """The resource is not served (404: CRD missing) or not allowed (403). Its set is empty
    until a later :class:`Relisted`; the stream retries slowly."""

    stream: str
    status: int
    reason: str


Update = Batch | Relisted | Unavailable | Page


def object_key(obj: RawObject) -> str:
    """uid; ``namespace/name`` for the odd body without one."""
    meta = obj.get("metadata") or {}
    uid = meta.get("uid")
    if uid:
        return uid
    return f"{meta.get('namespace', '')}/{meta.get('name', '')}"


def merge(pending: Event | None, new: Event) -> Event:
    """Fold ``new`` into the pending event of the same uid.

    The result brings a consumer that saw the state *before* the batch to the state after:
    a DELETED always survives (the consumer must remove the object; deleting one it never
    saw is a no-op for it); otherwise the last body wins and the type says whether the
    object existed before the batch (MODIFIED) or entered the stream within it (ADDED).
    """
    if pending is None or new.type is EventType.DELETED:
        return new
    if pending.type is EventType.ADDED:
        return Event(EventType.ADDED, new.uid, new.obj)
    # It existed before the batch (MODIFIED), or left and came back (DELETED then ADDED).
    return Event(EventType.MODIFIED, new.uid, new.obj)


def coalesce(events: Iterable[Event], into: dict[str, Event] | None = None) -> dict[str, Event]:
    """Coalesce ``events`` by uid into ``into`` (ordered by each uid's last event)."""
    out: dict[str, Event] = {} if into is None else into
    for ev in events:
        prev = out.pop(ev.uid, None)
        out[ev.uid] = merge(prev, ev)
    return out


# -- fingerprints -------------------------------------------------------------------------

Fingerprint = tuple[object, ...]
"""Compare with ``==`` (it holds references to sub-objects of the body: not hashable)."""

LATTICE_ANNOTATION_PREFIX: Final = "lattice.dev/"
"""The annotations scheduling reads (devices, gpu-alignment, rdma; the solver keys on all)."""

_NODE_CONSTRAINED_VOLUME_KEYS: Final = frozenset(
    {
        "persistentVolumeClaim",
        "ephemeral",
        "gcePersistentDisk",
        "awsElasticBlockStore",
        "rbd",
        "iscsi",
        "azureDisk",
        "azureFile",
        "cinder",
        "portworxVolume",
        "vsphereVolume",
        "csi",
    }
)


def _container_view(c: Mapping[str, Any]) -> tuple[object, ...]:
    return (
        c.get("name"),
        c.get("resources"),
        c.get("ports"),
        c.get("restartPolicy"),
        c.get("restartPolicyRules"),
        _bind_mounts(c.get("volumeMounts")),
    )


def _bind_mounts(mounts: object) -> object:
    """The volume mounts with bind-mount options (a node declared feature needs them); the
    others place nothing. Anything malformed is kept whole, for the parser to report."""
    if mounts is None:
        return ()
    if not isinstance(mounts, list):
        return mounts
    return tuple(_with_bind_options(mounts))


def _with_bind_options(mounts: list[Any]) -> list[Any]:
    return [m for m in mounts if not isinstance(m, dict) or "bindMountOptions" in m]


def _status_view(cs: Mapping[str, Any]) -> tuple[object, ...]:
    return (cs.get("name"), cs.get("resources"), cs.get("allocatedResources"))


def _statuses_view(statuses: Any) -> tuple[object, ...]:
    """Only statuses that report resources count (``Pod.from_api`` reads nothing else of
    them): the kubelet's first Running status, container states without resources, must
    not make the echo of our binding, coalesced with it, look like someone's change."""
    return tuple(
        _status_view(cs)
        for cs in statuses or ()
        if cs.get("resources") is not None or cs.get("allocatedResources") is not None
    )


def _resize_infeasible(status: Mapping[str, Any]) -> bool:
    for c in status.get("conditions") or ():
        if c.get("type") == "PodResizePending":
            return bool(c.get("reason") == "Infeasible")
    return False


def resize_view(status: Mapping[str, Any]) -> Fingerprint:
    """What ``Pod.from_api`` reads of a pod's status for the request it holds on its node
    (in-place resize): the container statuses that report resources, the pod-level
    ``resources``/``allocatedResources`` and whether the resize is infeasible. The kubelet
    changes these without touching the spec, so they must be compared on their own."""
    return (
        _statuses_view(status.get("containerStatuses")),
        _statuses_view(status.get("initContainerStatuses")),
        status.get("resources"),
        status.get("allocatedResources"),
        _resize_infeasible(status),
    )


def _volume_view(v: Mapping[str, Any]) -> tuple[object, ...]:
    """The name and every source that constrains placement, whole (claims, disks that
    conflict or count against attach limits); emptyDir, configMap, projected ... are not."""
    return (v.get("name"), *((k, x) for k, x in v.items() if k in _NODE_CONSTRAINED_VOLUME_KEYS))


def pod_fingerprint(raw: Mapping[str, Any]) -> Fingerprint:
    """Everything ``Pod.from_api``, the snapshot, the graph and the topology ledger read.

    Left out on purpose: every other status field (conditions, container states, IPs,
    start times: the status-only updates of a running pod), annotations other than
    ``lattice.dev/``, ``resourceVersion``/``managedFields``, ``nominatedNodeName`` (no
    filter or score reads it; :func:`pending_fingerprint` adds it for pending pods) and the
    non-terminal phase (Pending -> Running changes nothing a decision reads; terminal pods
    leave the assigned stream anyway).
    """
    meta: Mapping[str, Any] = raw.get("metadata") or {}
    spec: Mapping[str, Any] = raw.get("spec") or {}
    status: Mapping[str, Any] = raw.get("status") or {}
    annotations: Mapping[str, str] = meta.get("annotations") or {}
    affinity = spec.get("affinity")
    return (
        meta.get("uid"),
        meta.get("name"),
        meta.get("namespace"),
        meta.get("generation"),
        meta.get("labels"),
        meta.get("deletionTimestamp") is not None,
        tuple((k, v) for k, v in annotations.items() if k.startswith(LATTICE_ANNOTATION_PREFIX)),
        spec.get("nodeName"),
        spec.get("schedulerName"),
        spec.get("priority"),
        spec.get("schedulingGates"),
        spec.get("nodeSelector"),
        affinity,
        spec.get("tolerations"),
        spec.get("topologySpreadConstraints"),
        spec.get("hostNetwork"),
        spec.get("hostUsers"),
        tuple(_container_view(c) for c in spec.get("containers") or ()),
        tuple(_container_view(c) for c in spec.get("initContainers") or ()),
        tuple(
            _bind_mounts(c.get("volumeMounts")) if isinstance(c, Mapping) else c
            for c in spec.get("ephemeralContainers") or ()
        ),
        spec.get("overhead"),
        spec.get("resources"),
        tuple(_volume_view(v) for v in spec.get("volumes") or ()),
        spec.get("resourceClaims"),
        status.get("resourceClaimStatuses"),
        status.get("phase") in TERMINAL_PHASES,
        resize_view(status),
    )


def pending_fingerprint(raw: Mapping[str, Any]) -> Fingerprint:
    """:func:`pod_fingerprint` and ``status.nominatedNodeName``: no filter or score reads
    it, but the preemptor keeps a pending pod's nomination (it counts for pods of lower or
    equal priority), so an update that only sets it (a previous leader's preemption, seen
    while this replica stood by) must be read, as kube-scheduler's queue updates its
    nominator on every update of a pending pod. The status we write with it (PodScheduled)
    still changes nothing."""
    status: Mapping[str, Any] = raw.get("status") or {}
    return (*pod_fingerprint(raw), status.get("nominatedNodeName"))


def bound_fingerprint(
    pending: Mapping[str, Any],
    *,
    node: str,
    annotations: Mapping[str, str] | None = None,
    labels: Mapping[str, str] | None = None,
) -> Fingerprint:
    """The fingerprint the assigned stream's echo of *our* binding will have: the pending
    body with ``spec.nodeName`` set and the Binding's annotations merged (what a Binding
    changes). Equal to :func:`pod_fingerprint` of the echo unless someone else changed the
    pod meanwhile, so the confirmation needs no re-parse."""
    meta = dict(pending.get("metadata") or {})
    if annotations:
        meta["annotations"] = {**(meta.get("annotations") or {}), **annotations}
    if labels:  # the node's zone and region, copied by the API server's admission (1.35+)
        meta["labels"] = {**(meta.get("labels") or {}), **labels}
    spec = {**(pending.get("spec") or {}), "nodeName": node}
    return pod_fingerprint({**pending, "metadata": meta, "spec": spec})


def node_fingerprint(raw: Mapping[str, Any]) -> Fingerprint:
    """What ``Node.from_api`` reads, plus capacity: not conditions, heartbeats, images,
    addresses or nodeInfo (what a node's periodic status update changes)."""
    meta: Mapping[str, Any] = raw.get("metadata") or {}
    spec: Mapping[str, Any] = raw.get("spec") or {}
    status: Mapping[str, Any] = raw.get("status") or {}
    return (
        meta.get("uid"),
        meta.get("name"),
        meta.get("labels"),
        spec.get("taints"),
        spec.get("unschedulable"),
        status.get("allocatable"),
        status.get("capacity"),
        status.get("declaredFeatures"),
    )


# -- the pod tracker (the tombstone rule) -------------------------------------------------


class PendingVerdict(Enum):
    """What a pending-stream event means once the assigned stream is taken into account."""

    UPSERT = "upsert"
    """A pod waiting for us: queue it (or update its queue entry)."""
    STALE = "stale"
    """An old state of a pod already seen bound (or bound by us, or gone since): ignore."""
    LEFT = "left"
    """It stopped being pending (bound, or deleted): drop its queue entry only. Never
    touch the snapshot for it: if it is assumed, the assigned stream confirms it (or the
    assume TTL / the binding's error forgets it); if it is bound elsewhere, the assigned
    stream adds it."""


class PodTracker:
    """The rule for the two pod streams, kept by uid (a re-created pod has a new uid).

    * The **assigned stream** alone drives the snapshot: ADDED/MODIFIED place, DELETED
      removes. Tell the tracker with :meth:`bound` / :meth:`gone` / :meth:`relisted`; also
      call :meth:`bound` when our own binding succeeds (its echo may be slower than the
      pending stream's last events of the pod).
    * The **pending stream** drives the queue, through :meth:`pending`: a pending-stream
      DELETED is only "no longer pending" (:attr:`PendingVerdict.LEFT`), whether the pod
      was bound or deleted; an ADDED/MODIFIED of a uid that is bound, or was seen bound
      and then left the assigned stream, is :attr:`PendingVerdict.STALE` (``spec.nodeName``
      never goes back to empty, so any such event is old news from a lagging stream).
    * A pending :class:`Relisted` replaces the queue's pending pods: skip its items that
      :meth:`is_bound` (the assigned stream can be ahead of the pending list's RV).
    * **Tombstones.** When a bound pod leaves the assigned stream (deleted or finished),
      its uid is remembered with the RV of that event until the pending stream's RV has
      passed it (:meth:`pending_progress`: from then on nothing older can still arrive on
      the pending stream) or ``ttl`` seconds have passed (RVs that are not integers, or
      a pending stream that is down).
    """

    def __init__(self, *, ttl: float = 120.0, clock: Callable[[], float] = time.monotonic) -> None:
        self.ttl = ttl
        self.clock = clock
        self._bound: set[str] = set()
        self._tombstones: dict[str, tuple[int | None, float]] = {}

    def bound(self, uid: str) -> None:
        self._bound.add(uid)
        self._tombstones.pop(uid, None)

    def gone(self, uid: str, resource_version: str | None = None) -> None:
        """The pod left the assigned stream (DELETED): keep a tombstone."""
        self._bound.discard(uid)
        self._tombstones[uid] = (_rv_int(resource_version), self.clock() + self.ttl)

    def relisted(self, uids: Iterable[str], resource_version: str) -> None:
        """The assigned stream's reconcile: bound pods not in it left during the gap."""
        now_bound = set(uids)
        for uid in self._bound - now_bound:
            self.gone(uid, resource_version)
        self._bound = now_bound
        for uid in now_bound:
            self._tombstones.pop(uid, None)

    def pending(self, event: Event) -> PendingVerdict:
        if event.type is EventType.DELETED:
            return PendingVerdict.LEFT
        if self.is_bound(event.uid):
            return PendingVerdict.STALE
        return PendingVerdict.UPSERT

    def is_bound(self, uid: str) -> bool:
        """Bound now, or bound recently enough that a lagging pending event may follow."""
        if uid in self._bound:
            return True
        stone = self._tombstones.get(uid)
        if stone is None:
            return False
        if self.clock() >= stone[1]:
            del self._tombstones[uid]
            return False
        return True

    def pending_progress(self, resource_version: str) -> None:
        """The pending stream has delivered everything up to ``resource_version``: call it
        with each pending :class:`Batch`'s or :class:`Relisted`'s RV *after* judging its
        events (a tombstone must still catch the batch's own stale events)."""
        rv = _rv_int(resource_version)
        now = self.clock()
        expired = [
            uid
            for uid, (stone_rv, deadline) in self._tombstones.items()
            if now >= deadline or (rv is not None and stone_rv is not None and rv >= stone_rv)
        ]
        for uid in expired:
            del self._tombstones[uid]

    @property
    def tombstones(self) -> int:
        return len(self._tombstones)


def _rv_int(resource_version: str | None) -> int | None:
    """etcd revisions are integers; the tracker only compares those it can parse."""
    try:
        return int(resource_version) if resource_version else None
    except ValueError:
        return None


# -- streams ------------------------------------------------------------------------------


@dataclass(frozen=True, slots=True, kw_only=True)
class IntakeSettings:
    page_size: int = 500
    """``limit`` of each LIST page."""
    watch_timeout_s: int = 300
    """``timeoutSeconds`` of each WATCH: the server closes it and the stream resumes."""
    request_timeout_s: float = 60.0
    """Connect timeout and LIST page timeout; a watch may idle for ``watch_timeout_s``."""
    unavailable_retry_s: float = 30.0
    """How often to retry a resource that is not served (404) or not allowed (403)."""
    backoff_initial_s: float = 0.2
    backoff_max_s: float = 10.0
    max_pending: int = 50_000
    """Distinct objects a stream buffers for a slow consumer before it stops reading."""
    read_size: int = 1 << 20
    """Most bytes taken from the socket per read (one read, one batch at most)."""


@dataclass
class StreamStats:
    lists: int = 0
    relists: int = 0
    watches: int = 0
    events: int = 0
    bookmarks: int = 0
    bytes: int = 0
    pages: int = 0
    errors: int = 0


class GoneError(Exception):
    """410 Gone: the resourceVersion (or continue token) is older than the server keeps."""


class _Restart(Exception):
    """The watch must be retried after a pause (an error event or status other than 410)."""


class _Buffer:
    """A stream's pending output: an optional whole-set value, then coalesced events."""

    def __init__(self, key: str, wake: asyncio.Event, max_pending: int) -> None:
        self.key = key
        self._wake = wake
        self._max = max_pending
        self.pages: list[Page] = []
        self.head: Relisted | Unavailable | None = None
        self.events: dict[str, Event] = {}
        self.resource_version = ""
        self._room = asyncio.Event()
        self._room.set()

    def put_head(self, value: Relisted | Unavailable) -> None:
        self.head = value
        self.events.clear()  # the whole set supersedes changes before it
        if isinstance(value, Relisted):
            self.resource_version = value.resource_version
        self._room.set()
        self._wake.set()

    def put_page(self, page: Page) -> None:
        if page.first:  # a new list supersedes whatever is pending from before it
            self.pages.clear()
            self.head = None
            self.events.clear()
            self._room.set()
        self.pages.append(page)
        self._wake.set()

    def put_events(self, events: Iterable[Event], resource_version: str) -> None:
        coalesce(events, self.events)
        self.resource_version = resource_version
        if len(self.events) >= self._max:
            self._room.clear()
        self._wake.set()

    def advance(self, resource_version: str) -> None:
        """A bookmark: no objects, but the consumer's view of the RV moves on."""
        self.resource_version = resource_version

    def has_news(self) -> bool:
        return self.head is not None or bool(self.events) or bool(self.pages)

    def take(self) -> list[Update]:
        out: list[Update] = [*self.pages]
        self.pages = []
        if self.head is not None:
            out.append(self.head)
            self.head = None
        if self.events:
            out.append(Batch(self.key, tuple(self.events.values()), self.resource_version))
            self.events = {}
        self._room.set()
        return out

    async def room(self) -> None:
        await self._room.wait()


REQUEST_HEADERS: Final = MappingProxyType(
    {"Accept": "application/json", "Accept-Encoding": "identity"}
)
"""What every list and watch asks for. No compression: aiohttp asks for gzip unless told
otherwise, and the API server then gzips every list response over 128 KB (a 500-pod page
is ~1.8 MB), which costs its CPU to compress and ours to inflate, for bytes that cross
loopback or a cluster network. kube-scheduler and the other control-plane components turn
compression off for the same reason (kubernetes#80919)."""


class Stream:
    """One resource: list, then watch with resume; see the module docstring."""

    def __init__(
        self,
        api: client.ApiClient,
        resource: Resource,
        *,
        settings: IntakeSettings,
        wake: asyncio.Event,
    ) -> None:
        self.api = api
        self.resource = resource
        self.settings = settings
        self.buffer = _Buffer(resource.key, wake, settings.max_pending)
        self.stats = StreamStats()
        self.resource_version = ""
        """Last RV read (object or bookmark): where a watch resumes."""
        self.available = True
        self._synced = asyncio.Event()

    @property
    def synced(self) -> bool:
        return self._synced.is_set()

    async def wait_synced(self) -> None:
        await self._synced.wait()

    # -- requests -----------------------------------------------------------------------
    async def _get(
        self, params: list[tuple[str, str]], client_timeout: aiohttp.ClientTimeout
    ) -> Any:
        r = self.resource
        if r.field_selector:
            params.append(("fieldSelector", r.field_selector))
        if r.label_selector:
            params.append(("labelSelector", r.label_selector))
        return await self.api.call_api(
            r.path,
            "GET",
            query_params=params,
            header_params=dict(REQUEST_HEADERS),
            auth_settings=["BearerToken"],
            _preload_content=False,
            _request_timeout=client_timeout,
        )

    async def _list(self) -> Relisted | Unavailable:
        """One consistent paged list; raises :class:`GoneError` if a continue token expired."""
        s = self.settings
        timeout = aiohttp.ClientTimeout(total=s.request_timeout_s)
        items: list[RawObject] = []
        rv = ""
        token = ""
        paged = self.resource.paged
        while True:
            params = [("limit", str(s.page_size))]
            if token:
                params.append(("continue", token))
            resp = await self._get(params, timeout)
            try:
                data = await resp.read()
                status = int(resp.status)
            finally:
                resp.release()
            self.stats.bytes += len(data)
            self.stats.pages += 1
            if status in (403, 404):
                return Unavailable(self.resource.key, status, _status_message(data))
            if status == 410:
                raise GoneError(_status_message(data))
            if status != 200:
                raise _Restart(f"list: HTTP {status}: {_status_message(data)}")
            body = cast(_ListBody, orjson.loads(data))
            meta = body.get("metadata") or {}
            if not rv:
                rv = meta.get("resourceVersion", "")
            page = body.get("items") or []
            if self.resource.slim is not None:
                for item in page:
                    self.resource.slim(item)
            if paged:
                self.buffer.put_page(Page(self.resource.key, tuple(page), rv, first=not token))
            else:
                items.extend(page)
            token = cast(str, cast(Mapping[str, Any], meta).get("continue") or "")
            if not token:
                return Relisted(
                    self.resource.key, tuple(items), rv, initial=not self.synced, paged=paged
                )

    async def _watch_once(self) -> int:
        """One WATCH request from :attr:`resource_version` until the server closes it; the
        bytes it read. Raises :class:`GoneError` on 410, :class:`_Restart` on other errors."""
        s = self.settings
        params = [
            ("watch", "true"),
            ("resourceVersion", self.resource_version),
            ("allowWatchBookmarks", "true"),
            ("timeoutSeconds", str(s.watch_timeout_s)),
        ]
        timeout = aiohttp.ClientTimeout(
            total=None,
            sock_connect=s.request_timeout_s,
            sock_read=s.watch_timeout_s + s.request_timeout_s,
        )
        resp = await self._get(params, timeout)
        try:
            status = int(resp.status)
            if status != 200:
                data = await resp.read()
                if status == 410:
                    raise GoneError(_status_message(data))
                raise _Restart(f"watch: HTTP {status}: {_status_message(data)}")
            self.stats.watches += 1
            tail = b""
            content = resp.content
            read = 0
            while True:
                await self.buffer.room()
                chunk = await content.read(s.read_size)
                if not chunk:
                    return read
                read += len(chunk)
                self.stats.bytes += len(chunk)
                lines = (tail + chunk).split(b"\n")
                tail = lines.pop()
                self._apply(lines)
        finally:
            resp.close()

    def _apply(self, lines: list[bytes]) -> None:
        """Everything one read returned: one call into the buffer."""
        events: list[Event] = []
        rv = self.resource_version
        for line in lines:
            if not line.strip():
                continue
            ev = cast(_WatchLine, orjson.loads(line))
            kind = ev.get("type")
            obj = ev.get("object") or {}
            if kind == "ERROR":
                if events:
                    self._deliver(events, rv)
                status = cast(_StatusBody, obj)
                if status.get("code") == 410:
                    raise GoneError(status.get("message", "410 Gone"))
                raise _Restart(f"watch error event: {status.get('code')}: {status.get('message')}")
            rv = (obj.get("metadata") or {}).get("resourceVersion") or rv
            if kind == "BOOKMARK":
                self.stats.bookmarks += 1
                continue
            events.append(Event(EventType(kind), object_key(obj), obj))
        self.resource_version = rv
        if events:
            self._deliver(events, rv)
        else:
            self.buffer.advance(rv)

    def _deliver(self, events: list[Event], rv: str) -> None:
        self.resource_version = rv
        self.stats.events += len(events)
        self.buffer.put_events(events, rv)

    # -- the loop -----------------------------------------------------------------------
    async def run(self) -> None:
        """List, watch, resume, re-list: until cancelled. Never raises for I/O."""
        s = self.settings
        backoff = s.backoff_initial_s
        need_list = True
        while True:
            try:
                if need_list:
                    result = await self._list()
                    if isinstance(result, Unavailable):
                        self._unavailable(result)
                        await asyncio.sleep(s.unavailable_retry_s)
                        continue
                    self._relisted(result)
                    need_list = False
                started = time.monotonic()
                if await self._watch_once() or time.monotonic() - started >= min(
                    1.0, s.watch_timeout_s / 2
                ):
                    backoff = s.backoff_initial_s  # a watch that ran its course: all is well
                else:  # closed at once with nothing said (a server going away): do not spin
                    await asyncio.sleep(backoff)
                    backoff = min(backoff * 2, s.backoff_max_s)
            except asyncio.CancelledError:
                raise
            except GoneError as exc:
                log.info("intake_relist", reason=f"{self.resource.key}: 410 Gone: {exc}")
                need_list = True
            except (_Restart, aiohttp.ClientError, TimeoutError, OSError, ValueError) as exc:
                # ValueError: a line orjson could not parse (a cut connection), or an
                # unknown event type: resume from the last good RV.
                self.stats.errors += 1
                log.warning(
                    "intake_stream_error",
                    reason=f"{self.resource.key}: {type(exc).__name__}: {exc}",
                )
                await asyncio.sleep(backoff)
                backoff = min(backoff * 2, s.backoff_max_s)

    def _unavailable(self, value: Unavailable) -> None:
        if self.available or not self.synced:
            log.warning(
                "intake_resource_unavailable",
                reason=f"{self.resource.key}: HTTP {value.status}: {value.reason}",
            )
            self.buffer.put_head(value)
        self.available = False
        self._synced.set()

    def _relisted(self, value: Relisted) -> None:
        if value.initial:
            self.stats.lists += 1
        else:
            self.stats.relists += 1
        self.available = True
        self.resource_version = value.resource_version
        self.buffer.put_head(value)
        self._synced.set()


def _status_message(data: bytes) -> str:
    try:
        body = orjson.loads(data)
    except ValueError:
        return data[:200].decode(errors="replace")
    if isinstance(body, dict):
        return str(body.get("message") or body.get("reason") or "")[:300]
    return ""


# -- the intake ---------------------------------------------------------------------------


class Intake:
    """Several streams, one consumer: start, :meth:`wait_synced`, then :meth:`get` in a loop.

    Use as ``async with Intake(api, [...]) as intake:`` or call :meth:`start` and
    :meth:`close`.
    """

    def __init__(
        self,
        api: client.ApiClient,
        resources: Sequence[Resource],
        *,
        settings: IntakeSettings | None = None,
    ) -> None:
        keys = [r.key for r in resources]
        if len(set(keys)) != len(keys):
            raise ValueError(f"duplicate stream keys: {keys}")
        self.settings = settings or IntakeSettings()
        self._wake = asyncio.Event()
        self.streams: dict[str, Stream] = {
            r.key: Stream(api, r, settings=self.settings, wake=self._wake) for r in resources
        }
        self._tasks: list[asyncio.Task[None]] = []

    def start(self) -> None:
        if self._tasks:
            raise RuntimeError("intake already started")
        self._tasks = [
            asyncio.create_task(s.run(), name=f"intake:{key}") for key, s in self.streams.items()
        ]
        for t in self._tasks:
            t.add_done_callback(lambda _: self._wake.set())

    def _raise_if_broken(self) -> None:
        """A stream task only ends on a bug (I/O errors are retried): surface it to the
        consumer instead of leaving it waiting for news that will never come."""
        for t in self._tasks:
            if t.done() and not t.cancelled() and (exc := t.exception()) is not None:
                raise exc

    async def close(self) -> None:
        tasks, self._tasks = self._tasks, []
        for t in tasks:
            t.cancel()
        await asyncio.gather(*tasks, return_exceptions=True)

    async def __aenter__(self) -> Intake:
        self.start()
        return self

    async def __aexit__(self, *_: object) -> Literal[False]:
        await self.close()
        return False

    @property
    def synced(self) -> bool:
        return all(s.synced for s in self.streams.values())

    async def wait_synced(self, keys: Iterable[str] | None = None) -> None:
        """Every stream (of ``keys``) has delivered its initial list (or reported its
        resource missing)."""
        streams = self.streams.values() if keys is None else [self.streams[k] for k in keys]
        waiter = asyncio.ensure_future(asyncio.gather(*(s.wait_synced() for s in streams)))
        watched: list[asyncio.Future[Any]] = [waiter, *self._tasks]
        try:
            await asyncio.wait(watched, return_when=asyncio.FIRST_COMPLETED)
        finally:
            waiter.cancel()
            await asyncio.gather(waiter, return_exceptions=True)
        self._raise_if_broken()

    def get_nowait(self, keys: Iterable[str] | None = None) -> list[Update]:
        """Whatever every stream (of ``keys``) has pending (possibly nothing), without
        waiting."""
        self._raise_if_broken()
        streams = self.streams.values() if keys is None else [self.streams[k] for k in keys]
        if keys is None:
            self._wake.clear()
        out: list[Update] = []
        for s in streams:
            if s.buffer.has_news():
                out.extend(s.buffer.take())
        return out

    async def get(self) -> list[Update]:
        """Wait for news on any stream, then take everything pending."""
        while True:
            out = self.get_nowait()
            if out:
                return out
            await self._wake.wait()
