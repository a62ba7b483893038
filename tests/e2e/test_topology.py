"""GPU and NIC placement end to end on gpu-8x kwok nodes whose NodeTopology objects
were published by the real agent code (simulated agents on a fixture tree)."""

from __future__ import annotations

import collections
import json
from collections.abc import AsyncIterator, Iterator
from pathlib import Path
from typing import Any

import pytest
from kubernetes_asyncio import client

from lattice_dev.devcluster.cluster import ClusterConfig
from lattice_dev.devcluster.kube import api_client, poll
from tests.e2e.test_scheduler import Plane, create_pods, lattice_plane, wait_bound

NODES = 4
# 32 GPUs in all; big pods first would be the easy order, so mix them.
STREAM = [2, 1, 8, 4, 1, 2, 4, 2, 1, 1, 4, 2]


@pytest.fixture(scope="module")
def gpu_plane(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Plane]:
    config = ClusterConfig(nodes=NODES, node_profile="gpu-8x")
    with lattice_plane(tmp_path_factory.mktemp("gpuplane"), config) as p:
        yield p


@pytest.fixture(scope="module")
async def gpu_api(gpu_plane: Plane) -> AsyncIterator[client.ApiClient]:
    async with api_client(gpu_plane.cluster.kubeconfig) as a:
        yield a


def gpu_pod(i: int, gpus: int) -> dict[str, Any]:
    res: dict[str, str] = {"cpu": "1", "memory": "4Gi", "nvidia.com/gpu": str(gpus)}
    annotations = {"lattice.dev/gpu-alignment": "strict" if gpus <= 4 else "preferred"}
    if i % 3 == 0:
        annotations["lattice.dev/rdma"] = "true"
    return {
        "apiVersion": "v1",
        "kind": "Pod",
        "metadata": {"name": f"gpu-{i}-x{gpus}", "annotations": annotations},
        "spec": {
            "schedulerName": "lattice",
            "containers": [
                {
                    "name": "c",
                    "image": "cuda",
                    "resources": {"requests": res, "limits": {"nvidia.com/gpu": str(gpus)}},
                }
            ],
        },
    }


async def test_gpu_stream_is_aligned_and_recorded(
    gpu_plane: Plane, gpu_api: client.ApiClient, tmp_path: Path
) -> None:
    core = client.CoreV1Api(gpu_api)
    ns = "gpus"
    await core.create_namespace({"metadata": {"name": ns}})  # type: ignore[arg-type]
    sched = gpu_plane.lattice().start()
    try:
        await create_pods(gpu_api, ns, [gpu_pod(i, g) for i, g in enumerate(STREAM)])
        bound = await wait_bound(gpu_api, ns, len(STREAM), within=120)
    finally:
        sched.stop()
    used: dict[str, collections.Counter[int]] = collections.defaultdict(collections.Counter)
    for pod in bound:
        gpus = int(pod["spec"]["containers"][0]["resources"]["requests"]["nvidia.com/gpu"])
        devices = json.loads(pod["metadata"]["annotations"]["lattice.dev/devices"])
        assert len(devices["gpus"]) == gpus, pod["metadata"]["name"]
        used[pod["spec"]["nodeName"]].update(devices["gpus"])
        if gpus <= 4:  # fits under one switch or NUMA node on this hardware: must be aligned
            assert devices["numa"] is not None, f"{pod['metadata']['name']}: {devices}"
        if pod["metadata"]["annotations"].get("lattice.dev/rdma") == "true":
            assert devices["nics"], f"{pod['metadata']['name']} asked for an RDMA NIC"
    for node, counts in used.items():
        assert max(counts.values()) == 1, f"a GPU on {node} was handed out twice: {counts}"
        assert set(counts) <= set(range(8))
    assert sum(sum(c.values()) for c in used.values()) == sum(STREAM)


async def test_a_gang_of_gpu_workers_is_placed_whole_and_aligned(
    gpu_plane: Plane, gpu_api: client.ApiClient
) -> None:
    """Six 4-GPU workers, strict alignment, one PodGroup: all bound at once, each member's
    GPUs on one NUMA node, no GPU handed out twice (members share nodes: the commit
    re-checks each against the ledger with the members before it assumed)."""
    core = client.CoreV1Api(gpu_api)
    objects = client.CustomObjectsApi(gpu_api)
    ns = "gpu-gang"
    await core.create_namespace({"metadata": {"name": ns}})  # type: ignore[arg-type]
    # The stream above filled the fleet; free it (its namespace stays for the other test).
    await core.delete_collection_namespaced_pod("gpus", grace_period_seconds=0)

    async def freed() -> bool:
        return not (await core.list_namespaced_pod("gpus")).items

    await poll(freed, within=60, interval=0.3)
    group = {
        "apiVersion": "scheduling.x-k8s.io/v1alpha1",
        "kind": "PodGroup",
        "metadata": {"name": "train"},
        "spec": {"minMember": 6},
    }
    await objects.create_namespaced_custom_object(
        "scheduling.x-k8s.io", "v1alpha1", ns, "podgroups", group
    )
    members = []
    for i in range(6):
        body = gpu_pod(100 + i, 4)
        body["metadata"]["name"] = f"train-{i}"
        body["metadata"]["annotations"] = {"lattice.dev/gpu-alignment": "strict"}
        body["metadata"]["labels"] = {"scheduling.x-k8s.io/pod-group": "train"}
        members.append(body)
    sched = gpu_plane.lattice().start()
    try:
        await create_pods(gpu_api, ns, members)
        bound = await wait_bound(gpu_api, ns, 6, within=120)
    finally:
        sched.stop()
    used: dict[str, collections.Counter[int]] = collections.defaultdict(collections.Counter)
    for pod in bound:
        devices = json.loads(pod["metadata"]["annotations"]["lattice.dev/devices"])
        assert len(devices["gpus"]) == 4, pod["metadata"]["name"]
        assert devices["numa"] is not None, f"{pod['metadata']['name']}: {devices}"
        used[pod["spec"]["nodeName"]].update(devices["gpus"])
    for node, counts in used.items():
        assert max(counts.values()) == 1, f"a GPU on {node} was handed out twice: {counts}"
    assert sum(sum(c.values()) for c in used.values()) == 24
