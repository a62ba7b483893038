"""Binding conditions through the scheduler (kube 1.36+): PreBind waits in the pod's
binding task, the loop scheduling and binding other pods meanwhile; the conditions met,
the pod binds; a failure condition or the binding timeout fails the PreBind as kube's:
the pod leaves ``reservedFor``, goes back with a SchedulerError that says why, and its
next attempt finds the claim available nowhere and gives the allocation back."""

from __future__ import annotations

import asyncio
import copy
from typing import Any, cast

import pytest

from scheduler.control.dra import Kind
from scheduler.control.kubeio import KubeWriter
from scheduler.control.queue import QueueName, pod_key
from scheduler.control.scheduler import Scheduler
from scheduler.control.settings import SettingsError, default_spec, parse_dra, parse_spec
from scheduler.obs.metrics import Metrics
from tests.builders import make_node, make_pod
from tests.control.test_dra_flow import claim_pod
from tests.control.test_gangs import Clock, run_one
from tests.control.test_write_errors import FaultyWriter, assert_requeued, settled
from tests.core.dra.builders import GPU_DRIVER, claim, device, device_class, exactly, request
from tests.core.dra.builders import resource_slice as slice_body

ATTACHED = "gpu.example.com/attached"
FAILED = "gpu.example.com/attach-failed"


def make(timeout: float | None = None, kube_minor: int = 37) -> tuple[Scheduler, FaultyWriter]:
    """Three nodes; n1 has ``gpu-0``, whose binding waits for ``ATTACHED``; claim ``c``."""
    writer = FaultyWriter()
    spec: dict[str, Any] = {}
    if timeout is not None:
        spec["dra"] = {"bindingTimeoutSeconds": timeout}
    sched = Scheduler(
        parse_spec(spec, "lattice", kube_minor=kube_minor),
        writer=cast(KubeWriter, writer),
        metrics=Metrics.create(),
        clock=Clock(),
        wall_clock=lambda: 0.0,
    )
    for i in range(3):
        sched.node_upserted(make_node(f"n{i}", cpu="4", memory="16Gi").obj())
    sched.dra_upserted(Kind.CLASS, device_class("gpu"))
    gpu = {**device("gpu-0"), "bindingConditions": [ATTACHED], "bindingFailureConditions": [FAILED]}
    sched.dra_upserted(Kind.SLICE, slice_body("s", [gpu], node="n1"))
    body = claim("c", request("gpu", exactly("gpu")))
    writer.bodies["c"] = body
    sched.dra_upserted(Kind.CLAIM, body)
    return sched, writer


def waits(sched: Scheduler, outcome: str) -> float | None:
    """``lattice_dra_binding_condition_waits_total`` for ``outcome``."""
    return sched.metrics.registry.get_sample_value(
        "lattice_dra_binding_condition_waits_total", {"outcome": outcome}
    )


async def start_binding(sched: Scheduler, writer: FaultyWriter) -> None:
    """Run one cycle and let its binding task go as far as writing the claim."""
    info = sched.queue.try_pop()
    assert info is not None
    sched.schedule_one(info)
    for _ in range(200):
        await asyncio.sleep(0.01)
        if writer.written:
            return
    raise AssertionError("the claim was never written")


def driver_sets(sched: Scheduler, *conditions: tuple[str, str], version: str) -> None:
    """The claim as the driver's status update leaves it: ``conditions`` on ``gpu-0``."""
    held = sched.cache.dra.claims[("default", "c")]
    body = copy.deepcopy(claim("c", request("gpu", exactly("gpu"))))
    body["metadata"]["resourceVersion"] = version
    body["status"] = {
        "allocation": copy.deepcopy(dict(held.allocation or {})),
        "reservedFor": [
            {"resource": "pods", "name": r.name, "uid": r.uid} for r in held.reserved_for
        ],
        "devices": [
            {
                "driver": GPU_DRIVER,
                "pool": "n1",
                "device": "gpu-0",
                "conditions": [
                    {"type": t, "status": s, "reason": "Attaching", "message": f"{t}={s}"}
                    for t, s in conditions
                ],
            }
        ],
    }
    sched.dra_upserted(Kind.CLAIM, body)


async def test_the_pod_binds_once_the_driver_sets_the_binding_condition() -> None:
    sched, writer = make()
    sched.pod_upserted(claim_pod("p", "c"))
    plain = make_pod("q", "100m").obj()
    plain["spec"]["schedulerName"] = "lattice"
    sched.pod_upserted(plain)
    await start_binding(sched, writer)
    held = sched.cache.dra.claims[("default", "c")]
    (result,) = (held.allocation or {})["devices"]["results"]
    assert result["bindingConditions"] == [ATTACHED]
    await asyncio.sleep(0.2)
    assert writer.binds == []  # waiting for the driver
    pending = [e for e in writer.events if e[2] == "BindingConditionsPending"]
    assert [e[3] for e in pending] == ["waiting for binding conditions for device on node n1"]
    info = sched.queue.try_pop()  # another pod is scheduled and bound meanwhile
    assert info is not None
    assert info.pod.name == "q"
    sched.schedule_one(info)
    for _ in range(200):
        await asyncio.sleep(0.01)
        if writer.binds:
            break
    assert [p for p, _ in writer.binds] == ["q"]
    driver_sets(sched, (ATTACHED, "False"), version="3")
    await asyncio.sleep(0.1)
    assert [p for p, _ in writer.binds] == ["q"]  # False is not True
    driver_sets(sched, (ATTACHED, "True"), version="4")
    await settled(sched)
    assert ("p", "n1") in writer.binds
    assert waits(sched, "ready") == 1
    assert writer.unreserved == []
    assert writer.deallocated == []


async def test_a_failure_condition_unreserves_requeues_and_then_deallocates() -> None:
    sched, writer = make()
    body = claim_pod("p", "c")
    sched.pod_upserted(body)
    await start_binding(sched, writer)
    driver_sets(sched, (ATTACHED, "False"), (FAILED, "True"), version="3")
    await settled(sched)
    assert writer.binds == []
    assert writer.unreserved == [("c", body["metadata"]["uid"])]
    assert_requeued(
        sched,
        writer,
        "p",
        says='running PreBind plugin "DynamicResources": device binding failed: claim=c, '
        f'reason=Attaching, message="{FAILED}=True"',
    )
    assert waits(sched, "failed") == 1
    # The echo of the unreserve: allocated still, reserved for nobody. The next attempt
    # finds the claim available on no node; PostFilter gives the allocation back.
    echo = copy.deepcopy(claim("c", request("gpu", exactly("gpu"))))
    held = sched.cache.dra.claims[("default", "c")]
    echo["metadata"]["resourceVersion"] = "5"
    echo["status"] = {
        "allocation": dict(held.allocation or {}),
        "devices": list(held.device_statuses),
    }
    sched.dra_upserted(Kind.CLAIM, echo)
    sched.queue.flush(now=float("inf"))
    await run_one(sched)
    await settled(sched)
    assert writer.deallocated == ["c"]
    failed = [e[3] for e in writer.events if e[1] == "p" and e[2] == "FailedScheduling"]
    assert "resourceclaim not available on the node" in failed[-1]
    assert sched.cache.dra.claims[("default", "c")].allocation is None


async def test_the_binding_times_out_and_the_pod_goes_back() -> None:
    sched, writer = make(timeout=0.3)
    sched.pod_upserted(claim_pod("p", "c"))
    await start_binding(sched, writer)
    await settled(sched)
    assert writer.binds == []
    assert_requeued(
        sched,
        writer,
        "p",
        says='running PreBind plugin "DynamicResources": device binding timeout: claim=c',
    )
    assert waits(sched, "timeout") == 1
    count = "lattice_dra_binding_condition_wait_seconds_count"
    assert sched.metrics.registry.get_sample_value(count) == 1
    assert sched.queue.where(pod_key("default", "p")) is QueueName.BACKOFF


async def test_1_35_never_allocates_the_device_so_nothing_waits() -> None:
    sched, writer = make(kube_minor=35)
    sched.pod_upserted(claim_pod("p", "c"))
    await run_one(sched)
    assert writer.written == []
    assert writer.binds == []
    (event,) = [e for e in writer.events if e[2] == "FailedScheduling"]
    assert "cannot allocate all claims" in event[3]


async def test_a_pod_deleted_while_waiting_ends_the_wait_and_is_unreserved() -> None:
    sched, writer = make()
    body = claim_pod("p", "c")
    sched.pod_upserted(body)
    await start_binding(sched, writer)
    sched.pending_left(body, bound=False)  # deleted while pending
    await settled(sched)
    assert writer.binds == []
    assert writer.unreserved == [("c", body["metadata"]["uid"])]
    assert not [e for e in writer.events if e[2] == "FailedScheduling"]
    assert sched.queue.where(pod_key("default", "p")) is None
    assert waits(sched, "gone") == 1


def test_the_binding_timeout_is_a_setting_600_s_by_default() -> None:
    assert parse_dra(None).binding_timeout == parse_dra({}).binding_timeout == 600.0
    assert parse_dra({"bindingTimeoutSeconds": 5}).binding_timeout == 5.0
    for bad in (0, -1, True, "5", 86401):
        with pytest.raises(SettingsError, match="bindingTimeoutSeconds"):
            parse_dra({"bindingTimeoutSeconds": bad})
    assert default_spec("lattice")["dra"]["bindingTimeoutSeconds"] == 600.0
