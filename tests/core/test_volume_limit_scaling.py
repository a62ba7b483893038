"""NodeVolumeLimits' missing-driver check (VolumeLimitScaling, KEP-5030), per release.

kube 1.37 (``nodevolumelimits/csi.go`` Filter and ``checkCSIDriverOnNode``): a driver of
the pod's new volumes whose CSIDriver sets ``preventPodSchedulingIfMissing`` must be listed
in the node's CSINode, else Unschedulable "<driver> CSI driver is not installed on the
node", before any limit is counted. 1.35 and 1.36 have the gate off.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Sequence

import pytest

from scheduler.core.explain import Decision
from scheduler.core.framework import Code
from scheduler.core.plugins.node_volume_limits import REASON as LIMIT_REASON
from scheduler.core.profile import DEFAULT_PROFILE
from scheduler.core.snapshot import Snapshot
from scheduler.core.volumes import volume_state_from_api
from scheduler.model.pod import Pod
from tests.builders import make_node, make_pod
from tests.e2e.differential.volumes_objects import (
    Body,
    claim_volume,
    csi_driver,
    csi_node,
    pv,
    pvc,
    schedule_with_volumes,
    storage_class,
)

DRIVER = "csi.example.com"
OTHER = "other.example.com"
MISSING = "csi.example.com CSI driver is not installed on the node"


def nodes() -> Snapshot:
    snap = Snapshot()
    for name in ("has", "lacks", "bare"):
        snap.add_node(make_node(name).build())
    return snap


def csi_nodes() -> list[Body]:
    """ "has" lists the driver (no count), "lacks" only another one, "bare" has no CSINode."""
    return [csi_node("has", {DRIVER: None}), csi_node("lacks", {OTHER: 1})]


def pod_with(*claims: str) -> Pod:
    builder = make_pod("p")
    builder.body["spec"]["volumes"] = [claim_volume(f"v{i}", c) for i, c in enumerate(claims)]
    return builder.build()


def decide(minor: int, drivers: Sequence[Body], claim: str = "bound") -> Decision:
    built = volume_state_from_api(
        pvs=[pv("vol", claim=("default", "bound"), phase="Bound", csi=(DRIVER, "h1"))],
        pvcs=[
            pvc("bound", volume_name="vol", bound=True, storage_class="csi"),
            pvc("fresh", storage_class="csi"),
        ],
        classes=[storage_class("csi", provisioner=DRIVER)],
        csi_nodes=csi_nodes(),
        csi_drivers=drivers,
    )
    assert not built.skipped
    profile = dataclasses.replace(DEFAULT_PROFILE, kube_minor=minor)
    decision, _ = schedule_with_volumes(nodes(), pod_with(claim), built.state, profile=profile)
    return decision


@pytest.mark.parametrize("claim", ["bound", "fresh"])
def test_a_required_driver_must_be_on_the_node_from_1_37(claim: str) -> None:
    """A bound PV's ``spec.csi.driver`` and an unbound claim's provisioner alike."""
    decision = decide(37, [csi_driver(DRIVER, required=True)], claim)
    assert decision.feasible == ("has",)
    assert decision.reason_counts() == {MISSING: 2}
    for name in ("lacks", "bare"):
        verdict = decision.explanation.node(name)
        assert verdict.plugin == "NodeVolumeLimits"
        assert verdict.code is Code.UNSCHEDULABLE


@pytest.mark.parametrize(
    ("minor", "drivers"),
    [
        pytest.param(35, [csi_driver(DRIVER, required=True)], id="1.35-gate-off"),
        pytest.param(36, [csi_driver(DRIVER, required=True)], id="1.36-gate-off"),
        pytest.param(37, [csi_driver(DRIVER, required=False)], id="1.37-flag-false"),
        pytest.param(37, [csi_driver(DRIVER)], id="1.37-flag-unset"),
        pytest.param(37, [csi_driver(OTHER, required=True)], id="1.37-another-driver"),
        pytest.param(37, [], id="1.37-no-csidriver"),
    ],
)
def test_otherwise_a_missing_driver_does_not_matter(minor: int, drivers: list[Body]) -> None:
    decision = decide(minor, drivers)
    assert set(decision.feasible) == {"has", "lacks", "bare"}


def test_the_missing_driver_is_checked_before_the_limit() -> None:
    """ "lacks" lists the driver now, with a count of 0: over its limit. A node without the
    required driver is reported as such, whatever its counts would say."""
    built = volume_state_from_api(
        pvs=[pv("vol", claim=("default", "bound"), phase="Bound", csi=(DRIVER, "h1"))],
        pvcs=[pvc("bound", volume_name="vol", bound=True, storage_class="csi")],
        classes=[storage_class("csi", provisioner=DRIVER)],
        csi_nodes=[csi_node("has", {DRIVER: 0}), csi_node("lacks", {OTHER: 0})],
        csi_drivers=[csi_driver(DRIVER, required=True)],
    )
    decision, _ = schedule_with_volumes(nodes(), pod_with("bound"), built.state)
    assert decision.feasible == ()
    assert decision.reason_counts() == {LIMIT_REASON: 1, MISSING: 2}
