"""DRA through the scheduler: an allocator error backs off; a slice arriving wakes the pod."""

from __future__ import annotations

import copy
from typing import Any, cast

from structlog.testing import capture_logs

from scheduler.control.dra import Kind
from scheduler.control.kubeio import KubeWriter
from scheduler.control.queue import QueueName, pod_key
from scheduler.control.scheduler import Scheduler
from scheduler.control.settings import parse_spec
from scheduler.core.dra.state import ClaimWrite
from scheduler.obs.metrics import Metrics
from tests.builders import make_node, make_pod
from tests.control.test_gangs import Clock, FakeWriter, podgroup, run_one, scheduler
from tests.core.dra.builders import (
    claim,
    device,
    device_class,
    exactly,
    request,
    resource_slice,
    taint,
    taint_rule,
)


def claim_pod(name: str, claim_name: str) -> dict[str, Any]:
    body = make_pod(name, "100m").obj()
    body["spec"]["schedulerName"] = "lattice"
    body["spec"]["resourceClaims"] = [{"name": "gpu", "resourceClaimName": claim_name}]
    return body


async def test_an_allocator_error_is_a_scheduler_error_with_backoff() -> None:
    sched, writer = scheduler()
    sched.dra_upserted(Kind.CLASS, device_class("gpu"))
    sched.dra_upserted(Kind.SLICE, resource_slice("s", [device("gpu-0")], node="n1"))
    selector = 'device.attributes["gpu.example.com"].missing == 1'
    sched.dra_upserted(Kind.CLAIM, claim("bad", request("gpu", exactly("gpu", selector))))
    sched.pod_upserted(claim_pod("p", "bad"))
    await run_one(sched)
    assert writer.binds == []
    assert sched.queue.where(pod_key("default", "p")) is QueueName.BACKOFF
    assert sched.counters.errors == 1
    (event,) = [e for e in writer.events if e[2] == "FailedScheduling"]
    assert "CEL runtime error" in event[3]


async def test_a_pod_without_devices_waits_for_a_dra_change() -> None:
    sched, writer = scheduler()
    sched.dra_upserted(Kind.CLASS, device_class("gpu"))
    sched.dra_upserted(Kind.CLAIM, claim("c", request("gpu", exactly("gpu"))))
    sched.pod_upserted(claim_pod("p", "c"))
    await run_one(sched)
    key = pod_key("default", "p")
    assert sched.queue.where(key) is QueueName.UNSCHEDULABLE
    (event,) = [e for e in writer.events if e[2] == "FailedScheduling"]
    assert event[3].startswith("0/3 nodes are available: 3 cannot allocate all claims.")
    sched.dra_upserted(Kind.SLICE, resource_slice("s", [device("gpu-0")], node="n2"))
    assert sched.queue.where(key) in (QueueName.ACTIVE, QueueName.BACKOFF)


async def test_one_device_in_two_allocations_is_counted_logged_and_an_event() -> None:
    sched, writer = scheduler()
    results = [{"request": "gpu", "driver": "gpu.example.com", "pool": "n1", "device": "gpu-0"}]
    for name in ("a", "b"):
        body = claim(
            name,
            request("gpu", exactly("gpu")),
            status={"allocation": {"devices": {"results": results}}},
        )
        with capture_logs() as logs:
            sched.dra_upserted(Kind.CLAIM, body)
    assert sched.metrics.dra_double_allocations._value.get() == 1
    assert [(e["event"], e["reason"]) for e in logs] == [
        ("device_double_allocated", "gpu.example.com/n1/gpu-0")
    ]
    await sched.drain(30)
    (event,) = [e for e in writer.events if e[2] == "DeviceDoubleAllocated"]
    assert event[:2] == ("ResourceClaim", "b")  # the claim whose update showed it
    assert "gpu.example.com/n1/gpu-0" in event[3]
    assert "spec.dra.nodeSelector" in event[3]


class ClaimWriter(FakeWriter):
    """FakeWriter plus the claim writes, recorded; each written claim comes back as the
    API server would return it (allocation and reservedFor set)."""

    def __init__(self, bodies: dict[str, dict[str, Any]]) -> None:
        super().__init__()
        self.bodies = bodies
        self.written: list[str] = []
        self.unreserved: list[tuple[str, str]] = []

    async def write_claim(
        self, write: ClaimWrite, *, pod_name: str, pod_uid: str
    ) -> tuple[dict[str, Any] | None, str | None]:
        self.written.append(write.name)
        body = copy.deepcopy(self.bodies[write.name])
        body["metadata"]["resourceVersion"] = "2"
        reserved = [{"resource": "pods", "name": pod_name, "uid": pod_uid}]
        body["status"] = {"allocation": dict(write.allocation or {}), "reservedFor": reserved}
        return body, None

    async def unreserve_claim(self, write: ClaimWrite, *, pod_uid: str) -> str | None:
        self.unreserved.append((write.name, pod_uid))
        return None


def claim_scheduler(
    *claims: dict[str, Any], writer: ClaimWriter | None = None
) -> tuple[Scheduler, ClaimWriter]:
    """Three nodes, one GPU on n1, ``claims``; ``writer``: a ClaimWriter of the test's own."""
    if writer is None:
        writer = ClaimWriter({})
    writer.bodies.update({c["metadata"]["name"]: c for c in claims})
    sched = Scheduler(
        parse_spec({}, "lattice"),
        writer=cast(KubeWriter, writer),
        metrics=Metrics.create(),
        clock=Clock(),
        wall_clock=lambda: 0.0,
    )
    for i in range(3):
        sched.node_upserted(make_node(f"n{i}", cpu="4", memory="16Gi").obj())
    sched.dra_upserted(Kind.CLASS, device_class("gpu"))
    sched.dra_upserted(Kind.SLICE, resource_slice("s", [device("gpu-0")], node="n1"))
    for c in claims:
        sched.dra_upserted(Kind.CLAIM, c)
    return sched, writer


async def test_lattice_allocates_only_on_its_own_dra_nodes() -> None:
    """spec.dra.nodeSelector: devices elsewhere are kube-scheduler's; the pod waits with a
    reason that names the setting, and is placed once the setting admits the node."""
    sched, writer = claim_scheduler(claim("c", request("gpu", exactly("gpu"))))
    own = {"dra": {"nodeSelector": {"matchLabels": {"kubernetes.io/hostname": "n2"}}}}
    sched.apply_settings(parse_spec(own, "lattice"))
    sched.pod_upserted(claim_pod("p", "c"))
    await run_one(sched)
    assert writer.binds == []
    (event,) = [e for e in writer.events if e[2] == "FailedScheduling"]
    assert event[3].startswith(
        "0/3 nodes are available: 1 cannot allocate all claims, 2 node(s) outside Lattice's DRA"
        " nodes (LatticeScheduler spec.dra.nodeSelector)."
    )
    key = pod_key("default", "p")
    assert sched.queue.where(key) is QueueName.UNSCHEDULABLE
    sched.apply_settings(parse_spec({}, "lattice"))  # a new profile retries the pod
    assert sched.queue.where(key) in (QueueName.ACTIVE, QueueName.BACKOFF)
    sched.queue.flush(now=float("inf"))  # past its backoff
    await run_one(sched)
    assert writer.binds == [("p", "n1")]
    assert writer.written == ["c"]


async def test_a_taint_rule_names_its_taint_and_its_deletion_wakes_the_pod() -> None:
    """A DeviceTaintRule taints the only device: FailedScheduling names the taint; the
    rule's deletion (a DRA change, as kube's slice tracker reports it) wakes the pod,
    which then gets the device."""
    sched, writer = claim_scheduler(claim("c", request("gpu", exactly("gpu"))))
    rule = taint_rule("maint", taint("example.com/maintenance"), selector={"pool": "n1"})
    sched.dra_upserted(Kind.TAINT_RULE, rule)
    sched.pod_upserted(claim_pod("p", "c"))
    await run_one(sched)
    assert writer.binds == []
    (event,) = [e for e in writer.events if e[2] == "FailedScheduling"]
    assert event[3].startswith(
        "0/3 nodes are available: 1 cannot allocate all claims (untolerated device taint: "
        "example.com/maintenance:NoSchedule), 2 cannot allocate all claims."
    )
    key = pod_key("default", "p")
    assert sched.queue.where(key) is QueueName.UNSCHEDULABLE
    sched.dra_deleted(Kind.TAINT_RULE, rule)
    assert sched.queue.where(key) in (QueueName.ACTIVE, QueueName.BACKOFF)
    sched.queue.flush(now=float("inf"))
    await run_one(sched)
    assert writer.binds == [("p", "n1")]


async def test_claims_are_written_before_the_binding_and_counted() -> None:
    c = claim("c", request("gpu", exactly("gpu")))
    sched, writer = claim_scheduler(c)
    sched.pod_upserted(claim_pod("p", "c"))
    await run_one(sched)
    assert writer.written == ["c"]
    assert writer.binds == [("p", "n1")]
    assert sched.metrics.dra_allocations._value.get() == 1
    registry = sched.metrics.registry
    assert registry.get_sample_value("lattice_dra_allocation_duration_seconds_count") == 1
    assert (registry.get_sample_value("lattice_dra_allocation_duration_seconds_sum") or 0) > 0
    # the class selector ran on the one device; a second pod's cycle reuses the verdict
    assert registry.get_sample_value("lattice_dra_cel_evaluations_sum") == 1
    held = sched.cache.dra.claims[("default", "c")]
    assert held.allocation is not None
    assert sched.cache.dra.pending_for(("default", "c")) is None


async def test_a_failed_binding_takes_the_pod_out_of_reserved_for() -> None:
    c = claim("c", request("gpu", exactly("gpu")))
    sched, writer = claim_scheduler(c)
    body = claim_pod("p", "c")
    writer.fail.add("p")
    sched.pod_upserted(body)
    await run_one(sched)
    assert writer.binds == []
    assert writer.unreserved == [("c", body["metadata"]["uid"])]
    assert sched.queue.where(pod_key("default", "p")) is QueueName.BACKOFF


async def test_a_pod_with_claims_is_nominated_before_its_prebind_and_only_such_pods() -> None:
    """kube 1.35+ (NominatedNodeNameForExpectation): nominatedNodeName is the node before
    the claims are written, so kube-scheduler beside us and autoscalers count the room as
    taken; a plain pod binds at once and is not nominated."""
    c = claim("c", request("gpu", exactly("gpu")))
    sched, writer = claim_scheduler(c)
    sched.pod_upserted(claim_pod("p", "c"))
    plain = make_pod("q", "100m").obj()
    plain["spec"]["schedulerName"] = "lattice"
    sched.pod_upserted(plain)
    await run_one(sched)
    await run_one(sched)
    assert ("p", "n1") in writer.binds
    assert sorted(pod for pod, _ in writer.binds) == ["p", "q"]
    assert writer.status_patches == [("p", {"nominatedNodeName": "n1"})]


async def test_a_failed_binding_clears_the_nomination_it_wrote() -> None:
    """kube clears the pod's nomination when its binding cycle fails (#135007)."""
    c = claim("c", request("gpu", exactly("gpu")))
    sched, writer = claim_scheduler(c)
    writer.fail.add("p")
    sched.pod_upserted(claim_pod("p", "c"))
    await run_one(sched)
    await sched.drain(30)
    assert writer.binds == []
    nominations = [s for n, s in writer.status_patches if "nominatedNodeName" in s]
    assert nominations == [{"nominatedNodeName": "n1"}, {"nominatedNodeName": None}]


def test_a_pod_whose_template_claim_is_not_generated_yet_waits_gated_without_an_attempt() -> None:
    """kube's DynamicResources PreEnqueue: no attempt and no FailedScheduling until
    kube-controller-manager names the generated claim in status.resourceClaimStatuses."""
    sched, writer = scheduler()
    body = make_pod("p", "100m").obj()
    body["spec"]["schedulerName"] = "lattice"
    body["spec"]["resourceClaims"] = [{"name": "gpu", "resourceClaimTemplateName": "one"}]
    sched.pod_upserted(body)
    key = pod_key("default", "p")
    assert sched.queue.where(key) is QueueName.GATED
    assert sched.queue.try_pop() is None
    assert writer.events == []
    named = copy.deepcopy(body)
    named["status"] = {"resourceClaimStatuses": [{"name": "gpu", "resourceClaimName": "p-gpu"}]}
    sched.pod_upserted(named)
    assert sched.queue.where(key) is QueueName.ACTIVE


async def test_prebind_does_not_write_a_device_another_allocation_took_since() -> None:
    """kube-scheduler's allocation of the same device arrives between Lattice's decision
    and its PreBind: nothing is written, the conflict is counted, the pod backs off."""
    sched, writer = claim_scheduler(claim("c", request("gpu", exactly("gpu"))))
    sched.pod_upserted(claim_pod("p", "c"))
    info = sched.queue.try_pop()
    assert info is not None
    sched.schedule_one(info)  # decided and assumed; its PreBind task has not run yet
    results = [{"request": "gpu", "driver": "gpu.example.com", "pool": "n1", "device": "gpu-0"}]
    theirs = claim(
        "kubes",
        request("gpu", exactly("gpu")),
        status={"allocation": {"devices": {"results": results}}},
    )
    sched.dra_upserted(Kind.CLAIM, theirs)
    await sched.drain(30)
    assert writer.written == []
    assert writer.binds == []
    assert sched.metrics.dra_conflicts._value.get() == 1
    assert sched.queue.where(pod_key("default", "p")) is QueueName.BACKOFF
    assert sched.cache.dra.pending_for(("default", "c")) is None


def gang_member(name: str, group: str) -> tuple[dict[str, Any], dict[str, Any]]:
    """A PodGroup member with one 1-device claim generated for it from a template."""
    body = claim_pod(name, "unused")
    body["metadata"].setdefault("labels", {})["scheduling.x-k8s.io/pod-group"] = group
    uid = body["metadata"]["uid"]
    body["spec"]["resourceClaims"] = [{"name": "gpu", "resourceClaimTemplateName": "one"}]
    body["status"] = {
        "resourceClaimStatuses": [{"name": "gpu", "resourceClaimName": f"{name}-gpu"}]
    }
    owned = claim(f"{name}-gpu", request("gpu", exactly("gpu")))
    owned["metadata"]["ownerReferences"] = [
        {"apiVersion": "v1", "kind": "Pod", "name": name, "uid": uid, "controller": True}
    ]
    return body, owned


async def test_a_gang_with_claims_allocates_every_member_or_none() -> None:
    pods, claims = zip(*(gang_member(f"w{i}", "g") for i in range(3)), strict=True)
    sched, writer = claim_scheduler(*claims)
    sched.dra_upserted(Kind.SLICE, resource_slice("s2", [device("gpu-0")], node="n2"))
    sched.podgroup_upserted(podgroup("g", 3))
    for body in pods:
        sched.pod_upserted(body)
    await run_one(sched)  # two devices in the cluster, three members: none placed
    assert writer.written == []
    assert writer.binds == []
    assert sched.cache.dra.allocated_devices() == frozenset()
    sched.dra_upserted(Kind.SLICE, resource_slice("s0", [device("gpu-0")], node="n0"))
    sched.queue.flush(now=float("inf"))
    await run_one(sched)
    assert sorted(writer.written) == ["w0-gpu", "w1-gpu", "w2-gpu"]
    assert sorted(node for _, node in writer.binds) == ["n0", "n1", "n2"]
    used = sched.cache.dra.allocated_devices()
    assert len(used) == 3  # one device each, none twice


async def test_claim_changes_wake_only_the_pods_they_can_help() -> None:
    """kube's queueing hints for claims: another pod's claim written or reserved changes
    nothing for a waiting pod; its own claim's status does; a claim deallocated, or deleted
    while allocated, frees devices for every pod with claims; slices and classes deleted
    help nobody."""
    sched, _ = scheduler()
    sched.dra_upserted(Kind.CLASS, device_class("gpu"))
    sched.dra_upserted(Kind.CLAIM, claim("c", request("gpu", exactly("gpu"))))
    sched.pod_upserted(claim_pod("p", "c"))
    await run_one(sched)
    key = pod_key("default", "p")

    def parked() -> bool:
        return sched.queue.where(key) is QueueName.UNSCHEDULABLE

    def park() -> None:
        sched.queue.flush(now=10**9)
        info = sched.queue.try_pop()
        assert info is not None
        sched.queue.requeue_after_failure(info, unschedulable=True, reason="test")
        assert parked()

    assert parked()
    results = [{"request": "gpu", "driver": "gpu.example.com", "pool": "n1", "device": "gpu-0"}]
    allocated = {"allocation": {"devices": {"results": results}}}
    other = claim("other", request("gpu", exactly("gpu")))
    sched.dra_upserted(Kind.CLAIM, other)  # created, not ours
    assert parked()
    sched.dra_upserted(Kind.CLAIM, claim("other", request("gpu", exactly("gpu")), status=allocated))
    assert parked()  # allocated to someone else: takes devices, frees none
    sched.dra_deleted(Kind.SLICE, resource_slice("s", [device("gpu-0")], node="n1"))
    sched.dra_deleted(Kind.CLASS, device_class("unused"))
    assert parked()
    sched.dra_upserted(Kind.CLAIM, claim("other", request("gpu", exactly("gpu"))))
    assert not parked()  # deallocated: devices free for every pod with claims
    park()
    sched.dra_upserted(Kind.CLAIM, claim("c", request("gpu", exactly("gpu")), status=allocated))
    assert not parked()  # our own claim's status changed
    park()
    sched.dra_deleted(Kind.CLAIM, claim("c", request("gpu", exactly("gpu")), status=allocated))
    assert not parked()  # deleted while allocated
    park()
    sched.dra_deleted(Kind.CLAIM, claim("other", request("gpu", exactly("gpu"))))
    assert parked()  # an unallocated claim gone frees nothing
