"""DraState: devices in use = written allocations (adminAccess aside) + assumed ones."""

from __future__ import annotations

from typing import Any

from scheduler.core.dra.objects import DeviceId, ResourceClaim
from scheduler.core.dra.state import ClaimPlan, ClaimWrite, DraState
from tests.core.dra.builders import GPU_DRIVER, claim, exactly, request


def allocation(*devices: str, admin: bool = False) -> dict[str, Any]:
    results = [
        {"request": "gpu", "driver": GPU_DRIVER, "pool": "n1", "device": d}
        | ({"adminAccess": True} if admin else {})
        for d in devices
    ]
    return {"devices": {"results": results}}


def gpu(d: str) -> DeviceId:
    return DeviceId(GPU_DRIVER, "n1", d)


def allocated(name: str, *devices: str, admin: bool = False) -> ResourceClaim:
    body = claim(
        name,
        request("gpu", exactly("gpu")),
        status={"allocation": allocation(*devices, admin=admin)},
    )
    return ResourceClaim.from_api(body)


def test_written_allocations_count_and_admin_access_does_not() -> None:
    dra = DraState()
    dra.set_claim(allocated("a", "gpu-0", "gpu-1"))
    dra.set_claim(allocated("watcher", "gpu-0", admin=True))
    assert dra.allocated_devices() == {gpu("gpu-0"), gpu("gpu-1")}
    dra.set_claim(allocated("a", "gpu-1"))  # updated: gpu-0 released
    assert dra.allocated_devices() == {gpu("gpu-1")}
    dra.remove_claim("default", "a")
    assert dra.allocated_devices() == frozenset()


def test_one_device_in_two_allocations_is_reported() -> None:
    dra = DraState()
    dra.set_claim(allocated("a", "gpu-0"))
    dra.set_claim(allocated("b", "gpu-0"))
    assert dra.double_allocated() == [gpu("gpu-0")]
    dra.remove_claim("default", "b")
    assert dra.double_allocated() == []
    assert dra.allocated_devices() == {gpu("gpu-0")}


def test_an_assumption_lasts_until_the_write_is_seen_or_forgotten() -> None:
    dra = DraState()
    dra.set_claim(ResourceClaim.from_api(claim("c", request("gpu", exactly("gpu")))))
    plan = ClaimPlan("p", "u1", (ClaimWrite("default", "c", "uid-c", allocation("gpu-2")),))
    dra.assume(plan)
    assert dra.pending_for(("default", "c")) == "u1"
    assert dra.allocated_devices() == {gpu("gpu-2")}
    other = ClaimPlan("q", "u2", plan.writes)
    dra.forget(other)  # another pod's forget leaves it alone
    assert dra.pending_for(("default", "c")) == "u1"
    dra.set_claim(ResourceClaim.from_api(claim("c", request("gpu", exactly("gpu")))))  # stale echo
    assert dra.pending_for(("default", "c")) == "u1"
    dra.set_claim(allocated("c", "gpu-2"))
    assert dra.pending_for(("default", "c")) is None
    assert dra.allocated_devices() == {gpu("gpu-2")}
    assert dra.double_allocated() == []
    dra.forget(plan)  # nothing pending any more: the written allocation stays
    assert dra.allocated_devices() == {gpu("gpu-2")}


def test_forget_frees_an_unwritten_assumption() -> None:
    dra = DraState()
    plan = ClaimPlan("p", "u1", (ClaimWrite("default", "c", "uid-c", allocation("gpu-0")),))
    dra.assume(plan)
    dra.forget(plan)
    assert dra.allocated_devices() == frozenset()
    assert dra.pending_for(("default", "c")) is None


def test_prebind_sees_a_device_another_allocation_took_since_the_decision() -> None:
    dra = DraState()
    write = ClaimWrite("default", "mine", "uid-mine", allocation("gpu-0", "gpu-1"))
    plan = ClaimPlan("p", "u-p", (write,))
    dra.assume(plan)
    assert dra.taken_since(write, "u-p") == []  # only its own assumption holds them
    dra.set_claim(allocated("kubes", "gpu-1"))  # another scheduler wrote gpu-1 meanwhile
    assert dra.taken_since(write, "u-p") == [gpu("gpu-1")]
    dra.forget(plan)
    assert dra.taken_since(write, "u-p") == [gpu("gpu-1")]  # still taken without ours
    dra.remove_claim("default", "kubes")
    assert dra.taken_since(write, "u-p") == []
    reserve_only = ClaimWrite("default", "shared", "uid-s", None)
    assert dra.taken_since(reserve_only, "u-p") == []
