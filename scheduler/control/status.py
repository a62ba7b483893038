"""The LatticeScheduler object: created with defaults when missing; status from the leader.

Status is a merge patch of the status subresource at most every few seconds,
so `kubectl get latticeschedulers` shows leader, readiness, queue lengths,
counts, recent latency and graph size without a metrics stack.
"""

from __future__ import annotations

import datetime as dt
from typing import Any

import numpy as np
import structlog
from kubernetes_asyncio import client

from scheduler.control.kueue import Reason, Resolution, pending
from scheduler.control.scheduler import Scheduler
from scheduler.control.settings import API_GROUP, API_VERSION, PLURAL, default_spec

log = structlog.get_logger("lattice.status")


def _now() -> str:
    return dt.datetime.now(dt.UTC).strftime("%Y-%m-%dT%H:%M:%SZ")


async def ensure_object(api: client.ApiClient, name: str) -> dict[str, Any]:
    """Read our object, creating it with the default profile if it does not exist."""
    objects = client.CustomObjectsApi(api)
    try:
        found: dict[str, Any] = await objects.get_cluster_custom_object(
            API_GROUP, API_VERSION, PLURAL, name
        )
        return found
    except client.ApiException as exc:
        if exc.status != 404:
            raise
    body = {
        "apiVersion": f"{API_GROUP}/{API_VERSION}",
        "kind": "LatticeScheduler",
        "metadata": {"name": name, "labels": {"app.kubernetes.io/part-of": "lattice"}},
        "spec": default_spec(name),
    }
    try:
        created: dict[str, Any] = await objects.create_cluster_custom_object(
            API_GROUP, API_VERSION, PLURAL, body
        )
        log.info("scheduler_object_created", reason=name)
        return created
    except client.ApiException as exc:
        if exc.status != 409:  # a twin replica created it first
            raise
        again: dict[str, Any] = await objects.get_cluster_custom_object(
            API_GROUP, API_VERSION, PLURAL, name
        )
        return again


def build_status(
    scheduler: Scheduler,
    *,
    leader: str,
    ready: bool,
    settings_error: str | None,
    generation: int | None,
    kueue: Resolution | None = None,
) -> dict[str, Any]:
    lat = np.array(scheduler.latencies, dtype=np.float64)
    p50, p99 = (np.percentile(lat, [50, 99]) * 1000).round(1).tolist() if len(lat) else (0, 0)
    queue = scheduler.queue_counts()
    c = scheduler.counters
    graph = scheduler.cache.snapshot.affinity_graph.graph
    status: dict[str, Any] = {
        "leader": leader,
        "queue": {k: queue.get(k, 0) for k in ("active", "backoff", "unschedulable", "gated")},
        "counts": {
            "scheduled": c.scheduled,
            "unschedulable": c.unschedulable,
            "errors": c.errors,
            "bindErrors": c.bind_errors,
        },
        "latency": {"p50Ms": p50, "p99Ms": p99},
        "lastUpdateTime": _now(),
        "conditions": [
            {
                "type": "Ready",
                "status": "True" if ready else "False",
                "reason": "Scheduling" if ready else "CacheNotSynced",
                "message": f"leader {leader} is scheduling pods with schedulerName "
                f"{scheduler.settings.scheduler_name}"
                if ready
                else "waiting for the cache",
                "lastTransitionTime": _now(),
            },
            {
                "type": "SpecValid",
                "status": "False" if settings_error else "True",
                "reason": "InvalidSpec" if settings_error else "Applied",
                "message": settings_error or "the spec is in force",
                "lastTransitionTime": _now(),
            },
            topology_condition(scheduler, kueue),
        ],
    }
    status["graph"] = {"vertices": len(graph), "edges": graph.number_of_edges()}
    if generation is not None:
        status["observedGeneration"] = generation
    return status


async def write_status(api: client.ApiClient, name: str, status: dict[str, Any]) -> None:
    objects: Any = client.CustomObjectsApi(api)  # the stubs lack _content_type; it exists
    await objects.patch_cluster_custom_object_status(
        API_GROUP,
        API_VERSION,
        PLURAL,
        name,
        {"status": status},
        _content_type="application/merge-patch+json",
    )


def topology_condition(scheduler: Scheduler, kueue: Resolution | None) -> dict[str, Any]:
    """``TopologyResolved``: where the levels in force come from. False only while
    ``spec.topology.fromKueue`` names a Topology whose levels are not in force (Kueue's
    API not served, the object missing or unusable, not read yet): the levels are then
    empty, and the message says why."""
    topology = scheduler.settings.topology
    name = topology.from_kueue
    if name is None:
        levels = ", ".join(topology.levels) or "none"
        resolution = Resolution(
            "", Reason.SPEC_LEVELS, f"levels from spec.topology.levels: {levels}"
        )
    else:
        resolution = kueue if kueue is not None and kueue.name == name else pending(name)
    ok = resolution.reason in (Reason.SPEC_LEVELS, Reason.READ)
    return {
        "type": "TopologyResolved",
        "status": "True" if ok else "False",
        "reason": resolution.reason.value,
        "message": resolution.message,
        "lastTransitionTime": _now(),
    }
