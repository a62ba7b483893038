"""GPUPlacement's DRA node score: where a new allocation sits on a node's devices decides
the node (kube scores only prioritized lists, so among nodes offering a claim the same
devices its choice is cpu's)."""

from __future__ import annotations

import dataclasses
from typing import Any

import numpy as np

from scheduler.core.dra.allocator import PCIE_ROOT
from scheduler.core.dra.objects import DeviceClass, ResourceClaim, ResourceSlice
from scheduler.core.dra.state import DraState
from scheduler.core.explain import Decision
from scheduler.core.framework import Cycle
from scheduler.core.plugins.dynamic_resources import (
    DeviceFit,
    DynamicResources,
    device_fits,
)
from scheduler.core.profile import DEFAULT_PROFILE, GpuPlacementArgs, GpuPolicy, Profile
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

NODES = [make_node(f"n{i}", cpu="64", memory="256Gi") for i in range(2)]


def gpus(node: str, n: int = 8, per_root: int = 4) -> dict[str, Any]:
    return resource_slice(
        f"{node}-gpus",
        [device(f"gpu-{i}", qualified={PCIE_ROOT: f"pci000{i // per_root}"}) for i in range(n)],
        node=node,
    )


def held(name: str, node: str, *devices: int) -> dict[str, Any]:
    """A claim whose allocation is written already: those devices are in use."""
    results = [
        {"request": "gpu", "driver": GPU_DRIVER, "pool": node, "device": f"gpu-{i}"}
        for i in devices
    ]
    return claim(
        name,
        request("gpu", exactly("gpu", count=len(devices))),
        status={"allocation": {"devices": {"results": results}}},
    )


def state(*claims: dict[str, Any]) -> DraState:
    dra = DraState()
    dra.set_class(DeviceClass.from_api(device_class("gpu")))
    for node in ("n0", "n1"):
        dra.set_slice(ResourceSlice.from_api(gpus(node)))
    for c in claims:
        dra.set_claim(ResourceClaim.from_api(c))
    return dra


def pod(count: int) -> tuple[PodBuilder, dict[str, Any]]:
    wanted = claim("want", request("gpu", exactly("gpu", count=count)))
    p = make_pod("p", cpu="1").uid("u-p")
    p.body["spec"]["resourceClaims"] = [{"name": "gpu", "resourceClaimName": "want"}]
    return p, wanted


def schedule(profile: Profile, count: int, *claims: dict[str, Any], seed: int = 0) -> Decision:
    p, wanted = pod(count)
    return Framework(profile).schedule(
        cluster(NODES), p.build(), dra=state(wanted, *claims), seed=seed
    )


def policy(value: GpuPolicy) -> Profile:
    return dataclasses.replace(DEFAULT_PROFILE, gpu_placement=GpuPlacementArgs(policy=value))


def fits_of(count: int, *claims: dict[str, Any]) -> dict[str, DeviceFit]:
    """The figures GPUPlacement ranks by, per node name, after DynamicResources' filter."""
    p, wanted = pod(count)
    snapshot = cluster(NODES)
    cycle = Cycle(snapshot, p.build(), dra=state(wanted, *claims))
    plugin = DynamicResources()
    plugin.pre_filter(cycle)
    plugin.filter(cycle, np.ones(snapshot.num_nodes, dtype=np.bool_))
    return {snapshot.node(row).name: fit for row, fit in device_fits(cycle).items()}


def test_a_one_device_claim_fills_the_partly_used_node_and_root() -> None:
    claims = (held("other", "n1", 0, 1, 2),)  # n1's first root has one device left
    for seed in range(8):
        assert schedule(DEFAULT_PROFILE, 1, *claims, seed=seed).selected == "n1"
    fits = fits_of(1, *claims)
    assert fits["n1"] == DeviceFit(devices=1, roots=1, left_on_roots=0, left_in_pools=4)
    assert fits["n0"] == DeviceFit(devices=1, roots=1, left_on_roots=3, left_in_pools=7, opens=True)


def test_a_whole_node_is_kept_before_a_claim_is_kept_on_one_root() -> None:
    """n1 has one free device on each root (gpu-3, gpu-7): a pair there spans both roots.
    The pair that shares a root on n0 would break the only whole node, which a later
    8-device claim needs; the claim asked for no common root, so it fills n1 (bench-dra:
    kube-scheduler 1.37 kept more whole nodes than roots-first did)."""
    claims = (held("other", "n1", 0, 1, 2, 4, 5, 6),)
    fits = fits_of(2, *claims)
    assert (fits["n1"].roots, fits["n1"].opens) == (2, False)
    assert (fits["n0"].roots, fits["n0"].opens) == (1, True)
    for seed in range(8):
        decision = schedule(DEFAULT_PROFILE, 2, *claims, seed=seed)
        assert (decision.selected, devices_of(decision)) == ("n1", ["gpu-3", "gpu-7"])


def test_among_used_nodes_alignment_comes_before_filling_a_node() -> None:
    """Neither node is whole: n0's first root has two free devices (a pair fits on it),
    n1 has one free on each root. The pair shares a root on n0 rather than fill n1."""
    claims = (held("other", "n1", 0, 1, 2, 4, 5, 6), held("mine", "n0", 0, 1))
    fits = fits_of(2, *claims)
    assert (fits["n1"].roots, fits["n1"].opens) == (2, False)
    assert (fits["n0"].roots, fits["n0"].opens) == (1, False)
    for seed in range(8):
        decision = schedule(DEFAULT_PROFILE, 2, *claims, seed=seed)
        assert (decision.selected, devices_of(decision)) == ("n0", ["gpu-2", "gpu-3"])


def devices_of(decision: Decision) -> list[str]:
    assert decision.claim_plan is not None
    (write,) = decision.claim_plan.allocations
    assert write.allocation is not None
    return [r["device"] for r in write.allocation["devices"]["results"]]


def test_inside_a_node_a_claim_takes_the_root_that_best_fits_it() -> None:
    """n1's first root has one free device (gpu-3), its second four. kube's first fit
    gives a pair gpu-3 and gpu-4, across both roots; Lattice's order tries whole roots that
    hold the count first, fewest free first: the pair lands on the second root, and a
    single device fills the first root's last one, keeping the second whole."""
    claims = (held("other", "n1", 0, 1, 2),)
    pair = schedule(DEFAULT_PROFILE, 2, *claims)
    assert pair.selected == "n1"  # aligned there too, and it fills the partly used node
    assert devices_of(pair) == ["gpu-4", "gpu-5"]
    single = schedule(DEFAULT_PROFILE, 1, *claims)
    assert (single.selected, devices_of(single)) == ("n1", ["gpu-3"])
    # Four on a node whose roots have 1 and 4 free: the whole root, not a spread.
    four = schedule(DEFAULT_PROFILE, 4, *claims)
    assert (four.selected, devices_of(four)) == ("n1", ["gpu-4", "gpu-5", "gpu-6", "gpu-7"])
    # LeastAllocated keeps kube's first fit, as kube-scheduler's users would get it.
    on_n1 = [
        d
        for seed in range(16)
        if (d := schedule(policy(GpuPolicy.LEAST_ALLOCATED), 2, *claims, seed=seed)).selected
        == "n1"
    ]
    assert on_n1  # LeastAllocated has no DRA score: the seed sends some to n1
    assert all(devices_of(d) == ["gpu-3", "gpu-4"] for d in on_n1)


def test_a_later_claim_counts_the_devices_an_earlier_claim_of_the_pod_took() -> None:
    """n1's first root has two free devices (gpu-2, gpu-3), its second four. The pod's
    1-device claim fills the first root (gpu-2); its pair must then see one device left
    there, not two, and take the second root whole (seed 1257856956's c14, where counting
    the earlier claim's device as free sent the pair across two roots)."""
    claims = (held("full", "n0", *range(8)), held("other", "n1", 0, 1))
    one = claim("one", request("gpu", exactly("gpu", count=1)))
    pair = claim("pair", request("gpu", exactly("gpu", count=2)))
    p = make_pod("p", cpu="1").uid("u-p")
    p.body["spec"]["resourceClaims"] = [
        {"name": "a", "resourceClaimName": "one"},
        {"name": "b", "resourceClaimName": "pair"},
    ]
    decision = Framework(DEFAULT_PROFILE).schedule(
        cluster(NODES), p.build(), dra=state(one, pair, *claims)
    )
    assert decision.selected == "n1"
    assert decision.claim_plan is not None
    picked = {
        w.name: [r["device"] for r in (w.allocation or {})["devices"]["results"]]
        for w in decision.claim_plan.allocations
    }
    assert picked == {"one": ["gpu-2"], "pair": ["gpu-4", "gpu-5"]}


def test_most_allocated_fills_the_fullest_node_and_least_allocated_is_kubes() -> None:
    claims = (held("other", "n1", 0, 1, 2),)
    for seed in range(8):
        assert schedule(policy(GpuPolicy.MOST_ALLOCATED), 2, *claims, seed=seed).selected == "n1"
    # LeastAllocated adds no DRA score: the two nodes tie as kube's scores see them (cpu is
    # equal), so the seed decides and both come up.
    chosen = {
        schedule(policy(GpuPolicy.LEAST_ALLOCATED), 1, *claims, seed=seed).selected
        for seed in range(16)
    }
    assert chosen == {"n0", "n1"}


def test_admin_access_takes_no_device_and_a_pod_without_claims_has_no_fit() -> None:
    claims = (held("other", "n1", 0, 1, 2),)
    admin = claim("want", request("gpu", exactly("gpu", admin=True)))
    p = make_pod("p", cpu="1").uid("u-p")
    p.body["spec"]["resourceClaims"] = [{"name": "gpu", "resourceClaimName": "want"}]
    snapshot = cluster(NODES)
    cycle = Cycle(snapshot, p.build(), dra=state(admin, *claims))
    plugin = DynamicResources()
    plugin.pre_filter(cycle)
    plugin.filter(cycle, np.ones(snapshot.num_nodes, dtype=np.bool_))
    fits = device_fits(cycle)
    assert sorted(fits) == [0, 1]
    assert all(f.devices == 0 and f.roots == 0 for f in fits.values())
    plain = Cycle(snapshot, make_pod("q", cpu="1").build(), dra=state(*claims))
    assert plugin.pre_filter(plain).code is not None
    assert device_fits(plain) == {}
