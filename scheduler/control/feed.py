"""The intake side of the scheduler: what each stream's updates do to the cache and queue.

:class:`~scheduler.control.intake.Intake` delivers per-stream :class:`Relisted` sets and
coalesced :class:`Batch`\\ es; :class:`Feed` applies them to the :class:`Scheduler`, one
call per read. Order within one call: custom resources (ElasticQuotas first), nodes and
namespaces first, then bound pods, then pending pods, so that a pending pod's PodGroup,
its quota and the nodes it could go to are known when it is queued. At start-up the app
applies the custom resources, namespaces and nodes first, the bound pods'
:class:`~scheduler.control.intake.Page`\\ s as they are read, and the pending pods once
every stream has synced.

Fast paths skip the work of the common no-op events without parsing (each compares every
field that the snapshot, the affinity graph and the device ledger read; see
:func:`~scheduler.control.intake.pod_fingerprint`):

* the echo of **our own binding** (the assigned stream's ADDED of a pod we assumed, equal to
  its pending body plus our node and annotations): the pod becomes ADDED in the lifecycle,
  and the snapshot, graph and ledger are not touched again;
* a **status-only change of a bound pod** (it started, its IP or conditions changed): only
  its resourceVersion moves on;
* a **node heartbeat** (conditions, images, addresses): nothing at all;
* a **pending pod's own status** (the PodScheduled condition we wrote): nothing at all (a
  changed ``nominatedNodeName`` is read: see :func:`~scheduler.control.intake.pending_fingerprint`).

Pods move between the two pod streams; :class:`~scheduler.control.intake.PodTracker` holds
the rule (only the assigned stream changes the snapshot; a pending DELETED only means "no
longer pending"). Deletes are checked by uid, because a pod re-created under the same name
may be seen on one stream before the old one's DELETED arrives on the other.

PodDisruptionBudgets are kept whole by the scheduler (preemption reads their status); a bound
pod's status-only change still reaches :meth:`Scheduler.bound_pod_unchanged`, which keeps the
pod's preemption facts (start time, terminating by preemption) current.

Storage objects (PVs, claims, StorageClasses, CSINodes, VolumeAttachments, CSIDrivers,
CSIStorageCapacities) go to
:class:`~scheduler.control.storage.Storage` through the scheduler, which wakes the pods
with claims on each change; DRA objects (DeviceClasses, ResourceSlices, ResourceClaims, and
DeviceTaintRules where served) go to :class:`~scheduler.control.dra.DraObjects` the same way
and wake the pods with resource claims (a rule's change is a change of the devices it taints,
as kube's slice tracker reports it).

Missing resources (:class:`Unavailable`: CRD not installed, no grant) count as empty sets.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable, Mapping, Sequence
from functools import partial
from typing import Any, Final

import structlog

from scheduler.control import intake
from scheduler.control.dra import Kind as DraKind
from scheduler.control.dra import object_key as dra_key
from scheduler.control.intake import (
    Batch,
    Event,
    EventType,
    Fingerprint,
    Page,
    PendingVerdict,
    PodTracker,
    RawObject,
    Relisted,
    Resource,
    Unavailable,
    Update,
    bound_fingerprint,
    node_fingerprint,
    pending_fingerprint,
    pod_fingerprint,
)
from scheduler.control.kubeio import PODGROUP_GROUP, PODGROUP_PLURAL, PODGROUP_VERSION
from scheduler.control.queue import PodKey, pod_key
from scheduler.control.quotas import GROUP as QUOTA_GROUP
from scheduler.control.quotas import PLURAL as QUOTA_PLURAL
from scheduler.control.quotas import STREAM as QUOTAS
from scheduler.control.quotas import VERSION as QUOTA_VERSION
from scheduler.control.scheduler import Scheduler
from scheduler.control.settings import API_GROUP, API_VERSION
from scheduler.control.storage import Kind, object_key
from scheduler.model import noderesourcetopology as nrt
from scheduler.model.workload import (
    UPSTREAM_GROUP,
    UPSTREAM_PLURAL,
    UPSTREAM_PREFIX,
    UPSTREAM_VERSION,
)

log = structlog.get_logger("lattice.feed")

TOPOLOGIES: Final = f"nodetopologies.{API_GROUP}"
NRTS: Final = f"{nrt.PLURAL}.{nrt.GROUP}"
PODGROUPS: Final = f"{PODGROUP_PLURAL}.{PODGROUP_GROUP}"
UPSTREAM_PODGROUPS: Final = f"{UPSTREAM_PLURAL}.{UPSTREAM_GROUP}"

_ORDER: Final = (
    QUOTAS,
    PODGROUPS,
    UPSTREAM_PODGROUPS,
    TOPOLOGIES,
    NRTS,
    intake.NAMESPACES,
    intake.PDBS,
    intake.PVS,
    intake.PVCS,
    intake.STORAGE_CLASSES,
    intake.CSI_NODES,
    intake.VOLUME_ATTACHMENTS,
    intake.CSI_DRIVERS,
    intake.CSI_STORAGE_CAPACITIES,
    intake.DEVICE_CLASSES,
    intake.DEVICE_TAINT_RULES,
    intake.RESOURCE_SLICES,
    intake.RESOURCE_CLAIMS,
    intake.NODES,
    intake.ASSIGNED_PODS,
    intake.PENDING_PODS,
)
_STORAGE: Final = {
    intake.PVS: Kind.PV,
    intake.PVCS: Kind.PVC,
    intake.STORAGE_CLASSES: Kind.CLASS,
    intake.CSI_NODES: Kind.CSI_NODE,
    intake.VOLUME_ATTACHMENTS: Kind.ATTACHMENT,
    intake.CSI_DRIVERS: Kind.CSI_DRIVER,
    intake.CSI_STORAGE_CAPACITIES: Kind.CAPACITY,
}
_DRA: Final = {
    intake.DEVICE_CLASSES: DraKind.CLASS,
    intake.RESOURCE_CLAIMS: DraKind.CLAIM,
    intake.RESOURCE_SLICES: DraKind.SLICE,
    intake.DEVICE_TAINT_RULES: DraKind.TAINT_RULE,
}


def resources(scheduler_name: str, *, device_taint_rules: bool = False) -> list[Resource]:
    """Every stream the scheduler follows (our LatticeScheduler object stays with kopf);
    DeviceTaintRules only where the API server serves them (``device_taint_rules``)."""
    return [
        intake.custom(PODGROUP_GROUP, PODGROUP_VERSION, PODGROUP_PLURAL, key=PODGROUPS),
        intake.custom(UPSTREAM_GROUP, UPSTREAM_VERSION, UPSTREAM_PLURAL, key=UPSTREAM_PODGROUPS),
        intake.custom(QUOTA_GROUP, QUOTA_VERSION, QUOTA_PLURAL, key=QUOTAS),
        intake.custom(API_GROUP, API_VERSION, "nodetopologies", key=TOPOLOGIES),
        intake.custom(nrt.GROUP, nrt.VERSION, nrt.PLURAL, key=NRTS),
        intake.namespaces(),
        intake.pod_disruption_budgets(),
        *intake.storage(),
        *intake.dynamic_resources(taint_rules=device_taint_rules),
        intake.nodes(),
        intake.assigned_pods(),
        intake.pending_pods(scheduler_name),
    ]


def _meta(obj: RawObject) -> tuple[str, str, str]:
    meta = obj.get("metadata") or {}
    return meta.get("namespace", ""), meta.get("name", ""), meta.get("uid", "")


def _name(obj: RawObject) -> str:
    return (obj.get("metadata") or {}).get("name", "")


def _rv(obj: RawObject) -> int | None:
    try:
        return int((obj.get("metadata") or {}).get("resourceVersion") or "")
    except ValueError:
        return None


class FeedStats:
    """What the fast paths saved (for the profile and the benchmark's explanation)."""

    def __init__(self) -> None:
        self.echoes = 0
        self.bound_unchanged = 0
        self.node_heartbeats = 0
        self.pending_unchanged = 0
        self.parsed = 0


class Feed:
    """Applies intake updates to one :class:`Scheduler` (see the module docstring)."""

    def __init__(self, scheduler: Scheduler, tracker: PodTracker | None = None) -> None:
        self.scheduler = scheduler
        self.tracker = tracker or PodTracker()
        self.stats = FeedStats()
        self._pending_raw: dict[str, RawObject] = {}
        """Pending bodies by uid while queued or being bound: our binding's echo is
        compared with them."""
        self._pending_fp: dict[str, Fingerprint] = {}
        self._bound_fp: dict[str, Fingerprint] = {}
        self._node_fp: dict[str, Fingerprint] = {}
        self._paged: dict[str, dict[PodKey, str]] = {}
        """Per stream, what the current list's pages showed so far (key -> uid)."""
        self._handlers: dict[str, Callable[[Sequence[Event]], None]] = {
            PODGROUPS: self._podgroups,
            UPSTREAM_PODGROUPS: partial(self._podgroups, upstream=True),
            QUOTAS: self._quotas,
            TOPOLOGIES: self._topologies,
            NRTS: self._nrts,
            intake.NAMESPACES: self._namespaces,
            intake.PDBS: self._pdbs,
            intake.NODES: self._nodes,
            intake.ASSIGNED_PODS: self._assigned,
            intake.PENDING_PODS: self._pending,
        }
        self._relisters: dict[str, Callable[[Sequence[RawObject]], None]] = {
            PODGROUPS: self._podgroups_listed,
            UPSTREAM_PODGROUPS: partial(self._podgroups_listed, upstream=True),
            QUOTAS: self._quotas_listed,
            TOPOLOGIES: self._topologies_listed,
            NRTS: self._nrts_listed,
            intake.NAMESPACES: self._namespaces_listed,
            intake.PDBS: self._pdbs_listed,
            intake.NODES: self._nodes_listed,
            intake.ASSIGNED_PODS: self._assigned_listed,
            intake.PENDING_PODS: self._pending_listed,
        }
        for stream, kind in _STORAGE.items():
            self._handlers[stream] = partial(self._storage, kind)
            self._relisters[stream] = partial(self._storage_listed, kind)
        for stream, dra_kind in _DRA.items():
            self._handlers[stream] = partial(self._dra, dra_kind)
            self._relisters[stream] = partial(self._dra_listed, dra_kind)
        if scheduler.binder is not None:
            scheduler.binder.on_bound.append(self.tracker.bound)
        scheduler.on_expired.append(self._expired)

    # -- dispatch -----------------------------------------------------------------------
    def apply(self, updates: Iterable[Update]) -> None:
        by_stream: dict[str, list[Update]] = {}
        for update in updates:
            by_stream.setdefault(update.stream, []).append(update)
        for stream in _ORDER:
            for update in by_stream.pop(stream, ()):
                self._apply_one(update)
        for rest in by_stream.values():  # a stream this feed does not know: a bug
            for update in rest:
                log.warning("feed_unknown_stream", reason=update.stream)

    def _apply_one(self, update: Update) -> None:
        if isinstance(update, Page):
            self._page(update)
        elif isinstance(update, Batch):
            self._handlers[update.stream](update.events)
            if update.stream == intake.PENDING_PODS:
                self.tracker.pending_progress(update.resource_version)
        elif isinstance(update, Relisted) and update.paged:
            # The pages were the whole list, upserted as they came: drop the rest.
            shown = self._paged.pop(update.stream, {})
            if not update.initial:
                log.info("feed_reconcile", reason=f"{update.stream}: {len(shown)} objects, paged")
            if update.stream == intake.ASSIGNED_PODS:
                self._drop_unlisted(shown)
                self.tracker.relisted(shown.values(), update.resource_version)
        elif isinstance(update, Relisted):
            if not update.initial:
                log.info("feed_reconcile", reason=f"{update.stream}: {len(update.items)} objects")
            self._relisters[update.stream](update.items)
            if update.stream == intake.ASSIGNED_PODS:
                self.tracker.relisted((_meta(o)[2] for o in update.items), update.resource_version)
            if update.stream == intake.PENDING_PODS:
                self.tracker.pending_progress(update.resource_version)
        elif isinstance(update, Unavailable):
            self._relisters[update.stream](())

    def _page(self, page: Page) -> None:
        """A page of a list: upsert its pods now, drop the unlisted ones at its close."""
        if page.stream != intake.ASSIGNED_PODS:  # only bound pods come paged
            log.warning("feed_unknown_stream", reason=f"a page of {page.stream}")
            return
        if page.first:
            self._paged[page.stream] = {}
        shown = self._paged.setdefault(page.stream, {})
        for obj in page.items:
            namespace, name, uid = _meta(obj)
            shown[pod_key(namespace, name)] = uid
            self.tracker.bound(uid)
            self._bound(obj, uid)

    # -- bound pods ---------------------------------------------------------------------
    def _assigned(self, events: Sequence[Event]) -> None:
        for ev in events:
            if ev.type is EventType.DELETED:
                self.tracker.gone(ev.uid, (ev.obj.get("metadata") or {}).get("resourceVersion"))
                self._bound_fp.pop(ev.uid, None)
                self._pending_raw.pop(ev.uid, None)
                self.scheduler.pod_deleted(ev.obj)
            else:
                self.tracker.bound(ev.uid)
                self._bound(ev.obj, ev.uid)

    def _bound(self, obj: RawObject, uid: str) -> None:
        namespace, name, _ = _meta(obj)
        key = pod_key(namespace, name)
        fp = pod_fingerprint(obj)
        s = self.scheduler
        assumed = s.cache.assumed(key, uid)
        if assumed is not None:
            raw = self._pending_raw.pop(uid, None)
            self._pending_fp.pop(uid, None)
            if raw is not None and fp == bound_fingerprint(
                raw,
                node=assumed.node,
                annotations=assumed.annotations,
                labels=assumed.binding_labels,
            ):
                self.stats.echoes += 1
                self._bound_fp[uid] = fp
                s.binding_confirmed(obj, key, _rv(obj))
                return
        elif self._bound_fp.get(uid) == fp and s.cache.cached_pod(key) is not None:
            self.stats.bound_unchanged += 1
            s.bound_pod_unchanged(obj, key, _rv(obj))
            return
        self.stats.parsed += 1
        self._pending_raw.pop(uid, None)
        self._pending_fp.pop(uid, None)
        self._bound_fp[uid] = fp
        s.pod_upserted(obj)

    def _assigned_listed(self, items: Sequence[RawObject]) -> None:
        self._drop_unlisted({pod_key(ns, name): uid for ns, name, uid in map(_meta, items)})
        for obj in items:
            uid = _meta(obj)[2]
            self.tracker.bound(uid)
            self._bound(obj, uid)

    def _drop_unlisted(self, listed: Mapping[PodKey, str]) -> None:
        """A list of the bound pods (key -> uid) is complete: what it lacks is gone."""
        s = self.scheduler
        for key in s.cache.pod_keys() - listed.keys():
            cached = s.cache.cached_pod(key)
            if cached is not None and s.cache.assumed(key, cached.pod.uid) is None:
                # Placed once, no longer on any node: deleted or finished during a gap.
                namespace, name = key.split("/", 1)
                self._bound_fp.pop(cached.pod.uid, None)
                uid = cached.pod.uid
                s.pod_deleted({"metadata": {"namespace": namespace, "name": name, "uid": uid}})
        uids = set(listed.values())
        for uid in [u for u in self._bound_fp if u not in uids]:
            del self._bound_fp[uid]

    # -- pending pods -------------------------------------------------------------------
    def _pending(self, events: Sequence[Event]) -> None:
        for ev in events:
            verdict = self.tracker.pending(ev)
            if verdict is PendingVerdict.STALE:
                continue
            if verdict is PendingVerdict.LEFT:
                self._pending_fp.pop(ev.uid, None)
                namespace, name, uid = _meta(ev.obj)
                key = pod_key(namespace, name)
                ours = self.scheduler.cache.assumed(key, uid) is not None
                if not ours:
                    self._pending_raw.pop(uid, None)
                self.scheduler.pending_left(ev.obj, bound=ours or self.tracker.is_bound(uid))
                continue
            self._upsert_pending(ev.obj, ev.uid)

    def _upsert_pending(self, obj: RawObject, uid: str) -> None:
        fp = pending_fingerprint(obj)
        if self._pending_fp.get(uid) == fp:
            self.stats.pending_unchanged += 1
            return
        self._pending_fp[uid] = fp
        intake.slim_pod(obj)  # kept until the echo of our binding: only what it compares
        self._pending_raw[uid] = obj
        self.stats.parsed += 1
        self.scheduler.pod_upserted(obj)

    def _expired(self, key: str) -> None:
        """Our binding of ``key`` never showed up on a node within the assume TTL: if the
        pending stream still shows the pod, queue it again (should it be bound after all,
        the next binding's 409 says so and nothing is bound twice); otherwise the
        streams' news of it is on its way. Rare, so a scan."""
        for uid, obj in list(self._pending_raw.items()):
            namespace, name, _ = _meta(obj)
            if pod_key(namespace, name) == key and uid in self._pending_fp:
                del self._pending_fp[uid]
                self._upsert_pending(obj, uid)
                return

    def _pending_listed(self, items: Sequence[RawObject]) -> None:
        live = {uid: obj for obj in items if not self.tracker.is_bound(uid := _meta(obj)[2])}
        self.scheduler.pending_relisted(set(live))
        for uid in [u for u in self._pending_fp if u not in live]:
            del self._pending_fp[uid]
        for uid, obj in live.items():
            self._upsert_pending(obj, uid)

    # -- nodes and namespaces -----------------------------------------------------------
    def _nodes(self, events: Sequence[Event]) -> None:
        for ev in events:
            name = _name(ev.obj)
            if ev.type is EventType.DELETED:
                self._node_fp.pop(name, None)
                self.scheduler.node_deleted(ev.obj)
                continue
            fp = node_fingerprint(ev.obj)
            if self._node_fp.get(name) == fp:
                self.stats.node_heartbeats += 1
                continue
            self._node_fp[name] = fp
            self.scheduler.node_upserted(ev.obj)

    def _nodes_listed(self, items: Sequence[RawObject]) -> None:
        listed = {_name(o) for o in items}
        for name in self.scheduler.cache.node_names() - listed:
            self._node_fp.pop(name, None)
            self.scheduler.node_deleted({"metadata": {"name": name}})
        self._nodes([Event(EventType.MODIFIED, _name(o), o) for o in items])

    def _namespaces(self, events: Sequence[Event]) -> None:
        for ev in events:
            if ev.type is EventType.DELETED:
                self.scheduler.namespace_deleted(ev.obj)
            else:
                self.scheduler.namespace_upserted(ev.obj)

    def _namespaces_listed(self, items: Sequence[RawObject]) -> None:
        listed = {_name(o) for o in items}
        for name in self.scheduler.cache.namespace_names() - listed:
            self.scheduler.namespace_deleted({"metadata": {"name": name}})
        for obj in items:
            self.scheduler.namespace_upserted(obj)

    # -- PodDisruptionBudgets -----------------------------------------------------------
    def _pdbs(self, events: Sequence[Event]) -> None:
        for ev in events:
            if ev.type is EventType.DELETED:
                self.scheduler.preemptor.pdb_deleted(ev.obj)
            else:
                self.scheduler.preemptor.pdb_upserted(ev.obj)

    def _pdbs_listed(self, items: Sequence[RawObject]) -> None:
        listed = {f"{ns}/{name}" for ns, name, _ in map(_meta, items)}
        for key in self.scheduler.preemptor.pdb_keys() - listed:
            namespace, name = key.split("/", 1)
            self.scheduler.preemptor.pdb_deleted(
                {"metadata": {"namespace": namespace, "name": name}}
            )
        for obj in items:
            self.scheduler.preemptor.pdb_upserted(obj)

    # -- storage ------------------------------------------------------------------------
    def _storage(self, kind: Kind, events: Sequence[Event]) -> None:
        for ev in events:
            if ev.type is EventType.DELETED:
                self.scheduler.storage_deleted(kind, ev.obj)
            else:
                self.scheduler.storage_upserted(kind, ev.obj)

    def _storage_listed(self, kind: Kind, items: Sequence[RawObject]) -> None:
        listed = {object_key(kind, o) for o in items}
        for key in self.scheduler.storage.keys(kind) - listed:
            namespace, _, name = key.rpartition("/")
            self.scheduler.storage_deleted(
                kind, {"metadata": {"namespace": namespace, "name": name}}
            )
        for obj in items:
            self.scheduler.storage_upserted(kind, obj)

    # -- dynamic resources --------------------------------------------------------------
    def _dra(self, kind: DraKind, events: Sequence[Event]) -> None:
        for ev in events:
            if ev.type is EventType.DELETED:
                self.scheduler.dra_deleted(kind, ev.obj)
            else:
                self.scheduler.dra_upserted(kind, ev.obj)

    def _dra_listed(self, kind: DraKind, items: Sequence[RawObject]) -> None:
        listed = {dra_key(kind, o) for o in items}
        for key in self.scheduler.dra.keys(kind) - listed:
            namespace, _, name = key.rpartition("/")
            self.scheduler.dra_deleted(kind, {"metadata": {"namespace": namespace, "name": name}})
        for obj in items:
            self.scheduler.dra_upserted(kind, obj)

    # -- custom resources ---------------------------------------------------------------
    def _topologies(self, events: Sequence[Event]) -> None:
        for ev in events:
            if ev.type is EventType.DELETED:
                self.scheduler.node_reports.topology_deleted(ev.obj)
            else:
                self.scheduler.node_reports.topology_upserted(ev.obj)

    def _topologies_listed(self, items: Sequence[RawObject]) -> None:
        listed = {_name(o) for o in items}
        for name in self.scheduler.node_reports.topology_names() - listed:
            self.scheduler.node_reports.topology_deleted({"metadata": {"name": name}})
        for obj in items:
            self.scheduler.node_reports.topology_upserted(obj)

    def _nrts(self, events: Sequence[Event]) -> None:
        for ev in events:
            if ev.type is EventType.DELETED:
                self.scheduler.node_reports.nrt_deleted(ev.obj)
            else:
                self.scheduler.node_reports.nrt_upserted(ev.obj)

    def _nrts_listed(self, items: Sequence[RawObject]) -> None:
        listed = {_name(o) for o in items}
        for name in self.scheduler.node_reports.nrt_names() - listed:
            self.scheduler.node_reports.nrt_deleted({"metadata": {"name": name}})
        for obj in items:
            self.scheduler.node_reports.nrt_upserted(obj)

    def _podgroups(self, events: Sequence[Event], *, upstream: bool = False) -> None:
        for ev in events:
            if ev.type is EventType.DELETED:
                self.scheduler.podgroup_deleted(ev.obj, upstream=upstream)
            else:
                self.scheduler.podgroup_upserted(ev.obj, upstream=upstream)

    def _podgroups_listed(self, items: Sequence[RawObject], *, upstream: bool = False) -> None:
        prefix = UPSTREAM_PREFIX if upstream else ""
        listed = {f"{ns}/{prefix}{name}" for ns, name, _ in map(_meta, items)}
        for key in self.scheduler.podgroup_keys(upstream=upstream) - listed:
            namespace, name = key.split("/", 1)
            gone = {"metadata": {"namespace": namespace, "name": name.removeprefix(prefix)}}
            self.scheduler.podgroup_deleted(gone, upstream=upstream)
        for obj in items:
            self.scheduler.podgroup_upserted(obj, upstream=upstream)

    def _quotas(self, events: Sequence[Event]) -> None:
        for ev in events:
            if ev.type is EventType.DELETED:
                self.scheduler.quota_deleted(ev.obj)
            else:
                self.scheduler.quota_upserted(ev.obj)

    def _quotas_listed(self, items: Sequence[RawObject]) -> None:
        listed = {f"{ns}/{name}" for ns, name, _ in map(_meta, items)}
        for key in self.scheduler.quotas.keys() - listed:
            namespace, name = key.split("/", 1)
            self.scheduler.quota_deleted({"metadata": {"namespace": namespace, "name": name}})
        for obj in items:
            self.scheduler.quota_upserted(obj)


def describe(stats: FeedStats) -> dict[str, Any]:
    """The fast paths' counts, for logs at shutdown."""
    return dict(vars(stats))
