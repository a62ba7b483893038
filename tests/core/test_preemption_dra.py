"""Preemption that frees DRA devices (kube 1.34 cannot: its DRA rejections are all
UnschedulableAndUnresolvable). A victim's devices count as free in the dry run when only it
holds them; the dry run leaves the device ledger as it found it."""

from __future__ import annotations

from typing import Any

from scheduler.core.dra.objects import DeviceClass, ResourceClaim, ResourceSlice
from scheduler.core.dra.state import DraState
from scheduler.core.framework import Code
from scheduler.core.plugins.dynamic_resources import CANNOT_ALLOCATE
from scheduler.core.preemption import Inputs, preempt
from scheduler.core.schedule import Framework
from scheduler.model.pod import Pod
from tests.builders import cluster, make_node, make_pod
from tests.core.dra.builders import (
    GPU_DRIVER,
    claim,
    device,
    device_class,
    exactly,
    request,
    resource_slice,
)

FRAMEWORK = Framework()
NODES = [make_node(f"n{i}", cpu="8", memory="16Gi") for i in range(2)]


def held(name: str, node: str, devices: list[int], *holders: str) -> dict[str, Any]:
    results = [
        {"request": "gpu", "driver": GPU_DRIVER, "pool": node, "device": f"gpu-{i}"}
        for i in devices
    ]
    status = {
        "allocation": {"devices": {"results": results}},
        "reservedFor": [{"resource": "pods", "name": h, "uid": h} for h in holders],
    }
    return claim(name, request("gpu", exactly("gpu", count=len(devices))), status=status)


def claim_pod(name: str, priority: int, *claims: str, cpu: str = "1") -> Pod:
    builder = make_pod(name, cpu=cpu).priority(priority).uid(name)
    builder.body["spec"]["resourceClaims"] = [
        {"name": f"c{i}", "resourceClaimName": c} for i, c in enumerate(claims)
    ]
    return builder.build()


def state(*claims: dict[str, Any]) -> DraState:
    dra = DraState()
    dra.set_class(DeviceClass.from_api(device_class("gpu")))
    for node in ("n0", "n1"):
        dra.set_slice(
            ResourceSlice.from_api(
                resource_slice(f"{node}-gpus", [device(f"gpu-{i}") for i in range(2)], node=node)
            )
        )
    for c in claims:
        dra.set_claim(ResourceClaim.from_api(c))
    return dra


def test_a_claim_preempts_the_lowest_holder_of_devices_and_only_it() -> None:
    dra = state(
        held("c-a", "n0", [0, 1], "a"),
        held("c-b", "n1", [0, 1], "b"),
        claim("want", request("gpu", exactly("gpu", count=2))),
    )
    a, b = claim_pod("a", 1, "c-a"), claim_pod("b", 5, "c-b")
    bystander = make_pod("cpu-only", cpu="1").priority(0).uid("cpu-only").build()
    bare = make_node("bare", cpu="8", memory="16Gi")  # no devices: eviction cannot help
    snapshot = cluster([*NODES, bare], [(a, "n0"), (bystander, "n0"), (b, "n1")])
    pod = claim_pod("hi", 10, "want")
    decision = FRAMEWORK.schedule(snapshot, pod, dra=dra)
    assert decision.selected is None
    for node in ("n0", "n1"):
        assert decision.explanation.node(node).reasons == (CANNOT_ALLOCATE,)
        assert decision.explanation.node(node).code is Code.UNSCHEDULABLE  # helps preemption
    assert decision.explanation.node("bare").code is Code.UNSCHEDULABLE_AND_UNRESOLVABLE
    before = dra.allocated_devices()
    result = preempt(FRAMEWORK, snapshot, decision, Inputs(dra=dra))
    assert result is not None
    assert result.node == "n0"  # lowest highest-victim priority
    assert [v.name for v in result.victims] == ["a"]  # the cpu-only pod holds no device
    assert {c.node for c in result.candidates} == {"n0", "n1"}
    assert dra.allocated_devices() == before  # the dry run put every device back


def test_a_shared_claim_is_not_freed_by_evicting_one_of_its_pods() -> None:
    """Only a claim reserved for the victim alone is freed by its eviction; a claim that a
    higher-priority pod also uses stays allocated, so there is no candidate."""
    dra = state(
        held("shared", "n0", [0, 1], "a", "keeper"),
        held("c-b", "n1", [0, 1], "b"),
        claim("want", request("gpu", exactly("gpu", count=2))),
    )
    a, keeper = claim_pod("a", 1, "shared"), claim_pod("keeper", 50, "shared")
    b = claim_pod("b", 20, "c-b")
    snapshot = cluster(NODES, [(a, "n0"), (keeper, "n0"), (b, "n1")])
    pod = claim_pod("hi", 10, "want")
    decision = FRAMEWORK.schedule(snapshot, pod, dra=dra)
    assert decision.selected is None
    assert preempt(FRAMEWORK, snapshot, decision, Inputs(dra=dra)) is None


def test_without_dra_inputs_a_claim_pod_finds_no_candidate() -> None:
    dra = state(held("c-a", "n0", [0, 1], "a"), claim("want", request("gpu", exactly("gpu"))))
    snapshot = cluster(NODES[:1], [(claim_pod("a", 1, "c-a"), "n0")])
    pod = claim_pod("hi", 10, "want")
    decision = FRAMEWORK.schedule(snapshot, pod, dra=dra)
    assert decision.selected is None
    assert preempt(FRAMEWORK, snapshot, decision, Inputs()) is None
    result = preempt(FRAMEWORK, snapshot, decision, Inputs(dra=dra))
    assert result is not None
    assert [v.name for v in result.victims] == ["a"]
