"""Gangs whose members have DRA claims: the problem counts each node's free devices as the
commit's member-by-member allocation would, and one claim-using class per node."""

from __future__ import annotations

import dataclasses
import time
from typing import Any

import numpy as np

from scheduler.control.gang_flow import shared_unallocated_claim
from scheduler.core.dra.allocator import PCIE_ROOT
from scheduler.core.dra.objects import DeviceClass, ResourceClaim, ResourceSlice
from scheduler.core.dra.state import DraState
from scheduler.core.plugins.dynamic_resources import unallocated_claims
from scheduler.core.profile import DynamicResourcesArgs
from scheduler.core.schedule import Framework
from scheduler.model.pod import Pod
from scheduler.solver import build_problem, solve, violations
from tests.builders import cluster, make_node, make_pod
from tests.core.dra.builders import claim, device, device_class, exactly, request, resource_slice
from tests.solver.support import framework, gang

NODES = ["n0", "n1", "n2"]


def gpus(node: str, n: int = 4) -> dict[str, Any]:
    return resource_slice(
        f"{node}-gpus",
        [device(f"gpu-{i}", qualified={PCIE_ROOT: f"pci{i // 2}"}) for i in range(n)],
        node=node,
    )


def member(name: str, count: int, *, template: bool = True) -> tuple[Pod, dict[str, Any]]:
    """A member with one claim of ``count`` GPUs: generated from a template for it (owned
    by it, as kube-controller-manager makes them), or named (``template=False``)."""
    uid = f"u-{name}"
    body = claim(f"{name}-gpu", request("gpu", exactly("gpu", count=count)))
    p = make_pod(name, cpu="1").uid(uid).label("app", "train")
    if template:
        body["metadata"]["ownerReferences"] = [
            {"apiVersion": "v1", "kind": "Pod", "name": name, "uid": uid, "controller": True}
        ]
        p.body["spec"]["resourceClaims"] = [{"name": "gpu", "resourceClaimTemplateName": "two"}]
        p.body["status"] = {
            "resourceClaimStatuses": [{"name": "gpu", "resourceClaimName": f"{name}-gpu"}]
        }
    else:
        p.body["spec"]["resourceClaims"] = [{"name": "gpu", "resourceClaimName": f"{name}-gpu"}]
    return p.build(), body


def state(claims: list[dict[str, Any]], nodes: list[str] = NODES) -> DraState:
    dra = DraState()
    dra.set_class(DeviceClass.from_api(device_class("gpu")))
    for node in nodes:
        dra.set_slice(ResourceSlice.from_api(gpus(node)))
    for body in claims:
        dra.set_claim(ResourceClaim.from_api(body))
    return dra


def gang_of(n: int, count: int, **kw: Any) -> tuple[list[Pod], list[dict[str, Any]]]:
    built = [member(f"w{i}", count, **kw) for i in range(n)]
    return [p for p, _ in built], [c for _, c in built]


def test_template_members_are_one_class_and_each_node_takes_what_its_devices_hold() -> None:
    members, claims = gang_of(4, 2)
    dra = state(claims)
    snapshot = cluster([make_node(n, cpu="64", memory="256Gi") for n in NODES])
    problem = build_problem(framework(), snapshot, gang(min_member=4), members, need=4, dra=dra)
    assert problem.num_classes == 1  # one template: the claims differ only by name
    assert problem.limit.tolist() == [[2, 2, 2]]  # 4 GPUs / 2 per member (cpu allows 64)
    plan = solve(problem, time_limit_s=2.0)
    assert plan.admitted
    assert plan.placed == 4
    counts = np.zeros((1, 3), dtype=np.int64)
    for _, node in plan.placements:
        counts[0, problem.node_names.index(node)] += 1
    assert violations(problem, counts) == []
    assert counts.max() <= 2


def test_a_gang_the_devices_cannot_hold_is_not_admitted() -> None:
    members, claims = gang_of(4, 2)
    dra = state(claims, nodes=["n0"])  # 4 GPUs in all: room for 2 members
    snapshot = cluster([make_node(n, cpu="64", memory="256Gi") for n in NODES])
    problem = build_problem(framework(), snapshot, gang(min_member=4), members, need=4, dra=dra)
    assert problem.node_names == ("n0",)
    assert problem.limit.tolist() == [[2]]
    assert not solve(problem, time_limit_s=2.0).admitted


def test_devices_in_use_lower_the_limit() -> None:
    members, claims = gang_of(2, 2)
    held = claim(
        "held",
        request("gpu", exactly("gpu", count=3)),
        status={
            "allocation": {
                "devices": {
                    "results": [
                        {
                            "request": "gpu",
                            "driver": "gpu.example.com",
                            "pool": "n0",
                            "device": f"gpu-{i}",
                        }
                        for i in range(3)
                    ]
                }
            }
        },
    )
    dra = state([*claims, held])
    snapshot = cluster([make_node(n, cpu="64", memory="256Gi") for n in NODES])
    problem = build_problem(framework(), snapshot, gang(min_member=2), members, need=2, dra=dra)
    assert "n0" not in problem.node_names  # one GPU left there: a member needs two
    assert problem.limit.tolist() == [[2, 2]]


def test_members_with_claims_of_their_own_name_are_one_class_too() -> None:
    members, claims = gang_of(2, 1, template=False)
    dra = state(claims, nodes=["n0"])
    snapshot = cluster([make_node("n0", cpu="64", memory="256Gi")])
    problem = build_problem(framework(), snapshot, gang(min_member=2), members, need=2, dra=dra)
    assert problem.num_classes == 1  # unallocated, unshared: only the spec matters
    assert problem.limit.tolist() == [[2]]
    assert solve(problem, time_limit_s=2.0).admitted


def test_classes_with_different_claims_do_not_meet_on_a_node() -> None:
    one, two = member("a", 1), member("b", 2)
    dra = state([one[1], two[1]], nodes=["n0"])
    snapshot = cluster([make_node("n0", cpu="64", memory="256Gi")])
    members = [one[0], two[0]]
    problem = build_problem(framework(), snapshot, gang(min_member=2), members, need=2, dra=dra)
    assert problem.num_classes == 2
    assert problem.device_exclusive.tolist() == [True]
    # Each alone fits (4 GPUs), together too (3), but the model does not count devices
    # between classes: one claim-using class per node, so not on one node.
    assert not solve(problem, time_limit_s=2.0).admitted


def test_a_claim_two_members_share_must_be_allocated_first() -> None:
    a, body = member("a", 1, template=False)
    b = dataclasses.replace(
        make_pod("b", cpu="1").uid("u-b").build(), resource_claims=a.resource_claims
    )
    dra = state([body])
    assert shared_unallocated_claim([a, b], dra) == "default/a-gpu"
    assert shared_unallocated_claim([a], dra) is None
    assert [c.name for c in unallocated_claims(a, dra) or []] == ["a-gpu"]


def test_counting_members_per_node_stops_at_the_search_budget() -> None:
    """Members with two claims of 9 on nodes of 34 devices: one member fits at once; the
    second's 9 + 9 in the 16 left fit neither together nor is that seen without a search
    that runs to kube's 10 s per node. The count over all nodes shares the attempt's
    budget (0.3 s here), and each node keeps at least the one member its filter found."""
    members: list[Pod] = []
    claims: list[dict[str, Any]] = []
    for i in range(3):
        names = [f"w{i}-a", f"w{i}-b"]
        claims += [claim(n, request("gpu", exactly("gpu", count=9))) for n in names]
        p = make_pod(f"w{i}", cpu="1").uid(f"u-w{i}").label("app", "train")
        p.body["spec"]["resourceClaims"] = [
            {"name": n.rsplit("-", 1)[1], "resourceClaimName": n} for n in names
        ]
        members.append(p.build())
    dra = DraState()
    dra.set_class(DeviceClass.from_api(device_class("gpu")))
    for node in NODES:
        body = resource_slice(f"{node}-gpus", [device(f"gpu-{i}") for i in range(34)], node=node)
        dra.set_slice(ResourceSlice.from_api(body))
    for body in claims:
        dra.set_claim(ResourceClaim.from_api(body))
    profile = dataclasses.replace(
        framework().profile, dynamic_resources=DynamicResourcesArgs(search_budget=0.3)
    )
    snapshot = cluster([make_node(n, cpu="64", memory="256Gi") for n in NODES])
    started = time.monotonic()
    fw = Framework(profile)
    problem = build_problem(fw, snapshot, gang(min_member=3), members, need=3, dra=dra)
    assert time.monotonic() - started < 3.0
    assert problem.limit.min() >= 1
    assert problem.limit.max() == 1


def test_a_gang_does_not_count_the_devices_held_for_a_nominated_pod() -> None:
    """A nominated pod of at least the gang's priority holds the devices its claims would
    get on its node (as in a single pod's cycle): its node offers the gang none of them;
    a nominee of lower priority holds nothing for it."""
    members, claims = gang_of(2, 2)
    nominee_claim = claim("hi-gpu", request("gpu", exactly("gpu", count=4)))
    dra = state([*claims, nominee_claim], nodes=["n0", "n1"])
    snapshot = cluster([make_node(n, cpu="64", memory="256Gi") for n in ("n0", "n1")])
    spec = gang(min_member=2)

    def nominee(priority: int) -> Pod:
        p = make_pod("hi", cpu="1").uid("u-hi").priority(priority)
        p.body["spec"]["resourceClaims"] = [{"name": "gpu", "resourceClaimName": "hi-gpu"}]
        return p.build()

    def limits(nominated: list[tuple[Pod, str]]) -> dict[str, int]:
        problem = build_problem(
            framework(), snapshot, spec, members, need=2, dra=dra, nominated=nominated
        )
        return dict(zip(problem.node_names, problem.limit[0].tolist(), strict=True))

    assert limits([]) == {"n0": 2, "n1": 2}
    assert limits([(nominee(0), "n0")]) == {"n1": 2}  # equal priority: held
    assert limits([(nominee(-1), "n0")]) == {"n0": 2, "n1": 2}  # lower: not held
    assert dra.held_for_nominated() == frozenset()


# -- DRA-backed extended resources (a DeviceClass's extendedResourceName) -------------

EXTENDED = "example.com/gpu"


def extended_state(nodes: dict[str, int]) -> DraState:
    """A class serving ``example.com/gpu`` and each node's devices in a slice."""
    body = device_class("gpu")
    body["spec"]["extendedResourceName"] = EXTENDED
    dra = DraState()
    dra.set_class(DeviceClass.from_api(body))
    for node, n in nodes.items():
        dra.set_slice(ResourceSlice.from_api(gpus(node, n)))
    return dra


def extended_gang(n: int, count: int) -> list[Pod]:
    """Unchanged pods asking ``example.com/gpu: count``: no claim of their own."""
    return [
        make_pod(f"w{i}", cpu="1", resources={EXTENDED: str(count)})
        .uid(f"u-w{i}")
        .label("app", "train")
        .build()
        for i in range(n)
    ]


def test_members_asking_a_dra_extended_resource_count_the_devices_of_dra_nodes() -> None:
    """Nodes without the resource in their allocatable serve it from their devices (8 on
    n0, 4 on n1): 4 members of 2 fit as 4 + 2 (n2 has none); a device plugin's node
    (allocatable 2) serves one member by its allocatable. The gang of 7 fits only so."""
    dra = extended_state({"n0": 8, "n1": 4})
    snapshot = cluster(
        [
            make_node("n0", cpu="64", memory="256Gi"),
            make_node("n1", cpu="64", memory="256Gi"),
            make_node("n2", cpu="64", memory="256Gi"),
            make_node("plugin", cpu="64", memory="256Gi").resource(EXTENDED, 2),
        ]
    )
    members = extended_gang(7, 2)
    problem = build_problem(framework(), snapshot, gang(min_member=7), members, need=7, dra=dra)
    assert problem.num_classes == 1
    limits = dict(zip(problem.node_names, problem.limit[0].tolist(), strict=True))
    assert limits == {"n0": 4, "n1": 2, "plugin": 1}
    assert problem.classes[0].topology_active  # a device user where it claims devices
    plan = solve(problem, time_limit_s=2.0)
    assert plan.admitted
    counts = np.zeros((1, len(problem.node_names)), dtype=np.int64)
    for _, node in plan.placements:
        counts[0, problem.node_names.index(node)] += 1
    assert violations(problem, counts) == []
    assert counts.tolist() == [[4, 2, 1]]
    one_more = extended_gang(8, 2)
    problem = build_problem(framework(), snapshot, gang(min_member=8), one_more, need=8, dra=dra)
    assert not solve(problem, time_limit_s=2.0).admitted


def test_before_1_36_a_dra_extended_resource_is_the_allocatable_s_alone() -> None:
    """DRAExtendedResource is off in 1.35: only the device plugin's node serves them."""
    dra = extended_state({"n0": 8})
    snapshot = cluster(
        [
            make_node("n0", cpu="64", memory="256Gi"),
            make_node("plugin", cpu="64", memory="256Gi").resource(EXTENDED, 4),
        ]
    )
    fw = Framework(dataclasses.replace(framework().profile, kube_minor=35))
    members = extended_gang(2, 2)
    problem = build_problem(fw, snapshot, gang(min_member=2), members, need=2, dra=dra)
    assert problem.node_names == ("plugin",)
    assert problem.limit.tolist() == [[2]]
