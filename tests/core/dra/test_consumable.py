"""Consumable capacity (DRAConsumableCapacity, beta and on from 1.36): kube's shares.

Every expected value is worked out from dynamic-resource-allocation v0.37's incubating
allocator (``CmpRequestOverCapacity``, ``calculateConsumedCapacity``, ``violatesPolicy``,
``allocateDevice``, ``distinctAttributeConstraint``) and the scheduler plugin's
``GatherAllocatedState``: a device with ``allowMultipleAllocations`` serves a share while,
for each of its capacities, what the shares in use, the shares picked so far and this one
consume stays within the capacity; a result with a ``shareID`` is a share, not a device
taken whole."""

from __future__ import annotations

import uuid
from collections.abc import Sequence
from typing import Any

import pytest

from scheduler.core.dra.allocator import AllocationError
from scheduler.core.dra.objects import (
    DeviceClass,
    DeviceId,
    ResourceClaim,
    ResourceSlice,
    claim_alpha_fields,
)
from scheduler.core.dra.state import ClaimPlan, ClaimWrite, DraState
from scheduler.model.quantity import Quantity
from tests.core.dra.builders import (
    GPU_DRIVER,
    claim,
    consuming,
    counter_slice,
    device,
    exactly,
    request,
    resource_slice,
)
from tests.core.dra.test_allocator import GPU_CLASS, allocate, devices_of

GI = 2**30


def shared_gpu(
    name: str = "gpu-0", memory: str = "40Gi", policy: dict[str, Any] | None = None, **attrs: Any
) -> dict[str, Any]:
    """A device allowing multiple allocations, with a ``memory`` capacity."""
    body = device(name, capacity={"memory": memory}, **attrs)
    body["allowMultipleAllocations"] = True
    if policy is not None:
        body["capacity"]["memory"]["requestPolicy"] = policy
    return body


def node_slice(*devices: dict[str, Any], node: str = "n1") -> dict[str, Any]:
    return resource_slice(f"{node}-gpus", list(devices), node=node)


def wants(name: str, memory: str | None = None, *, count: int = 1, **kw: Any) -> dict[str, Any]:
    """A claim asking ``count`` devices, each with a ``memory`` share (None: no request)."""
    body = exactly("gpu", count=count)
    if memory is not None:
        body["capacity"] = {"requests": {"memory": memory}}
    return claim(name, request("gpu", body), **kw)


def consumed(allocation: dict[str, Any]) -> list[int]:
    """The memory each result consumes, in bytes (exact)."""
    return [
        Quantity.parse(r["consumedCapacity"]["memory"]).nanos // 10**9
        for r in allocation["devices"]["results"]
    ]


def one(claims: Sequence[dict[str, Any]], *devices: dict[str, Any], **kw: Any) -> Any:
    return allocate(claims, [node_slice(*devices)], **kw)


RANGE = {"default": "2Gi", "validRange": {"min": "1Gi", "max": "20Gi", "step": "1Gi"}}


@pytest.mark.parametrize(
    ("asked", "expected"),
    [
        ("1536Mi", 2 * GI),  # rounded up to the next step
        (None, 2 * GI),  # omitted: the default
        ("512Mi", GI),  # below min: min
        ("20Gi", 20 * GI),  # the max itself
    ],
)
def test_a_valid_range_rounds_a_request_up_to_its_step(asked: str | None, expected: int) -> None:
    found = one([wants("c", asked)], shared_gpu(policy=RANGE))
    assert found is not None
    assert consumed(found[0]) == [expected]


def test_a_request_above_the_range_or_between_valid_values_does_not_fit() -> None:
    assert one([wants("c", "21Gi")], shared_gpu(policy=RANGE)) is None
    values = {"validValues": ["4Gi", "8Gi"]}
    found = one([wants("c", "5Gi")], shared_gpu(policy=values))
    assert found is not None
    assert consumed(found[0]) == [8 * GI]  # rounded up to the next valid value
    assert one([wants("c", "9Gi")], shared_gpu(policy=values)) is None


def test_without_a_policy_an_omitted_request_takes_the_whole_capacity() -> None:
    found = one([wants("a"), wants("b", "1Gi")], shared_gpu(), shared_gpu("gpu-1"))
    assert found is not None
    assert [devices_of(a) for a in found] == [["gpu-0"], ["gpu-1"]]
    assert [consumed(a) for a in found] == [[40 * GI], [GI]]


def test_shares_fill_a_device_and_are_never_overspent() -> None:
    """40Gi, 16Gi each: two shares of gpu-0 (one pod's claims, and one claim's devices);
    a third would make 48Gi and goes to gpu-1, a fourth too, a fifth fits nowhere."""
    found = one([wants("a", "16Gi"), wants("b", "16Gi")], shared_gpu())
    assert found is not None
    assert [devices_of(a) for a in found] == [["gpu-0"], ["gpu-0"]]
    share_ids = [a["devices"]["results"][0]["shareID"] for a in found]
    assert len(set(share_ids)) == 2
    assert all(str(uuid.UUID(s)) == s for s in share_ids)  # kube's shape: a UUID
    assert one([wants("a", "16Gi", count=3)], shared_gpu()) is None
    five = [wants(f"c{i}", "16Gi") for i in range(5)]
    assert one(five, shared_gpu(), shared_gpu("gpu-1")) is None
    four = one(five[:4], shared_gpu(), shared_gpu("gpu-1"))
    assert four is not None
    assert [devices_of(a) for a in four] == [["gpu-0"], ["gpu-0"], ["gpu-1"], ["gpu-1"]]


def test_a_request_naming_a_capacity_the_device_lacks_or_exceeds_skips_it() -> None:
    """The check covers devices that allow one allocation too: a bound, no share."""
    plain = device("gpu-0", capacity={"memory": "40Gi"})
    assert one([wants("c", "48Gi")], plain) is None
    fits = one([wants("c", "8Gi")], plain)
    assert fits is not None
    assert "shareID" not in fits[0]["devices"]["results"][0]
    assert "consumedCapacity" not in fits[0]["devices"]["results"][0]
    lacking = claim(
        "c", request("gpu", {**exactly("gpu"), "capacity": {"requests": {"cores": "1"}}})
    )
    assert one([lacking], shared_gpu()) is None


def pair(**kw: Any) -> dict[str, Any]:
    """One claim, two requests of an 8Gi share each."""
    share = {**exactly("gpu"), "capacity": {"requests": {"memory": "8Gi"}}}
    return claim("c", request("a", share), request("b", share), **kw)


def test_distinct_attribute_puts_each_share_on_another_device() -> None:
    """Two requests share one device unless distinctAttribute tells them apart (one
    request's own devices are distinct anyway: kube's search goes on after the device it
    took)."""
    devices = (shared_gpu(uid="a"), shared_gpu("gpu-1", uid="b"))
    same = one([pair()], *devices)
    assert same is not None
    assert devices_of(same[0]) == ["gpu-0", "gpu-0"]
    apart = one([pair(constraints=[{"distinctAttribute": "gpu.example.com/uid"}])], *devices)
    assert apart is not None
    assert devices_of(apart[0]) == ["gpu-0", "gpu-1"]
    counted = one([wants("c", "8Gi", count=2)], *devices)
    assert counted is not None
    assert devices_of(counted[0]) == ["gpu-0", "gpu-1"]
    lone = one([pair(constraints=[{"distinctAttribute": "gpu.example.com/uid"}])], devices[0])
    assert lone is None  # one value only


def state_with(*devices: dict[str, Any]) -> DraState:
    dra = DraState()
    dra.set_class(DeviceClass.from_api(GPU_CLASS))
    dra.set_slice(ResourceSlice.from_api(node_slice(*devices)))
    return dra


def allocate_on(dra: DraState, *claims: dict[str, Any], kube_minor: int = 37) -> Any:
    allocator = dra.allocator(kube_minor=kube_minor)
    return allocator.allocate("n1", {}, [ResourceClaim.from_api(c) for c in claims])


def written(body: dict[str, Any], allocation: dict[str, Any]) -> ResourceClaim:
    return ResourceClaim.from_api({**body, "status": {"allocation": allocation}})


def test_in_flight_and_written_shares_are_counted() -> None:
    """Lattice's own assumed share (not yet written) and a share written by another
    scheduler both count against the device's capacity; forgetting or deleting frees it."""
    dra = state_with(shared_gpu())
    first = allocate_on(dra, wants("a", "30Gi"))
    assert first is not None
    plan = ClaimPlan("p", "u1", (ClaimWrite("default", "a", "uid-a", first[0]),))
    dra.assume(plan)
    assert dra.shared_capacity() == {
        DeviceId(GPU_DRIVER, "n1", "gpu-0"): {"memory": 30 * GI * 10**9}
    }
    assert dra.allocated_devices() == frozenset()  # a share does not take the device
    assert allocate_on(dra, wants("b", "16Gi")) is None
    assert allocate_on(dra, wants("b", "10Gi")) is not None
    dra.forget(plan)
    assert dra.shared_capacity() == {}
    assert allocate_on(dra, wants("b", "16Gi")) is not None
    dra.set_claim(written(wants("other", "30Gi"), first[0]))  # another scheduler's share
    assert allocate_on(dra, wants("b", "16Gi")) is None
    # Release 1.35 (gate off) counts the shared device as taken whole.
    assert allocate_on(dra, wants("b"), kube_minor=35) is None
    dra.remove_claim("default", "other")
    assert allocate_on(dra, wants("b", "16Gi")) is not None


def test_a_result_without_share_id_takes_a_multi_allocatable_device_whole() -> None:
    dra = state_with(shared_gpu())
    whole = {"devices": {"results": [
        {"request": "gpu", "driver": GPU_DRIVER, "pool": "n1", "device": "gpu-0"}
    ]}}  # fmt: skip
    dra.set_claim(written(wants("other"), whole))
    assert allocate_on(dra, wants("b", "1Gi")) is None


def test_prebind_sees_a_share_written_since_the_decision() -> None:
    dra = state_with(shared_gpu())
    mine = allocate_on(dra, wants("a", "30Gi"))
    assert mine is not None
    write = ClaimWrite("default", "a", "uid-a", mine[0])
    plan = ClaimPlan("p", "u1", (write,))
    dra.assume(plan)
    assert dra.capacity_overspent(write, "u1") == []
    theirs = allocate_on(state_with(shared_gpu()), wants("x", "16Gi"))
    assert theirs is not None
    dra.set_claim(written(wants("x", "16Gi"), theirs[0]))
    assert dra.capacity_overspent(write, "u1") == [f"{GPU_DRIVER}/n1/gpu-0/memory"]


def test_a_shared_device_charges_its_counters_once() -> None:
    """kube skips the counter check for a further share of a device already in use."""
    gpu = consuming(shared_gpu(), "set", memory="40Gi")
    other = consuming(device("gpu-1", capacity={"memory": "40Gi"}), "set", memory="40Gi")
    slices = [
        counter_slice("n1-counters", {"set": {"memory": "40Gi"}}, node="n1", pool="n1"),
        resource_slice("n1-gpus", [gpu, other], node="n1", pool="n1", count=2),
    ]
    found = allocate([wants("a", "8Gi"), wants("b", "8Gi")], slices)
    assert found is not None
    assert [devices_of(a) for a in found] == [["gpu-0"], ["gpu-0"]]
    # The shared device holds the set's whole counter: the other device cannot join it.
    both = claim("c", request("gpu", {**exactly("gpu", count=2)}))
    assert allocate([both], slices) is None


def test_fractional_ranges_round_in_milliunits_only_from_1_38() -> None:
    """DRAFractionalCapacityRange is off in kube-scheduler 1.37 as shipped (on only with
    ``--min-compatibility-version`` 1.37, the default from 1.38): 1.36 and 1.37 round every
    value up to whole units first; with it, bounds in whole milliunits round there and a
    request finer than 1m is an error."""
    policy = {"validRange": {"min": "100m", "step": "100m"}}
    body = shared_gpu(memory="4", policy=policy)
    for minor in (36, 37):
        old = one([wants("c", "150m")], body, kube_minor=minor)
        assert old is not None
        assert old[0]["devices"]["results"][0]["consumedCapacity"] == {"memory": "1"}
    found = one([wants("c", "150m")], body, kube_minor=38)
    assert found is not None
    assert found[0]["devices"]["results"][0]["consumedCapacity"] == {"memory": "200m"}
    with pytest.raises(AllocationError, match="not a milli value"):
        one([wants("c", "1500500u")], body, kube_minor=38)


def test_release_1_35_passes_over_shared_devices_and_refuses_the_fields() -> None:
    assert one([wants("c")], shared_gpu(), kube_minor=35) is None
    parsed = ResourceClaim.from_api(
        wants("c", "1Gi", constraints=[{"distinctAttribute": "gpu.example.com/uid"}])
    )
    assert claim_alpha_fields(parsed, 35) == [
        "spec.devices.requests[0].exactly.capacity",
        "spec.devices.constraints[0].distinctAttribute",
    ]
    assert claim_alpha_fields(parsed, 36) == []


def test_selectors_see_allow_multiple_allocations() -> None:
    """kube's CEL device has ``allowMultipleAllocations`` (false when unset)."""
    plain = device("gpu-1", capacity={"memory": "40Gi"})
    only_shared = claim(
        "c", request("gpu", exactly("gpu", "device.allowMultipleAllocations", count=1))
    )
    found = allocate([only_shared], [node_slice(plain, shared_gpu())])
    assert found is not None
    assert devices_of(found[0]) == ["gpu-0"]
    only_plain = claim(
        "c", request("gpu", exactly("gpu", "!device.allowMultipleAllocations", count=1))
    )
    found = allocate([only_plain], [node_slice(shared_gpu(), plain)])
    assert found is not None
    assert devices_of(found[0]) == ["gpu-1"]
