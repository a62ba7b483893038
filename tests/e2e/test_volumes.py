"""Volumes end to end: `lattice run` (with the shipped RBAC) binds pods with claims on a
real control plane whose kube-controller-manager runs the PV controller.

* A WaitForFirstConsumer claim whose only matching local PV is on one node: the pod lands
  there, and only after the PV controller bound the claim to that PV (our PreBind wrote
  the PV's claimRef, as kube-scheduler does for a static PV).
* A WaitForFirstConsumer claim of a provisioning StorageClass limited to one zone: the claim
  gets ``volume.kubernetes.io/selected-node`` naming a node of that zone and the pod waits,
  unbound, until a provisioner (this test) made the PV and the PV controller bound it.
* A pod whose claim does not exist yet gets a FailedScheduling event that names it, and is
  bound once the claim and a PV arrive.
"""

from __future__ import annotations

import contextlib
import json
from collections.abc import AsyncIterator, Iterator
from typing import Any, cast

import pytest
from kubernetes_asyncio import client

from lattice_dev.devcluster.cluster import ClusterConfig
from lattice_dev.devcluster.kube import poll
from scheduler.model.volume import BIND_COMPLETED, SELECTED_NODE
from tests.conftest import report_line
from tests.e2e.differential.volumes_objects import claim_volume, pv, pvc, storage_class
from tests.e2e.lattice_proc import LatticeProcess
from tests.e2e.test_scheduler import Plane, lattice_plane

NODES = 6
PROVISIONER = "example.com/e2e-provisioner"

pytestmark = pytest.mark.cluster


@pytest.fixture(scope="module")
def plane(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Plane]:
    config = ClusterConfig(nodes=NODES, node_profile="small")
    with lattice_plane(tmp_path_factory.mktemp("volumeplane"), config) as p:
        yield p


@pytest.fixture(scope="module")
def lattice(plane: Plane) -> Iterator[LatticeProcess]:
    proc = plane.lattice(identity="volumes").start()
    try:
        yield proc
    finally:
        proc.stop()


@pytest.fixture
async def storage(api: client.ApiClient, ns: str) -> AsyncIterator[list[str]]:
    """Names of the cluster-scoped objects a test made (PVs, classes), deleted after it."""
    made: list[str] = []
    yield made
    core, st = client.CoreV1Api(api), client.StorageV1Api(api)
    for name in made:
        with contextlib.suppress(client.ApiException):
            if name.startswith("sc/"):
                await st.delete_storage_class(name[3:])
            else:
                await core.delete_persistent_volume(name)


def claimant(name: str, claim: str) -> dict[str, Any]:
    return {
        "apiVersion": "v1",
        "kind": "Pod",
        "metadata": {"name": name},
        "spec": {
            "schedulerName": "lattice",
            "containers": [
                {"name": "c", "image": "busybox", "resources": {"requests": {"cpu": "100m"}}}
            ],
            "volumes": [claim_volume("data", claim)],
        },
    }


async def read(call: Any, *args: Any) -> dict[str, Any]:
    response: Any = await call(*args, _preload_content=False)
    body: dict[str, Any] = json.loads(await response.read())
    return body


async def nodes_by_zone(core: client.CoreV1Api) -> dict[str, list[str]]:
    out: dict[str, list[str]] = {}
    for n in (await read(core.list_node))["items"]:
        zone = n["metadata"]["labels"]["topology.kubernetes.io/zone"]
        out.setdefault(zone, []).append(n["metadata"]["name"])
    return {z: sorted(names) for z, names in out.items()}


async def test_a_wait_for_first_consumer_claim_binds_its_only_matching_local_pv(
    lattice: LatticeProcess, api: client.ApiClient, ns: str, storage: list[str]
) -> None:
    core, st = client.CoreV1Api(api), client.StorageV1Api(api)
    nodes = sorted(n for names in (await nodes_by_zone(core)).values() for n in names)
    klass = f"local-{ns}"
    await st.create_storage_class(cast(client.V1StorageClass, storage_class(klass)))
    storage.append(f"sc/{klass}")
    target = nodes[3]
    volumes = [
        pv(f"{ns}-match", "10Gi", storage_class=klass, host=target),
        pv(f"{ns}-small", "1Gi", storage_class=klass, host=nodes[0]),  # too small
        pv(f"{ns}-ro", "10Gi", storage_class=klass, host=nodes[1], modes=("ReadOnlyMany",)),
        pv(f"{ns}-other", "10Gi", storage_class=f"{klass}-x", host=nodes[2]),  # other class
    ]
    for body in volumes:
        body.pop("status")
        await core.create_persistent_volume(cast(client.V1PersistentVolume, body))
        storage.append(body["metadata"]["name"])
    await core.create_namespaced_persistent_volume_claim(
        ns,
        cast(client.V1PersistentVolumeClaim, pvc("data", "5Gi", namespace=ns, storage_class=klass)),
    )
    await core.create_namespaced_pod(ns, cast(client.V1Pod, claimant("trainer", "data")))

    async def placed() -> str | None:
        p = await read(core.read_namespaced_pod, "trainer", ns)
        return cast(str | None, p["spec"].get("nodeName"))

    assert await poll(placed, within=60, interval=0.3) == target
    # PreBind waited: when the pod got its node, the claim was already bound to the PV.
    claim = await read(core.read_namespaced_persistent_volume_claim, "data", ns)
    assert claim["spec"]["volumeName"] == f"{ns}-match"
    assert BIND_COMPLETED in claim["metadata"]["annotations"]
    volume = await read(core.read_persistent_volume, f"{ns}-match")
    ref = volume["spec"]["claimRef"]
    assert (ref["namespace"], ref["name"], ref["uid"]) == (ns, "data", claim["metadata"]["uid"])
    for name in (f"{ns}-small", f"{ns}-ro", f"{ns}-other"):
        assert "claimRef" not in (await read(core.read_persistent_volume, name))["spec"]
    report_line(f"volumes e2e: WaitForFirstConsumer claim bound to its only local PV on {target}")


async def test_a_provisioned_claim_gets_the_selected_node_and_the_pod_waits_for_it(
    lattice: LatticeProcess, api: client.ApiClient, ns: str, storage: list[str]
) -> None:
    core, st = client.CoreV1Api(api), client.StorageV1Api(api)
    zones = await nodes_by_zone(core)
    klass = f"prov-{ns}"
    body = storage_class(klass, provisioner=PROVISIONER, zones=["zone-b"])
    await st.create_storage_class(cast(client.V1StorageClass, body))
    storage.append(f"sc/{klass}")
    await core.create_namespaced_persistent_volume_claim(
        ns,
        cast(
            client.V1PersistentVolumeClaim, pvc("scratch", "5Gi", namespace=ns, storage_class=klass)
        ),
    )
    await core.create_namespaced_pod(ns, cast(client.V1Pod, claimant("worker", "scratch")))

    async def selected() -> str | None:
        claim = await read(core.read_namespaced_persistent_volume_claim, "scratch", ns)
        return cast(str | None, (claim["metadata"].get("annotations") or {}).get(SELECTED_NODE))

    node = await poll(selected, within=60, interval=0.3)
    assert node in zones["zone-b"], (node, zones)
    # No provisioner yet: the pod must wait unbound (kube's PreBind waits for the claim).
    pod = await read(core.read_namespaced_pod, "worker", ns)
    assert not pod["spec"].get("nodeName")

    # Play the provisioner: a PV on that node, pre-bound to the claim.
    claim = await read(core.read_namespaced_persistent_volume_claim, "scratch", ns)
    made = pv(f"{ns}-provisioned", "5Gi", storage_class=klass, host=node, claim=(ns, "scratch"))
    made.pop("status")
    made["spec"]["claimRef"]["uid"] = claim["metadata"]["uid"]
    made["metadata"]["annotations"] = {"pv.kubernetes.io/provisioned-by": PROVISIONER}
    await core.create_persistent_volume(cast(client.V1PersistentVolume, made))
    storage.append(made["metadata"]["name"])

    async def placed() -> str | None:
        p = await read(core.read_namespaced_pod, "worker", ns)
        return cast(str | None, p["spec"].get("nodeName"))

    assert await poll(placed, within=60, interval=0.3) == node
    claim = await read(core.read_namespaced_persistent_volume_claim, "scratch", ns)
    assert claim["spec"]["volumeName"] == f"{ns}-provisioned"
    report_line(f"volumes e2e: provisioned claim selected {node} (zone-b); pod bound after it")


async def test_a_missing_claim_is_reported_and_the_pod_binds_once_it_exists(
    lattice: LatticeProcess, api: client.ApiClient, ns: str, storage: list[str]
) -> None:
    core, st = client.CoreV1Api(api), client.StorageV1Api(api)
    nodes = sorted(n for names in (await nodes_by_zone(core)).values() for n in names)
    await core.create_namespaced_pod(ns, cast(client.V1Pod, claimant("late", "later")))

    async def refused() -> str | None:
        events = await core.list_namespaced_event(ns, field_selector="reason=FailedScheduling")
        for e in events.items:
            if e.involved_object.name == "late":
                return str(e.message)
        return None

    message = await poll(refused, within=60, interval=0.3)
    assert 'persistentvolumeclaim "later" not found' in message, message

    klass = f"late-{ns}"
    await st.create_storage_class(cast(client.V1StorageClass, storage_class(klass)))
    storage.append(f"sc/{klass}")
    body = pv(f"{ns}-late", "10Gi", storage_class=klass, host=nodes[5])
    body.pop("status")
    await core.create_persistent_volume(cast(client.V1PersistentVolume, body))
    storage.append(body["metadata"]["name"])
    await core.create_namespaced_persistent_volume_claim(
        ns,
        cast(
            client.V1PersistentVolumeClaim, pvc("later", "5Gi", namespace=ns, storage_class=klass)
        ),
    )

    async def placed() -> str | None:
        p = await read(core.read_namespaced_pod, "late", ns)
        return cast(str | None, p["spec"].get("nodeName"))

    assert await poll(placed, within=60, interval=0.3) == nodes[5]
