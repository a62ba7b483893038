"""`lattice explain` against the live control plane."""

from __future__ import annotations

import json
from typing import Any, cast

import pytest
from kubernetes_asyncio import client

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


async def _run(argv: list[str]) -> int:
    """The CLI runs its own event loop; keep it off the test's loop."""
    import asyncio

    return await asyncio.to_thread(main, argv)
