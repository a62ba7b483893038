"""kopf as a thin shell: raw watch events of pods, nodes, namespaces, PodGroups,
NodeResourceTopologies (NFD's) and our LatticeScheduler and NodeTopology objects, handed to
the scheduler as plain dicts. A resource whose CRD is not installed is simply not watched.

Only ``on.event`` handlers are used: they persist nothing onto the objects (no
finalizers, no progress annotations), and kopf's k8s-event posting and peering
are off. Scanning is off too, so kopf needs no permission on CRDs.

A listing event (type None) after start-up means kopf re-listed a resource (a
restarted watch, a 410 Gone): objects deleted during the gap produce no
DELETE, so the app runs a full reconcile soon after.
"""

from __future__ import annotations

import logging
from collections.abc import Callable, Mapping
from typing import Any, cast

import kopf

from scheduler.control.kubeio import PODGROUP_GROUP, PODGROUP_PLURAL, PODGROUP_VERSION
from scheduler.control.scheduler import Scheduler
from scheduler.control.settings import API_GROUP, API_VERSION, PLURAL
from scheduler.model import noderesourcetopology as nrt


class NoDiffBase(kopf.DiffBaseStorage):
    """Lattice has no change-detecting handlers, so kopf's per-event essence (a deep
    copy and a diff of every body) is pure overhead: about a third of the CPU spent
    per pod event in a profile. Report no essence and store nothing."""

    def build(self, *, body: kopf.Body, extra_fields: Any = None) -> kopf.BodyEssence:
        return cast(kopf.BodyEssence, None)

    def fetch(self, *, body: kopf.Body) -> kopf.BodyEssence | None:
        return None

    def store(self, *, body: kopf.Body, patch: kopf.Patch, essence: kopf.BodyEssence) -> None:
        return None


def operator_settings() -> kopf.OperatorSettings:
    settings = kopf.OperatorSettings()
    settings.persistence.diffbase_storage = NoDiffBase()
    settings.posting.enabled = False
    settings.scanning.disabled = True
    settings.peering.standalone = True
    settings.watching.server_timeout = 300
    settings.watching.client_timeout = 330
    settings.watching.connect_timeout = 30
    settings.networking.request_timeout = 60
    return settings


def build_registry(
    scheduler: Scheduler,
    *,
    login: Callable[..., kopf.ConnectionInfo | None],
    on_settings: Callable[[str | None, Mapping[str, Any]], None],
    on_relist: Callable[[], None],
    synced: Callable[[], bool],
) -> kopf.OperatorRegistry:
    registry = kopf.OperatorRegistry()
    logging.getLogger("kopf").setLevel(logging.WARNING)

    typed_seen: set[str] = set()

    def relisted(kind: str, event: kopf.RawEvent) -> None:
        """A listing (type None) after live events of the same kind is a re-list."""
        if event.get("type") is not None:
            typed_seen.add(kind)
        elif kind in typed_seen and synced():
            typed_seen.discard(kind)
            on_relist()

    @kopf.on.login(registry=registry)
    def _login(**kwargs: Any) -> kopf.ConnectionInfo | None:
        return login(**kwargs)

    @kopf.on.event("", "v1", "pods", registry=registry)
    async def _pod(*, event: kopf.RawEvent, **_: Any) -> None:
        relisted("pods", event)
        if event.get("type") == "DELETED":
            scheduler.pod_deleted(event["object"])
        else:
            scheduler.pod_upserted(event["object"])

    @kopf.on.event("", "v1", "nodes", registry=registry)
    async def _node(*, event: kopf.RawEvent, **_: Any) -> None:
        relisted("nodes", event)
        if event.get("type") == "DELETED":
            scheduler.node_deleted(event["object"])
        else:
            scheduler.node_upserted(event["object"])

    @kopf.on.event("", "v1", "namespaces", registry=registry)
    async def _namespace(*, event: kopf.RawEvent, **_: Any) -> None:
        relisted("namespaces", event)
        if event.get("type") == "DELETED":
            scheduler.namespace_deleted(event["object"])
        else:
            scheduler.namespace_upserted(event["object"])

    @kopf.on.event(API_GROUP, API_VERSION, "nodetopologies", registry=registry)
    async def _topology(*, event: kopf.RawEvent, **_: Any) -> None:
        if event.get("type") == "DELETED":
            scheduler.topology_deleted(event["object"])
        else:
            scheduler.topology_upserted(event["object"])

    @kopf.on.event(nrt.GROUP, nrt.VERSION, nrt.PLURAL, registry=registry)
    async def _nrt(*, event: kopf.RawEvent, **_: Any) -> None:
        relisted("noderesourcetopologies", event)
        if event.get("type") == "DELETED":
            scheduler.nrt_deleted(event["object"])
        else:
            scheduler.nrt_upserted(event["object"])

    @kopf.on.event(PODGROUP_GROUP, PODGROUP_VERSION, PODGROUP_PLURAL, registry=registry)
    async def _podgroup(*, event: kopf.RawEvent, **_: Any) -> None:
        relisted("podgroups", event)
        if event.get("type") == "DELETED":
            scheduler.podgroup_deleted(event["object"])
        else:
            scheduler.podgroup_upserted(event["object"])

    @kopf.on.event(API_GROUP, API_VERSION, PLURAL, registry=registry)
    async def _settings(*, event: kopf.RawEvent, **_: Any) -> None:
        on_settings(event.get("type"), event["object"])

    return registry
