"""Inline disks as kube 1.34 sees them: the Pod model's identities, VolumeRestrictions'
disk conflicts and NodeVolumeLimits' count of migrated in-tree disks."""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import pytest

from scheduler.core.framework import Code
from scheduler.core.plugins import volume_restrictions
from scheduler.core.plugins.node_volume_limits import REASON as LIMIT_REASON
from scheduler.core.plugins.node_volume_limits import TranslationError, ebs_volume_id
from scheduler.core.plugins.volume_restrictions import REASON_DISK, REASON_RWOP
from scheduler.core.profile import Profile
from scheduler.core.snapshot import Snapshot
from scheduler.core.volumes import VolumeState, volume_state_from_api
from scheduler.model.errors import InvalidObjectError
from scheduler.model.pod import Pod, StorageVolume
from tests.builders import make_node, make_pod
from tests.core.support import only_filter
from tests.e2e.differential.volumes_objects import (
    Body,
    claim_volume,
    csi_node,
    pv,
    pvc,
    schedule_with_volumes,
    storage_class,
)

GCE_DRIVER = "pd.csi.storage.gke.io"
EBS_DRIVER = "ebs.csi.aws.com"
PORTWORX_DRIVER = "pxd.portworx.com"


def disk_pod(name: str, *volumes: Body, node: str = "") -> Pod:
    builder = make_pod(name)
    builder.body["spec"]["volumes"] = list(volumes)
    if node:
        builder.node_name(node)
    return builder.build()


def gce(pd: str, read_only: bool = False, name: str = "d") -> Body:
    return {"name": name, "gcePersistentDisk": {"pdName": pd, "readOnly": read_only}}


def ebs(volume_id: str, read_only: bool = False, name: str = "d") -> Body:
    return {"name": name, "awsElasticBlockStore": {"volumeID": volume_id, "readOnly": read_only}}


def iscsi(iqn: str, lun: int = 0, read_only: bool = False, name: str = "d") -> Body:
    source = {"targetPortal": "10.0.0.1:3260", "iqn": iqn, "lun": lun, "readOnly": read_only}
    return {"name": name, "iscsi": source}


def rbd(
    monitors: Sequence[str], image: str, pool: str | None = None, read_only: bool = False
) -> Body:
    source: Body = {"monitors": list(monitors), "image": image, "readOnly": read_only}
    if pool is not None:
        source["pool"] = pool
    return {"name": "d", "rbd": source}


def state(
    csi_nodes: Sequence[Body] = (),
    placed: Sequence[Pod] = (),
    pvs: Sequence[Body] = (),
    pvcs: Sequence[Body] = (),
) -> VolumeState:
    built = volume_state_from_api(
        pvs=pvs,
        pvcs=pvcs,
        classes=[storage_class("local")],
        csi_nodes=csi_nodes,
        attachments=[],
        placed_pods=placed,
    )
    assert not built.skipped
    return built.state


def two_nodes(*placed: Pod) -> Snapshot:
    snap = Snapshot()
    for name in ("a", "b"):
        snap.add_node(make_node(name).build())
    for p in placed:
        snap.add_pod(p, p.node_name)
    return snap


# ----------------------------------------------------------------------------- the model
def test_inline_disks_keep_their_identity() -> None:
    pod = disk_pod(
        "p",
        gce("pd-1", read_only=True),
        {**ebs("vol-1"), "name": "e"},
        {**iscsi("iqn.2001-04.com.example:disk", lun=3), "name": "i"},
        {**rbd(["m1", "m2"], "img"), "name": "r"},
        {**rbd(["m1"], "img", pool="fast"), "name": "r2"},
        {"name": "az", "azureDisk": {"diskName": "x", "diskURI": "/subscriptions/s/disks/x"}},
        {"name": "c", "cinder": {"volumeID": "cv"}},
        {"name": "px", "portworxVolume": {"volumeID": "pv"}},
        {"name": "vs", "vsphereVolume": {"volumePath": "[ds] v.vmdk"}},
        {"name": "af", "azureFile": {"secretName": "s", "shareName": "share"}},
        {"name": "tmp", "emptyDir": {}},
    )
    assert pod.storage_volumes == (
        StorageVolume("d", "gcePersistentDisk", disk="pd-1", read_only=True),
        StorageVolume("e", "awsElasticBlockStore", disk="vol-1"),
        StorageVolume("i", "iscsi", disk="iqn.2001-04.com.example:disk"),
        StorageVolume("r", "rbd", disk="img", monitors=frozenset({"m1", "m2"}), pool="rbd"),
        StorageVolume("r2", "rbd", disk="img", monitors=frozenset({"m1"}), pool="fast"),
        StorageVolume("az", "azureDisk", disk="/subscriptions/s/disks/x"),
        StorageVolume("c", "cinder", disk="cv"),
        StorageVolume("px", "portworxVolume", disk="pv"),
        StorageVolume("vs", "vsphereVolume", disk="[ds] v.vmdk"),
        StorageVolume("af", "azureFile", disk="share"),
    )


@pytest.mark.parametrize(
    ("volume", "field"),
    [
        pytest.param({"gcePersistentDisk": "pd"}, "spec.volumes[0].gcePersistentDisk", id="source"),
        pytest.param(
            {"gcePersistentDisk": {"pdName": 7}},
            "spec.volumes[0].gcePersistentDisk.pdName",
            id="pd",
        ),
        pytest.param(
            {"awsElasticBlockStore": {"volumeID": "v", "readOnly": "yes"}},
            "spec.volumes[0].awsElasticBlockStore.readOnly",
            id="read-only",
        ),
        pytest.param(
            {"rbd": {"monitors": "m1", "image": "i"}}, "spec.volumes[0].rbd.monitors", id="monitors"
        ),
        pytest.param({"rbd": {"image": "i", "pool": 1}}, "spec.volumes[0].rbd.pool", id="pool"),
        pytest.param({"iscsi": {"iqn": ["x"]}}, "spec.volumes[0].iscsi.iqn", id="iqn"),
    ],
)
def test_malformed_disks_name_the_field(volume: dict[str, Any], field: str) -> None:
    with pytest.raises(InvalidObjectError) as caught:
        disk_pod("p", {"name": "d", **volume})
    assert caught.value.field == field


# ------------------------------------------------------------------ VolumeRestrictions
@pytest.mark.parametrize(
    ("existing", "incoming", "conflict"),
    [
        pytest.param(gce("pd"), gce("pd"), True, id="gce-read-write"),
        pytest.param(gce("pd", True), gce("pd"), True, id="gce-one-read-only"),
        pytest.param(gce("pd", True), gce("pd", True), False, id="gce-both-read-only"),
        pytest.param(gce("pd"), gce("other"), False, id="gce-other-disk"),
        pytest.param(ebs("vol-1", True), ebs("vol-1", True), True, id="ebs-even-read-only"),
        pytest.param(ebs("aws://z1/vol-1"), ebs("vol-1"), False, id="ebs-ids-compared-as-written"),
        pytest.param(ebs("vol-1"), gce("vol-1"), False, id="other-source"),
        pytest.param(iscsi("iqn.a:x", lun=1), iscsi("iqn.a:x", lun=2), True, id="iscsi-same-iqn"),
        pytest.param(iscsi("iqn.a:x", read_only=True), iscsi("iqn.a:x", read_only=True), False),
        pytest.param(iscsi("iqn.a:x"), iscsi("iqn.a:y"), False, id="iscsi-other-iqn"),
        pytest.param(rbd(["m1", "m2"], "i"), rbd(["m2", "m3"], "i"), True, id="rbd-monitor-shared"),
        pytest.param(rbd(["m1"], "i"), rbd(["m1"], "i", pool="rbd"), True, id="rbd-default-pool"),
        pytest.param(rbd(["m1"], "i"), rbd(["m1"], "i", pool="fast"), False, id="rbd-other-pool"),
        pytest.param(rbd(["m1"], "i"), rbd(["m2"], "i"), False, id="rbd-disjoint-monitors"),
        pytest.param(rbd(["m1"], "i"), rbd(["m1"], "j"), False, id="rbd-other-image"),
        pytest.param(rbd(["m"], "i", read_only=True), rbd(["m"], "i", read_only=True), False),
    ],
)
def test_disk_conflicts(existing: Body, incoming: Body, conflict: bool) -> None:
    holder = disk_pod("holder", {"name": "tmp", "emptyDir": {}}, existing, node="a")
    snap = two_nodes(holder)
    decision, _ = schedule_with_volumes(snap, disk_pod("p", incoming), state(placed=[holder]))
    if conflict:
        assert decision.feasible == ("b",)
        assert decision.reason_counts() == {REASON_DISK: 1}
        assert decision.explanation.node("a").reasons == (REASON_DISK,)
    else:
        assert set(decision.feasible) == {"a", "b"}


def test_disk_conflict_is_unschedulable_and_needs_no_volume_state() -> None:
    """Preemption may help (the holder can go), and the check reads only the snapshot."""
    holder = disk_pod("holder", gce("pd"), node="a")
    snap = two_nodes(holder, disk_pod("other", gce("pd"), node="b"))
    decision = only_filter(volume_restrictions.NAME).schedule(snap, disk_pod("p", gce("pd")))
    assert decision.selected is None
    assert decision.reason_counts() == {REASON_DISK: 2}
    assert decision.explanation.code is Code.UNSCHEDULABLE


def test_prefilter_skips_pods_without_conflicting_disks() -> None:
    holder = disk_pod("holder", gce("pd"), node="a")
    snap = two_nodes(holder)
    framework = only_filter(volume_restrictions.NAME)
    for volume in ({"name": "c", "cinder": {"volumeID": "pd"}}, {"name": "e", "emptyDir": {}}):
        decision = framework.schedule(snap, disk_pod("p", volume), volumes=state(placed=[holder]))
        assert decision.explanation.skipped_filters == (volume_restrictions.NAME,)


def test_disk_conflict_comes_before_read_write_once_pod() -> None:
    """kube's Filter: the disk first, then a ReadWriteOncePod claim in use (every node)."""
    holder = disk_pod("holder", gce("pd"), claim_volume("v", "solo"), node="a")
    snap = two_nodes(holder)
    claim = pvc("solo", modes=["ReadWriteOncePod"], volume_name="x", bound=True)
    volumes = state(placed=[holder], pvs=[pv("x", phase="Bound")], pvcs=[claim])
    incoming = disk_pod("p", gce("pd"), claim_volume("v", "solo"))
    decision, _ = schedule_with_volumes(snap, incoming, volumes)
    assert decision.reason_counts() == {REASON_DISK: 1, REASON_RWOP: 1}


# -------------------------------------------------------------------- NodeVolumeLimits
def limits(
    existing: Body | None,
    incoming: Body,
    *,
    a: Body | None,
    b: Body | None = None,
) -> set[str]:
    """Feasible nodes for a pod with ``incoming`` when node "a" already runs a pod with
    ``existing`` and the nodes have the CSINodes ``a`` and ``b``."""
    placed = [disk_pod("holder", existing, node="a")] if existing is not None else []
    nodes = [n for n in (a, b) if n is not None]
    decision, _ = schedule_with_volumes(
        two_nodes(*placed), disk_pod("p", incoming), state(nodes, placed)
    )
    rejected = 2 - len(decision.feasible)
    assert decision.reason_counts() == ({LIMIT_REASON: rejected} if rejected else {})
    return set(decision.feasible)


@pytest.mark.parametrize(
    ("existing", "incoming", "driver", "migrated", "feasible"),
    [
        pytest.param(
            gce("one"), gce("two"), GCE_DRIVER, (), {"b"}, id="gce-counts-without-annotation"
        ),
        pytest.param(
            gce("one", True),
            gce("one", True),
            GCE_DRIVER,
            (),
            {"a", "b"},
            id="gce-shared-disk-free",
        ),
        pytest.param(ebs("vol-1"), ebs("vol-2"), EBS_DRIVER, (), {"b"}, id="ebs"),
        pytest.param(
            ebs("aws://z1/vol-1"), ebs("vol-1"), EBS_DRIVER, (), {"a", "b"}, id="ebs-one-handle"
        ),
        pytest.param(
            {"name": "az", "azureDisk": {"diskName": "x", "diskURI": "/s/x"}},
            {"name": "az", "azureDisk": {"diskName": "y", "diskURI": "/s/y"}},
            "disk.csi.azure.com",
            (),
            {"b"},
            id="azure-disk",
        ),
        pytest.param(
            {"name": "c", "cinder": {"volumeID": "c1"}},
            {"name": "c", "cinder": {"volumeID": "c2"}},
            "cinder.csi.openstack.org",
            (),
            {"b"},
            id="cinder",
        ),
        pytest.param(
            {"name": "x", "portworxVolume": {"volumeID": "p1"}},
            {"name": "x", "portworxVolume": {"volumeID": "p2"}},
            PORTWORX_DRIVER,
            ("kubernetes.io/portworx-volume",),
            {"b"},
            id="portworx-migrated",
        ),
        pytest.param(
            {"name": "x", "portworxVolume": {"volumeID": "p1"}},
            {"name": "x", "portworxVolume": {"volumeID": "p2"}},
            PORTWORX_DRIVER,
            ("kubernetes.io/gce-pd",),
            {"b"},
            id="portworx-without-annotation-from-1.36",
        ),
        pytest.param(
            {"name": "v", "vsphereVolume": {"volumePath": "v1"}},
            {"name": "v", "vsphereVolume": {"volumePath": "v2"}},
            "csi.vsphere.vmware.com",
            ("kubernetes.io/vsphere-volume",),
            {"a", "b"},
            id="vsphere-never",
        ),
        pytest.param(
            {"name": "f", "azureFile": {"secretName": "s", "shareName": "s1"}},
            {"name": "f", "azureFile": {"secretName": "s", "shareName": "s2"}},
            "file.csi.azure.com",
            ("kubernetes.io/azure-file",),
            {"a", "b"},
            id="azure-file-never",
        ),
        pytest.param(
            rbd(["m"], "i1"),
            rbd(["m"], "i2"),
            "rbd.csi.ceph.com",
            ("kubernetes.io/rbd",),
            {"a", "b"},
            id="rbd-never",
        ),
    ],
)
def test_migrated_inline_disks_count_against_the_csi_driver(
    existing: Body, incoming: Body, driver: str, migrated: tuple[str, ...], feasible: set[str]
) -> None:
    """Node "a" allows one volume of the driver and has one; "b" allows one and has none."""
    a = csi_node("a", {driver: 1}, migrated)
    b = csi_node("b", {driver: 1}, migrated)
    assert limits(existing, incoming, a=a, b=b) == feasible


def test_portworx_needs_the_annotation_in_1_35() -> None:
    """kube 1.35's isCSIMigrationOn reads the CSINode's migrated-plugins annotation for
    Portworx (1.36 dropped that check): without it the disk is not counted."""
    px = [{"name": "x", "portworxVolume": {"volumeID": f"p{i}"}} for i in (1, 2)]
    nodes = [csi_node(n, {PORTWORX_DRIVER: 1}, ("kubernetes.io/gce-pd",)) for n in "ab"]
    placed = [disk_pod("holder", px[0], node="a")]
    for minor, feasible in ((35, {"a", "b"}), (36, {"b"}), (37, {"b"})):
        decision, _ = schedule_with_volumes(
            two_nodes(*placed),
            disk_pod("p", px[1]),
            state(nodes, placed),
            profile=Profile(kube_minor=minor),
        )
        assert set(decision.feasible) == feasible, minor


def test_no_csinode_means_no_migration() -> None:
    """Without a CSINode, kube's isCSIMigrationOn is false: the disk is not counted."""
    assert limits(gce("one"), gce("two"), a=None, b=None) == {"a", "b"}


def test_inline_gce_disk_is_the_csi_pv_of_the_same_handle() -> None:
    handle = "projects/UNSPECIFIED/zones/UNSPECIFIED/disks/pd"
    volume = pv("x", phase="Bound", claim=("default", "c"), csi=(GCE_DRIVER, handle))
    claim = pvc("c", volume_name="x", bound=True)
    holder = disk_pod("holder", claim_volume("v", "c"), node="a")
    nodes = [csi_node("a", {GCE_DRIVER: 1}), csi_node("b", {GCE_DRIVER: 1})]
    decision, _ = schedule_with_volumes(
        two_nodes(holder), disk_pod("p", gce("pd")), state(nodes, [holder], [volume], [claim])
    )
    assert set(decision.feasible) == {"a", "b"}
    decision, _ = schedule_with_volumes(
        two_nodes(holder), disk_pod("p", gce("other")), state(nodes, [holder], [volume], [claim])
    )
    assert decision.feasible == ("b",)


def test_ebs_ids_as_kube_translates_them() -> None:
    assert ebs_volume_id("vol-1") == "vol-1"
    assert ebs_volume_id("aws://us-east-1a/vol-1") == "vol-1"
    assert ebs_volume_id("aws:///vol-1") == "vol-1"
    assert ebs_volume_id("anything") == "anything"
    for bad in ("aws://vol-1", "aws://z/x/vol-1", "aws://z/disk-1"):
        with pytest.raises(TranslationError):
            ebs_volume_id(bad)


def test_untranslatable_ebs_id_rejects_every_candidate() -> None:
    """kube ends the attempt with an Error at the first node that translates it."""
    nodes = [csi_node("a", {EBS_DRIVER: 5})]
    decision, _ = schedule_with_volumes(
        two_nodes(), disk_pod("p", ebs("aws://z1/nope", name="e")), state(nodes)
    )
    message = (
        "converting volume(e) from inline to csi: failed to translate Kubernetes ID to EBS "
        "Volume ID Invalid format for AWS volume (aws://z1/nope)"
    )
    assert decision.selected is None
    assert decision.reason_counts() == {message: 2}
