"""DynamicResources in the framework: claims resolved, allocated per node, assumed, shared."""

from __future__ import annotations

import dataclasses
from typing import Any

from scheduler.core.dra.objects import DeviceClass, ResourceClaim, ResourceSlice
from scheduler.core.dra.state import DraState
from scheduler.core.explain import Decision
from scheduler.core.framework import Code
from scheduler.core.plugins.dynamic_resources import (
    CANNOT_ALLOCATE,
    NOT_AVAILABLE,
    RESERVED_FOR_MAX,
    stale_allocations,
)
from scheduler.core.plugins.unsupported import ADVICE, DRA_ALPHA, NO_DRA
from scheduler.core.profile import DEFAULT_PROFILE, DYNAMIC_RESOURCES, Profile
from scheduler.core.schedule import Framework
from tests.builders import PodBuilder, cluster, make_node, make_pod
from tests.core.dra.builders import (
    GPU_DRIVER,
    claim,
    device,
    device_class,
    exactly,
    request,
    resource_slice,
)

FRAMEWORK = Framework(DEFAULT_PROFILE)
NODES = [make_node(f"n{i}", cpu="8", memory="16Gi") for i in range(3)]


def state(*claims: dict[str, Any], gpus_on: dict[str, int] | None = None) -> DraState:
    dra = DraState()
    dra.set_class(DeviceClass.from_api(device_class("gpu")))
    for node, n in (gpus_on or {"n1": 2}).items():
        dra.set_slice(
            ResourceSlice.from_api(
                resource_slice(f"{node}-gpus", [device(f"gpu-{i}") for i in range(n)], node=node)
            )
        )
    for c in claims:
        dra.set_claim(ResourceClaim.from_api(c))
    return dra


def pod_with(name: str, *claims: dict[str, Any], uid: str | None = None) -> PodBuilder:
    pod = make_pod(name, cpu="100m")
    if uid is not None:
        pod.uid(uid)
    pod.body["spec"]["resourceClaims"] = list(claims)
    return pod


def schedule(pod: PodBuilder, dra: DraState | None, framework: Framework = FRAMEWORK) -> Decision:
    return framework.schedule(cluster(NODES), pod.build(), dra=dra)


def one_gpu(name: str = "gpu-claim", **kw: Any) -> dict[str, Any]:
    return claim(name, request("gpu", exactly("gpu")), **kw)


def rejection(decision: Decision) -> tuple[str, Code, str]:
    r = decision.explanation.prefilter_rejection
    assert r is not None
    return r.plugin, r.code, r.message


def test_a_claim_is_allocated_on_the_node_with_devices_and_planned() -> None:
    dra = state(one_gpu())
    decision = schedule(
        pod_with("p", {"name": "gpu", "resourceClaimName": "gpu-claim"}, uid="u1"), dra
    )
    assert decision.selected == "n1"
    assert decision.explanation.node("n0").reasons == (CANNOT_ALLOCATE,)
    plan = decision.claim_plan
    assert plan is not None
    assert plan.pod_uid == "u1"
    (write,) = plan.writes
    assert (write.namespace, write.name, write.uid) == ("default", "gpu-claim", "uid-gpu-claim")
    assert write.allocation is not None
    assert write.allocation["devices"]["results"] == [
        {"request": "gpu", "driver": GPU_DRIVER, "pool": "n1", "device": "gpu-0"}
    ]


def test_an_assumed_allocation_is_never_offered_again_and_forget_frees_it() -> None:
    dra = state(one_gpu("a"), one_gpu("b"), one_gpu("c"))
    first = schedule(pod_with("p1", {"name": "gpu", "resourceClaimName": "a"}, uid="u1"), dra)
    assert first.claim_plan is not None
    dra.assume(first.claim_plan)
    second = schedule(pod_with("p2", {"name": "gpu", "resourceClaimName": "b"}, uid="u2"), dra)
    assert second.claim_plan is not None
    allocation = second.claim_plan.writes[0].allocation
    assert allocation is not None
    assert allocation["devices"]["results"][0]["device"] == "gpu-1"
    dra.assume(second.claim_plan)
    third = schedule(pod_with("p3", {"name": "gpu", "resourceClaimName": "c"}, uid="u3"), dra)
    assert third.selected is None
    assert third.explanation.node("n1").reasons == (CANNOT_ALLOCATE,)
    dra.forget(first.claim_plan)
    again = schedule(pod_with("p3", {"name": "gpu", "resourceClaimName": "c"}, uid="u3"), dra)
    assert again.selected == "n1"


def test_a_shared_claim_waits_while_in_flight_then_only_needs_a_reservation() -> None:
    dra = state(one_gpu("shared"))
    ref = {"name": "gpu", "resourceClaimName": "shared"}
    first = schedule(pod_with("p1", ref, uid="u1"), dra)
    assert first.claim_plan is not None
    dra.assume(first.claim_plan)
    waiting = schedule(pod_with("p2", ref, uid="u2"), dra)
    assert rejection(waiting) == (
        DYNAMIC_RESOURCES,
        Code.UNSCHEDULABLE_AND_UNRESOLVABLE,
        'resourceclaim "shared" is in the process of being allocated',
    )
    # The write comes back: the claim is allocated and reserved for p1.
    allocation = first.claim_plan.writes[0].allocation
    assert allocation is not None
    written = one_gpu(
        "shared",
        status={
            "allocation": allocation,
            "reservedFor": [{"resource": "pods", "name": "p1", "uid": "u1"}],
        },
    )
    dra.set_claim(ResourceClaim.from_api(written))
    assert dra.pending_for(("default", "shared")) is None
    second = schedule(pod_with("p2", ref, uid="u2"), dra)
    assert second.selected == "n1"
    assert second.explanation.node("n0").reasons == (NOT_AVAILABLE,)
    assert second.claim_plan is not None
    (write,) = second.claim_plan.writes
    assert write.allocation is None  # reserve only
    again = schedule(pod_with("p1", ref, uid="u1"), dra)
    assert again.claim_plan is not None
    assert again.claim_plan.writes == ()  # already reserved for p1


def test_an_allocated_claim_without_node_selector_is_available_everywhere() -> None:
    allocation = {
        "devices": {
            "results": [{"request": "gpu", "driver": GPU_DRIVER, "pool": "net", "device": "x"}]
        }
    }
    dra = state(one_gpu("net", status={"allocation": allocation}))
    decision = schedule(pod_with("p", {"name": "gpu", "resourceClaimName": "net"}), dra)
    assert decision.selected is not None
    assert decision.feasible == ("n0", "n1", "n2")
    assert ("gpu.example.com", "net", "x") in dra.allocated_devices()


def test_a_template_claim_waits_for_its_generated_claim_and_its_owner() -> None:
    ref = {"name": "gpu", "resourceClaimTemplateName": "one-gpu"}
    pod = pod_with("p", ref, uid="u1")
    assert rejection(schedule(pod, state())) == (
        DYNAMIC_RESOURCES,
        Code.UNSCHEDULABLE_AND_UNRESOLVABLE,
        'waiting for resource claim "gpu" of pod default/p to be created from '
        'ResourceClaimTemplate "one-gpu"',
    )
    pod.body["status"] = {
        "resourceClaimStatuses": [{"name": "gpu", "resourceClaimName": "p-gpu-x1"}]
    }
    assert rejection(schedule(pod, state())) == (
        DYNAMIC_RESOURCES,
        Code.UNSCHEDULABLE_AND_UNRESOLVABLE,
        'resourceclaim "p-gpu-x1" not found',
    )
    foreign = one_gpu("p-gpu-x1")
    foreign["metadata"]["ownerReferences"] = [
        {"kind": "Pod", "name": "q", "uid": "other", "controller": True}
    ]
    assert "(pod is not owner)" in rejection(schedule(pod, state(foreign)))[2]
    owned = one_gpu("p-gpu-x1")
    owned["metadata"]["ownerReferences"] = [
        {"kind": "Pod", "name": "p", "uid": "u1", "controller": True}
    ]
    assert schedule(pod, state(owned)).selected == "n1"
    pod.body["status"] = {"resourceClaimStatuses": [{"name": "gpu", "resourceClaimName": None}]}
    not_needed = schedule(pod, state())
    assert not_needed.selected is not None
    assert not_needed.claim_plan is None


def test_missing_deleting_or_classless_claims_are_unresolvable() -> None:
    ref = {"name": "gpu", "resourceClaimName": "c"}
    assert rejection(schedule(pod_with("p", ref), state()))[2] == 'resourceclaim "c" not found'
    deleting = one_gpu("c")
    deleting["metadata"]["deletionTimestamp"] = "2026-01-01T00:00:00Z"
    assert (
        rejection(schedule(pod_with("p", ref), state(deleting)))[2]
        == 'resourceclaim "c" is being deleted'
    )
    classless = claim("c", request("gpu", exactly("tpu")))
    assert rejection(schedule(pod_with("p", ref), state(classless))) == (
        DYNAMIC_RESOURCES,
        Code.UNSCHEDULABLE_AND_UNRESOLVABLE,
        'resourceclaim "c": device class tpu does not exist',
    )


def test_an_allocator_error_ends_the_attempt_with_an_error() -> None:
    bad = claim(
        "c", request("gpu", exactly("gpu", 'device.attributes["gpu.example.com"].missing == 1'))
    )
    decision = schedule(pod_with("p", {"name": "gpu", "resourceClaimName": "c"}), state(bad))
    assert decision.selected is None
    assert decision.code is Code.ERROR
    plugin, code, message = rejection(decision)
    assert (plugin, code) == (DYNAMIC_RESOURCES, Code.ERROR)
    assert "CEL runtime error" in message


FRAMEWORK_1_35 = Framework(dataclasses.replace(DEFAULT_PROFILE, kube_minor=35))


def test_consumable_capacity_fields_keep_an_unsupported_refusal_naming_them_on_1_35() -> None:
    """DRAConsumableCapacity is off in 1.35: the fields are refused by name there; from
    1.36 the same claim is allocated (or not) like any other."""
    consuming = claim(
        "c", request("gpu", {**exactly("gpu"), "capacity": {"requests": {"memory": "1Gi"}}})
    )
    pod = pod_with("p", {"name": "gpu", "resourceClaimName": "c"})
    assert schedule(pod, state(consuming)).explanation.prefilter_rejection is None
    decision = schedule(pod, state(consuming), FRAMEWORK_1_35)
    assert rejection(decision) == (
        "Unsupported",
        Code.UNSCHEDULABLE_AND_UNRESOLVABLE,
        'pod has resource claim "gpu" (ResourceClaim "c") using '
        f"spec.devices.requests[0].exactly.capacity: {DRA_ALPHA}; {ADVICE}",
    )
    distinct = claim(
        "c", request("gpu", exactly("gpu", count=2)), constraints=[{"distinctAttribute": "x/y"}]
    )
    message = rejection(
        schedule(
            pod_with("p", {"name": "gpu", "resourceClaimName": "c"}),
            state(distinct),
            FRAMEWORK_1_35,
        )
    )[2]
    assert "spec.devices.constraints[0].distinctAttribute" in message


def test_tainted_devices_name_their_taint_and_a_tolerating_claim_gets_one() -> None:
    """Every device of the only node with devices is tainted: the pod is refused there with
    kube's words plus the taint, the nodes without devices with kube's words alone; a claim
    tolerating the taint gets a device, its result carrying the tolerations."""
    dra = state(one_gpu("plain"))
    dra.set_slice(
        ResourceSlice.from_api(
            resource_slice(
                "n1-gpus",
                [{**device(f"gpu-{i}"), "taints": [{"key": "maint", "effect": "NoExecute"}]}
                 for i in range(2)],
                node="n1",
            )
        )
    )  # fmt: skip
    refused = schedule(pod_with("p", {"name": "gpu", "resourceClaimName": "plain"}), dra)
    assert refused.selected is None
    tainted = f"{CANNOT_ALLOCATE} (untolerated device taint: maint:NoExecute)"
    assert refused.explanation.node("n1").reasons == (tainted,)
    assert refused.explanation.node("n0").reasons == (CANNOT_ALLOCATE,)
    assert refused.summary == (f"0/3 nodes are available: 1 {tainted}, 2 {CANNOT_ALLOCATE}.")
    assert refused.code is Code.UNSCHEDULABLE_AND_UNRESOLVABLE
    tolerations = [{"key": "maint", "operator": "Exists", "effect": "NoExecute"}]
    dra.set_claim(
        ResourceClaim.from_api(
            claim("tolerant", request("gpu", {**exactly("gpu"), "tolerations": tolerations}))
        )
    )
    placed = schedule(pod_with("q", {"name": "gpu", "resourceClaimName": "tolerant"}), dra)
    assert placed.selected == "n1"
    assert placed.claim_plan is not None
    (write,) = placed.claim_plan.writes
    assert write.allocation is not None
    assert write.allocation["devices"]["results"] == [
        {
            "request": "gpu",
            "driver": GPU_DRIVER,
            "pool": "n1",
            "device": "gpu-0",
            "tolerations": tolerations,
        }
    ]


def test_without_dra_state_or_the_plugin_claims_are_refused() -> None:
    pod = pod_with("p", {"name": "gpu", "resourceClaimName": "gpu-claim"})
    expected = f'pod has resource claim "gpu" (ResourceClaim "gpu-claim"): {NO_DRA}; {ADVICE}'
    assert rejection(schedule(pod, None))[2] == expected
    without = Profile(
        name="no-dra", filters=tuple(f for f in DEFAULT_PROFILE.filters if f != DYNAMIC_RESOURCES)
    )
    assert rejection(schedule(pod, state(one_gpu()), Framework(without)))[2] == expected


def test_an_allocation_no_node_can_use_is_given_back_unless_someone_else_holds_it() -> None:
    gone = {
        "nodeSelectorTerms": [
            {"matchFields": [{"key": "metadata.name", "operator": "In", "values": ["gone"]}]}
        ]
    }
    allocation = {
        "devices": {
            "results": [{"request": "gpu", "driver": GPU_DRIVER, "pool": "gone", "device": "x"}]
        },
        "nodeSelector": gone,
    }
    mine = {
        "allocation": allocation,
        "reservedFor": [{"resource": "pods", "name": "p", "uid": "u1"}],
    }
    shared = {
        "allocation": allocation,
        "reservedFor": [{"resource": "pods", "name": "q", "uid": "u2"}],
    }
    usable = {
        **allocation,
        "nodeSelector": {
            **gone,
            "nodeSelectorTerms": [
                {"matchFields": [{"key": "metadata.name", "operator": "In", "values": ["n1"]}]}
            ],
        },
    }
    dra = state(
        one_gpu("mine", status=mine),
        one_gpu("shared", status=shared),
        one_gpu("usable", status={"allocation": usable}),
    )
    pod = pod_with(
        "p",
        {"name": "a", "resourceClaimName": "mine"},
        {"name": "b", "resourceClaimName": "shared"},
        {"name": "c", "resourceClaimName": "usable"},
        uid="u1",
    ).build()
    decision = FRAMEWORK.schedule(cluster(NODES), pod, dra=dra)
    assert decision.selected is None
    assert set(decision.reason_counts()) == {NOT_AVAILABLE}
    reached = decision.explanation.reached("DynamicResources")
    assert set(reached) == {"n0", "n1", "n2"}
    stale = stale_allocations(pod, dra, cluster(NODES), reached)
    assert [c.name for c in stale] == ["mine"]


def test_an_allocation_a_node_reaching_the_filter_cannot_use_is_given_back_as_in_kube() -> None:
    """kube 1.34+: a claim allocated on n1, for a pod whose selector rules n1 out, fails the
    other nodes in DynamicResources' filter, so PostFilter deallocates it; where every node
    fails an earlier filter (too much cpu), DynamicResources never ran and it stays."""
    on_n1 = {
        "devices": {
            "results": [{"request": "gpu", "driver": GPU_DRIVER, "pool": "n1", "device": "x"}]
        },
        "nodeSelector": {
            "nodeSelectorTerms": [
                {"matchFields": [{"key": "metadata.name", "operator": "In", "values": ["n1"]}]}
            ]
        },
    }
    status = {"allocation": on_n1, "reservedFor": [{"resource": "pods", "name": "p", "uid": "u1"}]}
    dra = state(one_gpu("held", status=status))
    elsewhere = pod_with("p", {"name": "a", "resourceClaimName": "held"}, uid="u1")
    elsewhere.body["spec"]["affinity"] = {
        "nodeAffinity": {
            "requiredDuringSchedulingIgnoredDuringExecution": {
                "nodeSelectorTerms": [
                    {
                        "matchFields": [
                            {"key": "metadata.name", "operator": "NotIn", "values": ["n1"]}
                        ]
                    }
                ]
            }
        }
    }
    pod = elsewhere.build()
    decision = FRAMEWORK.schedule(cluster(NODES), pod, dra=dra)
    assert decision.selected is None
    reached = decision.explanation.reached(DYNAMIC_RESOURCES)
    assert set(reached) == {"n0", "n2"}
    assert [c.name for c in stale_allocations(pod, dra, cluster(NODES), reached)] == ["held"]

    big = pod_with("p", {"name": "a", "resourceClaimName": "held"}, uid="u1")
    big.body["spec"]["containers"][0]["resources"] = {"requests": {"cpu": "100"}}
    pod = big.build()
    decision = FRAMEWORK.schedule(cluster(NODES), pod, dra=dra)
    assert decision.selected is None
    reached = decision.explanation.reached(DYNAMIC_RESOURCES)
    assert reached == ()
    assert stale_allocations(pod, dra, cluster(NODES), reached) == []


def test_two_entries_naming_one_claim_allocate_it_once() -> None:
    dra = state(one_gpu("c"), gpus_on={"n1": 1})
    pod = pod_with(
        "p", {"name": "a", "resourceClaimName": "c"}, {"name": "b", "resourceClaimName": "c"}
    )
    decision = schedule(pod, dra)
    assert decision.selected == "n1"
    assert decision.claim_plan is not None
    assert [w.name for w in decision.claim_plan.writes] == ["c"]


def test_a_claim_reserved_for_as_many_consumers_as_the_api_allows_refuses_one_more() -> None:
    """The API server refuses a 257th reservedFor entry; kube-scheduler finds out at
    PreBind (an error, backoff), Lattice in PreFilter: the pod waits unschedulable."""
    ref = {"name": "gpu", "resourceClaimName": "shared"}
    first = schedule(pod_with("p0", ref, uid="u0"), state(one_gpu("shared")))
    assert first.claim_plan is not None
    allocation = first.claim_plan.writes[0].allocation

    def reserved(count: int) -> DraState:
        consumers = [{"resource": "pods", "name": f"p{i}", "uid": f"u{i}"} for i in range(count)]
        status = {"allocation": allocation, "reservedFor": consumers}
        return state(one_gpu("shared", status=status))

    assert schedule(pod_with("new", ref, uid="new"), reserved(255)).selected == "n1"
    full = reserved(RESERVED_FOR_MAX)
    assert rejection(schedule(pod_with("new", ref, uid="new"), full)) == (
        DYNAMIC_RESOURCES,
        Code.UNSCHEDULABLE_AND_UNRESOLVABLE,
        'resourceclaim "shared" in use: its reservedFor already holds 256 consumers, the '
        "API server's limit",
    )
    assert schedule(pod_with("p7", ref, uid="u7"), full).selected == "n1"  # already in it
