"""Binding conditions (DRADeviceBindingConditions, beta and on from 1.36).

The allocator's part is worked out from dynamic-resource-allocation v0.37's incubating
allocator: ``isSelectable`` (a device with binding conditions is passed over with the gate
off, 1.35), ``GatherPools`` (complete pools some of whose devices have binding conditions
go last, each group in pool order), the result (``bindingConditions`` and
``bindingFailureConditions`` copied from the device) and ``createNodeSelector``
(``bindsToNode`` pins the allocation to the node by name). The readiness part is
kube-scheduler's ``isClaimReadyForBinding`` and ``isClaimTimeout``."""

from __future__ import annotations

from typing import Any

import pytest

from scheduler.core.dra.binding import Readiness, binding_check, has_binding_conditions
from scheduler.core.dra.objects import ResourceClaim
from scheduler.core.plugins.dynamic_resources import binding_failed
from tests.core.dra.builders import GPU_DRIVER, claim, device, exactly, request, resource_slice
from tests.core.dra.test_allocator import allocate, devices_of, node_selector

ATTACHED = "gpu.example.com/attached"
FAILED = "gpu.example.com/attach-failed"


def binding(body: dict[str, Any], *, to_node: bool = False) -> dict[str, Any]:
    """``body`` (a device) with one binding condition and one failure condition."""
    out = {**body, "bindingConditions": [ATTACHED], "bindingFailureConditions": [FAILED]}
    if to_node:
        out["bindsToNode"] = True
    return out


def one_gpu(name: str = "c") -> dict[str, Any]:
    return claim(name, request("gpu", exactly("gpu")))


def test_1_35_passes_over_a_device_with_binding_conditions() -> None:
    slices = [resource_slice("s", [binding(device("gpu-0"))], node="n1")]
    assert allocate([one_gpu()], slices, kube_minor=35) is None


@pytest.mark.parametrize("minor", [36, 37])
def test_from_1_36_the_device_is_allocated_its_conditions_copied(minor: int) -> None:
    slices = [resource_slice("s", [binding(device("gpu-0"))], node="n1")]
    result = allocate([one_gpu()], slices, kube_minor=minor)
    assert result is not None
    (allocation,) = result
    assert allocation["devices"]["results"] == [
        {
            "request": "gpu",
            "driver": GPU_DRIVER,
            "pool": "n1",
            "device": "gpu-0",
            "bindingConditions": [ATTACHED],
            "bindingFailureConditions": [FAILED],
        }
    ]
    assert has_binding_conditions(allocation)


def test_binds_to_node_pins_a_device_of_every_node_to_the_chosen_one() -> None:
    plain = [resource_slice("s", [device("gpu-0")], pool="shared", all_nodes=True)]
    (free,) = allocate([one_gpu()], plain, node="n2") or [{}]
    assert "nodeSelector" not in free  # allNodes: available everywhere
    pinned = [
        resource_slice("s", [binding(device("gpu-0"), to_node=True)], pool="shared", all_nodes=True)
    ]
    (allocation,) = allocate([one_gpu()], pinned, node="n2") or [{}]
    assert allocation["nodeSelector"] == node_selector("n2")
    # bindsToNode alone (no conditions): pinned, and nothing to wait for
    alone = [
        resource_slice(
            "s", [{**device("gpu-0"), "bindsToNode": True}], pool="shared", all_nodes=True
        )
    ]
    (allocation,) = allocate([one_gpu()], alone, node="n2") or [{}]
    assert allocation["nodeSelector"] == node_selector("n2")
    assert not has_binding_conditions(allocation)
    assert allocate([one_gpu()], alone, node="n2", kube_minor=35) is None


def test_pools_with_binding_conditions_are_tried_last() -> None:
    """Pool "a" sorts first, but one of its devices has binding conditions: kube tries
    pool "b" first, and takes from "a" (its plain device first) only when "b" is used up."""
    slices = [
        resource_slice("a", [binding(device("gpu-0")), device("gpu-1")], node="n1", pool="a"),
        resource_slice("b", [device("gpu-0")], node="n1", pool="b"),
    ]
    claims = [one_gpu("x"), one_gpu("y"), one_gpu("z")]
    result = allocate(claims, slices)
    assert result is not None
    assert [(r["pool"], r["device"]) for a in result for r in a["devices"]["results"]] == [
        ("b", "gpu-0"),
        ("a", "gpu-0"),
        ("a", "gpu-1"),
    ]
    # on 1.35 the pool keeps its place and its device with conditions is passed over
    old = allocate(claims[:2], slices, kube_minor=35)
    assert old is not None
    assert [devices_of(a) for a in old] == [["gpu-1"], ["gpu-0"]]


def allocated(
    devices: list[dict[str, Any]] | None = None,
    *,
    stamp: str | None = "2026-12-07T00:00:00Z",
    conditions: tuple[str, ...] = (ATTACHED,),
) -> ResourceClaim:
    result: dict[str, Any] = {
        "request": "gpu",
        "driver": GPU_DRIVER,
        "pool": "n1",
        "device": "gpu-0",
    }
    if conditions:
        result |= {"bindingConditions": list(conditions), "bindingFailureConditions": [FAILED]}
    allocation: dict[str, Any] = {"devices": {"results": [result]}}
    if stamp is not None:
        allocation["allocationTimestamp"] = stamp
    status: dict[str, Any] = {"allocation": allocation}
    if devices is not None:
        status["devices"] = devices
    return ResourceClaim.from_api({**one_gpu(), "status": status})


def status_of(*conditions: tuple[str, str], device_name: str = "gpu-0") -> list[dict[str, Any]]:
    return [
        {
            "driver": GPU_DRIVER,
            "pool": "n1",
            "device": device_name,
            "conditions": [
                {"type": t, "status": s, "reason": "Attach", "message": f"{t} is {s}"}
                for t, s in conditions
            ],
        }
    ]


STAMPED = 1_796_601_600.0  # 2026-12-07T00:00:00Z


def test_a_claim_waits_until_every_binding_condition_of_its_device_is_true() -> None:
    def check(claim: ResourceClaim, now: float = STAMPED + 5) -> Readiness:
        return binding_check(claim, now=now, timeout=600).readiness

    assert check(allocated()) is Readiness.WAITING  # no status entry yet
    assert check(allocated(status_of((ATTACHED, "True"), device_name="gpu-9"))) is (
        Readiness.WAITING  # another device's entry
    )
    assert check(allocated(status_of((ATTACHED, "False")))) is Readiness.WAITING
    assert check(allocated(status_of((ATTACHED, "True")))) is Readiness.READY
    assert check(allocated(conditions=())) is Readiness.READY  # nothing to wait for
    assert check(allocated(), now=STAMPED + 601) is Readiness.TIMED_OUT
    assert check(allocated(stamp=None), now=STAMPED + 10_000) is Readiness.WAITING
    # met conditions never time out
    assert check(allocated(status_of((ATTACHED, "True"))), now=STAMPED + 601) is (Readiness.READY)


def test_a_failure_condition_fails_the_binding_at_once_and_says_why() -> None:
    failed = allocated(status_of((ATTACHED, "False"), (FAILED, "True")))
    check = binding_check(failed, now=STAMPED, timeout=600)
    assert check.readiness is Readiness.FAILED
    assert check.message == (
        f'device binding failed: claim=c, reason=Attach, message="{FAILED} is True"'
    )
    # even with the binding conditions met, as kube checks the failure first
    both = allocated(status_of((ATTACHED, "True"), (FAILED, "True")))
    assert binding_check(both, now=STAMPED, timeout=600).readiness is Readiness.FAILED
    assert binding_failed(both, 600, STAMPED)
    assert not binding_failed(both, None, STAMPED)  # 1.35: no binding conditions
    timed_out = binding_check(allocated(), now=STAMPED + 11, timeout=10)
    assert (timed_out.readiness, timed_out.message) == (
        Readiness.TIMED_OUT,
        "device binding timeout: claim=c",
    )
    assert binding_failed(allocated(), 10, STAMPED + 11)
    assert not binding_failed(allocated(), 10, STAMPED + 9)
