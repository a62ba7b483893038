"""Partitionable devices (DRAPartitionableDevices, beta and on from 1.36): kube's counters.

Every expected value is worked out from dynamic-resource-allocation v0.37's incubating
allocator (``checkAvailableCounters``, ``GatherPools``, ``buildPool``, ``isSelectable``,
``createNodeSelector``): a device that consumes counters fits while, for every counter of
its pool, the set's value minus what allocated devices and the devices picked so far in
the search consume stays at or above zero."""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import pytest

from scheduler.core.dra.allocator import NodeAllocationError
from scheduler.core.dra.objects import DeviceClass, DeviceId, ResourceClaim, ResourceSlice
from scheduler.core.dra.state import ClaimPlan, ClaimWrite, DraState
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
from tests.core.dra.test_allocator import GPU_CLASS, allocate, devices_of, node_selector

PARTITIONS = 'device.attributes["gpu.example.com"].kind == "partition"'
FULL = 'device.attributes["gpu.example.com"].kind == "full"'


def gpu_with_partitions(
    memory: str = "10Gi", parts: Sequence[str] = ("4Gi", "4Gi", "4Gi"), *, node: str = "n1"
) -> list[dict[str, Any]]:
    """One GPU as two slices of pool ``node``: its counter set, then the full device
    (consuming the whole memory) and partitions consuming ``parts``."""
    devices = [consuming(device("gpu-0", kind="full"), "gpu-0", memory=memory)]
    devices += [
        consuming(device(f"part-{i}", kind="partition"), "gpu-0", memory=m)
        for i, m in enumerate(parts)
    ]
    return [
        counter_slice(f"{node}-counters", {"gpu-0": {"memory": memory}}, node=node, pool=node),
        resource_slice(f"{node}-devices", devices, node=node, pool=node, count=2),
    ]


def one(name: str, *selectors: str, count: int = 1) -> dict[str, Any]:
    return claim(name, request("gpu", exactly("gpu", *selectors, count=count)))


def ids(*names: str, pool: str = "n1") -> list[DeviceId]:
    return [DeviceId(GPU_DRIVER, pool, n) for n in names]


def test_two_partitions_fit_a_third_overspends_the_memory_counter() -> None:
    """10Gi, 4Gi each: two take 8Gi; a third would make 12Gi."""
    slices = gpu_with_partitions()
    two = allocate([one("c", PARTITIONS, count=2)], slices)
    assert two is not None
    assert devices_of(two[0]) == ["part-0", "part-1"]
    assert two[0]["nodeSelector"] == node_selector("n1")
    assert allocate([one("c", PARTITIONS, count=3)], slices) is None
    # Across claims of one pod, and against partitions already allocated.
    pair = allocate([one("a", PARTITIONS), one("b", PARTITIONS)], slices)
    assert pair is not None
    assert [devices_of(a) for a in pair] == [["part-0"], ["part-1"]]
    assert allocate([one("c", PARTITIONS)], slices, allocated=ids("part-0", "part-2")) is None
    left = allocate([one("c", PARTITIONS)], slices, allocated=ids("part-2"))
    assert left is not None
    assert devices_of(left[0]) == ["part-0"]


def test_the_full_device_and_its_partitions_share_the_counter() -> None:
    slices = gpu_with_partitions()
    first = allocate([one("c")], slices)
    assert first is not None
    assert devices_of(first[0]) == ["gpu-0"]  # first in spec order, all 10Gi
    assert allocate([one("c", PARTITIONS)], slices, allocated=ids("gpu-0")) is None
    assert allocate([one("c", FULL)], slices, allocated=ids("part-1")) is None
    # Any device, with one partition taken: the full one no longer fits, a partition does.
    rest = allocate([one("c")], slices, allocated=ids("part-1"))
    assert rest is not None
    assert devices_of(rest[0]) == ["part-0"]
    # One pod asking for the full device and a partition cannot have both.
    assert allocate([one("a", FULL), one("b", PARTITIONS)], slices) is None


def test_backtracking_gives_back_the_counters_of_a_device_it_drops() -> None:
    """Request ``any`` takes gpu-0 (10Gi) first; ``part`` then finds no memory and the
    search backtracks: ``any`` takes part-0 (4Gi) and ``part`` gets part-1 (8Gi in all),
    which works only if gpu-0's 10Gi were released."""
    slices = gpu_with_partitions()
    body = claim(
        "c",
        request("any", exactly("gpu")),
        request("part", exactly("gpu", PARTITIONS)),
    )
    result = allocate([body], slices)
    assert result is not None
    assert [(r["request"], r["device"]) for r in result[0]["devices"]["results"]] == [
        ("any", "part-0"),
        ("part", "part-1"),
    ]


def test_all_mode_needs_every_matching_device_within_the_counters() -> None:
    slices = gpu_with_partitions()
    every = claim("c", request("gpu", exactly("gpu", PARTITIONS, mode="All")))
    assert allocate([every], slices) is None  # 3 x 4Gi > 10Gi
    two = gpu_with_partitions(parts=("4Gi", "4Gi"))
    result = allocate([every], two)
    assert result is not None
    assert devices_of(result[0]) == ["part-0", "part-1"]


def test_one_overspent_counter_refuses_every_consuming_device_of_the_pool() -> None:
    """kube compares every counter of the pool after adding the device's consumption, so
    set ``a`` over-spent by allocated devices (two schedulers, say) keeps ``b-0`` (which
    consumes only from ``b``) out too."""
    slices = [
        counter_slice("s-counters", {"a": {"memory": "4Gi"}, "b": {"memory": "4Gi"}}, node="n1"),
        resource_slice(
            "s-devices",
            [
                consuming(device("a-0"), "a", memory="4Gi"),
                consuming(device("a-1"), "a", memory="4Gi"),
                consuming(device("b-0"), "b", memory="4Gi"),
            ],
            node="n1",
            pool="n1",
            count=2,
        ),
    ]
    fits = allocate([one("c")], slices, allocated=ids("a-0"))
    assert fits is not None
    assert devices_of(fits[0]) == ["b-0"]
    assert allocate([one("c")], slices, allocated=ids("a-0", "a-1")) is None


def test_an_unknown_counter_set_or_counter_makes_the_pool_invalid() -> None:
    for use in ({"nope": "1"}, {"memory": "1Gi", "nope": "1"}):
        slices = gpu_with_partitions()
        slices[1]["spec"]["devices"][1] = consuming(device("part-0"), "gpu-0", **use)
        with pytest.raises(NodeAllocationError, match="invalid resource pools"):
            allocate([one("c")], slices)
    missing_set = gpu_with_partitions()
    missing_set[1]["spec"]["devices"][1] = consuming(device("part-0"), "other", memory="1Gi")
    # ExactCount passes an invalid pool by and takes from the next one.
    fine = resource_slice("z", [device("z-0")], node="n1", pool="z")
    result = allocate([one("c")], [*missing_set, fine])
    assert result is not None
    assert devices_of(result[0]) == ["z-0"]


def test_a_duplicate_counter_set_name_in_the_pool_makes_it_invalid() -> None:
    slices = gpu_with_partitions()
    twin = counter_slice("n1-twin", {"gpu-0": {"memory": "1Gi"}}, node="n1", pool="n1", count=3)
    for s in slices:
        s["spec"]["pool"]["resourceSliceCount"] = 3
    with pytest.raises(NodeAllocationError):
        allocate([one("c")], [*slices, twin])


def test_per_device_node_selection_and_counters_shared_across_nodes() -> None:
    """Pool ``shared``: counters for all nodes, and one per-device slice per node. n1 sees
    two of its three slices, so kube reads the third (n2's) for its allocated devices."""
    counters = counter_slice(
        "shared-counters", {"fabric": {"links": "10"}}, pool="shared", count=3, all_nodes=True
    )

    def per_device(name: str, node: str) -> dict[str, Any]:
        body = resource_slice(
            name,
            [{**consuming(device(f"d-{node}"), "fabric", links="6"), "nodeName": node}],
            pool="shared",
            count=3,
        )
        body["spec"]["perDeviceNodeSelection"] = True
        return body

    slices = [counters, per_device("shared-a", "n1"), per_device("shared-b", "n2")]
    result = allocate([one("c")], slices)
    assert result is not None
    assert devices_of(result[0]) == ["d-n1"]  # never n2's
    assert result[0]["nodeSelector"] == node_selector("n1")  # the device's own node
    assert allocate([one("c")], slices, allocated=ids("d-n2", pool="shared")) is None
    assert allocate([one("c")], slices, node="n3") is None  # n3 sees no device slice


def test_a_device_for_all_nodes_adds_no_node_selector() -> None:
    body = resource_slice("p", [{**device("d"), "allNodes": True}], pool="p")
    body["spec"]["perDeviceNodeSelection"] = True
    result = allocate([one("c")], [body], node="anywhere")
    assert result is not None
    assert devices_of(result[0]) == ["d"]
    assert "nodeSelector" not in result[0]


def test_a_newer_generation_elsewhere_makes_the_pool_obsolete() -> None:
    """The node sees generation 1 (one of two slices); another slice of the pool is at
    generation 2: kube ignores the pool (``checkSlicesInPool``)."""
    old = resource_slice("a", [device("gpu-0")], node="n1", pool="p", count=2)
    newer = resource_slice("b", [device("gpu-1")], node="n2", pool="p", count=2, generation=2)
    assert allocate([one("c")], [old, newer]) is None
    same = resource_slice("b", [device("gpu-1")], node="n2", pool="p", count=2)
    result = allocate([one("c")], [old, same])  # complete across nodes: n1 takes its own
    assert result is not None
    assert devices_of(result[0]) == ["gpu-0"]


@pytest.mark.parametrize("minor", [36, 37])
def test_1_36_and_1_37_allocate_partitions(minor: int) -> None:
    result = allocate([one("c", PARTITIONS, count=2)], gpu_with_partitions(), kube_minor=minor)
    assert result is not None
    assert devices_of(result[0]) == ["part-0", "part-1"]


def test_1_35_refuses_devices_that_consume_counters() -> None:
    slices = gpu_with_partitions()
    assert allocate([one("c")], slices, kube_minor=35) is None
    plain = resource_slice("z", [device("z-0")], node="n1", pool="z")
    result = allocate([one("c")], [*slices, plain], kube_minor=35)
    assert result is not None
    assert devices_of(result[0]) == ["z-0"]


def allocated_claim(name: str, *devices: str) -> ResourceClaim:
    results = [{"request": "gpu", "driver": GPU_DRIVER, "pool": "n1", "device": d} for d in devices]
    return ResourceClaim.from_api(
        claim(
            name,
            request("gpu", exactly("gpu")),
            status={"allocation": {"devices": {"results": results}}},
        )
    )


def state_with(slices: Sequence[dict[str, Any]]) -> DraState:
    dra = DraState()
    dra.set_class(DeviceClass.from_api(GPU_CLASS))
    for s in slices:
        dra.set_slice(ResourceSlice.from_api(s))
    return dra


def partition_for(dra: DraState) -> list[str] | None:
    found = dra.allocator().allocate("n1", {}, [ResourceClaim.from_api(one("new", PARTITIONS))])
    return None if found is None else devices_of(found[0])


def test_counters_of_written_and_assumed_allocations_count() -> None:
    dra = state_with(gpu_with_partitions())
    dra.set_claim(allocated_claim("a", "part-0", "part-1"))
    assert partition_for(dra) is None  # 8Gi written, 4Gi more would be 12Gi
    dra.set_claim(allocated_claim("a", "part-0"))
    assert partition_for(dra) == ["part-1"]
    plan = ClaimPlan(
        "p",
        "u1",
        (ClaimWrite("default", "b", "uid-b", allocated_claim("b", "part-2").allocation),),
    )
    dra.assume(plan)
    assert partition_for(dra) is None  # 4Gi written + 4Gi in flight
    dra.forget(plan)
    dra.remove_claim("default", "a")
    assert partition_for(dra) == ["part-0"]


def test_prebind_sees_counters_another_scheduler_took_since_the_decision() -> None:
    dra = state_with(gpu_with_partitions())
    mine = allocated_claim("mine", "part-0", "part-1").allocation
    write = ClaimWrite("default", "mine", "uid-mine", mine)
    dra.assume(ClaimPlan("p", "u1", (write,)))
    assert dra.overspent(write) == []  # 8Gi of 10Gi, its own assumption counted once
    dra.forget(ClaimPlan("p", "u1", (write,)))
    assert dra.overspent(write) == []  # counted even when no longer assumed
    dra.set_claim(allocated_claim("theirs", "part-2"))  # 12Gi
    assert dra.overspent(write) == [f"{GPU_DRIVER}/n1/gpu-0"]
    dra.remove_claim("default", "theirs")
    assert dra.overspent(write) == []
    dra.set_slice(ResourceSlice.from_api(resource_slice("z", [device("z-0")], node="n1", pool="z")))
    plain = ClaimWrite(
        "default",
        "z",
        "uid-z",
        {
            "devices": {
                "results": [{"request": "gpu", "driver": GPU_DRIVER, "pool": "z", "device": "z-0"}]
            }
        },
    )
    assert dra.overspent(plain) == []
