"""``spec.topology.fromKueue`` end to end: the levels read from a Kueue Topology, through
the shipped RBAC, and followed live.

Lattice starts before Kueue's API exists (the condition says it is not served); the
Topology CRD (a stand-in with Kueue's API shape: ``fixtures/kueue-topologies-crd.yaml``)
and a Topology without a rack level are created; a gang that requires one rack is placed
in one rack, and a gang sliced by rack is refused (rack is no level). The Topology is then
changed as Kueue allows (its levels are immutable: deleted and re-created with a rack
level), and the refused gang is read again and placed, each slice in one rack.

Kwok nodes (8 GPUs each; members of 4 GPUs, so 2 a node), all in block b1:
rack r1: 2 nodes (4 members), rack r2: 1 node (2), rack r3: 2 nodes (4).
"""

from __future__ import annotations

import collections
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import yaml
from kubernetes_asyncio import client

from lattice_dev.devcluster.cluster import ClusterConfig
from lattice_dev.devcluster.kube import create_nodes, node_is_ready, poll
from lattice_dev.devcluster.profiles import get_profile
from tests.e2e.lattice_proc import LatticeProcess
from tests.e2e.test_gang_topology import group
from tests.e2e.test_gangs import events_of, set_spec, wait_names_bound
from tests.e2e.test_scheduler import Plane, lattice_plane, list_pods

BLOCK, RACK, HOST = "example.com/block", "example.com/rack", "kubernetes.io/hostname"
POOL = "example.com/pool"
RACKS = {"r1": 2, "r2": 1, "r3": 2}
KUEUE = ("kueue.x-k8s.io", "v1beta2", "topologies")
CRD = Path(__file__).parent / "fixtures" / "kueue-topologies-crd.yaml"

pytestmark = pytest.mark.cluster


@pytest.fixture(scope="module")
def plane(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Plane]:
    config = ClusterConfig(nodes=0, node_profile="gpu-8x")
    with lattice_plane(tmp_path_factory.mktemp("kueueplane"), config) as p:
        yield p


@pytest.fixture(scope="module")
def sched(plane: Plane) -> Iterator[LatticeProcess]:
    proc = plane.lattice(identity="kueue").start()
    yield proc
    proc.stop()


async def topology_resolved(api: client.ApiClient) -> dict[str, Any] | None:
    obj: dict[str, Any] = await client.CustomObjectsApi(api).get_cluster_custom_object(
        "lattice.dev", "v1alpha1", "latticeschedulers", "lattice"
    )
    for c in (obj.get("status") or {}).get("conditions") or []:
        if c.get("type") == "TopologyResolved":
            return dict(c)
    return None


async def wait_reason(
    api: client.ApiClient, reason: str, ending: str = "", within: float = 30
) -> str:
    """The condition's message once its reason is ``reason`` (and its message ends with
    ``ending``): the status is written every few seconds."""

    async def reached() -> str | None:
        got = await topology_resolved(api)
        if got is None or got["reason"] != reason or not str(got["message"]).endswith(ending):
            return None
        return str(got["message"])

    return await poll(reached, within=within, interval=0.3)


async def create_topology(api: client.ApiClient, *labels: str) -> None:
    body = {
        "apiVersion": "kueue.x-k8s.io/v1beta2",
        "kind": "Topology",
        "metadata": {"name": "net"},
        "spec": {"levels": [{"nodeLabel": label} for label in labels]},
    }
    await client.CustomObjectsApi(api).create_cluster_custom_object(*KUEUE, body)


async def test_levels_follow_a_kueue_topology_live(
    plane: Plane, api: client.ApiClient, ns: str, sched: LatticeProcess
) -> None:
    await set_spec(api, {"topology": {"fromKueue": "net"}})
    message = await wait_reason(api, "KueueAPINotServed")
    assert "does not serve topologies.kueue.x-k8s.io" in message, message

    crd = yaml.safe_load(CRD.read_text())
    plane.run("apply", "--server-side", "-f", "-", stdin=yaml.safe_dump(crd))
    plane.run("wait", "--for=condition=Established", "crd/topologies.kueue.x-k8s.io")
    await wait_reason(api, "KueueTopologyNotFound")  # discovery again within 10 s
    await create_topology(api, BLOCK, HOST)
    message = await wait_reason(api, "KueueTopologyRead")
    assert message == f"levels from Kueue Topology net (kueue.x-k8s.io/v1beta2): {BLOCK}, {HOST}"

    profile = get_profile("gpu-8x")
    bodies = []
    for rack, count in RACKS.items():
        for i in range(count):
            body = profile.node_body(f"kwok-{rack}-{i}", i)
            body["metadata"]["labels"] |= {BLOCK: "b1", RACK: rack, POOL: "kueue"}
            bodies.append(body)
    await create_nodes(api, bodies)
    core = client.CoreV1Api(api)

    async def ready() -> bool:
        nodes = (await core.list_node(label_selector=f"{POOL}=kueue")).items
        return len(nodes) == len(bodies) and all(node_is_ready(n) for n in nodes)

    await poll(ready, within=60, interval=0.5)

    # Required rack, 4 members: one of the racks of 4 (r1 or r3) takes them all.
    await group(api, ns, "req", 4, "kueue", **{"lattice.dev/topology-required": RACK})
    await wait_names_bound(api, ns, {f"req-{i}" for i in range(4)}, within=60)
    racks = await racks_of(api, ns, "req-")
    assert len(set(racks.values())) == 1, racks
    assert next(iter(racks.values())) in ("r1", "r3"), racks

    # Slices by rack while the Topology has no rack level: refused, and it says so.
    sliced = {"lattice.dev/topology-slice-size": "2", "lattice.dev/topology-slice-required": RACK}
    await group(api, ns, "sl", 4, "kueue", **sliced)

    async def refused() -> str | None:
        for e in await events_of(api, ns, "FailedScheduling"):
            if e.message.startswith(f"gang {ns}/sl: PodGroup is invalid"):
                return str(e.message)
        return None

    message = await poll(refused, within=30, interval=0.3)
    assert f"must be one of the levels of Kueue Topology net ({BLOCK}, {HOST})" in message

    # The Topology changed as Kueue allows: deleted, re-created with a rack level.
    await client.CustomObjectsApi(api).delete_cluster_custom_object(*KUEUE, "net")
    await create_topology(api, BLOCK, RACK, HOST)
    await wait_names_bound(api, ns, {f"sl-{i}" for i in range(4)}, within=60)
    await wait_reason(api, "KueueTopologyRead", ending=f": {BLOCK}, {RACK}, {HOST}")
    by_slice: dict[str, list[str]] = collections.defaultdict(list)
    slices = await racks_of(api, ns, "sl-", by="lattice.dev/topology-slice")
    for pod_name, rack in (await racks_of(api, ns, "sl-")).items():
        by_slice[slices[pod_name]].append(rack)
    assert sorted(by_slice) == ["0", "1"], by_slice
    assert all(len(r) == 2 and len(set(r)) == 1 for r in by_slice.values()), by_slice


async def racks_of(api: client.ApiClient, ns: str, prefix: str, by: str = "") -> dict[str, str]:
    """Each bound pod's rack (its node's label), or with ``by`` the pod's annotation."""
    core = client.CoreV1Api(api)
    out = {}
    for p in await list_pods(api, ns):
        name = p["metadata"]["name"]
        if not name.startswith(prefix) or not p["spec"].get("nodeName"):
            continue
        if by:
            out[name] = (p["metadata"].get("annotations") or {})[by]
        else:
            node = await core.read_node(p["spec"]["nodeName"])
            out[name] = node.metadata.labels[RACK]
    return out
