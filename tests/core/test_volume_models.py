"""Volume models: every bad field is an InvalidObjectError naming it; Unsupported's bridge."""

from __future__ import annotations

from typing import Any

import pytest

from scheduler.core.framework import Code, Cycle
from scheduler.core.plugins.unsupported import NO_VOLUME_BINDING, NO_VOLUME_STATE, Unsupported
from scheduler.core.profile import DEFAULT_PROFILE
from scheduler.core.registry import default_registry
from scheduler.core.snapshot import Snapshot
from scheduler.core.volumes import VolumeState, volume_state_from_api
from scheduler.model.errors import InvalidObjectError
from scheduler.model.quantity import Quantity
from scheduler.model.volume import (
    CSIDriver,
    CSINode,
    CSIStorageCapacity,
    PersistentVolume,
    PersistentVolumeClaim,
    StorageClass,
    zone_values,
)
from tests.builders import make_pod
from tests.e2e.differential.volumes_objects import (
    claim_volume,
    csi_driver,
    csi_node,
    pv,
    pvc,
    storage_capacity,
    storage_class,
)


def test_round_trip_of_the_fields_the_plugins_read() -> None:
    volume = PersistentVolume.from_api(pv("x", "1536Mi", host="n1", claim=("ns", "c")))
    assert volume.capacity == Quantity.parse("1536Mi")
    assert volume.node_affinity is not None
    assert volume.claim_ref is not None
    body = pvc("c", "1Gi", namespace="ns", selector={"matchLabels": {"a": "b"}})
    body["metadata"]["annotations"] = {"volume.beta.kubernetes.io/storage-class": "beta"}
    claim = PersistentVolumeClaim.from_api(body)
    assert claim.storage_class == "beta"  # the annotation wins, as GetPersistentVolumeClaimClass
    assert claim.selector is not None
    assert claim.selector.matches({"a": "b"})
    assert volume.bound_to(claim)
    sc = StorageClass.from_api(storage_class("s", provisioner="p", zones=["z1"]))
    assert sc.delays_binding
    assert sc.can_provision
    assert sc.allowed_topologies
    node = CSINode.from_api(csi_node("n1", {"d": 3, "e": None}))
    assert node.limits == {"d": 3}
    assert node.drivers == {"d", "e"}
    assert zone_values("a__b") == frozenset({"a", "b"})
    assert zone_values("a__") is None


def _with(body: dict[str, Any], path: str, value: object) -> dict[str, Any]:
    target = body
    *parents, last = path.split(".")
    for key in parents:
        target = target.setdefault(key, {})
    target[last] = value
    return body


def test_csi_driver_and_storage_capacity_fields() -> None:
    """Unset ``*bool`` opt-ins are false; a capacity without ``nodeTopology`` reaches no node
    and one with ``{}`` every node (``LabelSelectorAsSelector``); ``maximumVolumeSize`` is
    the limit when set (``volumeLimit``)."""
    plain = CSIDriver.from_api(csi_driver("d"))
    assert (plain.storage_capacity, plain.prevent_pod_scheduling_if_missing) == (False, False)
    opted = CSIDriver.from_api(csi_driver("d", storage_capacity=True, required=True))
    assert (opted.storage_capacity, opted.prevent_pod_scheduling_if_missing) == (True, True)
    nowhere = CSIStorageCapacity.from_api(storage_capacity("c", "s", "10Gi"))
    assert nowhere.node_topology is None
    assert nowhere.key == ("kube-system", "c")
    assert nowhere.volume_limit == Quantity.parse("10Gi")
    everywhere = CSIStorageCapacity.from_api(
        storage_capacity("c", "s", "10Gi", nodes={}, maximum="2Gi")
    )
    assert everywhere.node_topology is not None
    assert everywhere.node_topology.matches({})
    assert everywhere.volume_limit == Quantity.parse("2Gi")
    unknown = CSIStorageCapacity.from_api(storage_capacity("c", "s", None, nodes={}))
    assert unknown.volume_limit is None
    assert PersistentVolumeClaim.from_api(pvc("c")).storage_requested
    unrequested = pvc("c")
    del unrequested["spec"]["resources"]
    assert not PersistentVolumeClaim.from_api(unrequested).storage_requested


def test_capacities_are_kept_by_class_in_name_order() -> None:
    built = volume_state_from_api(
        csi_drivers=[csi_driver("d")],
        capacities=[
            storage_capacity("b", "fast", "1Gi", nodes={}),
            storage_capacity("a", "fast", "1Gi", nodes={}),
            storage_capacity("c", "slow", "1Gi", nodes={}),
        ],
    )
    volumes = built.state
    assert not built.skipped
    assert list(volumes.csi_drivers) == ["d"]
    assert [c.name for c in volumes.capacities_of_class("fast")] == ["a", "b"]
    moved = CSIStorageCapacity.from_api(storage_capacity("a", "slow", "1Gi", nodes={}))
    volumes.set_capacity(moved)
    assert [c.name for c in volumes.capacities_of_class("fast")] == ["b"]
    assert [c.name for c in volumes.capacities_of_class("slow")] == ["a", "c"]
    volumes.remove_capacity("kube-system", "a")
    assert [c.name for c in volumes.capacities_of_class("slow")] == ["c"]
    volumes.remove_csi_driver("d")
    assert not volumes.csi_drivers


@pytest.mark.parametrize(
    ("parse", "body", "field"),
    [
        (
            PersistentVolume.from_api,
            _with(pv("x"), "spec.capacity.storage", "lots"),
            "spec.capacity.storage",
        ),
        (
            PersistentVolume.from_api,
            _with(pv("x"), "spec.accessModes", ["Sometimes"]),
            "spec.accessModes[0]",
        ),
        (PersistentVolume.from_api, _with(pv("x"), "spec.volumeMode", "Tape"), "spec.volumeMode"),
        (PersistentVolume.from_api, _with(pv("x"), "metadata.name", ""), "metadata.name"),
        (
            PersistentVolumeClaim.from_api,
            _with(pvc("c"), "spec.resources.requests.storage", []),
            "spec.resources.requests.storage",
        ),
        (PersistentVolumeClaim.from_api, _with(pvc("c"), "spec.volumeName", 3), "spec.volumeName"),
        (
            StorageClass.from_api,
            _with(storage_class("s"), "volumeBindingMode", "Later"),
            "volumeBindingMode",
        ),
        (
            CSINode.from_api,
            _with(csi_node("n", {}), "spec.drivers", [{"name": "d", "allocatable": {"count": -1}}]),
            "spec.drivers[0].allocatable.count",
        ),
        (
            CSIDriver.from_api,
            csi_driver("d", storage_capacity=True) | {"spec": {"storageCapacity": "yes"}},
            "spec.storageCapacity",
        ),
        (
            CSIDriver.from_api,
            _with(csi_driver("d"), "spec.preventPodSchedulingIfMissing", 1),
            "spec.preventPodSchedulingIfMissing",
        ),
        (
            CSIStorageCapacity.from_api,
            storage_capacity("c", "s", "ten gigs", nodes={}),
            "capacity",
        ),
        (
            CSIStorageCapacity.from_api,
            storage_capacity("c", "s", "1Gi", maximum="-", nodes={}),
            "maximumVolumeSize",
        ),
    ],
)
def test_bad_fields_are_named(parse: Any, body: dict[str, Any], field: str) -> None:
    with pytest.raises(InvalidObjectError) as caught:
        parse(body)
    assert caught.value.field == field


def test_unreadable_objects_are_listed_not_fatal() -> None:
    built = volume_state_from_api(pvs=[_with(pv("x"), "spec.volumeMode", "Tape"), pv("y")])
    assert list(built.state.pvs) == ["y"]
    assert built.skipped
    assert built.skipped[0].startswith("persistentvolume/x: invalid spec.volumeMode")


def test_claims_are_refused_until_the_cycle_has_a_volume_state() -> None:
    pod = make_pod("p")
    pod.body["spec"]["volumes"] = [claim_volume("data", "ckpt")]
    built = pod.build()
    snap = Snapshot()
    without = Unsupported().pre_filter(Cycle(snap, built))
    assert without.code is Code.UNSCHEDULABLE_AND_UNRESOLVABLE
    assert NO_VOLUME_BINDING in without.message
    with_state = Unsupported().pre_filter(Cycle(snap, built, volumes=VolumeState()))
    assert with_state.code is Code.SKIP
    disabled = Unsupported(volume_binding=False).pre_filter(
        Cycle(snap, built, volumes=VolumeState())
    )
    assert disabled.code is Code.UNSCHEDULABLE_AND_UNRESOLVABLE
    disk = make_pod("d")
    disk.body["spec"]["volumes"] = [{"name": "d", "awsElasticBlockStore": {"volumeID": "v"}}]
    # Inline disks are checked by VolumeRestrictions and NodeVolumeLimits given the state.
    inline = Unsupported().pre_filter(Cycle(snap, disk.build(), volumes=VolumeState()))
    assert inline.code is Code.SKIP
    stateless = Unsupported().pre_filter(Cycle(snap, disk.build()))
    assert stateless.code is Code.UNSCHEDULABLE_AND_UNRESOLVABLE
    assert NO_VOLUME_STATE in stateless.message


def test_the_default_profile_runs_kube_volume_filters_in_kube_order() -> None:
    plugins = default_registry().build(DEFAULT_PROFILE)
    names = [p.name for p in plugins.filters]
    volume = ["VolumeRestrictions", "NodeVolumeLimits", "VolumeBinding", "VolumeZone"]
    start = names.index("NodeResourcesFit") + 1
    assert names[start : start + 4] == volume
    assert names[start + 4] == "PodTopologySpread"
    assert [p.name for p in plugins.volume_planners] == ["VolumeBinding"]
