"""Load-aware scheduling end to end: agents' load reports steer `lattice run`.

A control plane of its own (12 kwok nodes, our CRDs, the shipped RBAC). Node load is
published the way agents publish it - a NodeTopology per node whose status carries
``load`` - so the scheduler's watch, parser, predictor and LoadAware plugin are all real.
"""

from __future__ import annotations

import asyncio
import json
from collections.abc import Iterator
from datetime import UTC, datetime
from pathlib import Path
from typing import Any, cast

import pytest
from kubernetes_asyncio import client

from lattice_dev.devcluster.cluster import ClusterConfig
from lattice_dev.devcluster.kube import poll
from scheduler.agent.publisher import KubernetesTopologyApi
from scheduler.agent.resource import node_topology_object
from scheduler.cli import main
from scheduler.model.topology import (
    LOCAL_NUMA_DISTANCE,
    NodeLoad,
    NodeTopology,
    NodeTopologyStatus,
    NumaNode,
)
from tests.e2e.test_scheduler import Plane, create_pods, lattice_plane, pod, wait_bound

NODES = 12
HOT = {f"kwok-node-{i:04d}" for i in range(4)}
GIB = 1024**3
NODE_CPU, NODE_MEM = 4000, 16 * GIB  # the standard profile's allocatable


@pytest.fixture(scope="module")
def plane(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Plane]:
    with lattice_plane(tmp_path_factory.mktemp("loadplane"), ClusterConfig(nodes=NODES)) as p:
        yield p


def _topology() -> NodeTopology:
    node = NumaNode(
        id=0, cpus=frozenset(range(4)), memory_bytes=NODE_MEM, distances=(LOCAL_NUMA_DISTANCE,)
    )
    return NodeTopology(numa_nodes=(node,))


async def publish_load(api: client.ApiClient, loads: dict[str, float]) -> None:
    """What each node's agent would write: the object once, then the status with load."""
    topo = KubernetesTopologyApi(api)
    now = datetime.now(UTC)
    for name, cpu in loads.items():
        if await topo.get(name) is None:
            await topo.create(node_topology_object(name, _topology()))
        status = NodeTopologyStatus(
            last_report_time=now,
            load=NodeLoad(
                sample_time=now,
                window_seconds=15.0,
                samples=3,
                cpu_used_milli=round(cpu * NODE_CPU),
                cpu_capacity_milli=NODE_CPU,
                mem_used_bytes=4 * GIB,
                mem_capacity_bytes=NODE_MEM,
            ),
        )
        await topo.replace_status(name, dict(status.to_status()))


async def test_hot_nodes_get_nothing_then_threshold_holds_and_releases(
    plane: Plane, api: client.ApiClient, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    core = client.CoreV1Api(api)
    ns = "load"
    await core.create_namespace(cast(client.V1Namespace, {"metadata": {"name": ns}}))
    loads = {
        f"kwok-node-{i:04d}": (0.9 if f"kwok-node-{i:04d}" in HOT else 0.3) for i in range(NODES)
    }
    await publish_load(api, loads)
    sched = plane.lattice().start()
    try:
        # 1. Hot from load nobody placed: 40 pods, none on the four hot nodes.
        await create_pods(api, ns, [pod(f"web-{i}", cpu="200m") for i in range(40)])
        bound = await wait_bound(api, ns, 40, within=90)
        hot_placements = [p["metadata"]["name"] for p in bound if p["spec"]["nodeName"] in HOT]
        assert hot_placements == []

        # 2. A CPU threshold set live, and a fast EWMA (alpha 0.9 per 1 s report) so the test
        #    need not wait for 15 s reports; every node reports hot: the pod waits, saying why.
        custom = client.CustomObjectsApi(api)
        await custom.patch_cluster_custom_object(
            "lattice.dev",
            "v1alpha1",
            "latticeschedulers",
            "lattice",
            {
                "spec": {
                    "loadAware": {
                        "cpuThreshold": 0.7,
                        "cpuAlpha": 0.9,
                        "reportIntervalSeconds": 1,
                        "staleAfterSeconds": 30,
                    }
                }
            },
            _content_type="application/merge-patch+json",  # type: ignore[call-arg]
        )
        await asyncio.sleep(2.0)  # the spec event reaches the scheduler
        await publish_load(api, dict.fromkeys(loads, 0.85))
        await asyncio.sleep(1.0)
        await publish_load(api, dict.fromkeys(loads, 0.85))  # two samples: the EWMA is there
        await create_pods(api, ns, [pod("late", cpu="200m")])

        async def waiting() -> Any:
            p = await core.read_namespaced_pod("late", ns)
            conds = [c for c in p.status.conditions or [] if c.type == "PodScheduled"]
            return conds[0] if conds and conds[0].status == "False" else None

        cond = await poll(waiting, within=60, interval=0.3)
        assert "would exceed the CPU load threshold (70%)" in cond.message

        # 3. One node cools down: its report moves the pod, which lands there.
        cool = "kwok-node-0007"
        await asyncio.sleep(1.0)
        await publish_load(api, {cool: 0.1})
        bound = await wait_bound(api, ns, 41, within=60)
        late = next(p for p in bound if p["metadata"]["name"] == "late")
        assert late["spec"]["nodeName"] == cool

        # 4. `lattice explain` shows measured, predicted and in-flight load per node.
        manifest = tmp_path / "probe.json"
        manifest.write_text(json.dumps(pod("probe", cpu="100m")))
        argv = [
            "explain",
            "--kubeconfig",
            str(plane.cluster.kubeconfig),
            "-f",
            str(manifest),
            "-o",
            "json",
        ]
        assert await asyncio.to_thread(main, argv) == 0
        out = json.loads(capsys.readouterr().out)
        assert out["selected"] == cool
        hot_row = out["load"]["kwok-node-0000"]
        assert hot_row["status"] == "fresh"
        assert hot_row["measured"]["cpuMillicores"] == 0.85 * NODE_CPU
        assert f"{ns}/late" in out["load"][cool]["inflightPods"]
        assert out["reason_counts"] == {
            "node(s) would exceed the CPU load threshold (70%)": NODES - 1
        }
        assert await asyncio.to_thread(main, argv[:-2]) == 0
        table = capsys.readouterr().out
        assert "CPU MEASURED" in table
        assert "CPU IN-FLIGHT" in table
    finally:
        sched.stop()
        await core.delete_namespace(ns)
