"""Devices held for a nominated DRA pod (Lattice beyond kube 1.37, whose DynamicResources
has no PreFilterExtensions): the devices a nominee's claims would get on its nominated node
count as in use for pods of lower or equal priority, as its cpu does (kube's
``addNominatedPods``), until the nomination ends. The hold leaves the ledger as it found it
and is part of the memo key."""

from __future__ import annotations

from typing import Any

from scheduler.core.dra.objects import DeviceClass, DeviceId, ResourceClaim, ResourceSlice
from scheduler.core.dra.search import DeviceSearch, search_node
from scheduler.core.dra.state import DraState, Hold, allocation_devices
from scheduler.core.explain import Decision
from scheduler.core.framework import Code
from scheduler.core.nominated import nominee_hold, schedule_with_nominated
from scheduler.core.plugins.dynamic_resources import CANNOT_ALLOCATE, remember
from scheduler.core.preemption import Inputs, preempt
from scheduler.core.schedule import Framework
from scheduler.core.snapshot import Snapshot
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
from tests.core.dra.test_consumable import node_slice, shared_gpu, wants

FRAMEWORK = Framework()
NODES = [make_node(f"n{i}", cpu="8", memory="16Gi") for i in range(2)]


def held(name: str, node: str, devices: list[int], holder: str) -> dict[str, Any]:
    results = [
        {"request": "gpu", "driver": GPU_DRIVER, "pool": node, "device": f"gpu-{i}"}
        for i in devices
    ]
    status = {
        "allocation": {"devices": {"results": results}},
        "reservedFor": [{"resource": "pods", "name": holder, "uid": holder}],
    }
    return claim(name, request("gpu", exactly("gpu", count=len(devices))), status=status)


def wanting(name: str, count: int) -> dict[str, Any]:
    return claim(name, request("gpu", exactly("gpu", count=count)))


def claim_pod(name: str, priority: int, claim_name: str, *, terminating: bool = False) -> Pod:
    builder = make_pod(name, cpu="1").priority(priority).uid(name)
    if terminating:
        builder.terminating()
    builder.body["spec"]["resourceClaims"] = [{"name": "c", "resourceClaimName": claim_name}]
    return builder.build()


def state(*claims: dict[str, Any]) -> DraState:
    """Two nodes of two GPUs each; n1's are held by pod "b" (priority 20)."""
    dra = DraState()
    dra.set_class(DeviceClass.from_api(device_class("gpu")))
    for node in ("n0", "n1"):
        dra.set_slice(
            ResourceSlice.from_api(
                resource_slice(f"{node}-gpus", [device(f"gpu-{i}") for i in range(2)], node=node)
            )
        )
    for c in (held("c-b", "n1", [0, 1], "b"), *claims):
        dra.set_claim(ResourceClaim.from_api(c))
    return dra


def setup(nominee_gpus: int, *claims: dict[str, Any]) -> tuple[DraState, Snapshot, Pod]:
    """n0 free (the nominee's victims are gone), n1 full; the nominee "hi" (priority 10)."""
    dra = state(wanting("want", nominee_gpus), wanting("lo-c", 1), *claims)
    snapshot = cluster(NODES, [(claim_pod("b", 20, "c-b"), "n1")])
    return dra, snapshot, claim_pod("hi", 10, "want")


def devices_of(decision: Decision) -> set[DeviceId]:
    plan = decision.claim_plan
    assert plan is not None
    return {d for w in plan.allocations for d in allocation_devices(w.allocation)}


def test_a_lower_priority_pod_cannot_take_the_devices_held_for_a_nominee() -> None:
    dra, snapshot, hi = setup(2)
    lo = claim_pod("lo", 1, "lo-c")
    before = dra.allocated_devices()
    assert schedule_with_nominated(FRAMEWORK, snapshot, lo, [], dra=dra).selected == "n0"
    d = schedule_with_nominated(FRAMEWORK, snapshot, lo, [(hi, "n0")], dra=dra)
    assert d.selected is None
    verdict = d.explanation.node("n0")
    assert verdict.reasons == (CANNOT_ALLOCATE,)
    assert verdict.code is Code.UNSCHEDULABLE
    # The hold ends with the decision: the ledger is as it was.
    assert dra.allocated_devices() == before
    assert dra.held_for_nominated() == frozenset()
    # The nomination ended (bound, deleted, cleared): the devices are anyone's again.
    assert schedule_with_nominated(FRAMEWORK, snapshot, lo, [], dra=dra).selected == "n0"


def test_the_priority_rule_is_kubes_add_nominated_pods() -> None:
    dra, snapshot, hi = setup(2)
    equal = claim_pod("eq", 10, "lo-c")
    higher = claim_pod("up", 11, "lo-c")
    assert (
        schedule_with_nominated(FRAMEWORK, snapshot, equal, [(hi, "n0")], dra=dra).selected is None
    )
    assert schedule_with_nominated(FRAMEWORK, snapshot, higher, [(hi, "n0")], dra=dra).selected == (
        "n0"
    )
    # The nominee itself is never kept from its own devices.
    assert schedule_with_nominated(FRAMEWORK, snapshot, hi, [(hi, "n0")], dra=dra).selected == "n0"


def test_only_the_planned_devices_are_held() -> None:
    dra, snapshot, hi = setup(1)
    lo = claim_pod("lo", 1, "lo-c")
    planned = nominee_hold(FRAMEWORK, snapshot, lo, [(hi, "n0")], dra).devices
    assert len(planned) == 1
    d = schedule_with_nominated(FRAMEWORK, snapshot, lo, [(hi, "n0")], dra=dra)
    assert d.selected == "n0"
    assert devices_of(d).isdisjoint(planned)
    # The nominee's own decision takes what was held for it (the same plan).
    mine = schedule_with_nominated(FRAMEWORK, snapshot, hi, [(hi, "n0")], dra=dra)
    assert devices_of(mine) == planned


def test_the_devices_of_a_gone_victim_are_held_while_another_still_terminates() -> None:
    """The nominee needs both GPUs of n0; one victim is gone, the other terminating: the
    GPU the first freed is held already (planned as the dry run did, the terminating
    victim's device counted free), not handed to a lower-priority pod."""
    dra = state(wanting("want", 2), wanting("lo-c", 1), held("c-v", "n0", [1], "v"))
    victim = claim_pod("v", 0, "c-v", terminating=True)
    snapshot = cluster(NODES, [(claim_pod("b", 20, "c-b"), "n1"), (victim, "n0")])
    hi, lo = claim_pod("hi", 10, "want"), claim_pod("lo", 1, "lo-c")
    assert schedule_with_nominated(FRAMEWORK, snapshot, lo, [], dra=dra).selected == "n0"
    assert schedule_with_nominated(FRAMEWORK, snapshot, lo, [(hi, "n0")], dra=dra).selected is None
    held_now = nominee_hold(FRAMEWORK, snapshot, lo, [(hi, "n0")], dra).devices
    assert held_now == {DeviceId(GPU_DRIVER, "n0", "gpu-0"), DeviceId(GPU_DRIVER, "n0", "gpu-1")}


def test_nominees_are_planned_by_priority_each_without_the_devices_before_it() -> None:
    """Two nominees to n0 wanting one GPU each: the higher priority is planned first; both
    are held for a pod below both, only the higher one's for a pod between them."""
    dra, snapshot, hi = setup(1, wanting("mid-c", 1))
    mid = claim_pod("mid", 5, "mid-c")
    nominated = [(mid, "n0"), (hi, "n0")]
    below = claim_pod("lo", 1, "lo-c")
    between = claim_pod("btw", 7, "lo-c")
    both = nominee_hold(FRAMEWORK, snapshot, below, nominated, dra).devices
    assert len(both) == 2
    only_hi = nominee_hold(FRAMEWORK, snapshot, between, nominated, dra).devices
    assert len(only_hi) == 1
    assert only_hi < both
    assert schedule_with_nominated(FRAMEWORK, snapshot, below, nominated, dra=dra).selected is None
    assert (
        schedule_with_nominated(FRAMEWORK, snapshot, between, nominated, dra=dra).selected == "n0"
    )


def test_a_pod_without_claims_holds_nothing_and_pays_nothing() -> None:
    dra, snapshot, hi = setup(2)
    plain = make_pod("plain", cpu="1").priority(1).uid("plain").build()
    assert nominee_hold(FRAMEWORK, snapshot, plain, [(hi, "n0")], dra).devices == frozenset()
    assert schedule_with_nominated(FRAMEWORK, snapshot, plain, [(hi, "n0")], dra=dra).selected


def test_preemption_does_not_target_devices_held_for_a_nominee() -> None:
    """A pod below the nominee that fits nowhere preempts elsewhere: the held devices are
    in use in its dry run too (n0 holds no victim it could evict for them)."""
    dra = state(wanting("want", 2), wanting("lo-c", 1))
    low = claim_pod("b", 0, "c-b")  # n1's holder is evictable now
    snapshot = cluster(NODES, [(low, "n1")])
    hi, lo = claim_pod("hi", 10, "want"), claim_pod("lo", 5, "lo-c")
    decision = schedule_with_nominated(FRAMEWORK, snapshot, lo, [(hi, "n0")], dra=dra)
    assert decision.selected is None
    found = preempt(FRAMEWORK, snapshot, decision, Inputs(dra=dra, nominated=[(hi, "n0")]))
    assert found is not None
    assert found.node == "n1"
    assert [v.name for v in found.victims] == ["b"]
    assert dra.held_for_nominated() == frozenset()


def test_a_deferred_search_finds_its_verdicts_under_the_same_hold() -> None:
    """The memo key names the held devices: a decision taken again under the same hold (the
    controller's second pass after the worker searched) reads what the worker found,
    instead of asking for the same nodes forever; the pool versions do not move."""
    dra, snapshot, hi = setup(1)
    lo = claim_pod("lo", 1, "lo-c")
    first = DeviceSearch(deferred=True)
    schedule_with_nominated(FRAMEWORK, snapshot, lo, [(hi, "n0")], dra=dra, search=first)
    jobs = first.take_jobs()
    assert [j.node for j in jobs] == ["n0", "n1"]
    planned = nominee_hold(FRAMEWORK, snapshot, lo, [(hi, "n0")], dra).devices
    for job in jobs:
        assert planned <= job.allocator.allocated  # the worker searches under the hold
        remember(dra, job.key, search_node(job.allocator, job.node, job.labels, job.claims, None))
    again = DeviceSearch(deferred=True)
    d = schedule_with_nominated(FRAMEWORK, snapshot, lo, [(hi, "n0")], dra=dra, search=again)
    assert again.take_jobs() == []
    assert d.selected == "n0"
    assert devices_of(d).isdisjoint(planned)
    # Without the hold the key differs: no verdict made under it is read.
    plain = DeviceSearch(deferred=True)
    schedule_with_nominated(FRAMEWORK, snapshot, lo, [], dra=dra, search=plain)
    assert {j.key for j in plain.take_jobs()}.isdisjoint(j.key for j in jobs)


# -- a nominee asking through a DeviceClass's extendedResourceName ---------------------

GPU = "example.com/gpu"


def gpu_pod(name: str, priority: int, count: int) -> Pod:
    """A pod asking ``count`` of the extended resource no node's allocatable has: served by
    DRA through the class's ``extendedResourceName`` (one implicit claim per node)."""
    return make_pod(name, cpu="1", resources={GPU: str(count)}).priority(priority).uid(name).build()


def extended_setup(nominee_gpus: int) -> tuple[DraState, Snapshot, Pod]:
    """:func:`setup`, the class serving ``example.com/gpu``; the nominee "hi" (priority 10)
    asks for ``nominee_gpus`` of it instead of a claim."""
    dra, snapshot, _ = setup(1)
    body = device_class("gpu")
    body["spec"]["extendedResourceName"] = GPU
    dra.set_class(DeviceClass.from_api(body))
    return dra, snapshot, gpu_pod("hi", 10, nominee_gpus)


def test_the_devices_of_an_extended_resource_nominee_are_held_for_it() -> None:
    dra, snapshot, hi = extended_setup(2)
    nominated = [(hi, "n0")]
    lo, lo_gpu = claim_pod("lo", 1, "lo-c"), gpu_pod("lo-gpu", 1, 1)
    before = dra.allocated_devices()
    planned = nominee_hold(FRAMEWORK, snapshot, lo, nominated, dra).devices
    assert planned == {DeviceId(GPU_DRIVER, "n0", "gpu-0"), DeviceId(GPU_DRIVER, "n0", "gpu-1")}
    for pod in (lo, lo_gpu):  # a claim or an extended resource: both kept off
        assert schedule_with_nominated(FRAMEWORK, snapshot, pod, [], dra=dra).selected == "n0"
        d = schedule_with_nominated(FRAMEWORK, snapshot, pod, nominated, dra=dra)
        assert d.selected is None
        verdict = d.explanation.node("n0")
        assert verdict.reasons == (CANNOT_ALLOCATE,)
        assert verdict.code is Code.UNSCHEDULABLE
    assert dra.allocated_devices() == before
    assert dra.held_for_nominated() == frozenset()
    # kube's rule: a nominee of priority >= the pod's holds; a higher-priority pod may take.
    equal = gpu_pod("eq", 10, 1)
    assert schedule_with_nominated(FRAMEWORK, snapshot, equal, nominated, dra=dra).selected is None
    for up in (claim_pod("up", 11, "lo-c"), gpu_pod("up-gpu", 11, 1)):
        assert schedule_with_nominated(FRAMEWORK, snapshot, up, nominated, dra=dra).selected == "n0"
    # The nominee gets the devices held for it, through its node's implicit claim.
    mine = schedule_with_nominated(FRAMEWORK, snapshot, hi, nominated, dra=dra)
    assert mine.selected == "n0"
    assert devices_of(mine) == planned
    # The nomination ended: the devices are anyone's again.
    assert schedule_with_nominated(FRAMEWORK, snapshot, lo_gpu, [], dra=dra).selected == "n0"


def test_only_the_planned_devices_of_an_extended_resource_nominee_are_held() -> None:
    dra, snapshot, hi = extended_setup(1)
    lo = gpu_pod("lo", 1, 1)
    planned = nominee_hold(FRAMEWORK, snapshot, lo, [(hi, "n0")], dra).devices
    assert len(planned) == 1
    d = schedule_with_nominated(FRAMEWORK, snapshot, lo, [(hi, "n0")], dra=dra)
    assert d.selected == "n0"
    assert devices_of(d).isdisjoint(planned)


def test_an_extended_resource_nominee_on_a_device_plugin_node_holds_no_devices() -> None:
    """Where the nominated node's allocatable has the resource, NodeResourcesFit serves it
    (the nominee's count is added there as kube adds it): no implicit claim, nothing held."""
    dra, _, hi = extended_setup(2)
    nodes = [NODES[0], make_node("n1", cpu="8", memory="16Gi").resource(GPU, 2)]
    snapshot = cluster(nodes, [(claim_pod("b", 20, "c-b"), "n1")])
    lo = claim_pod("lo", 1, "lo-c")
    assert nominee_hold(FRAMEWORK, snapshot, lo, [(hi, "n1")], dra).devices == frozenset()
    assert nominee_hold(FRAMEWORK, snapshot, lo, [(hi, "n0")], dra).devices == frozenset(
        {DeviceId(GPU_DRIVER, "n0", "gpu-0"), DeviceId(GPU_DRIVER, "n0", "gpu-1")}
    )


# -- a nominee whose claim takes a share of a multi-allocatable device -----------------


def shares_setup() -> tuple[DraState, Snapshot]:
    """n0 and n1 each have one GPU allowing multiple allocations, 40Gi of memory; n1's is
    taken whole by "b" (priority 20). Claims ``hi-c`` (30Gi share), ``lo-c`` (20Gi),
    ``small-c`` (10Gi)."""
    dra = DraState()
    dra.set_class(DeviceClass.from_api(device_class("gpu")))
    for node in ("n0", "n1"):
        dra.set_slice(ResourceSlice.from_api(node_slice(shared_gpu(), node=node)))
    for c in (
        held("c-b", "n1", [0], "b"),
        wants("hi-c", "30Gi"),
        wants("lo-c", "20Gi"),
        wants("small-c", "10Gi"),
    ):
        dra.set_claim(ResourceClaim.from_api(c))
    return dra, cluster(NODES, [(claim_pod("b", 20, "c-b"), "n1")])


def test_a_nominees_share_of_a_device_is_held_for_it() -> None:
    dra, snapshot = shares_setup()
    hi = claim_pod("hi", 10, "hi-c")
    nominated = [(hi, "n0")]
    lo = claim_pod("lo", 1, "lo-c")
    assert schedule_with_nominated(FRAMEWORK, snapshot, lo, [], dra=dra).selected == "n0"
    # 30Gi of the 40Gi held for the nominee: 20Gi is too much, for lower or equal priority.
    d = schedule_with_nominated(FRAMEWORK, snapshot, lo, nominated, dra=dra)
    assert d.selected is None
    assert d.explanation.node("n0").reasons == (CANNOT_ALLOCATE,)
    assert (
        schedule_with_nominated(
            FRAMEWORK, snapshot, claim_pod("eq", 10, "lo-c"), nominated, dra=dra
        ).selected
        is None
    )
    assert dra.shared_capacity() == {}
    assert dra.nominated_hold() == Hold()
    # What is left of the device is anyone's, and a higher-priority pod may take the rest.
    small = claim_pod("small", 1, "small-c")
    assert schedule_with_nominated(FRAMEWORK, snapshot, small, nominated, dra=dra).selected == "n0"
    up = claim_pod("up", 11, "lo-c")
    assert schedule_with_nominated(FRAMEWORK, snapshot, up, nominated, dra=dra).selected == "n0"
    # The nominee itself gets its share; once the nomination ends, so may the lower pod.
    assert schedule_with_nominated(FRAMEWORK, snapshot, hi, nominated, dra=dra).selected == "n0"
    assert schedule_with_nominated(FRAMEWORK, snapshot, lo, [], dra=dra).selected == "n0"
    held_now = nominee_hold(FRAMEWORK, snapshot, lo, nominated, dra)
    assert held_now.devices == frozenset()
    assert [(s.device, dict(s.consumed)) for s in held_now.shares] == [
        (DeviceId(GPU_DRIVER, "n0", "gpu-0"), {"memory": 30 * 2**30 * 10**9})
    ]


def test_two_nominees_shares_of_one_device_add_up() -> None:
    """Each nominee is planned with the shares of those before it: two 20Gi shares fill
    the device, a third nominee below them is planned nothing there."""
    dra, snapshot = shares_setup()
    first, second = claim_pod("hi", 10, "lo-c"), claim_pod("mid", 5, "lo-c")
    third = claim_pod("third", 4, "small-c")
    nominated = [(first, "n0"), (second, "n0"), (third, "n0")]
    held_now = nominee_hold(FRAMEWORK, snapshot, claim_pod("lo", 1, "small-c"), nominated, dra)
    assert len(held_now.shares) == 2
    small = claim_pod("small", 1, "small-c")
    assert schedule_with_nominated(FRAMEWORK, snapshot, small, nominated, dra=dra).selected is None
