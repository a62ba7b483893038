"""The control plane is real: kube-scheduler binds, kwok runs, our pods are left alone."""

from __future__ import annotations

import asyncio
from typing import Any, cast

from kubernetes_asyncio import client

from lattice_dev.devcluster.build import kubernetes_version
from lattice_dev.devcluster.kube import node_is_ready, poll
from tests.conftest import SUITE_NODES


def _pod(name: str, scheduler_name: str | None = None) -> client.V1Pod:
    spec: dict[str, Any] = {
        "containers": [
            {"name": "c", "image": "busybox", "resources": {"requests": {"cpu": "100m"}}}
        ]
    }
    if scheduler_name:
        spec["schedulerName"] = scheduler_name
    body = {"apiVersion": "v1", "kind": "Pod", "metadata": {"name": name}, "spec": spec}
    return cast(client.V1Pod, body)  # the client sends plain dicts as they are


async def test_nodes_are_ready_with_capacity(kube: client.ApiClient) -> None:
    nodes = (await client.CoreV1Api(kube).list_node()).items
    assert len(nodes) == SUITE_NODES
    for node in nodes:
        assert node_is_ready(node), node.metadata.name
        assert node.status.allocatable["cpu"] == "32"
        assert node.status.allocatable["memory"] == "128Gi"


async def test_server_version_is_the_pinned_one(kube: client.ApiClient) -> None:
    info = await client.VersionApi(kube).get_code()
    assert info.git_version == kubernetes_version()


async def test_kube_scheduler_binds_and_kwok_runs_the_pod(
    kube: client.ApiClient, namespace: str
) -> None:
    core = client.CoreV1Api(kube)
    await core.create_namespaced_pod(namespace, _pod("plain"))

    async def running() -> client.V1Pod | None:
        pod = await core.read_namespaced_pod("plain", namespace)
        return pod if pod.status.phase == "Running" else None

    pod = await poll(running, within=30)
    assert pod.spec.node_name.startswith("kwok-node-")
    events = await core.list_namespaced_event(namespace, field_selector="reason=Scheduled")
    assert any(e.involved_object.name == "plain" for e in events.items)


async def test_kube_scheduler_leaves_lattice_pods_alone(
    kube: client.ApiClient, namespace: str
) -> None:
    core = client.CoreV1Api(kube)
    await core.create_namespaced_pod(namespace, _pod("ours", scheduler_name="lattice"))
    # A control pod created after ours is bound: kube-scheduler has seen both by then.
    await core.create_namespaced_pod(namespace, _pod("theirs"))

    async def control_bound() -> bool:
        pod = await core.read_namespaced_pod("theirs", namespace)
        return bool(pod.spec.node_name)

    await poll(control_bound, within=30)
    await asyncio.sleep(2)
    ours = await core.read_namespaced_pod("ours", namespace)
    assert not ours.spec.node_name
    assert ours.status.phase == "Pending"
    assert not ours.status.conditions, "kube-scheduler must not even try"
