"""Preemption and ReadWriteOncePod claims: a lower-priority holder of the claim is a victim
(kube 1.34's VolumeRestrictions counts the claim's users through its PreFilter
extensions, RemovePod/AddPod, as the dry run takes victims out and puts them back)."""

from __future__ import annotations

from scheduler.core.plugins.volume_restrictions import REASON_RWOP
from scheduler.core.preemption import Inputs, no_preemption_message, preempt
from scheduler.core.schedule import Framework
from scheduler.core.snapshot import Snapshot
from scheduler.core.volumes import VolumeState, volume_state_from_api
from scheduler.model.pod import Pod
from tests.builders import cluster, make_node, make_pod
from tests.e2e.differential.volumes_objects import claim_volume, pv, pvc, storage_class

FRAMEWORK = Framework()
DRIVER = "csi.lattice.dev"


def claimant(name: str, priority: int, *claims: str, cpu: str = "1") -> Pod:
    builder = make_pod(name, cpu=cpu).priority(priority).uid(name)
    builder.body["spec"]["volumes"] = [claim_volume(f"v{i}", c) for i, c in enumerate(claims)]
    return builder.build()


def storage(placed: list[tuple[Pod, str]]) -> VolumeState:
    """One bound ReadWriteOncePod claim "solo" (a CSI volume: no node affinity)."""
    built = volume_state_from_api(
        pvs=[
            pv(
                "x",
                phase="Bound",
                storage_class="csi",
                csi=(DRIVER, "x"),
                claim=("default", "solo"),
            )
        ],
        pvcs=[
            pvc(
                "solo",
                modes=["ReadWriteOncePod"],
                storage_class="csi",
                volume_name="x",
                bound=True,
            )
        ],
        classes=[storage_class("csi", provisioner=DRIVER)],
        placed_pods=[p for p, _ in placed],
    )
    assert not built.skipped
    return built.state


def world(holder_priority: int) -> tuple[Snapshot, VolumeState, Pod]:
    """Two roomy nodes; the claim's holder and an unrelated pod on n0, another on n1."""
    placed = [
        (claimant("holder", holder_priority, "solo"), "n0"),
        (claimant("other", 1), "n0"),
        (claimant("far", 1), "n1"),
    ]
    snapshot = cluster([make_node("n0", cpu="4"), make_node("n1", cpu="4")], placed)
    return snapshot, storage(placed), claimant("hi", 100, "solo")


def test_the_lower_priority_holder_of_a_read_write_once_pod_claim_is_the_victim() -> None:
    snapshot, volumes, pod = world(holder_priority=1)
    decision = FRAMEWORK.schedule(snapshot, pod, volumes=volumes)
    assert decision.selected is None
    assert decision.reason_counts() == {REASON_RWOP: 2}
    inputs = Inputs(volumes=volumes)
    for force in (False, True):
        found = preempt(FRAMEWORK, snapshot, decision, inputs, force_simulation=force)
        # Only the holder's node frees the claim, and only the holder need go there.
        assert found is not None
        assert (found.node, [v.name for v in found.victims]) == ("n0", ["holder"])
        assert [c.node for c in found.candidates] == ["n0"]
        # The dry run put the holder back among the claim's users.
        assert volumes.claim_in_use("default", "solo")


def test_a_holder_of_higher_priority_keeps_its_claim() -> None:
    snapshot, volumes, pod = world(holder_priority=1000)
    decision = FRAMEWORK.schedule(snapshot, pod, volumes=volumes)
    inputs = Inputs(volumes=volumes)
    assert preempt(FRAMEWORK, snapshot, decision, inputs) is None
    assert no_preemption_message(FRAMEWORK, snapshot, decision, inputs) == (
        f"0/2 nodes are available: 2 {REASON_RWOP}."
    )
    assert volumes.claim_in_use("default", "solo")
