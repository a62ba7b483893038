"""The scheduler's cache: nodes, placed pods and namespaces, kept as the core's Snapshot.

Watch events and the scheduler's own decisions both land here, and each one
changes the snapshot by exactly that object (``Snapshot.add_pod``,
``update_node`` ...): nothing is rebuilt per pod. Which pod events are legal
in which state is :mod:`scheduler.control.lifecycle`'s table; this class only
applies its transitions to the snapshot.

Pods count against capacity from ``assume`` (before the binding is sent) until
the watch deletes them or they finish (Succeeded/Failed pods hold nothing, as
in kube-scheduler). Bodies that do not parse are kept out of the snapshot and
reported, never raised into the watch: one broken object must not stall the
scheduler.

Watch restarts: each object's last resourceVersion is kept, so a re-list that
replays an older state is ignored and ``reconcile`` can drop what a missed
DELETE left behind.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from dataclasses import dataclass, replace
from typing import Any, Final

import structlog

from scheduler.control.intake import Fingerprint, resize_view
from scheduler.control.lifecycle import IllegalTransitionError, PodLifecycle, PodState
from scheduler.control.queue import PodKey, pod_key
from scheduler.control.quotas import NamespaceUsage
from scheduler.core.dra.state import DraState
from scheduler.core.snapshot import Snapshot
from scheduler.core.topology.state import TopologyState
from scheduler.core.volumes import VolumeState
from scheduler.model.errors import InvalidObjectError
from scheduler.model.node import Namespace, Node
from scheduler.model.pod import Pod
from scheduler.model.release import DEFAULT_KUBE_MINOR

log = structlog.get_logger("lattice.cache")

TERMINAL_PHASES = frozenset({"Succeeded", "Failed"})


def resource_version(body: Mapping[str, Any]) -> int | None:
    """etcd revisions are integers; anything else cannot be ordered and is not compared."""
    rv = body.get("metadata", {}).get("resourceVersion")
    try:
        return int(rv) if rv is not None else None
    except (TypeError, ValueError):
        return None


def newer(old: int | None, new: int | None) -> bool:
    return old is None or new is None or new >= old


BINDING_LABELS: Final = ("topology.kubernetes.io/zone", "topology.kubernetes.io/region")
"""What the API server's PodTopologyLabels admission (1.35+, beta and on) copies from the
node onto the pod at binding, overwriting the pod's own."""


@dataclass
class CachedPod:
    pod: Pod
    node: str
    rv: int | None
    generation: int | None = None
    annotations: Mapping[str, str] | None = None
    """What our Binding set on the pod (devices): the echo of the binding must show it."""
    binding_labels: Mapping[str, str] | None = None
    """The node's labels the API server copies onto the pod at binding (assumed with
    them, so the echo matches and the graph is not patched twice)."""
    resize: Fingerprint | None = None
    """:func:`~scheduler.control.intake.resize_view` of the body parsed (None: assumed
    from the pending pod, whose status the kubelet has not written yet)."""


class SchedulerCache:
    """Snapshot plus the pod lifecycle; every method is one watch event or decision."""

    def __init__(
        self,
        *,
        assumed_ttl: float | None = 30.0,
        topology: TopologyState | None = None,
        kube_minor: int = DEFAULT_KUBE_MINOR,
    ) -> None:
        self.kube_minor = kube_minor
        """The release mirrored: it decides what a bound pod's status adds to its node."""
        self.snapshot = Snapshot()
        self.topology = topology or TopologyState()
        """Per-node devices in use, fed from the same pod events as the snapshot."""
        self.dra = DraState()
        """DeviceClasses, ResourceClaims, ResourceSlices (fed by
        :class:`~scheduler.control.dra.DraObjects`) and the allocations assumed for pods
        being bound."""
        self.volumes = VolumeState()
        """Storage objects (fed by :class:`~scheduler.control.storage.Storage`) and which
        placed pods use which claims (fed here, with the snapshot)."""
        self.quota_usage = NamespaceUsage()
        """Per namespace, what its placed pods hold: ElasticQuota usage, fed with the
        snapshot so it counts exactly the pods the snapshot does."""
        self.lifecycle = PodLifecycle(assumed_ttl=assumed_ttl)
        self._pods: dict[PodKey, CachedPod] = {}
        self._node_rv: dict[str, int | None] = {}
        self._ns_rv: dict[str, int | None] = {}
        self.broken: dict[str, str] = {}
        """Objects whose body did not parse: ``kind/name`` -> reason."""

    # -- nodes --------------------------------------------------------------
    def upsert_node(self, body: Mapping[str, Any]) -> Node | None:
        """Add or update a node from its body; None if ignored (stale or broken)."""
        name = str(body.get("metadata", {}).get("name", ""))
        rv = resource_version(body)
        if name in self._node_rv and not newer(self._node_rv[name], rv):
            return None
        try:
            node = Node.from_api(body)
        except InvalidObjectError as exc:
            self._broken(f"node/{name}", str(exc))
            if self.snapshot.get_node(name) is not None:
                # A node we cannot read is a node we cannot place on.
                self.snapshot.remove_node(name)
            return None
        self.broken.pop(f"node/{name}", None)
        self._node_rv[name] = rv
        if self.snapshot.get_node(name) is None:
            self.snapshot.add_node(node)
        else:
            self.snapshot.update_node(node)
        return node

    def delete_node(self, name: str) -> bool:
        self._node_rv.pop(name, None)
        self.topology.remove_node(name)
        self.broken.pop(f"node/{name}", None)
        if self.snapshot.get_node(name) is None:
            return False
        self.snapshot.remove_node(name)
        return True

    def _placed(self, pod: Pod, node: str, annotations: Mapping[str, str] | None = None) -> None:
        self.snapshot.add_pod(pod, node)
        self.quota_usage.placed(pod)
        self.topology.pod_placed(pod, node, annotations)
        if pod.storage_volumes:
            self.volumes.add_pod(pod)

    def _removed(self, pod: Pod) -> None:
        self.snapshot.remove_pod(pod)
        self.quota_usage.removed(pod)
        self.topology.pod_removed(pod.key)
        self.volumes.remove_pod(pod.key)

    def node_names(self) -> set[str]:
        return set(self._node_rv)

    # -- namespaces ---------------------------------------------------------
    def upsert_namespace(self, body: Mapping[str, Any]) -> None:
        name = str(body.get("metadata", {}).get("name", ""))
        rv = resource_version(body)
        if name in self._ns_rv and not newer(self._ns_rv[name], rv):
            return
        try:
            ns = Namespace.from_api(body)
        except InvalidObjectError as exc:
            self._broken(f"namespace/{name}", str(exc))
            return
        self._ns_rv[name] = rv
        self.snapshot.set_namespace(ns)

    def delete_namespace(self, name: str) -> None:
        self._ns_rv.pop(name, None)
        self.snapshot.remove_namespace(name)

    def namespace_names(self) -> set[str]:
        return set(self._ns_rv)

    # -- pods ---------------------------------------------------------------
    def observe_bound_pod(self, body: Mapping[str, Any]) -> Pod | None:
        """A pod the watch shows on a node (ours confirmed, or anyone else's)."""
        meta = body.get("metadata", {})
        key = pod_key(str(meta.get("namespace", "")), str(meta.get("name", "")))
        rv = resource_version(body)
        known = self._pods.get(key)
        if known is not None and not newer(known.rv, rv):
            return None
        if body.get("status", {}).get("phase") in TERMINAL_PHASES:
            self.remove_pod(key)
            return None
        if (
            known is not None
            and self.lifecycle.state(key) is PodState.ADDED
            and self._unchanged(known, body)
        ):
            known.rv = rv  # a status heartbeat: nothing the scheduler reads has changed
            return None
        try:
            pod = Pod.from_api(body, kube_minor=self.kube_minor)
        except InvalidObjectError as exc:
            self._broken(f"pod/{key}", str(exc))
            return None
        if known is not None and known.pod.uid != pod.uid:
            self.remove_pod(key)  # same name, new pod: the old one is gone
            known = None
        node = pod.node_name
        state = self.lifecycle.state(key)
        try:
            if state in (PodState.ASSUMED, PodState.BOUND) or (
                state is PodState.INITIAL and known is None
            ):
                self.lifecycle.add(key, node)
            else:
                self.lifecycle.update(key, node)
        except IllegalTransitionError as exc:
            # The watch is the truth: re-seat the pod where the API says it is.
            log.warning("cache_transition_rejected", pod=key, reason=str(exc))
            self.lifecycle.remove(key)
            self.lifecycle.add(key, node)
        if known is not None:
            self._removed(known.pod)
        self._placed(pod, node)
        self._pods[key] = CachedPod(
            pod, node, rv, meta.get("generation"), resize=resize_view(body.get("status") or {})
        )
        return pod

    @staticmethod
    def _unchanged(known: CachedPod, body: Mapping[str, Any]) -> bool:
        """Bound pods mostly change in status only; re-parsing them is the watch's main
        cost. Labels, node, deletion, the spec generation (a resize bumps it) and the
        status of a resize (what the kubelet has allocated and actuated, which it writes
        later) are what could change a scheduling answer."""
        meta, spec = body.get("metadata") or {}, body.get("spec") or {}
        return (
            known.pod.uid == meta.get("uid", known.pod.uid)
            and known.node == spec.get("nodeName")
            and known.generation == meta.get("generation")
            and known.pod.terminating == bool(meta.get("deletionTimestamp"))
            and dict(known.pod.labels) == (meta.get("labels") or {})
            and known.resize is not None
            and known.resize == resize_view(body.get("status") or {})
        )

    def assume(self, pod: Pod, node: str, annotations: Mapping[str, str] | None = None) -> None:
        """Count the pod (and the devices chosen for it) on ``node`` now, before the
        binding is even sent."""
        key = pod_key(pod.namespace, pod.name)
        self.lifecycle.assume(key, node)
        added = self.binding_labels(node)
        if any(pod.labels.get(k) != v for k, v in added.items()):
            pod = replace(pod, labels={**pod.labels, **added})
        self._placed(pod, node, annotations)
        self._pods[key] = CachedPod(
            pod, node, None, annotations=annotations, binding_labels=added or None
        )

    def binding_labels(self, node: str) -> dict[str, str]:
        """:data:`BINDING_LABELS` as ``node`` has them: the pod will carry them once bound."""
        found = self.snapshot.get_node(node)
        if found is None:
            return {}
        return {k: found.labels[k] for k in BINDING_LABELS if k in found.labels}

    def assumed(self, key: PodKey, uid: str) -> CachedPod | None:
        """The cached pod if it is ``uid`` placed by us and not yet confirmed by the watch."""
        cached = self._pods.get(key)
        if cached is None or cached.pod.uid != uid:
            return None
        if self.lifecycle.state(key) not in (PodState.ASSUMED, PodState.BOUND):
            return None
        return cached

    def seen_bound(self, key: PodKey, uid: str) -> str | None:
        """The node the watch shows pod ``uid`` bound to (ADDED), else None: a binding
        whose reply was lost may have landed all the same."""
        cached = self._pods.get(key)
        if cached is None or cached.pod.uid != uid:
            return None
        return cached.node if self.lifecycle.state(key) is PodState.ADDED else None

    def confirm(self, key: PodKey, rv: int | None, generation: int | None) -> None:
        """The watch shows our binding exactly as we assumed it (the caller compared
        fingerprints): the pod is ADDED with the snapshot, graph and device ledger left as
        they are, instead of removed and placed again from a re-parse."""
        cached = self._pods[key]
        self.lifecycle.add(key, cached.node)
        cached.rv = rv
        cached.generation = generation

    def touch(self, key: PodKey, rv: int | None) -> None:
        """A change of a placed pod that nothing here reads (the caller compared
        fingerprints): only the resourceVersion moves on."""
        cached = self._pods.get(key)
        if cached is not None:
            cached.rv = rv

    def finish_binding(self, pod: Pod, now: float) -> None:
        key = pod_key(pod.namespace, pod.name)
        if self.lifecycle.state(key) is PodState.ASSUMED:
            self.lifecycle.finish_binding(key, now)

    def forget(self, pod: Pod) -> None:
        """The binding failed: give the room back (unless the watch confirmed it meanwhile)."""
        key = pod_key(pod.namespace, pod.name)
        if self.lifecycle.state(key) in (PodState.ASSUMED, PodState.BOUND):
            self.lifecycle.forget(key)
            cached = self._pods.pop(key, None)
            if cached is not None:
                self._removed(cached.pod)

    def expire(self, now: float) -> list[PodKey]:
        """Assumed pods whose binding finished but never showed up in the watch."""
        gone = [t.key for t in self.lifecycle.expire_due(now)]
        for key in gone:
            cached = self._pods.pop(key, None)
            if cached is not None:
                self._removed(cached.pod)
        return gone

    def remove_pod(self, key: PodKey) -> bool:
        cached = self._pods.pop(key, None)
        self.broken.pop(f"pod/{key}", None)
        if self.lifecycle.state(key) is not PodState.INITIAL:
            self.lifecycle.remove(key)
        if cached is None:
            return False
        self._removed(cached.pod)
        return True

    def pod_keys(self) -> set[PodKey]:
        return set(self._pods)

    def cached_pod(self, key: PodKey) -> CachedPod | None:
        return self._pods.get(key)

    # -- reconciliation -----------------------------------------------------
    def reconcile(
        self,
        nodes: Iterable[Mapping[str, Any]],
        bound_pods: Iterable[Mapping[str, Any]],
        namespaces: Iterable[Mapping[str, Any]],
        list_rv: int | None = None,
    ) -> dict[str, int]:
        """Make the cache equal a fresh list: add what is missing, drop what is gone.

        ``list_rv`` is the oldest resourceVersion of the lists: an entry the watch
        brought in after it is newer than the list and is kept, as are assumed pods
        (their binding may still be in flight and is in no list yet).
        """

        def older(rv: int | None) -> bool:
            return list_rv is None or (rv is not None and rv <= list_rv)

        removed = {"nodes": 0, "pods": 0, "namespaces": 0}
        node_bodies = list(nodes)
        seen_nodes = {str(b["metadata"]["name"]) for b in node_bodies}
        for name in self.node_names() - seen_nodes:
            if older(self._node_rv.get(name)):
                removed["nodes"] += self.delete_node(name)
        for body in node_bodies:
            self.upsert_node(body)
        ns_bodies = list(namespaces)
        seen_ns = {str(b["metadata"]["name"]) for b in ns_bodies}
        for name in self.namespace_names() - seen_ns:
            if older(self._ns_rv.get(name)):
                self.delete_namespace(name)
                removed["namespaces"] += 1
        for body in ns_bodies:
            self.upsert_namespace(body)
        pod_bodies = list(bound_pods)
        seen_pods = {
            pod_key(str(b["metadata"]["namespace"]), str(b["metadata"]["name"])) for b in pod_bodies
        }
        for key in self.pod_keys() - seen_pods:
            cached = self._pods[key]
            if self.lifecycle.state(key) is PodState.ADDED and older(cached.rv):
                removed["pods"] += self.remove_pod(key)
        for body in pod_bodies:
            self.observe_bound_pod(body)
        return removed

    def _broken(self, what: str, reason: str) -> None:
        if self.broken.get(what) != reason:
            log.warning("object_unreadable", reason=f"{what}: {reason}")
        self.broken[what] = reason
