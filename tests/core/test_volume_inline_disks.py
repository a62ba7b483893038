"""Inline disks as kube 1.34 sees them: the Pod model's identities."""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import pytest

from scheduler.model.errors import InvalidObjectError
from scheduler.model.pod import Pod, StorageVolume
from tests.builders import make_pod
from tests.e2e.differential.volumes_objects import Body


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
