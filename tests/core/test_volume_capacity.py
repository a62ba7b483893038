"""VolumeBinding with CSIStorageCapacity (every release).

Expected values are worked out by hand from kube's code (``volumebinding/binder.go``
``checkVolumeProvisions`` and ``hasEnoughCapacity``; ``scorer.go``; ``volume_binding.go``
Score; ``helper/shape_score.go``); 1 Gi = 2^30 bytes, so ``requested * 100 / capacity`` is
the ratio of the Gi figures, truncated.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Sequence

import pytest

from scheduler.core.explain import Decision
from scheduler.core.plugins.volume_binding import (
    REASON_BIND_CONFLICT,
    REASON_NOT_ENOUGH_SPACE,
)
from scheduler.core.profile import DEFAULT_PROFILE, Profile
from scheduler.core.snapshot import Snapshot
from scheduler.core.volumes import VolumeState, volume_state_from_api
from scheduler.model.pod import Pod
from tests.builders import make_node, make_pod
from tests.e2e.differential.volumes_objects import (
    HOSTNAME,
    Body,
    claim_volume,
    csi_driver,
    pvc,
    schedule_with_volumes,
    storage_capacity,
    storage_class,
)

ZONE = "topology.kubernetes.io/zone"
DRIVER = "csi.example.com"
ZONED = "zoned.example.com"


def cluster(n: int = 4) -> Snapshot:
    snap = Snapshot()
    for i in range(n):
        snap.add_node(make_node(f"node-{i}").label(ZONE, f"z{i % 2}").build())
    return snap


def on(node: str) -> dict[str, str]:
    return {HOSTNAME: node}


def state(
    *,
    pvs: Sequence[Body] = (),
    pvcs: Sequence[Body] = (),
    capacities: Sequence[Body] = (),
    drivers: Sequence[Body] = (csi_driver(DRIVER, storage_capacity=True),),
) -> VolumeState:
    built = volume_state_from_api(
        pvs=pvs,
        pvcs=pvcs,
        classes=[
            storage_class("local"),
            storage_class("local2"),
            storage_class("csi", provisioner=DRIVER),
            storage_class("zoned", provisioner=ZONED, zones=["z0"]),
        ],
        csi_drivers=drivers,
        capacities=capacities,
    )
    assert not built.skipped
    return built.state


def pod_with(*claims: str) -> Pod:
    builder = make_pod("p")
    builder.body["spec"]["volumes"] = [claim_volume(f"v{i}", c) for i, c in enumerate(claims)]
    return builder.build()


def release(minor: int) -> Profile:
    return dataclasses.replace(DEFAULT_PROFILE, kube_minor=minor)


def decide(snap: Snapshot, pod: Pod, volumes: VolumeState, minor: int = 37) -> Decision:
    decision, _ = schedule_with_volumes(snap, pod, volumes, profile=release(minor))
    return decision


# ----------------------------------------------------------------------------- filter
CAPACITIES = [
    storage_capacity("on-0", "csi", "10Gi", nodes=on("node-0")),
    storage_capacity("on-1", "csi", "3Gi", nodes=on("node-1")),
    storage_capacity("on-2", "csi", "100Gi", maximum="4Gi", nodes=on("node-2")),
    storage_capacity("nowhere", "csi", "100Gi"),
    storage_capacity("other-class", "local", "100Gi", nodes={}),
]
"""For a 5Gi claim: room on node-0 only (node-1 too small, node-2's largest volume too
small, node-3 has none; no nodeTopology reaches no node; another class does not count)."""


@pytest.mark.parametrize("minor", [35, 36, 37])
def test_a_provisioned_claim_needs_a_capacity_with_room_on_the_node(minor: int) -> None:
    volumes = state(pvcs=[pvc("data", "5Gi", storage_class="csi")], capacities=CAPACITIES)
    decision, plan = schedule_with_volumes(
        cluster(), pod_with("data"), volumes, profile=release(minor)
    )
    assert decision.feasible == ("node-0",)
    assert decision.reason_counts() == {REASON_NOT_ENOUGH_SPACE: 3}
    assert plan is not None
    assert [(p.claim_name, p.node) for p in plan.provisions] == [("data", "node-0")]


@pytest.mark.parametrize(
    ("drivers", "claim"),
    [
        pytest.param([csi_driver(DRIVER)], pvc("data", "5Gi", storage_class="csi"), id="no-opt-in"),
        pytest.param(
            [csi_driver(DRIVER, storage_capacity=False)],
            pvc("data", "5Gi", storage_class="csi"),
            id="opted-out",
        ),
        pytest.param([], pvc("data", "5Gi", storage_class="csi"), id="no-csidriver"),
        pytest.param(
            [csi_driver(DRIVER, storage_capacity=True)],
            {**pvc("data", storage_class="csi"), "spec": {"storageClassName": "csi"}},
            id="no-storage-request",
        ),
    ],
)
def test_capacity_is_checked_only_for_drivers_that_opt_in(drivers: list[Body], claim: Body) -> None:
    volumes = state(pvcs=[claim], capacities=CAPACITIES, drivers=drivers)
    decision = decide(cluster(), pod_with("data"), volumes)
    assert len(decision.feasible) == 4


@pytest.mark.parametrize(
    ("small", "big", "counts"),
    [
        # "a" (1Gi) first: node-2 and node-3 have no capacity for it, which ends their check
        # (node-3 would fail "zoned"'s topology too); node-1 is in z1, outside "zoned".
        pytest.param("csi", "zoned", {REASON_BIND_CONFLICT: 1, REASON_NOT_ENOUGH_SPACE: 2}),
        # "zoned" first: node-1 and node-3 fail its topology; node-2 then lacks capacity.
        pytest.param("zoned", "csi", {REASON_BIND_CONFLICT: 2, REASON_NOT_ENOUGH_SPACE: 1}),
    ],
)
def test_the_first_claim_to_provision_that_fails_decides_the_reason(
    small: str, big: str, counts: dict[str, int]
) -> None:
    volumes = state(
        pvcs=[pvc("a", "1Gi", storage_class=small), pvc("b", "2Gi", storage_class=big)],
        capacities=[
            storage_capacity("on-0", "csi", "10Gi", nodes=on("node-0")),
            storage_capacity("on-1", "csi", "10Gi", nodes=on("node-1")),
        ],
    )
    decision = decide(cluster(), pod_with("b", "a"), volumes)
    assert decision.feasible == ("node-0",)
    assert decision.reason_counts() == counts


def test_a_selected_node_claim_is_checked_for_capacity_there() -> None:
    volumes = state(
        pvcs=[pvc("data", "5Gi", storage_class="csi", selected_node="node-1")],
        capacities=CAPACITIES,
    )
    decision = decide(cluster(), pod_with("data"), volumes)
    assert decision.feasible == ()
    assert decision.reason_counts() == {REASON_BIND_CONFLICT: 3, REASON_NOT_ENOUGH_SPACE: 1}
    assert decision.explanation.node("node-1").reasons == (REASON_NOT_ENOUGH_SPACE,)
