"""VolumeZone, VolumeRestrictions (ReadWriteOncePod) and NodeVolumeLimits, as kube 1.34."""

from __future__ import annotations

from collections.abc import Sequence

import pytest

from scheduler.core.plugins.node_volume_limits import REASON as LIMIT_REASON
from scheduler.core.plugins.volume_restrictions import REASON_RWOP
from scheduler.core.plugins.volume_zone import REASON as ZONE_REASON
from scheduler.core.snapshot import Snapshot
from scheduler.core.volumes import VolumeState, volume_state_from_api
from scheduler.model.pod import Pod
from tests.builders import make_node, make_pod
from tests.e2e.differential.volumes_objects import (
    Body,
    claim_volume,
    csi_node,
    pv,
    pvc,
    schedule_with_volumes,
    storage_class,
)

ZONE = "topology.kubernetes.io/zone"
BETA_ZONE = "failure-domain.beta.kubernetes.io/zone"
DRIVER = "ebs.csi.aws.com"


def pod_with(name: str, *claims: str, node: str = "") -> Pod:
    builder = make_pod(name)
    builder.body["spec"]["volumes"] = [claim_volume(f"v{i}", c) for i, c in enumerate(claims)]
    if node:
        builder.node_name(node)
    return builder.build()


def volumes(
    pvs: Sequence[Body] = (),
    pvcs: Sequence[Body] = (),
    nodes: Sequence[Body] = (),
    placed: Sequence[Pod] = (),
    attachments: Sequence[Body] = (),
) -> VolumeState:
    built = volume_state_from_api(
        pvs=pvs,
        pvcs=pvcs,
        classes=[
            storage_class("local"),
            storage_class("csi", provisioner=DRIVER),
        ],
        csi_nodes=nodes,
        attachments=attachments,
        placed_pods=placed,
    )
    assert not built.skipped
    return built.state


def zoned_cluster() -> Snapshot:
    snap = Snapshot()
    snap.add_node(make_node("a").label(ZONE, "z1").build())
    snap.add_node(make_node("b").label(ZONE, "z2").build())
    snap.add_node(make_node("beta").label(BETA_ZONE, "z2").build())
    snap.add_node(make_node("plain").build())
    return snap


def bound(name: str, labels: dict[str, str]) -> tuple[Body, Body]:
    volume = pv(
        name, phase="Bound", labels=labels, claim=("default", f"c-{name}"), csi=(DRIVER, name)
    )
    return volume, pvc(f"c-{name}", volume_name=name, bound=True, storage_class="csi")


@pytest.mark.parametrize(
    ("labels", "feasible"),
    [
        pytest.param({ZONE: "z2"}, {"b", "plain"}, id="ga-label-has-no-beta-fallback"),
        pytest.param({BETA_ZONE: "z2"}, {"b", "beta", "plain"}, id="beta-label-on-ga-node"),
        pytest.param({BETA_ZONE: "z1__z2"}, {"a", "b", "beta", "plain"}, id="multi-zone"),
        pytest.param({ZONE: "z3"}, {"plain"}, id="no-node-in-zone"),
        pytest.param({ZONE: "z1__"}, {"a", "b", "beta", "plain"}, id="unparsable-label-ignored"),
    ],
)
def test_volume_zone(labels: dict[str, str], feasible: set[str]) -> None:
    volume, claim = bound("pv", labels)
    decision, _ = schedule_with_volumes(
        zoned_cluster(), pod_with("p", "c-pv"), volumes([volume], [claim])
    )
    assert set(decision.feasible) == feasible
    rejected = 4 - len(feasible)
    assert decision.reason_counts() == ({ZONE_REASON: rejected} if rejected else {})


def test_volume_zone_prefilter_messages() -> None:
    snap = zoned_cluster()
    decision, _ = schedule_with_volumes(
        snap, pod_with("p", "c"), volumes([], [pvc("c", volume_name="nope", bound=True)])
    )
    assert decision.reason_counts() == {'persistentvolume "nope" not found': 4}


def test_read_write_once_pod_claim_in_use_blocks_every_node() -> None:
    snap = zoned_cluster()
    holder = pod_with("holder", "solo", node="a")
    snap.add_pod(holder, "a")
    claim = pvc(
        "solo", modes=["ReadWriteOncePod"], storage_class="csi", volume_name="x", bound=True
    )
    state = volumes([pv("x", phase="Bound", csi=(DRIVER, "x"))], [claim], placed=[holder])
    decision, _ = schedule_with_volumes(snap, pod_with("p", "solo"), state)
    assert decision.selected is None
    assert decision.reason_counts() == {REASON_RWOP: 4}
    # Once the holder is gone the claim is free again.
    snap.remove_pod(holder)
    state.remove_pod(holder.key)
    decision, _ = schedule_with_volumes(snap, pod_with("p", "solo"), state)
    assert decision.selected is not None


def test_read_write_once_claim_may_be_shared() -> None:
    snap = zoned_cluster()
    holder = pod_with("holder", "shared", node="a")
    snap.add_pod(holder, "a")
    claim = pvc("shared", storage_class="csi", volume_name="x", bound=True)
    state = volumes([pv("x", phase="Bound", csi=(DRIVER, "x"))], [claim], placed=[holder])
    decision, _ = schedule_with_volumes(snap, pod_with("p", "shared"), state)
    assert len(decision.feasible) == 4


def limits_cluster(count: int) -> tuple[Snapshot, list[Pod], list[Body], list[Body]]:
    """Two nodes; node "full" already runs a pod with ``count`` EBS volumes, both allow 2."""
    snap = Snapshot()
    for name in ("full", "empty"):
        snap.add_node(make_node(name).build())
    pvs, pvcs = [], []
    for i in range(count):
        volume, claim = bound(f"e{i}", {})
        pvs.append(volume)
        pvcs.append(claim)
    existing = pod_with("existing", *(f"c-e{i}" for i in range(count)), node="full")
    snap.add_pod(existing, "full")
    return snap, [existing], pvs, pvcs


def test_csi_attach_limit_counts_unique_volumes_per_driver() -> None:
    snap, placed, pvs, pvcs = limits_cluster(2)
    nodes = [csi_node("full", {DRIVER: 2}), csi_node("empty", {DRIVER: 2})]
    new_pv, new_claim = bound("n0", {})
    state = volumes([*pvs, new_pv], [*pvcs, new_claim], nodes, placed)
    decision, _ = schedule_with_volumes(snap, pod_with("p", "c-n0"), state)
    assert decision.feasible == ("empty",)
    assert decision.reason_counts() == {LIMIT_REASON: 1}
    # A volume the node already has costs nothing more.
    decision, _ = schedule_with_volumes(snap, pod_with("p", "c-e0"), state)
    assert set(decision.feasible) == {"full", "empty"}


def test_unbound_claim_counts_under_its_provisioner_and_attachments_count() -> None:
    snap, placed, pvs, pvcs = limits_cluster(1)
    nodes = [csi_node("full", {DRIVER: 2}), csi_node("empty", {DRIVER: None})]
    attachment = {
        "metadata": {"name": "va-1"},
        "spec": {
            "attacher": DRIVER,
            "nodeName": "full",
            "source": {"persistentVolumeName": "other"},
        },
    }
    other, _ = bound("other", {})
    state = volumes(
        [*pvs, other], [*pvcs, pvc("fresh", storage_class="csi")], nodes, placed, [attachment]
    )
    decision, _ = schedule_with_volumes(snap, pod_with("p", "fresh"), state)
    # full: 1 pod volume + 1 attachment + 1 new > 2; empty has no count: no limit.
    assert decision.feasible == ("empty",)
    assert decision.reason_counts() == {LIMIT_REASON: 1}


def test_no_csinode_means_no_limit() -> None:
    snap, placed, pvs, pvcs = limits_cluster(3)
    new_pv, new_claim = bound("n0", {})
    state = volumes([*pvs, new_pv], [*pvcs, new_claim], [], placed)
    decision, _ = schedule_with_volumes(snap, pod_with("p", "c-n0"), state)
    assert set(decision.feasible) == {"full", "empty"}
