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

from scheduler.devcluster.cluster import ClusterConfig
from scheduler.devcluster.kube import api_client
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
