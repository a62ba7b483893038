"""DRA through the scheduler: an allocator error backs off; a slice arriving wakes the pod."""

from __future__ import annotations

from typing import Any

from structlog.testing import capture_logs

from scheduler.control.dra import Kind
from scheduler.control.queue import QueueName, pod_key
from tests.builders import make_pod
from tests.control.test_gangs import run_one, scheduler
from tests.core.dra.builders import claim, device, device_class, exactly, request, resource_slice


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


def test_one_device_in_two_allocations_is_counted_and_logged() -> None:
    sched, _ = scheduler()
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
