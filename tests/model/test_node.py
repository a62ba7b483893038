"""Node and namespace parsing."""

from __future__ import annotations

import pytest

from scheduler.model.declared_features import feature_bits
from scheduler.model.errors import InvalidObjectError
from scheduler.model.node import Namespace, Node, Taint
from tests.builders import make_node


def test_allocatable_rounding_and_tracking() -> None:
    node = (
        make_node("n", cpu="3500m", memory="1.5Gi", pods=20)
        .resource("nvidia.com/gpu", "4")
        .resource("hugepages-1Gi", "2Gi")
        .resource("ephemeral-storage", "100G")
        .resource("example", "5")
        .build()
    )
    assert dict(node.allocatable) == {
        "cpu": 3500,
        "memory": 1536 * 1024**2,
        "pods": 20,
        "nvidia.com/gpu": 4,
        "hugepages-1Gi": 2 * 1024**3,
        "ephemeral-storage": 10**11,
    }


def test_taints_labels_unschedulable() -> None:
    node = (
        (
            make_node("n", zone="a")
            .taint("k", "v", "NoExecute")
            .taint("soft", effect="PreferNoSchedule")
        )
        .unschedulable()
        .build()
    )
    assert node.labels["zone"] == "a"
    assert node.taints == (Taint("k", "v", "NoExecute"), Taint("soft", "", "PreferNoSchedule"))
    assert node.taints[0].blocks_scheduling
    assert not node.taints[1].blocks_scheduling
    assert node.unschedulable


@pytest.mark.parametrize(
    ("body", "field"),
    [
        pytest.param({"metadata": {}}, "metadata.name", id="no-name"),
        pytest.param(
            {"metadata": {"name": "n"}, "spec": {"taints": [{"key": "k", "effect": "Sometimes"}]}},
            "spec.taints[0].effect",
            id="bad-effect",
        ),
        pytest.param(
            {"metadata": {"name": "n"}, "status": {"allocatable": {"cpu": "lots"}}},
            "status.allocatable[cpu]",
            id="bad-quantity",
        ),
        pytest.param(
            {"metadata": {"name": "n"}, "status": {"allocatable": {"memory": "10E"}}},
            "status.allocatable[memory]",
            id="beyond-int64",
        ),
        pytest.param(
            {"metadata": {"name": "n"}, "status": {"declaredFeatures": "VolumeBindMountOptions"}},
            "status.declaredFeatures",
            id="declared-features-not-a-list",
        ),
        pytest.param(
            {"metadata": {"name": "n"}, "status": {"declaredFeatures": ["A", 1]}},
            "status.declaredFeatures",
            id="declared-feature-not-a-string",
        ),
    ],
)
def test_invalid_nodes(body: dict[str, object], field: str) -> None:
    with pytest.raises(InvalidObjectError) as info:
        Node.from_api(body)
    assert info.value.field == field


def test_declared_features() -> None:
    """Kept as names; the bits cover only features a pod can need (kube's TryMap ignores
    unknown names), so a kubelet newer than us does not confuse the filter."""
    node = make_node("n").declared_features(
        "InPlacePodLevelResourcesVerticalScaling",
        "RestartAllContainersOnContainerExits",
        "VolumeBindMountOptions",
    )
    built = node.build()
    assert built.declared_features == {
        "InPlacePodLevelResourcesVerticalScaling",
        "RestartAllContainersOnContainerExits",
        "VolumeBindMountOptions",
    }
    assert built.declared_feature_bits == feature_bits(
        ["RestartAllContainersOnContainerExits", "VolumeBindMountOptions"]
    )
    assert make_node("n").build().declared_features == frozenset()
    assert make_node("n").build().declared_feature_bits == 0


def test_namespace() -> None:
    ns = Namespace.from_api({"metadata": {"name": "team", "labels": {"env": "prod"}}})
    assert (ns.name, dict(ns.labels)) == ("team", {"env": "prod"})
