"""Gangs placed in the network, end to end: kwok GPU nodes labelled with block and rack, a
LatticeScheduler with ``spec.topology.levels``, PodGroups with required and preferred
levels, and slices. The checks read the bound pods' nodes, their slice annotations and the
nodes' labels from the API server, not from the scheduler.

Layout (8 GPUs a node, members of 4 GPUs, so 2 members a node):

    block b1: rack r11 (2 nodes, 4 members), rack r12 (1 node, 2 members)
    block b2: rack r21 (2 nodes, 4 members), rack r22 (1 node, 2 members)
"""

from __future__ import annotations

import collections
from collections.abc import Iterator
from typing import Any

import pytest
from kubernetes_asyncio import client

from lattice_dev.devcluster.cluster import ClusterConfig
from lattice_dev.devcluster.kube import create_nodes, node_is_ready, poll
from lattice_dev.devcluster.profiles import get_profile
from tests.e2e.lattice_proc import LatticeProcess
from tests.e2e.test_gangs import events_of, set_spec, wait_names_bound
from tests.e2e.test_scheduler import Plane, create_pods, lattice_plane, list_pods

BLOCK, RACK = "example.com/block", "example.com/rack"
LEVELS = [BLOCK, RACK, "kubernetes.io/hostname"]
POOL = "example.com/pool"
LAYOUT = {"b1": {"r11": 2, "r12": 1}, "b2": {"r21": 2, "r22": 1}}
GROUP = ("scheduling.x-k8s.io", "v1alpha1", "podgroups")

pytestmark = pytest.mark.cluster


@pytest.fixture(scope="module")
def plane(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Plane]:
    config = ClusterConfig(nodes=0, node_profile="gpu-8x")
    with lattice_plane(tmp_path_factory.mktemp("topoplane"), config) as p:
        yield p


@pytest.fixture(scope="module")
def sched(plane: Plane) -> Iterator[LatticeProcess]:
    proc = plane.lattice(identity="topology").start()
    yield proc
    proc.stop()


def member(name: str, group: str, pool: str = "topology") -> dict[str, Any]:
    gpus = {"cpu": "1", "memory": "1Gi", "nvidia.com/gpu": "4"}
    return {
        "apiVersion": "v1",
        "kind": "Pod",
        "metadata": {"name": name, "labels": {"scheduling.x-k8s.io/pod-group": group}},
        "spec": {
            "schedulerName": "lattice",
            "nodeSelector": {POOL: pool},
            "containers": [
                {
                    "name": "c",
                    "image": "busybox",
                    "resources": {"requests": gpus, "limits": {"nvidia.com/gpu": "4"}},
                }
            ],
        },
    }


async def group(
    api: client.ApiClient,
    ns: str,
    name: str,
    size: int,
    pool: str = "topology",
    **annotations: str,
) -> None:
    body = {
        "apiVersion": "scheduling.x-k8s.io/v1alpha1",
        "kind": "PodGroup",
        "metadata": {"name": name, "annotations": annotations},
        "spec": {"minMember": size},
    }
    await client.CustomObjectsApi(api).create_namespaced_custom_object(
        *GROUP[:2], ns, GROUP[2], body
    )
    await create_pods(api, ns, [member(f"{name}-{i}", name, pool) for i in range(size)])


async def rack_nodes(
    api: client.ApiClient, layout: dict[str, dict[str, int]], pool: str, prefix: str = "kwok"
) -> None:
    """kwok GPU nodes (``{block: {rack: nodes}}``) labelled with their block, rack and pool,
    created and Ready."""
    profile = get_profile("gpu-8x")
    bodies = []
    for block, racks in layout.items():
        for rack, count in racks.items():
            for i in range(count):
                body = profile.node_body(f"{prefix}-{rack}-{i}", i)
                body["metadata"]["labels"] |= {BLOCK: block, RACK: rack, POOL: pool}
                bodies.append(body)
    await create_nodes(api, bodies)
    core = client.CoreV1Api(api)

    async def ready() -> bool:
        nodes = (await core.list_node(label_selector=f"{POOL}={pool}")).items
        return len(nodes) == len(bodies) and all(node_is_ready(n) for n in nodes)

    await poll(ready, within=120, interval=0.5)


async def domains_of(api: client.ApiClient, ns: str, prefix: str) -> list[tuple[str, str]]:
    """(block, rack) of each bound member's node, read from the Node objects."""
    core = client.CoreV1Api(api)
    out = []
    for p in await list_pods(api, ns):
        if p["metadata"]["name"].startswith(prefix) and p["spec"].get("nodeName"):
            node = await core.read_node(p["spec"]["nodeName"])
            labels = node.metadata.labels or {}
            out.append((labels[BLOCK], labels[RACK]))
    return out


async def spec_valid(api: client.ApiClient) -> tuple[str, str] | None:
    obj: dict[str, Any] = await client.CustomObjectsApi(api).get_cluster_custom_object(
        "lattice.dev", "v1alpha1", "latticeschedulers", "lattice"
    )
    for c in (obj.get("status") or {}).get("conditions") or []:
        if c.get("type") == "SpecValid":
            return str(c.get("status")), str(c.get("message"))
    return None


async def test_required_and_preferred_levels_on_labelled_racks(
    api: client.ApiClient, ns: str, sched: LatticeProcess
) -> None:
    # Invalid levels are reported, not fatal; valid ones take effect live.
    await set_spec(api, {"topology": {"levels": ["example.com/block", "a rack"]}})

    async def refused() -> str | None:
        got = await spec_valid(api)
        return got[1] if got is not None and got[0] == "False" else None

    message = await poll(refused, within=60, interval=0.5)
    assert "spec.topology.levels[1]: 'a rack'" in message
    await set_spec(api, {"topology": {"levels": LEVELS}})

    async def applied() -> bool:
        got = await spec_valid(api)
        return got is not None and got[0] == "True"

    await poll(applied, within=60, interval=0.5)

    await rack_nodes(api, LAYOUT, "topology")
    core = client.CoreV1Api(api)

    # Required rack, 5 members: no rack holds more than 4. Nothing binds; it says why.
    await group(api, ns, "wide", 5, **{"lattice.dev/topology-required": RACK})

    async def explained() -> str | None:
        for e in await events_of(api, ns, "FailedScheduling"):
            if e.message.startswith(f"gang {ns}/wide:") and "quorum" not in e.message:
                return str(e.message)
        return None

    message = await poll(explained, within=60, interval=0.5)
    assert f"no domain of {RACK} holds 5 members together" in message, message
    assert f"needs 20 GPUs in one {RACK}; the most free in one is 16" in message, message
    assert await domains_of(api, ns, "wide-") == []
    for i in range(5):
        await core.delete_namespaced_pod(f"wide-{i}", ns, grace_period_seconds=0)

    # Preferred rack, 3 members: one rack (r11 or r21 hold 4).
    await group(api, ns, "small", 3, **{"lattice.dev/topology-preferred": RACK})
    await wait_names_bound(api, ns, {f"small-{i}" for i in range(3)}, within=60)
    small = await domains_of(api, ns, "small-")
    assert len(set(small)) == 1, small
    taken_block = small[0][0]

    # Required block, preferred rack, 6 members: only the other block has 6 free slots
    # (4 + 2); no rack holds 6, so two racks, both of that block.
    await group(
        api,
        ns,
        "big",
        6,
        **{"lattice.dev/topology-required": BLOCK, "lattice.dev/topology-preferred": RACK},
    )
    await wait_names_bound(api, ns, {f"big-{i}" for i in range(6)}, within=60)
    big = await domains_of(api, ns, "big-")
    assert len({b for b, _ in big}) == 1, big
    assert big[0][0] != taken_block
    assert sorted(collections.Counter(r for _, r in big).values()) == [2, 4], big


async def test_slices_each_inside_one_rack(
    api: client.ApiClient, ns: str, sched: LatticeProcess
) -> None:
    """8 members in slices of 4 on their own racks holding 4, 2, 2 and 4 members: only
    the two racks of 4 hold a slice, so each takes one slice. Checked from each bound
    pod's ``lattice.dev/topology-slice`` annotation and its node's labels."""
    await set_spec(api, {"topology": {"levels": LEVELS}})
    await rack_nodes(api, {"b9": {"s1": 2, "s2": 1, "s3": 1, "s4": 2}}, "slices")
    core = client.CoreV1Api(api)

    # A slice level that is not a configured level: the PodGroup is invalid and says so.
    await group(
        api,
        ns,
        "badslice",
        4,
        "slices",
        **{"lattice.dev/topology-slice-size": "4", "lattice.dev/topology-slice-required": POOL},
    )

    async def invalid() -> str | None:
        for e in await events_of(api, ns, "FailedScheduling"):
            if e.message.startswith(f"gang {ns}/badslice: PodGroup is invalid"):
                return str(e.message)
        return None

    message = await poll(invalid, within=60, interval=0.5)
    assert "must be one of spec.topology.levels" in message, message
    for i in range(4):
        await core.delete_namespaced_pod(f"badslice-{i}", ns, grace_period_seconds=0)

    slices = {"lattice.dev/topology-slice-size": "4", "lattice.dev/topology-slice-required": RACK}
    await group(api, ns, "tp", 8, "slices", **slices)
    await wait_names_bound(api, ns, {f"tp-{i}" for i in range(8)}, within=60)
    by_slice: dict[str, list[str]] = collections.defaultdict(list)
    for p in await list_pods(api, ns):
        if not p["metadata"]["name"].startswith("tp-"):
            continue
        node = await core.read_node(p["spec"]["nodeName"])
        annotations = p["metadata"].get("annotations") or {}
        by_slice[annotations["lattice.dev/topology-slice"]].append(node.metadata.labels[RACK])
    assert sorted(by_slice) == ["0", "1"], by_slice
    for k, rack_list in by_slice.items():
        assert len(rack_list) == 4, (k, by_slice)
        assert len(set(rack_list)) == 1, (k, by_slice)
    assert {r[0] for r in by_slice.values()} == {"s1", "s4"}, by_slice
