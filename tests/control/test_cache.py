"""The scheduler cache: watch events and decisions applied to the snapshot."""

from __future__ import annotations

from typing import Any

from scheduler.control.cache import SchedulerCache
from scheduler.control.lifecycle import PodState
from scheduler.control.queue import pod_key
from scheduler.model.pod import Pod
from scheduler.model.release import DEFAULT_KUBE_MINOR
from tests.builders import make_node, make_pod


def _bound(name: str, node: str, rv: int, **kw: Any) -> dict[str, Any]:
    body = make_pod(name, "1", **kw).obj()
    body["metadata"].update(uid=f"uid-{name}", resourceVersion=str(rv))
    body["spec"]["nodeName"] = node
    return body


def _cpu_used(cache: SchedulerCache, node: str) -> int:
    row = cache.snapshot.index_of(node)
    assert row is not None
    col = cache.snapshot.resource_column("cpu")
    assert col is not None
    return int(cache.snapshot.requested[row, col])


def _cache(kube_minor: int = DEFAULT_KUBE_MINOR) -> SchedulerCache:
    cache = SchedulerCache(kube_minor=kube_minor)
    for name in ("n1", "n2"):
        body = make_node(name, cpu="4").obj()
        body["metadata"]["resourceVersion"] = "1"
        cache.upsert_node(body)
    return cache


def test_assume_counts_at_once_and_watch_confirms() -> None:
    cache = _cache()
    body = _bound("p", "n1", 10)
    pending = {**body, "spec": {k: v for k, v in body["spec"].items() if k != "nodeName"}}
    pod = Pod.from_api(pending)
    cache.assume(pod, "n1")
    assert _cpu_used(cache, "n1") == 1000
    cache.finish_binding(pod, now=0.0)
    cache.observe_bound_pod(body)
    assert cache.lifecycle.state(pod_key("default", "p")) is PodState.ADDED
    assert _cpu_used(cache, "n1") == 1000  # counted once, not twice


def test_forget_gives_the_room_back() -> None:
    cache = _cache()
    pod = Pod.from_api(make_pod("p", "2").obj())
    cache.assume(pod, "n2")
    cache.forget(pod)
    assert _cpu_used(cache, "n2") == 0
    assert cache.lifecycle.state(pod_key("default", "p")) is PodState.INITIAL


def test_stale_and_heartbeat_events_change_nothing() -> None:
    cache = _cache()
    assert cache.observe_bound_pod(_bound("p", "n1", 10)) is not None
    assert cache.observe_bound_pod(_bound("p", "n1", 9)) is None  # older: ignored
    assert cache.observe_bound_pod(_bound("p", "n1", 11)) is None  # status only: no re-parse
    relabelled = _bound("p", "n1", 12)
    relabelled["metadata"]["labels"] = {"app": "new"}
    updated = cache.observe_bound_pod(relabelled)
    assert updated is not None
    assert updated.labels == {"app": "new"}
    assert _cpu_used(cache, "n1") == 1000


def test_finished_pods_hold_nothing() -> None:
    cache = _cache()
    cache.observe_bound_pod(_bound("p", "n1", 10))
    done = _bound("p", "n1", 11)
    done["status"] = {"phase": "Succeeded"}
    cache.observe_bound_pod(done)
    assert _cpu_used(cache, "n1") == 0


def test_broken_bodies_are_reported_not_raised() -> None:
    cache = _cache()
    bad = _bound("p", "n1", 10)
    bad["spec"]["containers"][0]["resources"]["requests"]["cpu"] = "lots"
    assert cache.observe_bound_pod(bad) is None
    assert "pod/default/p" in cache.broken
    broken_node = make_node("n3", cpu="4").obj()
    broken_node["status"]["allocatable"]["memory"] = "12 GiB"
    assert cache.upsert_node(broken_node) is None
    assert "node/n3" in cache.broken


def test_reconcile_drops_what_a_missed_delete_left_but_keeps_newer_entries() -> None:
    cache = _cache()
    cache.observe_bound_pod(_bound("old", "n1", 10))
    cache.observe_bound_pod(_bound("new", "n2", 30))
    nodes = [make_node(n, cpu="4").obj() for n in ("n1", "n2")]
    removed = cache.reconcile(nodes, [], [], list_rv=20)
    assert removed["pods"] == 1
    assert cache.pod_keys() == {pod_key("default", "new")}  # rv 30 is newer than the list


def _resized(body: dict[str, Any], rv: int, statuses: list[dict[str, Any]]) -> dict[str, Any]:
    """The kubelet's status update of a resize: container statuses only, same generation."""
    out = {**body, "metadata": {**body["metadata"], "resourceVersion": str(rv)}}
    out["status"] = {"phase": "Running", "containerStatuses": statuses}
    return out


def test_a_resize_the_kubelet_reports_is_accounted() -> None:
    """Actuated and allocated resources come in status-only updates (no generation bump):
    the node is charged max(spec, actuated, allocated) as soon as they arrive."""
    cache = _cache()
    body = _bound("p", "n1", 10)
    cache.observe_bound_pod(body)
    assert _cpu_used(cache, "n1") == 1000
    grown = {"name": "c0", "resources": {"requests": {"cpu": "3"}}}
    assert cache.observe_bound_pod(_resized(body, 11, [grown])) is not None
    assert _cpu_used(cache, "n1") == 3000
    # The same status again (a heartbeat) is not parsed again.
    assert cache.observe_bound_pod(_resized(body, 12, [grown])) is None
    back = {"name": "c0", "resources": {"requests": {"cpu": "1"}}}
    assert cache.observe_bound_pod(_resized(body, 13, [back])) is not None
    assert _cpu_used(cache, "n1") == 1000


def test_the_cache_accounts_as_the_mirrored_release() -> None:
    """1.36 sums each container's max (2 + 2), 1.37 takes the max of the sums (3)."""
    body = make_pod("p", "1").container("2").obj()
    body["metadata"].update(uid="uid-p", resourceVersion="10")
    body["spec"]["nodeName"] = "n1"
    body["status"] = {
        "containerStatuses": [
            {"name": "c0", "resources": {"requests": {"cpu": "2"}}},
            {"name": "c1", "resources": {"requests": {"cpu": "1"}}},
        ]
    }
    used: dict[int, int] = {}
    for minor in (36, 37):
        cache = _cache(minor)
        cache.observe_bound_pod(body)
        used[minor] = _cpu_used(cache, "n1")
    assert used == {36: 4000, 37: 3000}
