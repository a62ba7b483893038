"""`lattice explain` against the live control plane."""

from __future__ import annotations

import json
from typing import Any, cast

import pytest
from kubernetes_asyncio import client

from lattice_dev.devcluster.kube import create_nodes, node_is_ready, poll
from lattice_dev.devcluster.profiles import get_profile
from scheduler.cli import main
from tests.conftest import SUITE_NODES, ControlPlane
from tests.e2e.differential.volumes_objects import claim_volume, pv, pvc, storage_class


def _pod(name: str, cpu: str, zone: str | None = None) -> dict[str, Any]:
    spec: dict[str, Any] = {
        "schedulerName": "lattice",  # nobody binds it: explain must not either
        "containers": [{"name": "c", "image": "busybox", "resources": {"requests": {"cpu": cpu}}}],
    }
    if zone:
        spec["nodeSelector"] = {"topology.kubernetes.io/zone": zone}
    return {"apiVersion": "v1", "kind": "Pod", "metadata": {"name": name}, "spec": spec}


async def test_explain_live_pod_as_json(
    control_plane: ControlPlane,
    kube: client.ApiClient,
    namespace: str,
    capsys: pytest.CaptureFixture[str],
) -> None:
    core = client.CoreV1Api(kube)
    await core.create_namespaced_pod(namespace, cast(client.V1Pod, _pod("p", "1", "zone-a")))
    argv = [
        "explain",
        "--kubeconfig",
        str(control_plane.kubeconfig),
        f"{namespace}/p",
        "-o",
        "json",
    ]
    assert await _run(argv) == 0
    out = json.loads(capsys.readouterr().out)
    zone_a = [f"kwok-node-{i:04d}" for i in range(SUITE_NODES) if i % 3 == 0]
    assert sorted(out["feasible"]) == zone_a
    assert out["selected"] in zone_a
    assert out["reason_counts"] == {
        "node(s) didn't match Pod's node affinity/selector": SUITE_NODES - len(zone_a)
    }
    pod = await core.read_namespaced_pod("p", namespace)
    assert not pod.spec.node_name  # explained, not bound


async def test_explain_manifest_table_and_bad_input(
    control_plane: ControlPlane, tmp_path: Any, capsys: pytest.CaptureFixture[str]
) -> None:
    manifest = tmp_path / "pod.json"
    manifest.write_text(json.dumps(_pod("big", "64")))
    argv = ["explain", "--kubeconfig", str(control_plane.kubeconfig), "-f", str(manifest)]
    assert await _run(argv) == 0
    out = capsys.readouterr().out
    assert "selected none" in out
    assert f"0/{SUITE_NODES} nodes are available: {SUITE_NODES} Insufficient cpu." in out

    manifest.write_text(json.dumps(_pod("bad", "lots")))
    assert await _run([*argv[:3], "-f", str(manifest)]) == 2
    assert "invalid" in capsys.readouterr().err


async def test_explain_a_claim_pod_reads_the_storage(
    control_plane: ControlPlane,
    kube: client.ApiClient,
    namespace: str,
    tmp_path: Any,
    capsys: pytest.CaptureFixture[str],
) -> None:
    """A WaitForFirstConsumer claim whose only PV is on one node: explain says that node."""
    core, st = client.CoreV1Api(kube), client.StorageV1Api(kube)
    klass, volume = f"explain-{namespace}", f"explain-{namespace}"
    target = f"kwok-node-{SUITE_NODES - 1:04d}"
    pv_body = pv(volume, storage_class=klass, host=target)
    pv_body.pop("status")
    await st.create_storage_class(cast(client.V1StorageClass, storage_class(klass)))
    await core.create_persistent_volume(cast(client.V1PersistentVolume, pv_body))
    try:
        claim = pvc("data", namespace=namespace, storage_class=klass)
        await core.create_namespaced_persistent_volume_claim(
            namespace, cast(client.V1PersistentVolumeClaim, claim)
        )
        body = _pod("with-claim", "100m")
        body["metadata"]["namespace"] = namespace
        body["spec"]["volumes"] = [claim_volume("data", "data")]
        manifest = tmp_path / "pod.json"
        manifest.write_text(json.dumps(body))
        argv = ["explain", "--kubeconfig", str(control_plane.kubeconfig), "-f", str(manifest)]
        assert await _run([*argv, "-o", "json"]) == 0
        out = json.loads(capsys.readouterr().out)
        assert out["feasible"] == [target]
        assert out["selected"] == target
        assert out["reason_counts"] == {
            "node(s) didn't find available persistent volumes to bind": SUITE_NODES - 1
        }
    finally:
        await core.delete_persistent_volume(volume)
        await st.delete_storage_class(klass)


async def test_explain_a_gpu_pod_shows_free_gpus_and_fragmentation(
    control_plane: ControlPlane,
    kube: client.ApiClient,
    namespace: str,
    capsys: pytest.CaptureFixture[str],
) -> None:
    """Two 8-GPU kwok nodes of our own, seven GPUs of one taken by bound pods: explain picks
    the node whose last GPU the pod fills (nothing left to fragment) and its GPU table says
    so, per node, from the live cluster."""
    core = client.CoreV1Api(kube)
    marker = "lattice.test/explain-gpu"
    suffix = namespace[-20:]
    whole, one_left = f"kwok-gpu-whole-{suffix}"[:63], f"kwok-gpu-one-{suffix}"[:63]
    bodies = []
    for name in (whole, one_left):
        body = get_profile("small").node_body(name, 0)
        body["metadata"]["labels"][marker] = suffix
        for key in ("capacity", "allocatable"):
            body["status"][key].update({"cpu": "96", "memory": "512Gi", "nvidia.com/gpu": "8"})
        body["spec"]["taints"] = [{"key": marker, "value": "x", "effect": "NoSchedule"}]
        bodies.append(body)
    await create_nodes(kube, bodies)
    toleration = {"key": marker, "operator": "Exists", "effect": "NoSchedule"}

    def gpu_pod(name: str, node: str | None = None) -> dict[str, Any]:
        body = _pod(name, "1")
        body["spec"]["containers"][0]["resources"] = {
            "requests": {"cpu": "1", "nvidia.com/gpu": "1"},
            "limits": {"nvidia.com/gpu": "1"},
        }
        body["spec"]["tolerations"] = [toleration]
        body["spec"]["nodeSelector"] = {marker: suffix}
        if node:
            body["spec"]["nodeName"] = node
        return body

    try:

        async def ready() -> bool | None:
            got = [await core.read_node(n) for n in (whole, one_left)]
            return True if all(node_is_ready(n) for n in got) else None

        await poll(ready, within=60, interval=0.2)
        for i in range(7):
            await core.create_namespaced_pod(
                namespace, cast(client.V1Pod, gpu_pod(f"used-{i}", one_left))
            )
        await core.create_namespaced_pod(namespace, cast(client.V1Pod, gpu_pod("p")))
        base = ["explain", "--kubeconfig", str(control_plane.kubeconfig), f"{namespace}/p"]
        assert await _run([*base, "-o", "json"]) == 0
        out = json.loads(capsys.readouterr().out)
        assert sorted(out["feasible"]) == sorted([whole, one_left])
        assert out["selected"] == one_left
        gpus = out["gpus"]
        assert gpus["podGPUs"] == 1
        assert gpus["nodes"][one_left]["freeGPUs"] == 1
        assert gpus["nodes"][one_left]["fragmentationAfter"] == 0
        assert gpus["nodes"][whole]["freeGPUs"] == 8
        assert gpus["nodes"][whole]["allocatableGPUs"] == 8
        rise = {
            n: gpus["nodes"][n]["fragmentationAfter"] - gpus["nodes"][n]["fragmentationBefore"]
            for n in (whole, one_left)
        }
        assert rise[one_left] < rise[whole]  # the reason it chose: a smaller rise

        assert await _run(base) == 0
        table = capsys.readouterr().out.splitlines()
        start = next(i for i, line in enumerate(table) if line.startswith("GPUs (pod asks 1;"))
        first, second = table[start + 2].split(), table[start + 3].split()
        assert first[:3] == ["*", one_left, "1/8"]
        assert second[:2] == [whole, "8/8"]
        pod = await core.read_namespaced_pod("p", namespace)
        assert not pod.spec.node_name  # explained, not bound
    finally:
        for p in (await core.list_namespaced_pod(namespace)).items:
            await core.delete_namespaced_pod(p.metadata.name, namespace, grace_period_seconds=0)
        for n in (whole, one_left):
            await core.delete_node(n)


async def _run(argv: list[str]) -> int:
    """The CLI runs its own event loop; keep it off the test's loop."""
    import asyncio

    return await asyncio.to_thread(main, argv)
