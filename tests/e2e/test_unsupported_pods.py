"""Pods Lattice cannot place correctly are refused with a clear event, never bound; pods
with claims or inline disks, which it now places, land where their volumes allow.

`lattice run` runs as a real process with the shipped RBAC on a 3-node control plane
(helpers from test_scheduler). The cluster holds what such pods reference, as a user's
would: a WaitForFirstConsumer StorageClass, a local PersistentVolume pinned to one node
with a PVC bound to it, a second local PV on another node for a generic ephemeral volume
whose PVC the controller creates, a DeviceClass, a ResourceClaimTemplate and a
ResourceClaim (resource.k8s.io/v1 is served by 1.34 without feature gates). The DRA pods
must get a FailedScheduling event and ``PodScheduled=False`` naming what is unsupported,
and stay unbound; the claim pods are bound on their PVs' nodes; two pods mounting the same
inline GCE disk read-write are both bound, on different nodes (VolumeRestrictions).
"""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any, Final

import pytest
import yaml
from kubernetes_asyncio import client

from scheduler.core.plugins.unsupported import NO_DRA
from scheduler.devcluster.cluster import ClusterConfig
from scheduler.devcluster.kube import poll
from tests.e2e.differential.volumes_objects import pv, storage_class
from tests.e2e.test_scheduler import (
    Plane,
    create_pods,
    lattice_plane,
    list_pods,
    pod,
    wait_bound,
    wait_scheduled_events,
)

NODES: Final = 3
PINNED_NODE: Final = "kwok-node-0001"
SCRATCH_NODE: Final = "kwok-node-0002"
ADVICE: Final = "use the default scheduler for this pod"


@pytest.fixture(scope="module")
def plane(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Plane]:
    with lattice_plane(tmp_path_factory.mktemp("unsupported"), ClusterConfig(nodes=NODES)) as p:
        yield p


def referenced_objects(ns: str) -> list[dict[str, Any]]:
    """What the refused pods point at: storage pinned to one node, DRA claims."""
    device_request = {"name": "gpu", "exactly": {"deviceClassName": f"{ns}-gpu"}}
    scratch = pv(f"{ns}-scratch", "1Gi", storage_class=f"{ns}-local", host=SCRATCH_NODE)
    scratch.pop("status")
    return [
        storage_class(f"{ns}-local"),
        scratch,
        {
            "apiVersion": "v1",
            "kind": "PersistentVolume",
            "metadata": {"name": f"{ns}-ckpt"},
            "spec": {
                "capacity": {"storage": "1Gi"},
                "accessModes": ["ReadWriteOnce"],
                "storageClassName": f"{ns}-local",
                "local": {"path": "/mnt/ckpt"},
                "claimRef": {"namespace": ns, "name": "ckpt"},
                "nodeAffinity": {
                    "required": {
                        "nodeSelectorTerms": [
                            {
                                "matchExpressions": [
                                    {
                                        "key": "kubernetes.io/hostname",
                                        "operator": "In",
                                        "values": [PINNED_NODE],
                                    }
                                ]
                            }
                        ]
                    }
                },
            },
        },
        {
            "apiVersion": "v1",
            "kind": "PersistentVolumeClaim",
            "metadata": {"name": "ckpt", "namespace": ns},
            "spec": {
                "accessModes": ["ReadWriteOnce"],
                "storageClassName": f"{ns}-local",
                "volumeName": f"{ns}-ckpt",
                "resources": {"requests": {"storage": "1Gi"}},
            },
        },
        {
            "apiVersion": "resource.k8s.io/v1",
            "kind": "DeviceClass",
            "metadata": {"name": f"{ns}-gpu"},
            "spec": {"selectors": [{"cel": {"expression": 'device.driver == "gpu.example.com"'}}]},
        },
        {
            "apiVersion": "resource.k8s.io/v1",
            "kind": "ResourceClaimTemplate",
            "metadata": {"name": "one-gpu", "namespace": ns},
            "spec": {"spec": {"devices": {"requests": [device_request]}}},
        },
        {
            "apiVersion": "resource.k8s.io/v1",
            "kind": "ResourceClaim",
            "metadata": {"name": "shared-gpu", "namespace": ns},
            "spec": {"devices": {"requests": [device_request]}},
        },
    ]


def claim_pods(ns: str) -> dict[str, tuple[dict[str, Any], str]]:
    """Pod name -> (body, the node its volume pins it to)."""
    ephemeral = {
        "volumeClaimTemplate": {
            "spec": {
                "accessModes": ["ReadWriteOnce"],
                "storageClassName": f"{ns}-local",
                "resources": {"requests": {"storage": "1Gi"}},
            }
        }
    }
    return {
        "with-pvc": (
            pod(
                "with-pvc",
                volumes=[
                    {"name": "tmp", "emptyDir": {}},
                    {"name": "data", "persistentVolumeClaim": {"claimName": "ckpt"}},
                ],
            ),
            PINNED_NODE,
        ),
        "with-ephemeral": (
            pod("with-ephemeral", volumes=[{"name": "scratch", "ephemeral": ephemeral}]),
            SCRATCH_NODE,
        ),
    }


def disk_pods() -> dict[str, dict[str, Any]]:
    """Two pods mounting one GCE disk read-write: never on the same node."""
    disk = {"name": "disk", "gcePersistentDisk": {"pdName": "training-data", "fsType": "ext4"}}
    return {name: pod(name, volumes=[disk]) for name in ("with-disk", "with-same-disk")}


def refused_pods() -> dict[str, tuple[dict[str, Any], str]]:
    """Pod name -> (body, the reason its FailedScheduling must carry)."""
    return {
        "with-claim-template": (
            pod(
                "with-claim-template",
                resourceClaims=[{"name": "gpu", "resourceClaimTemplateName": "one-gpu"}],
            ),
            f'pod has resource claim "gpu" (ResourceClaimTemplate "one-gpu"): {NO_DRA}; {ADVICE}',
        ),
        "with-claim": (
            pod("with-claim", resourceClaims=[{"name": "gpu", "resourceClaimName": "shared-gpu"}]),
            f'pod has resource claim "gpu" (ResourceClaim "shared-gpu"): {NO_DRA}; {ADVICE}',
        ),
    }


async def test_unsupported_pods_are_refused_and_claim_pods_placed_on_their_volumes(
    plane: Plane, api: client.ApiClient, ns: str
) -> None:
    objects = referenced_objects(ns)
    plane.run("apply", "-f", "-", stdin=yaml.safe_dump_all(objects))
    refused = refused_pods()
    claims = claim_pods(ns)
    disks = disk_pods()
    sched = plane.lattice().start()
    try:
        await create_pods(api, ns, [body for body, _ in refused.values()])
        await create_pods(api, ns, [body for body, _ in claims.values()])
        await create_pods(api, ns, list(disks.values()))
        await create_pods(api, ns, [pod("ordinary")])
        bound = await wait_bound(api, ns, 1 + len(claims) + len(disks), within=90)
        placed_on = {p["metadata"]["name"]: p["spec"]["nodeName"] for p in bound}
        assert placed_on == {
            "ordinary": placed_on.get("ordinary"),
            **{name: placed_on.get(name) for name in disks},
            **{name: node for name, (_, node) in claims.items()},
        }, placed_on
        assert placed_on["with-disk"] != placed_on["with-same-disk"], placed_on

        async def all_refused() -> dict[str, Any] | None:
            conditions = {}
            for p in await list_pods(api, ns):
                for c in p.get("status", {}).get("conditions") or []:
                    if c["type"] == "PodScheduled" and c["status"] == "False":
                        conditions[p["metadata"]["name"]] = c
            return conditions if set(refused) <= set(conditions) else None

        conditions = await poll(all_refused, within=60, interval=0.3)
        events = await client.CoreV1Api(api).list_namespaced_event(
            ns, field_selector="reason=FailedScheduling"
        )
        for name, (_, reason) in refused.items():
            message = (
                f"0/{NODES} nodes are available: {reason}. preemption: 0/{NODES} nodes are "
                f"available: {NODES} Preemption is not helpful for scheduling."
            )
            assert conditions[name]["reason"] == "Unschedulable"
            assert conditions[name]["message"] == message
            assert any(
                e.involved_object.name == name and e.message == message and e.type == "Warning"
                for e in events.items
            ), f"no FailedScheduling event for {name}"

        # The refusals were reported and the other pods bound after them: nothing left to
        # wait for. None of the refused was bound, assumed or got a Scheduled event.
        pods = {p["metadata"]["name"]: p for p in await list_pods(api, ns)}
        assert all(not pods[name]["spec"].get("nodeName") for name in refused)
        expected = {"ordinary", *claims, *disks}
        scheduled = await wait_scheduled_events(api, ns, len(expected))
        assert set(scheduled) == expected
        placed = {
            ln.get("pod") for ln in sched.lines() if ln.get("event") in ("pod_assumed", "pod_bound")
        }
        assert placed == {f"{ns}/{name}" for name in expected}
    finally:
        sched.stop()
        plane.run(
            "delete", "--wait=false", "-f", "-", stdin=yaml.safe_dump_all(objects), check=False
        )
    assert sched.proc is not None
    assert sched.proc.returncode == 0
