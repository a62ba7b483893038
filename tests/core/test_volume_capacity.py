"""VolumeBinding with CSIStorageCapacity (every release) and its score (1.37 only).

Expected values are worked out by hand from kube's code (``volumebinding/binder.go``
``checkVolumeProvisions`` and ``hasEnoughCapacity``; ``scorer.go``; ``volume_binding.go``
Score; ``helper/shape_score.go``); 1 Gi = 2^30 bytes, so ``requested * 100 / capacity`` is
the ratio of the Gi figures, truncated.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Sequence

import numpy as np
import pytest

from scheduler.core.explain import Decision
from scheduler.core.plugins.volume_binding import (
    REASON_BIND_CONFLICT,
    REASON_NOT_ENOUGH_SPACE,
    broken_linear,
    utilization_scores,
)
from scheduler.core.profile import DEFAULT_PROFILE, VOLUME_BINDING, Profile, VolumeBindingArgs
from scheduler.core.snapshot import Snapshot
from scheduler.core.volumes import VolumeState, volume_state_from_api
from scheduler.model.pod import Pod
from tests.builders import make_node, make_pod
from tests.core.support import scores
from tests.e2e.differential.volumes_objects import (
    HOSTNAME,
    Body,
    claim_volume,
    csi_driver,
    pv,
    pvc,
    schedule_with_volumes,
    storage_capacity,
    storage_class,
)

ZONE = "topology.kubernetes.io/zone"
DRIVER = "csi.example.com"
ZONED = "zoned.example.com"
GI = 2**30


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


def release(minor: int, volume_binding: VolumeBindingArgs | None = None) -> Profile:
    args = volume_binding or VolumeBindingArgs()
    return dataclasses.replace(DEFAULT_PROFILE, kube_minor=minor, volume_binding=args)


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


# ------------------------------------------------------------------------------ score
def test_the_shape_interpolates_as_go_integers() -> None:
    """A custom shape (0..10 points, times 10): flat outside, linear between points, each
    step's quotient truncated toward zero (falling segments round up, not down)."""
    shape = ((20, 20), (50, 80), (80, 30))
    utilization = np.array([0, 20, 35, 49, 50, 51, 79, 80, 100], dtype=np.int64)
    # 35: 20 + 60*15/30 = 50; 49: 20 + 1740/30 = 78; 51: 80 + (-50)/30 = 80 - 1;
    # 79: 80 + (-1450)/30 = 80 - 48 (floor division would give 78 and 31).
    expected = [20, 20, 50, 78, 80, 79, 32, 30, 30]
    assert broken_linear(utilization, shape).tolist() == expected


def test_utilization_is_full_when_the_capacity_is_zero_or_too_small() -> None:
    shape = ((0, 100), (100, 0))
    requested = np.array([5, 5, 0, 1, 2 * GI], dtype=np.int64)
    capacity = np.array([0, 4, 0, 3, 7 * GI], dtype=np.int64)
    # 1/3 -> 33 % -> 67; 2/7 -> 28 % -> 72.
    assert utilization_scores(requested, capacity, shape).tolist() == [0, 0, 0, 67, 72]


@pytest.mark.parametrize("minor", [35, 36])
def test_no_score_before_1_37(minor: int) -> None:
    volumes = state(
        pvs=[pv("p0", "3Gi", host="node-0"), pv("p1", "7Gi", host="node-1")],
        pvcs=[pvc("data", "2Gi")],
    )
    decision = decide(cluster(2), pod_with("data"), volumes, minor)
    assert VOLUME_BINDING in decision.explanation.skipped_scores


def test_static_pvs_score_their_utilization() -> None:
    """2Gi on a 3Gi PV: 66 % -> 34; on 7Gi: 28 % -> 72; on 2Gi: full -> 0."""
    volumes = state(
        pvs=[
            pv("p0", "3Gi", host="node-0"),
            pv("p1", "7Gi", host="node-1"),
            pv("p2", "2Gi", host="node-2"),
        ],
        pvcs=[pvc("data", "2Gi")],
    )
    decision = decide(cluster(3), pod_with("data"), volumes)
    assert scores(decision, VOLUME_BINDING) == {"node-0": 34, "node-1": 72, "node-2": 0}
    assert decision.selected == "node-1"


def test_a_custom_shape_from_the_profile() -> None:
    """Shape (0, 0), (100, 10): fuller storage scores higher (66, 28, 100)."""
    volumes = state(
        pvs=[
            pv("p0", "3Gi", host="node-0"),
            pv("p1", "7Gi", host="node-1"),
            pv("p2", "2Gi", host="node-2"),
        ],
        pvcs=[pvc("data", "2Gi")],
    )
    profile = release(37, volume_binding=VolumeBindingArgs(shape=((0, 0), (100, 10))))
    decision, _ = schedule_with_volumes(cluster(3), pod_with("data"), volumes, profile=profile)
    assert scores(decision, VOLUME_BINDING) == {"node-0": 66, "node-1": 28, "node-2": 100}
    assert decision.selected == "node-2"


def test_classes_are_averaged_and_a_class_sums_its_pvs() -> None:
    """node-0: "local" holds 1Gi+2Gi on two 4Gi PVs (3/8: 37 % -> 63) and "local2" 1Gi on
    2Gi (50 % -> 50): (63 + 50) / 2 = 56.5 -> 57 (half away from zero). node-1: "local"
    1Gi+2Gi on 3Gi and 8Gi PVs (3/11: 27 % -> 73), "local2" 1Gi on 3Gi (33 % -> 67):
    (73 + 67) / 2 = 70."""
    volumes = state(
        pvs=[
            pv("a0", "4Gi", host="node-0"),
            pv("b0", "4Gi", host="node-0"),
            pv("c0", "2Gi", storage_class="local2", host="node-0"),
            pv("a1", "3Gi", host="node-1"),
            pv("b1", "8Gi", host="node-1"),
            pv("c1", "3Gi", storage_class="local2", host="node-1"),
        ],
        pvcs=[pvc("one", "1Gi"), pvc("two", "2Gi"), pvc("other", "1Gi", storage_class="local2")],
    )
    decision = decide(cluster(2), pod_with("one", "two", "other"), volumes)
    assert scores(decision, VOLUME_BINDING) == {"node-0": 57, "node-1": 70}


def test_provisioned_claims_score_the_capacity_they_found() -> None:
    """5Gi of 100Gi: 5 % -> 95; of 10Gi: 50 % -> 50; node-2's object has only a
    maximumVolumeSize (kube would dereference a nil capacity): capacity 0, full -> 0."""
    volumes = state(
        pvcs=[pvc("data", "5Gi", storage_class="csi")],
        capacities=[
            storage_capacity("on-0", "csi", "100Gi", nodes=on("node-0")),
            storage_capacity("on-1", "csi", "10Gi", nodes=on("node-1")),
            storage_capacity("on-2", "csi", None, maximum="50Gi", nodes=on("node-2")),
        ],
    )
    decision = decide(cluster(3), pod_with("data"), volumes)
    assert scores(decision, VOLUME_BINDING) == {"node-0": 95, "node-1": 50, "node-2": 0}


def test_a_class_takes_the_capacity_of_its_last_provisioned_claim() -> None:
    """1Gi finds "a-small" (largest volume 2Gi, capacity 50Gi), then 4Gi finds "b-large"
    (20Gi): kube overwrites the class's capacity, so 5Gi of 20Gi: 25 % -> 75 (a sum would
    give 5/70 -> 93, the first object 5/50 -> 90)."""
    volumes = state(
        pvcs=[pvc("one", "1Gi", storage_class="csi"), pvc("four", "4Gi", storage_class="csi")],
        capacities=[
            storage_capacity("a-small", "csi", "50Gi", maximum="2Gi", nodes={}),
            storage_capacity("b-large", "csi", "20Gi", nodes={}),
        ],
    )
    decision = decide(cluster(1), pod_with("four", "one"), volumes)
    assert scores(decision, VOLUME_BINDING) == {"node-0": 75}


def test_a_node_with_a_static_pv_scores_only_its_pvs() -> None:
    """Class "csi" has a 2Gi PV on node-0. There 1Gi takes it (static: 50 % -> 50) and 3Gi
    is provisioned (not scored); on node-1 both are provisioned: 4Gi of 10Gi -> 60."""
    volumes = state(
        pvs=[pv("p0", "2Gi", storage_class="csi", host="node-0")],
        pvcs=[pvc("one", "1Gi", storage_class="csi"), pvc("three", "3Gi", storage_class="csi")],
        capacities=[
            storage_capacity("on-0", "csi", "10Gi", nodes=on("node-0")),
            storage_capacity("on-1", "csi", "10Gi", nodes=on("node-1")),
        ],
    )
    decision = decide(cluster(2), pod_with("one", "three"), volumes)
    assert scores(decision, VOLUME_BINDING) == {"node-0": 50, "node-1": 60}


def test_pods_without_scored_volumes_skip() -> None:
    """Bound claims, provisioning without capacity tracking, or no claims: kube scores 0
    everywhere, which ranks nothing; Lattice skips."""
    volumes = state(
        pvs=[pv("b", "5Gi", host="node-0", claim=("default", "bound"), phase="Bound")],
        pvcs=[
            pvc("bound", volume_name="b", bound=True),
            pvc("untracked", storage_class="zoned"),
        ],
    )
    for pod in (pod_with("bound"), pod_with("untracked"), make_pod("plain").build()):
        decision = decide(cluster(2), pod, volumes)
        assert decision.feasible
        assert VOLUME_BINDING in decision.explanation.skipped_scores


def test_shape_is_validated_and_refused_while_the_gate_is_off() -> None:
    for bad in ((), ((50, 1), (50, 2)), ((0, 11),), ((-1, 0),), ((101, 0),)):
        with pytest.raises(ValueError, match=r"VolumeBinding\.shape"):
            VolumeBindingArgs(shape=bad)
    with pytest.raises(ValueError, match="StorageCapacityScoring"):
        release(36, volume_binding=VolumeBindingArgs(shape=((0, 10), (100, 0))))
    assert dict(DEFAULT_PROFILE.scores)[VOLUME_BINDING] == 1
