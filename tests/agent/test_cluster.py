"""The agent's loop against the suite's real API server: the CRD stores status.load as written."""

from __future__ import annotations

import asyncio
from pathlib import Path

import pytest
import yaml
from kubernetes_asyncio import client

from lattice_dev.devcluster.kube import poll
from scheduler.agent.publisher import KubernetesTopologyApi, run_publisher
from scheduler.agent.runner import AgentSettings
from scheduler.model.topology import GROUP, PLURAL, VERSION, NodeTopologyStatus
from tests.agent.crd_schema import CRD_PATH
from tests.agent.fakes import FakeClock, LiveProc
from tests.agent.trees import TWO_SOCKET, roots
from tests.conftest import ControlPlane


async def _install_crd(kube: client.ApiClient) -> None:
    ext = client.ApiextensionsV1Api(kube)
    body = yaml.safe_load(CRD_PATH.read_text())
    try:
        await ext.create_custom_resource_definition(body)
    except client.ApiException as exc:
        if exc.status != 409:
            raise
        current = await ext.read_custom_resource_definition(body["metadata"]["name"])
        body["metadata"]["resourceVersion"] = current.metadata.resource_version
        await ext.replace_custom_resource_definition(body["metadata"]["name"], body)

    async def established() -> bool:
        crd = await ext.read_custom_resource_definition(body["metadata"]["name"])
        conditions = crd.status.conditions or [] if crd.status else []
        return any(c.type == "Established" and c.status == "True" for c in conditions)

    await poll(established, within=30)


@pytest.mark.cluster
async def test_load_reaches_the_api_server_and_the_printer_columns(
    kube: client.ApiClient, control_plane: ControlPlane, tmp_path: Path
) -> None:
    await _install_crd(kube)
    node = (await client.CoreV1Api(kube).list_node()).items[0].metadata.name
    clock = FakeClock(stop_at=21)  # reports at 5 s and 20 s
    proc = LiveProc(tmp_path / "proc", utilisation=0.375)
    clock.on_advance.append(proc.advance)
    settings = AgentSettings(node_name=node, sysfs_root=roots(TWO_SOCKET)[0], procfs_root=proc.root)
    custom = client.CustomObjectsApi(kube)
    try:
        api = KubernetesTopologyApi(kube)
        assert await run_publisher(settings, api, asyncio.Event(), clock=clock)
        obj = await custom.get_cluster_custom_object(GROUP, VERSION, PLURAL, node)
        load = obj["status"]["load"]
        assert (load["samples"], load["windowSeconds"], load["cpuPercent"]) == (3, 15, 38)
        assert load["sampleTime"] == "2025-03-01T12:00:20.000000Z"
        status = NodeTopologyStatus.from_status(obj["status"])
        assert status.load is not None
        assert status.load.cpu_used_milli == 1500

        kubectl = Path(control_plane.state.binaries) / "kubectl"
        process = await asyncio.create_subprocess_exec(
            str(kubectl),
            f"--kubeconfig={control_plane.kubeconfig}",
            "get",
            "ntopo",
            node,
            stdout=asyncio.subprocess.PIPE,
        )
        out, _ = await asyncio.wait_for(process.communicate(), timeout=60)
        assert process.returncode == 0
        header, row = out.decode().splitlines()
        columns = dict(zip(header.split(), row.split(), strict=True))
        assert (columns["CPU%"], columns["MEM%"]) == ("38", "25")
    finally:
        try:
            await custom.delete_cluster_custom_object(GROUP, VERSION, PLURAL, node)
        except client.ApiException as exc:
            if exc.status != 404:
                raise
