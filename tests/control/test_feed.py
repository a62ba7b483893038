"""The feed: intake updates applied to the scheduler, with the fast paths for no-op events
and the two-stream pod rule (pending vs assigned), without a server."""

from __future__ import annotations

import copy
from typing import Any, cast

import pytest

from scheduler.control import intake
from scheduler.control.feed import PODGROUPS, Feed, resources
from scheduler.control.intake import (
    Batch,
    Event,
    EventType,
    Page,
    RawObject,
    Relisted,
    Unavailable,
)
from scheduler.control.lifecycle import PodState
from scheduler.control.queue import pod_key
from scheduler.control.scheduler import Scheduler
from scheduler.control.settings import parse_spec
from scheduler.model.pod import Pod
from scheduler.obs.metrics import Metrics
from tests.builders import make_node, make_pod
from tests.core.dra.builders import GPU_DRIVER, taint, taint_rule

_rv = iter(range(100, 10_000_000))


def raw(body: dict[str, Any]) -> RawObject:
    body = copy.deepcopy(body)
    body.setdefault("metadata", {})["resourceVersion"] = str(next(_rv))
    return body  # type: ignore[return-value]


def uid_of(body: RawObject) -> str:
    return (body.get("metadata") or {}).get("uid", "")


def ev(kind: EventType, body: RawObject) -> Event:
    return Event(kind, uid_of(body) or (body.get("metadata") or {}).get("name", ""), body)


def batch(stream: str, *events: Event) -> Batch:
    return Batch(stream, events, str(next(_rv)))


def listed(stream: str, *items: RawObject, initial: bool = False) -> Relisted:
    return Relisted(stream, items, str(next(_rv)), initial=initial)


def pending_body(name: str, cpu: str = "100m") -> RawObject:
    body = make_pod(name, cpu).obj()
    body["spec"]["schedulerName"] = "lattice"
    body["status"] = {"phase": "Pending"}
    return raw(body)


def bound_echo(pending: RawObject, node: str, **annotations: str) -> RawObject:
    """What the assigned stream shows after a Binding: node set, annotations merged, and
    the kubelet's status on top (which scheduling never reads)."""
    echo: dict[str, Any] = copy.deepcopy(dict(pending))
    echo["spec"]["nodeName"] = node
    if annotations:
        echo["metadata"].setdefault("annotations", {}).update(annotations)
    echo["status"] = {"phase": "Running", "podIP": "10.0.0.7", "conditions": [{"type": "Ready"}]}
    return raw(echo)


@pytest.fixture
def sched() -> Scheduler:
    return Scheduler(parse_spec({}, "lattice"), writer=None, metrics=Metrics.create())


@pytest.fixture
def feed(sched: Scheduler) -> Feed:
    f = Feed(sched)
    f.apply(
        [
            Unavailable(PODGROUPS, 404, "no CRD"),
            listed(intake.NODES, *(raw(make_node(f"n{i}").obj()) for i in range(2)), initial=True),
            listed(intake.NAMESPACES, raw({"metadata": {"name": "default"}}), initial=True),
            listed(intake.ASSIGNED_PODS, initial=True),
            listed(intake.PENDING_PODS, initial=True),
        ]
    )
    return f


def queued_uids(sched: Scheduler) -> set[str]:
    out = set()
    while (info := sched.queue.try_pop()) is not None:
        out.add(info.pod.uid)
    return out


def assume(sched: Scheduler, body: RawObject, node: str, **annotations: str) -> Pod:
    """What a scheduling cycle does for the pod: pop it and count it on ``node``."""
    info = sched.queue.try_pop()
    assert info is not None
    assert info.pod.uid == uid_of(body)
    assert isinstance(info.pod, Pod)
    sched.cache.assume(info.pod, node, annotations or None)
    sched.queue.done(info)  # as the binding task does once its call returned
    return info.pod


@pytest.mark.parametrize("pending_first", [True, False], ids=["pending-first", "echo-first"])
def test_the_echo_of_our_binding_confirms_the_pod_without_placing_it_again(
    sched: Scheduler, feed: Feed, pending_first: bool
) -> None:
    body = pending_body("p")
    feed.apply([batch(intake.PENDING_PODS, ev(EventType.ADDED, body))])
    pod = assume(sched, body, "n1", **{"lattice.dev/devices": "gpu0"})
    sched.cache.finish_binding(pod, 0.0)
    feed.tracker.bound(pod.uid)  # the binding's answer
    seq = sched.cache.snapshot.affinity_graph.seq
    left = batch(intake.PENDING_PODS, ev(EventType.DELETED, body))
    echo = batch(
        intake.ASSIGNED_PODS,
        ev(EventType.ADDED, bound_echo(body, "n1", **{"lattice.dev/devices": "gpu0"})),
    )
    feed.apply([left, echo] if pending_first else [echo, left])
    key = pod_key("default", "p")
    cached = sched.cache.cached_pod(key)
    assert cached is not None
    assert cached.pod is pod
    assert sched.cache.lifecycle.state(key) is PodState.ADDED
    assert sched.cache.snapshot.affinity_graph.seq == seq  # the graph was not patched
    assert (feed.stats.echoes, feed.stats.parsed) == (1, 1)  # parsed: the pending ADDED only
    assert queued_uids(sched) == set()


def test_a_full_api_body_is_kept_slim_and_its_echo_still_confirms(
    sched: Scheduler, feed: Feed
) -> None:
    body = pending_body("p")
    meta = cast(dict[str, Any], body["metadata"])
    meta["managedFields"] = [{"manager": "kubectl", "fieldsV1": {"f:spec": {}}}]
    body["metadata"]["annotations"] = {"kubectl.kubernetes.io/last-applied-configuration": "{}"}
    body["spec"]["containers"][0]["env"] = [{"name": "A", "value": "b"}]
    as_sent = copy.deepcopy(dict(body))
    feed.apply([batch(intake.PENDING_PODS, ev(EventType.ADDED, body))])
    kept = feed._pending_raw[uid_of(body)]
    assert "managedFields" not in dict(kept["metadata"])
    assert kept["metadata"]["annotations"] == {}
    assert "env" not in kept["spec"]["containers"][0]
    pod = assume(sched, body, "n1")
    echo = bound_echo(cast(RawObject, as_sent), "n1")  # the server's echo is whole again
    feed.apply([batch(intake.ASSIGNED_PODS, ev(EventType.ADDED, echo))])
    cached = sched.cache.cached_pod(pod_key("default", "p"))
    assert cached is not None
    assert cached.pod is pod
    assert feed.stats.echoes == 1


def test_the_zone_and_region_the_api_server_copies_at_binding_are_assumed_and_confirmed(
    sched: Scheduler, feed: Feed
) -> None:
    """1.35+ (PodTopologyLabels admission): the binding copies the node's zone and region
    onto the pod, overwriting its own. The assumed pod carries them already, so the echo
    confirms it without a re-parse and label selectors see them from the start."""
    zone, region = "topology.kubernetes.io/zone", "topology.kubernetes.io/region"
    node = make_node("z1").labels({zone: "a", region: "r", "rack": "7"}).obj()
    feed.apply([batch(intake.NODES, ev(EventType.ADDED, raw(node)))])
    body = pending_body("p")
    body["metadata"]["labels"] = {"app": "web", zone: "stale"}
    feed.apply([batch(intake.PENDING_PODS, ev(EventType.ADDED, body))])
    assume(sched, body, "z1")
    key = pod_key("default", "p")
    cached = sched.cache.cached_pod(key)
    assert cached is not None
    assumed = cached.pod
    assert dict(assumed.labels) == {"app": "web", zone: "a", region: "r"}  # not the rack
    seq = sched.cache.snapshot.affinity_graph.seq
    echo = bound_echo(body, "z1")
    echo["metadata"]["labels"] = {"app": "web", zone: "a", region: "r"}
    feed.apply([batch(intake.ASSIGNED_PODS, ev(EventType.ADDED, echo))])
    cached = sched.cache.cached_pod(key)
    assert cached is not None
    assert cached.pod is assumed
    assert sched.cache.lifecycle.state(key) is PodState.ADDED
    assert sched.cache.snapshot.affinity_graph.seq == seq
    assert feed.stats.echoes == 1


def test_an_echo_without_the_copied_labels_is_read_again(sched: Scheduler, feed: Feed) -> None:
    """An API server that does not copy them (the gate turned off): the echo differs from
    what was assumed and is parsed, so the cache holds the pod's real labels."""
    zone = "topology.kubernetes.io/zone"
    feed.apply(
        [batch(intake.NODES, ev(EventType.ADDED, raw(make_node("z1").label(zone, "a").obj())))]
    )
    body = pending_body("p")
    feed.apply([batch(intake.PENDING_PODS, ev(EventType.ADDED, body))])
    assume(sched, body, "z1")
    feed.apply([batch(intake.ASSIGNED_PODS, ev(EventType.ADDED, bound_echo(body, "z1")))])
    cached = sched.cache.cached_pod(pod_key("default", "p"))
    assert cached is not None
    assert zone not in cached.pod.labels
    assert feed.stats.echoes == 0


def test_an_echo_that_differs_from_what_we_assumed_is_read_again(
    sched: Scheduler, feed: Feed
) -> None:
    body = pending_body("p")
    feed.apply([batch(intake.PENDING_PODS, ev(EventType.ADDED, body))])
    pod = assume(sched, body, "n1")
    echo = bound_echo(body, "n1")
    echo["metadata"]["labels"] = {"team": "b"}  # someone labelled it meanwhile
    feed.apply([batch(intake.ASSIGNED_PODS, ev(EventType.ADDED, echo))])
    cached = sched.cache.cached_pod(pod_key("default", "p"))
    assert cached is not None
    assert cached.pod is not pod
    assert dict(cached.pod.labels) == {"team": "b"}
    assert feed.stats.echoes == 0


def test_status_only_changes_of_a_bound_pod_are_skipped_and_others_are_not(
    sched: Scheduler, feed: Feed
) -> None:
    body = make_pod("q", "1").obj()
    body["spec"]["nodeName"] = "n0"
    first = raw(body)
    feed.apply([batch(intake.ASSIGNED_PODS, ev(EventType.ADDED, first))])
    key = pod_key("default", "q")
    placed = sched.cache.cached_pod(key)
    assert placed is not None
    running = raw(
        {**copy.deepcopy(dict(first)), "status": {"phase": "Running", "podIP": "1.2.3.4"}}
    )
    feed.apply([batch(intake.ASSIGNED_PODS, ev(EventType.MODIFIED, running))])
    now = sched.cache.cached_pod(key)
    assert now is not None
    assert now.pod is placed.pod
    assert feed.stats.bound_unchanged == 1
    assert now.rv == int(running["metadata"]["resourceVersion"])
    labelled: dict[str, Any] = copy.deepcopy(dict(running))
    labelled["metadata"]["labels"] = {"app": "x"}
    feed.apply([batch(intake.ASSIGNED_PODS, ev(EventType.MODIFIED, raw(labelled)))])
    now = sched.cache.cached_pod(key)
    assert now is not None
    assert dict(now.pod.labels) == {"app": "x"}


def test_a_node_heartbeat_is_skipped_and_a_capacity_change_is_not(
    sched: Scheduler, feed: Feed
) -> None:
    node = make_node("n0").obj()
    node["status"]["conditions"] = [{"type": "Ready", "lastHeartbeatTime": "t2"}]
    feed.apply([batch(intake.NODES, ev(EventType.MODIFIED, raw(node)))])
    assert feed.stats.node_heartbeats == 1
    node["status"]["allocatable"]["cpu"] = "64"
    feed.apply([batch(intake.NODES, ev(EventType.MODIFIED, raw(node)))])
    got = sched.cache.snapshot.get_node("n0")
    assert got is not None
    assert got.allocatable["cpu"] == 64_000
    assert feed.stats.node_heartbeats == 1


def test_an_old_pods_delete_does_not_touch_its_namesake(sched: Scheduler, feed: Feed) -> None:
    old = make_pod("web-0", "1").obj()
    old["spec"]["nodeName"] = "n0"
    old_raw = raw(old)
    feed.apply([batch(intake.ASSIGNED_PODS, ev(EventType.ADDED, old_raw))])
    new = pending_body("web-0")  # re-created under the same name (a StatefulSet does this)
    feed.apply([batch(intake.PENDING_PODS, ev(EventType.ADDED, new))])
    feed.apply([batch(intake.ASSIGNED_PODS, ev(EventType.DELETED, old_raw))])
    assert queued_uids(sched) == {uid_of(new)}


def test_a_lagging_pending_event_of_a_pod_seen_bound_is_ignored(
    sched: Scheduler, feed: Feed
) -> None:
    body = pending_body("late")
    elsewhere: dict[str, Any] = copy.deepcopy(dict(body))
    elsewhere["spec"]["nodeName"] = "n0"  # bound by someone else (nodeName set directly)
    feed.apply([batch(intake.ASSIGNED_PODS, ev(EventType.ADDED, raw(elsewhere)))])
    feed.apply([batch(intake.PENDING_PODS, ev(EventType.MODIFIED, body))])
    assert queued_uids(sched) == set()
    assert sched.cache.lifecycle.state(pod_key("default", "late")) is PodState.ADDED


def test_a_pending_delete_of_a_pod_bound_elsewhere_keeps_it_placed(
    sched: Scheduler, feed: Feed
) -> None:
    body = pending_body("x")
    feed.apply([batch(intake.PENDING_PODS, ev(EventType.ADDED, body))])
    elsewhere: dict[str, Any] = copy.deepcopy(dict(body))
    elsewhere["spec"]["nodeName"] = "n1"
    feed.apply(
        [
            batch(intake.ASSIGNED_PODS, ev(EventType.ADDED, raw(elsewhere))),
            batch(intake.PENDING_PODS, ev(EventType.DELETED, body)),
        ]
    )
    assert queued_uids(sched) == set()
    cached = sched.cache.cached_pod(pod_key("default", "x"))
    assert cached is not None
    assert cached.node == "n1"


def test_relists_drop_what_went_missing_during_a_gap(sched: Scheduler, feed: Feed) -> None:
    a, b = pending_body("a"), pending_body("b")
    feed.apply([batch(intake.PENDING_PODS, ev(EventType.ADDED, a), ev(EventType.ADDED, b))])
    placed = make_pod("c", "1").obj()
    placed["spec"]["nodeName"] = "n0"
    feed.apply([batch(intake.ASSIGNED_PODS, ev(EventType.ADDED, raw(placed)))])
    # 410 Gone on both pod streams; meanwhile "a" and "c" were deleted and n1 went away.
    feed.apply(
        [
            listed(intake.PENDING_PODS, b),
            listed(intake.ASSIGNED_PODS),
            listed(intake.NODES, raw(make_node("n0").obj())),
        ]
    )
    assert queued_uids(sched) == {uid_of(b)}
    assert sched.cache.cached_pod(pod_key("default", "c")) is None
    assert sched.cache.node_names() == {"n0"}


def test_a_relist_keeps_a_pod_we_are_still_binding(sched: Scheduler, feed: Feed) -> None:
    body = pending_body("inflight")
    feed.apply([batch(intake.PENDING_PODS, ev(EventType.ADDED, body))])
    assume(sched, body, "n0")
    feed.apply([listed(intake.ASSIGNED_PODS), listed(intake.PENDING_PODS)])
    key = pod_key("default", "inflight")
    assert sched.cache.lifecycle.state(key) is PodState.ASSUMED


def test_a_binding_that_never_shows_up_is_queued_again(sched: Scheduler, feed: Feed) -> None:
    body = pending_body("lost")
    feed.apply([batch(intake.PENDING_PODS, ev(EventType.ADDED, body))])
    pod = assume(sched, body, "n0")
    sched.cache.finish_binding(pod, -1000.0)  # long ago: the assume TTL has passed
    feed.tracker.bound(pod.uid)
    sched.tick()
    assert sched.cache.cached_pod(pod_key("default", "lost")) is None
    assert queued_uids(sched) == {pod.uid}


def test_an_expired_pod_the_pending_stream_no_longer_shows_is_not_queued(
    sched: Scheduler, feed: Feed
) -> None:
    body = pending_body("gone")
    feed.apply([batch(intake.PENDING_PODS, ev(EventType.ADDED, body))])
    pod = assume(sched, body, "n0")
    sched.cache.finish_binding(pod, -1000.0)
    feed.apply([batch(intake.PENDING_PODS, ev(EventType.DELETED, body))])
    sched.tick()
    assert queued_uids(sched) == set()


def test_an_initial_list_applied_page_by_page_places_every_pod(sched: Scheduler) -> None:
    """As `lattice run` starts: nodes first, then the bound pods' pages as they are read,
    closed by a paged Relisted; a later re-list still drops what went missing."""
    feed = Feed(sched)
    feed.apply([listed(intake.NODES, raw(make_node("n1").obj()), initial=True)])
    bodies = [bound_echo(pending_body(f"p{i}"), "n1") for i in range(4)]
    for i, body in enumerate(bodies):
        body["metadata"]["uid"] = f"uid-{i}"
    feed.apply([Page(intake.ASSIGNED_PODS, tuple(bodies[:2]), "50")])
    feed.apply([Page(intake.ASSIGNED_PODS, tuple(bodies[2:]), "50")])
    feed.apply([Relisted(intake.ASSIGNED_PODS, (), "50", initial=True, paged=True)])
    assert sched.cache.pod_keys() == {pod_key("default", f"p{i}") for i in range(4)}
    assert all(feed.tracker.is_bound(f"uid-{i}") for i in range(4))
    assert feed._paged == {}
    feed.apply([listed(intake.ASSIGNED_PODS, *bodies[1:])])  # p0 went during a gap
    assert sched.cache.pod_keys() == {pod_key("default", f"p{i}") for i in range(1, 4)}


def test_a_paged_list_read_again_whole_drops_what_its_pages_showed(sched: Scheduler) -> None:
    feed = Feed(sched)
    feed.apply([listed(intake.NODES, raw(make_node("n1").obj()), initial=True)])
    a, gone = (bound_echo(pending_body(n), "n1") for n in ("a", "gone"))
    a["metadata"]["uid"], gone["metadata"]["uid"] = "uid-a", "uid-gone"
    feed.apply([Page(intake.ASSIGNED_PODS, (a, gone), "50")])
    feed.apply([Relisted(intake.ASSIGNED_PODS, (a,), "60", initial=True)])
    assert sched.cache.pod_keys() == {pod_key("default", "a")}


def test_a_paged_relist_drops_what_its_pages_did_not_show(sched: Scheduler) -> None:
    """After 410 Gone the bound pods come back page by page: pods the pages showed are
    kept (and updated), the rest left during the gap, including pods that only an
    attempt cut short (expired continue token) still showed."""
    feed = Feed(sched)
    feed.apply([listed(intake.NODES, raw(make_node("n1").obj()), initial=True)])
    bodies = [bound_echo(pending_body(f"p{i}"), "n1") for i in range(4)]
    for i, body in enumerate(bodies):
        body["metadata"]["uid"] = f"uid-{i}"
    feed.apply([Page(intake.ASSIGNED_PODS, tuple(bodies), "50", first=True)])
    feed.apply([Relisted(intake.ASSIGNED_PODS, (), "50", initial=True, paged=True)])
    assert sched.cache.pod_keys() == {pod_key("default", f"p{i}") for i in range(4)}
    # The re-list: a first attempt shows p0..p2, is cut short; the second shows p1, p3.
    feed.apply([Page(intake.ASSIGNED_PODS, tuple(bodies[:3]), "90", first=True)])
    feed.apply([Page(intake.ASSIGNED_PODS, (bodies[1],), "95", first=True)])
    feed.apply([Page(intake.ASSIGNED_PODS, (bodies[3],), "95")])
    assert len(sched.cache.pod_keys()) == 4  # nothing is dropped before the list closes
    feed.apply([Relisted(intake.ASSIGNED_PODS, (), "95", initial=False, paged=True)])
    assert sched.cache.pod_keys() == {pod_key("default", "p1"), pod_key("default", "p3")}
    assert feed.tracker.is_bound("uid-1")
    assert feed.tracker.is_bound("uid-3")
    assert "uid-0" not in feed.tracker._bound
    assert "uid-2" not in feed.tracker._bound
    assert feed._paged == {}


def test_a_nomination_written_to_a_pending_pod_is_read_and_its_own_status_still_skipped(
    sched: Scheduler, feed: Feed
) -> None:
    """A status update that only sets ``nominatedNodeName`` (a previous leader's
    preemption, while this replica stood by) must reach the preemptor: its nomination
    counts for pods of lower or equal priority, as kube's nominator counts it on the pod's
    update. Other status-only updates (the PodScheduled we wrote) stay skipped."""
    body = pending_body("pree", "1")
    feed.apply([batch(intake.PENDING_PODS, ev(EventType.ADDED, body))])
    assert sched.nominated() == []
    status = {"phase": "Pending", "nominatedNodeName": "n1"}
    nominated = raw({**copy.deepcopy(dict(body)), "status": status})
    feed.apply([batch(intake.PENDING_PODS, ev(EventType.MODIFIED, nominated))])
    assert [(p.name, node) for p, node in sched.nominated()] == [("pree", "n1")]
    skipped = feed.stats.pending_unchanged
    condition = {"type": "PodScheduled", "status": "False", "reason": "Unschedulable"}
    reported = raw(
        {**copy.deepcopy(dict(nominated)), "status": {**status, "conditions": [condition]}}
    )
    feed.apply([batch(intake.PENDING_PODS, ev(EventType.MODIFIED, reported))])
    assert feed.stats.pending_unchanged == skipped + 1
    assert [(p.name, node) for p, node in sched.nominated()] == [("pree", "n1")]


def test_a_gated_pods_nomination_counts_from_its_first_update_not_at_first_sight(
    sched: Scheduler, feed: Feed
) -> None:
    """kube-scheduler 1.34 (checked on the harness): a gated pod seen first, at a restart
    or by a new leader, goes to unschedulablePods without its nomination; an update of it
    counts the nomination. An ungated pod's nomination counts at first sight."""
    status = {"phase": "Pending", "nominatedNodeName": "n1"}
    gated: dict[str, Any] = copy.deepcopy(dict(pending_body("gated", "1")))
    gated["spec"]["schedulingGates"] = [{"name": "example.com/hold"}]
    feed.apply([batch(intake.PENDING_PODS, ev(EventType.ADDED, raw({**gated, "status": status})))])
    assert sched.nominated() == []
    gated["metadata"]["labels"] = {"touched": "yes"}
    feed.apply(
        [batch(intake.PENDING_PODS, ev(EventType.MODIFIED, raw({**gated, "status": status})))]
    )
    assert [(p.name, node) for p, node in sched.nominated()] == [("gated", "n1")]
    open_pod = copy.deepcopy(dict(pending_body("open", "1")))
    feed.apply(
        [batch(intake.PENDING_PODS, ev(EventType.ADDED, raw({**open_pod, "status": status})))]
    )
    assert sorted(p.name for p, _ in sched.nominated()) == ["gated", "open"]


def test_device_taint_rules_are_followed_only_where_served_and_relisted(
    sched: Scheduler, feed: Feed
) -> None:
    """1.37 serves DeviceTaintRules in resource.k8s.io/v1; 1.35 and 1.36 (gate off, or
    v1beta2 only) do not, and get no stream for them. A re-list drops a rule gone
    during a gap, so its taint leaves the devices."""
    plural = {r.key: r.path for r in resources("lattice", device_taint_rules=True)}
    assert plural[intake.DEVICE_TAINT_RULES] == "/apis/resource.k8s.io/v1/devicetaintrules"
    assert intake.DEVICE_TAINT_RULES not in {r.key for r in resources("lattice")}
    rule = raw(taint_rule("r", taint("k"), selector={"driver": GPU_DRIVER}))
    feed.apply([listed(intake.DEVICE_TAINT_RULES, rule, initial=True)])
    assert set(sched.cache.dra.taint_rules) == {"r"}
    feed.apply([listed(intake.DEVICE_TAINT_RULES)])
    assert sched.cache.dra.taint_rules == {}
