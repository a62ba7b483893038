"""DRA-backed extended resources through the scheduler: PreBind creates the claim, writes
its allocation and the pod's status, then binds; every failure after the creation deletes
the claim (kube's Unreserve); a claim an earlier attempt left is deleted by PostFilter."""

from __future__ import annotations

import copy
from typing import Any, cast

from scheduler.control.dra import Kind
from scheduler.control.kubeio import KubeWriter, PodRef
from scheduler.control.queue import QueueName, pod_key
from scheduler.control.scheduler import Scheduler
from scheduler.control.settings import parse_spec
from scheduler.core.dra.state import ClaimWrite, placeholder_key
from scheduler.obs.metrics import Metrics
from tests.builders import make_node, make_pod
from tests.control.test_dra_flow import ClaimWriter
from tests.control.test_gangs import Clock, podgroup, run_one
from tests.core.dra.builders import device, device_class, resource_slice

GPU = "example.com/gpu"


class ExtendedWriter(ClaimWriter):
    """ClaimWriter plus the creation and deletion of claims and the pod status patch, in
    one ordered log; ``fail_at`` names the step that fails once."""

    def __init__(self) -> None:
        super().__init__({})
        self.log: list[tuple[str, str]] = []
        self.fail_at: set[str] = set()
        self.created = 0
        self.deleted: list[str] = []
        self.allocations: dict[str, dict[str, Any]] = {}

    def _failing(self, step: str) -> bool:
        if step in self.fail_at:
            self.fail_at.discard(step)
            return True
        return False

    async def create_claim(
        self, body: Any, *, pod_uid: str
    ) -> tuple[dict[str, Any] | None, str | None]:
        if self._failing("create"):
            return None, "creating the claim for extended resources: connection: lost"
        self.created += 1
        made = copy.deepcopy(dict(body))
        name = f"{made['metadata'].pop('generateName')}{self.created:05d}"
        made["metadata"].update(name=name, uid=f"uid-{name}", resourceVersion="1")
        self.bodies[name] = made
        self.log.append(("create", name))
        return made, None

    async def write_claim(
        self, write: ClaimWrite, *, pod_name: str, pod_uid: str
    ) -> tuple[dict[str, Any] | None, str | None]:
        if self._failing("write"):
            return None, f"writing resourceclaim {write.namespace}/{write.name}: 500"
        self.log.append(("write", write.name))
        self.allocations[write.name] = dict(write.allocation or {})
        return await super().write_claim(write, pod_name=pod_name, pod_uid=pod_uid)

    async def set_extended_claim_status(self, pod: PodRef, status: Any) -> str | None:
        if self._failing("status"):
            return f"pod {pod.namespace}/{pod.name} is gone"
        self.log.append(("status", status["extendedResourceClaimStatus"]["resourceClaimName"]))
        self.status_patches.append((pod.name, dict(status)))
        return None

    async def delete_claim(self, namespace: str, name: str, uid: str) -> str | None:
        if self._failing("delete"):
            return f"deleting resourceclaim {namespace}/{name}: connection: lost"
        self.log.append(("delete", name))
        self.deleted.append(name)
        return None

    async def bind(self, pod: PodRef, node: str, annotations: Any = None) -> Any:
        self.log.append(("bind", pod.name))
        return await super().bind(pod, node, annotations)


def gpu_class() -> dict[str, Any]:
    body = device_class("gpu")
    body["spec"]["extendedResourceName"] = GPU
    return body


def extended_scheduler() -> tuple[Scheduler, ExtendedWriter]:
    """n0 has the resource from a device plugin (1), n1 has 8 devices in a ResourceSlice,
    n2 has neither."""
    writer = ExtendedWriter()
    sched = Scheduler(
        parse_spec({}, "lattice"),
        writer=cast(KubeWriter, writer),
        metrics=Metrics.create(),
        clock=Clock(),
        wall_clock=lambda: 0.0,
    )
    sched.node_upserted(make_node("n0", cpu="4", memory="16Gi").resource(GPU, 1).obj())
    for name in ("n1", "n2"):
        sched.node_upserted(make_node(name, cpu="4", memory="16Gi").obj())
    sched.dra_upserted(Kind.CLASS, gpu_class())
    devices = [device(f"gpu-{i}") for i in range(8)]
    sched.dra_upserted(Kind.SLICE, resource_slice("s", devices, node="n1"))
    return sched, writer


def gpu_pod(name: str = "p", count: str = "2") -> dict[str, Any]:
    body = make_pod(name, "100m", resources={GPU: count}).obj()
    body["spec"]["schedulerName"] = "lattice"
    return body


async def test_the_claim_is_created_written_named_in_the_pod_status_then_bound() -> None:
    sched, writer = extended_scheduler()
    body = gpu_pod()
    sched.pod_upserted(body)
    await run_one(sched)
    name = "p-extended-resources-00001"
    assert writer.log == [("create", name), ("write", name), ("status", name), ("bind", "p")]
    assert writer.binds == [("p", "n1")]
    # kube 1.35+ nominates the node before a PreBind with work (the API server clears it
    # at binding), then records the claim
    nomination, (pod, status) = writer.status_patches
    assert nomination == ("p", {"nominatedNodeName": "n1"})
    assert pod == "p"
    assert status == {
        "extendedResourceClaimStatus": {
            "requestMappings": [
                {"containerName": "c0", "resourceName": GPU, "requestName": "container-0-request-1"}
            ],
            "resourceClaimName": name,
        }
    }
    held = sched.cache.dra.claims[("default", name)]
    assert held.allocation is not None
    assert len(held.allocated_devices()) == 2
    assert (held.extended_resources, held.controller_uid) == (True, body["metadata"]["uid"])
    assert sched.cache.dra.pending_for(placeholder_key("default", body["metadata"]["uid"])) is None
    assert len(sched.cache.dra.allocated_devices()) == 2
    assert sched.metrics.dra_allocations._value.get() == 1


async def test_a_device_plugin_node_binds_without_a_claim() -> None:
    sched, writer = extended_scheduler()
    sched.node_deleted(make_node("n1").obj())
    sched.pod_upserted(gpu_pod(count="1"))
    await run_one(sched)
    assert writer.log == [("bind", "p")]
    assert writer.binds == [("p", "n0")]


async def test_a_failed_binding_deletes_the_created_claim() -> None:
    sched, writer = extended_scheduler()
    writer.fail.add("p")
    sched.pod_upserted(gpu_pod())
    await run_one(sched)
    name = "p-extended-resources-00001"
    assert writer.log[-1] == ("delete", name)
    assert writer.binds == []
    assert ("default", name) not in sched.cache.dra.claims
    assert sched.cache.dra.allocated_devices() == frozenset()
    assert sched.queue.where(pod_key("default", "p")) is QueueName.BACKOFF
    sched.queue.flush(now=float("inf"))
    await run_one(sched)  # the retry makes a claim anew
    assert writer.binds == [("p", "n1")]
    assert writer.created == 2


async def test_a_failure_after_the_creation_deletes_the_claim_and_nothing_is_bound() -> None:
    for step in ("write", "status"):
        sched, writer = extended_scheduler()
        writer.fail_at.add(step)
        sched.pod_upserted(gpu_pod())
        await run_one(sched)
        name = "p-extended-resources-00001"
        assert writer.deleted == [name], step
        assert writer.binds == []
        assert sched.cache.dra.allocated_devices() == frozenset(), step
        assert sched.queue.where(pod_key("default", "p")) is QueueName.BACKOFF
        (event,) = [e for e in writer.events if e[2] == "FailedScheduling"]
        assert event[3].startswith('running PreBind plugin "DynamicResources": ')


async def test_a_failed_creation_leaves_nothing_assumed() -> None:
    sched, writer = extended_scheduler()
    writer.fail_at.add("create")
    sched.pod_upserted(gpu_pod())
    await run_one(sched)
    assert writer.log == []
    assert writer.deleted == []
    assert sched.cache.dra.allocated_devices() == frozenset()
    assert sched.queue.where(pod_key("default", "p")) is QueueName.BACKOFF


async def test_a_claim_an_earlier_attempt_left_is_deleted_and_the_pod_retried() -> None:
    """The deletion after a failed binding failed too (or the scheduler restarted between
    the creation and the binding): the claim fails every node, PostFilter deletes it, and
    the pod is tried again without waiting for the watch."""
    sched, writer = extended_scheduler()
    writer.fail.add("p")
    writer.fail_at.add("delete")
    sched.pod_upserted(gpu_pod())
    await run_one(sched)
    name = "p-extended-resources-00001"
    assert ("default", name) in sched.cache.dra.claims
    key = pod_key("default", "p")
    sched.queue.flush(now=float("inf"))
    await run_one(sched)
    failed = [e for e in writer.events if e[2] == "FailedScheduling"]
    assert failed[-1][3].startswith(  # n0's device plugin has 1, fewer than asked
        "0/3 nodes are available: 1 Insufficient example.com/gpu, 2 cannot schedule extended "
        "resource claim."
    )
    assert writer.deleted == [name]
    assert ("default", name) not in sched.cache.dra.claims
    assert sched.queue.where(key) in (QueueName.ACTIVE, QueueName.BACKOFF)
    sched.queue.flush(now=float("inf"))
    await run_one(sched)
    assert writer.binds == [("p", "n1")]


async def test_a_new_device_class_wakes_a_pod_waiting_for_the_resource() -> None:
    sched, writer = extended_scheduler()
    sched.dra_deleted(Kind.CLASS, gpu_class())
    sched.node_deleted(make_node("n0").obj())
    sched.pod_upserted(gpu_pod())
    await run_one(sched)
    key = pod_key("default", "p")
    assert sched.queue.where(key) is QueueName.UNSCHEDULABLE
    (event,) = [e for e in writer.events if e[2] == "FailedScheduling"]
    assert "Insufficient example.com/gpu" in event[3]
    sched.dra_upserted(Kind.CLASS, gpu_class())
    assert sched.queue.where(key) in (QueueName.ACTIVE, QueueName.BACKOFF)


async def test_gang_members_get_a_claim_each_where_the_node_serves_them_by_dra() -> None:
    """A gang of 3 asking for 2 each: n0's device plugin has 1 (too few), n1's 8 devices
    hold all 3; each member's binding creates its own claim, with devices of its own."""
    sched, writer = extended_scheduler()
    sched.podgroup_upserted(podgroup("g", 3))
    for name in ("a", "b", "c"):
        body = gpu_pod(name, count="2")
        body["metadata"].setdefault("labels", {})["scheduling.x-k8s.io/pod-group"] = "g"
        sched.pod_upserted(body)
    await run_one(sched)
    assert sorted(writer.binds) == [("a", "n1"), ("b", "n1"), ("c", "n1")]
    assert writer.created == 3
    assert sorted(writer.allocations) == sorted(writer.bodies)  # the created claims
    devices = [
        r["device"]
        for allocation in writer.allocations.values()
        for r in allocation["devices"]["results"]
    ]
    assert len(devices) == 6
    assert len(set(devices)) == 6
