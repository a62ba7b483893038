"""DynamicResources' Score (kube 1.35+, kubernetes#134711): prioritized lists, weight 2.

Expected values are computed by hand from kube's ``computeScore`` and
``helper.DefaultNormalizeScore``: per node, over the pod's claims, each ``firstAvailable``
request adds ``8 - index`` of the subrequest its allocation chose; then ``100 * raw // max``
over the feasible nodes.
"""

from __future__ import annotations

import dataclasses
from typing import Any

import numpy as np
import pytest

from scheduler.core.dra.allocator import PCIE_ROOT, chosen_subrequests
from scheduler.core.dra.objects import DeviceClass, ResourceClaim, ResourceSlice
from scheduler.core.dra.state import DraState
from scheduler.core.explain import Decision
from scheduler.core.framework import Cycle
from scheduler.core.plugins.dynamic_resources import DynamicResources, prioritized_list_scores
from scheduler.core.profile import (
    DEFAULT_PROFILE,
    DYNAMIC_RESOURCES,
    GPU_PLACEMENT,
    NEWEST_KUBE_MINOR,
    OLDEST_KUBE_MINOR,
    Profile,
    kube_profile,
)
from scheduler.core.schedule import Framework
from tests.builders import cluster, make_node, make_pod
from tests.core.dra.builders import (
    GPU_DRIVER,
    claim,
    device,
    device_class,
    exactly,
    first_available,
    request,
    resource_slice,
)

RELEASES = range(OLDEST_KUBE_MINOR, NEWEST_KUBE_MINOR + 1)
KUBE = kube_profile()
NODES = ("n0", "n1", "n2")
H100 = 'device.attributes["gpu.example.com"].model == "h100"'
A100 = 'device.attributes["gpu.example.com"].model == "a100"'


def gpus(node: str, *models: str, per_root: int = 4) -> dict[str, Any]:
    """A node-local slice: one device per model named, on PCIe roots of ``per_root``."""
    return resource_slice(
        f"{node}-gpus",
        [
            device(f"gpu-{i}", model=m, qualified={PCIE_ROOT: f"pci000{i // per_root}"})
            for i, m in enumerate(models)
        ],
        node=node,
    )


def held(name: str, node: str, *devices: int) -> dict[str, Any]:
    """A claim allocated already (by someone else): those devices are in use."""
    results = [
        {"request": "gpu", "driver": GPU_DRIVER, "pool": node, "device": f"gpu-{i}"}
        for i in devices
    ]
    return claim(
        name,
        request("gpu", exactly("gpu", count=len(devices))),
        status={"allocation": {"devices": {"results": results}}},
    )


def state(slices: dict[str, tuple[str, ...]], *claims: dict[str, Any]) -> DraState:
    dra = DraState()
    dra.set_class(DeviceClass.from_api(device_class("gpu")))
    for node, models in slices.items():
        dra.set_slice(ResourceSlice.from_api(gpus(node, *models)))
    for c in claims:
        dra.set_claim(ResourceClaim.from_api(c))
    return dra


def schedule(
    profile: Profile,
    dra: DraState,
    *claim_names: str,
    seed: int = 0,
    nodes: tuple[str, ...] = NODES,
) -> Decision:
    pod = make_pod("p", cpu="1").uid("u-p")
    pod.body["spec"]["resourceClaims"] = [
        {"name": f"c{i}", "resourceClaimName": n} for i, n in enumerate(claim_names)
    ]
    snapshot = cluster([make_node(n, cpu="64", memory="256Gi") for n in nodes])
    return Framework(profile).schedule(snapshot, pod.build(), dra=dra, seed=seed)


def dra_scores(decision: Decision) -> dict[str, int]:
    e = decision.explanation
    return {n: e.node(n).scores[DYNAMIC_RESOURCES] for n in e.node_names if n in decision.feasible}


def big_then_small(name: str = "want") -> dict[str, Any]:
    """One request: two devices if a node has them, else one."""
    return claim(
        name,
        first_available("gpu", ("two", exactly("gpu", count=2)), ("one", exactly("gpu", count=1))),
    )


def test_the_default_profile_of_every_release_scores_dra_with_weight_2() -> None:
    for minor in RELEASES:
        assert dict(kube_profile(kube_minor=minor).scores)[DYNAMIC_RESOURCES] == 2
        profile = dataclasses.replace(DEFAULT_PROFILE, kube_minor=minor)
        assert dict(profile.scores)[DYNAMIC_RESOURCES] == 2
        built = [(plugin.name, weight) for plugin, weight in Framework(profile).plugins.scores]
        assert (DYNAMIC_RESOURCES, 2) in built


def test_without_claims_or_without_prioritized_lists_the_plugin_skips() -> None:
    dra = state({"n0": ("a100",), "n1": ("a100",)}, claim("plain", request("gpu", exactly("gpu"))))
    plain = schedule(KUBE, dra, "plain")
    assert set(plain.feasible) == {"n0", "n1"}
    assert DYNAMIC_RESOURCES in plain.explanation.skipped_scores  # kube: 0 on every node
    none = schedule(KUBE, dra)
    assert DYNAMIC_RESOURCES in none.explanation.skipped_scores
    # A claim allocated already, even from a prioritized list: nothing is allocated in
    # this cycle, so kube has no per-node allocation to read and scores 0.
    allocated = claim(
        "done",
        first_available("gpu", ("two", exactly("gpu", count=2)), ("one", exactly("gpu"))),
        status={
            "allocation": {
                "devices": {
                    "results": [
                        {"request": "gpu/one", "driver": GPU_DRIVER, "pool": "x", "device": "d"}
                    ]
                }
            }
        },
    )
    dra.set_claim(ResourceClaim.from_api(allocated))
    done = schedule(KUBE, dra, "done")
    assert set(done.feasible) == set(NODES)
    assert DYNAMIC_RESOURCES in done.explanation.skipped_scores


def test_index_0_on_one_node_and_index_1_on_another() -> None:
    """n0 holds two devices (subrequest 0: raw 8), n1 one (subrequest 1: raw 7), n2 none
    (infeasible). Normalised: 100 * 8 // 8 = 100 and 100 * 7 // 8 = 87."""
    dra = state({"n0": ("a100", "a100"), "n1": ("a100",)}, big_then_small())
    decision = schedule(KUBE, dra, "want")
    assert dra_scores(decision) == {"n0": 100, "n1": 87}
    assert decision.explanation.node("n0").weighted[DYNAMIC_RESOURCES] == 200
    assert decision.explanation.node("n1").weighted[DYNAMIC_RESOURCES] == 174
    assert decision.selected == "n0"
    plan = decision.claim_plan
    assert plan is not None
    (write,) = plan.allocations
    assert write.allocation is not None
    assert chosen_subrequests(dra.claims[("default", "want")], write.allocation) == (("gpu", 0),)


def test_the_raw_score_is_read_from_each_nodes_filter_result() -> None:
    dra = state({"n0": ("a100", "a100"), "n1": ("a100",)}, big_then_small())
    pod = make_pod("p", cpu="1").uid("u-p")
    pod.body["spec"]["resourceClaims"] = [{"name": "c", "resourceClaimName": "want"}]
    snapshot = cluster([make_node(n, cpu="64", memory="256Gi") for n in NODES])
    cycle = Cycle(snapshot, pod.build(), dra=dra)
    plugin = DynamicResources()
    plugin.pre_filter(cycle)
    verdict = plugin.filter(cycle, np.ones(3, dtype=np.bool_))
    assert verdict is not None
    raw = prioritized_list_scores(cycle)
    assert raw is not None
    assert raw.tolist() == [8, 7, 0]
    feasible = ~verdict.rejected
    scores = plugin.score(cycle, feasible)
    assert scores is not None
    assert scores[feasible].tolist() == [100, 87]


def test_two_requests_add_up() -> None:
    """Request "model": an h100 (index 0) else an a100 (index 1); request "count": two more
    devices (index 0) else one (index 1). Depth-first, the first request chooses first:
    n0 (h100, a100, a100): 8 + 8 = 16; n1 (a100, a100): 7 + 7 = 14; n2 (h100, a100): 8 + 7
    = 15. Normalised by 16: 100, 1400 // 16 = 87, 1500 // 16 = 93."""
    two = claim(
        "two",
        first_available("model", ("h100", exactly("gpu", H100)), ("a100", exactly("gpu", A100))),
        first_available("count", ("two", exactly("gpu", count=2)), ("one", exactly("gpu"))),
    )
    dra = state(
        {"n0": ("h100", "a100", "a100"), "n1": ("a100", "a100"), "n2": ("h100", "a100")}, two
    )
    decision = schedule(KUBE, dra, "two")
    assert dra_scores(decision) == {"n0": 100, "n1": 87, "n2": 93}
    assert decision.selected == "n0"
    plan = decision.claim_plan
    assert plan is not None
    (write,) = plan.allocations
    assert write.allocation is not None
    assert chosen_subrequests(dra.claims[("default", "two")], write.allocation) == (
        ("model", 0),
        ("count", 0),
    )


def test_two_claims_add_up_and_exactly_requests_add_nothing() -> None:
    """Claim "want": 8 on n0, 7 on n1; claim "plain" (exactly) adds 0. 8 and 7 again."""
    plain = claim("plain", request("gpu", exactly("gpu")))
    dra = state({"n0": ("a100",) * 3, "n1": ("a100",) * 2}, big_then_small(), plain)
    decision = schedule(KUBE, dra, "want", "plain")
    assert dra_scores(decision) == {"n0": 100, "n1": 87}


@pytest.mark.parametrize("minor", RELEASES)
def test_an_allocated_claim_counts_the_same_on_every_node(minor: int) -> None:
    """A claim allocated already (no node selector: usable anywhere) from its subrequest 1
    adds 7 everywhere, as 1.36+ reads it from ``status.allocation``: raw 15 on n0, 14 on
    n1, so n1 gets 1400 // 15 = 93 instead of 87. kube 1.35.4 fails Score for such a pod
    (it indexes Filter's results by the claim's position among all claims); Lattice scores
    it as 1.36 in every release."""
    shared = claim(
        "shared",
        first_available("gpu", ("two", exactly("gpu", count=2)), ("one", exactly("gpu"))),
        status={
            "allocation": {
                "devices": {
                    "results": [
                        {"request": "gpu/one", "driver": GPU_DRIVER, "pool": "far", "device": "d"}
                    ]
                }
            }
        },
    )
    dra = state({"n0": ("a100",) * 2, "n1": ("a100",)}, shared, big_then_small())
    profile = kube_profile(kube_minor=minor)
    decision = schedule(profile, dra, "shared", "want")
    assert dra_scores(decision) == {"n0": 100, "n1": 93}


def test_the_score_alone_decides_where_every_other_score_ties() -> None:
    """n0 and n1 are alike for every other plugin (devices are not cpu); only n0 offers
    the first choice. Without DynamicResources' score the tie is broken at random."""
    dra = state({"n0": ("a100", "a100"), "n1": ("a100",)}, big_then_small())
    without = dataclasses.replace(
        KUBE, name="no-dra-score", scores=tuple(s for s in KUBE.scores if s[0] != DYNAMIC_RESOURCES)
    )
    picked_without = {schedule(without, dra, "want", seed=s).selected for s in range(16)}
    assert picked_without == {"n0", "n1"}
    for seed in range(16):
        decision = schedule(KUBE, dra, "want", seed=seed)
        assert decision.selected == "n0"
        others = {
            n: {
                p: v
                for p, v in decision.explanation.node(n).scores.items()
                if p != DYNAMIC_RESOURCES
            }
            for n in ("n0", "n1")
        }
        assert others["n0"] == others["n1"]


def test_gpu_placement_packs_only_among_nodes_offering_the_same_alternative() -> None:
    """n0: 8 free devices. n1: 7 of 8 held, one free. The pod wants two, else one. By fit
    alone n1 is better (its last free device, on a root and node left empty), and
    GPUPlacement's weight would outvote kube's 100 against 87; the preference comes first,
    so the pod gets its first choice on n0."""
    dra = state(
        {"n0": ("a100",) * 8, "n1": ("a100",) * 8},
        big_then_small(),
        held("other", "n1", 0, 1, 2, 3, 4, 5, 6),
    )
    for seed in range(8):
        decision = schedule(DEFAULT_PROFILE, dra, "want", seed=seed, nodes=("n0", "n1"))
        assert decision.selected == "n0"
    assert dra_scores(decision) == {"n0": 100, "n1": 87}
    gpu = {n: decision.explanation.node(n).scores[GPU_PLACEMENT] for n in ("n0", "n1")}
    assert gpu == {"n0": 100, "n1": 50}


def test_among_nodes_offering_the_same_alternative_gpu_placement_still_packs() -> None:
    """Both nodes offer the first choice (two devices): kube's score is 100 on both and
    packing decides: n1, whose first root is partly used, keeps n0 whole."""
    dra = state(
        {"n0": ("a100",) * 8, "n1": ("a100",) * 8},
        big_then_small(),
        held("other", "n1", 0, 1),
    )
    for seed in range(8):
        decision = schedule(DEFAULT_PROFILE, dra, "want", seed=seed, nodes=("n0", "n1"))
        assert decision.selected == "n1"
    assert dra_scores(decision) == {"n0": 100, "n1": 100}


def test_the_memo_follows_the_devices_in_use() -> None:
    """The raw part per node is memoised under Filter's key: a second pod with the same
    claim spec reads it, and once the first pod's devices are assumed n0 offers only the
    fallback (7 on both nodes: 100 each), never the memoised 8."""
    dra = state({"n0": ("a100",) * 3, "n1": ("a100",)}, big_then_small(), big_then_small("again"))
    first = schedule(KUBE, dra, "want", nodes=("n0", "n1"))
    assert dra_scores(first) == {"n0": 100, "n1": 87}
    assert any(k[0] == "prio" for k in dra.memo)
    assert dra_scores(schedule(KUBE, dra, "again", nodes=("n0", "n1"))) == {"n0": 100, "n1": 87}
    assert first.claim_plan is not None
    dra.assume(first.claim_plan)
    after = schedule(KUBE, dra, "again", nodes=("n0", "n1"))
    assert dra_scores(after) == {"n0": 100, "n1": 100}
