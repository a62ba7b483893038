"""Simulated agents for fake nodes: the real reader and publisher, on a fixture tree."""

from __future__ import annotations

import asyncio
import copy
from collections.abc import Mapping
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

import pytest
import yaml
from kubernetes_asyncio import client

from lattice_dev.devcluster import agents
from lattice_dev.devcluster.kube import poll
from scheduler.agent.publisher import SpecAction
from scheduler.core.topology import TopologyState
from scheduler.model.topology import GROUP, PLURAL, VERSION, NodeTopology
from tests.agent.crd_schema import CRD_PATH
from tests.agent.trees import FIXTURES, TWO_SOCKET
from tests.topology.support import two_socket

NOW = datetime(2025, 3, 1, 12, 0, tzinfo=UTC)


class FakeApi:
    """An in-memory TopologyApi."""

    def __init__(self) -> None:
        self.objects: dict[str, dict[str, Any]] = {}

    async def get(self, name: str) -> Mapping[str, Any] | None:
        obj = self.objects.get(name)
        return copy.deepcopy(obj) if obj is not None else None

    async def create(self, body: Mapping[str, Any]) -> None:
        self.objects[body["metadata"]["name"]] = copy.deepcopy(dict(body))

    async def replace_spec(self, name: str, spec: Mapping[str, Any]) -> None:
        self.objects[name]["spec"] = copy.deepcopy(dict(spec))

    async def replace_status(self, name: str, status: Mapping[str, Any]) -> None:
        self.objects[name]["status"] = copy.deepcopy(dict(status))

    async def node_uid(self, name: str) -> str | None:
        return f"uid-{name}"


def test_fixture_for_the_gpu_profile_is_the_committed_tree() -> None:
    assert agents.fixture_for_profile("gpu-8x") == FIXTURES / TWO_SOCKET
    assert agents.fixture_for_profile("standard") is None


def test_fixture_root_can_be_overridden(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    monkeypatch.setenv(agents.FIXTURES_ENV, str(tmp_path))
    assert agents.fixture_for_profile("gpu-8x") == tmp_path / TWO_SOCKET


async def test_publishes_the_fixture_topology_for_every_node() -> None:
    api = FakeApi()
    names = [f"kwok-node-{i:04d}" for i in range(3)]
    done = await agents.publish_simulated_topologies(api, names, FIXTURES / TWO_SOCKET, now=NOW)
    assert done == dict.fromkeys(names, SpecAction.CREATE)
    for name in names:
        obj = api.objects[name]
        assert obj["metadata"]["ownerReferences"][0]["uid"] == f"uid-{name}"
        assert NodeTopology.from_spec(obj["spec"]) == two_socket()
        assert obj["status"]["lastReportTime"] == "2025-03-01T12:00:00Z"
    again = await agents.publish_simulated_topologies(api, names, FIXTURES / TWO_SOCKET, now=NOW)
    assert set(again.values()) == {SpecAction.NONE}


async def test_missing_fixture_tree_is_a_clear_error(tmp_path: Path) -> None:
    with pytest.raises(agents.FixtureError, match="no fixture tree"):
        await agents.publish_simulated_topologies(FakeApi(), ["n"], tmp_path / "nowhere")


async def test_run_simulated_agents_stops() -> None:
    api, stop = FakeApi(), asyncio.Event()
    task = asyncio.create_task(
        agents.run_simulated_agents(api, ["n"], FIXTURES / TWO_SOCKET, stop, interval_seconds=0.01)
    )
    await poll(lambda: _has(api, "n"), within=10)
    stop.set()
    await asyncio.wait_for(task, timeout=10)


async def _has(api: FakeApi, name: str) -> bool:
    return name in api.objects


async def _install_crd(kube: client.ApiClient) -> None:
    ext = client.ApiextensionsV1Api(kube)
    body = yaml.safe_load(CRD_PATH.read_text())
    try:
        await ext.create_custom_resource_definition(body)
    except client.ApiException as exc:
        if exc.status != 409:
            raise

    async def established() -> bool:
        crd = await ext.read_custom_resource_definition(body["metadata"]["name"])
        conditions = crd.status.conditions or [] if crd.status else []
        return any(c.type == "Established" and c.status == "True" for c in conditions)

    await poll(established, within=30)


@pytest.mark.cluster
async def test_publishes_to_a_real_api_server(kube: client.ApiClient) -> None:
    """Against the suite's control plane: the CRD accepts what the reader made of the tree,
    the objects are owned by their kwok nodes, and the scheduler can read them back."""
    await _install_crd(kube)
    nodes = [n.metadata.name for n in (await client.CoreV1Api(kube).list_node()).items]
    custom = client.CustomObjectsApi(kube)
    try:
        done = await agents.publish_simulated_topologies(kube, nodes, FIXTURES / TWO_SOCKET)
        assert set(done.values()) <= {SpecAction.CREATE, SpecAction.NONE}
        listed = await custom.list_cluster_custom_object(GROUP, VERSION, PLURAL)
        state = TopologyState()
        for obj in listed["items"]:
            assert obj["metadata"]["ownerReferences"][0]["kind"] == "Node"
            assert "lastReportTime" in obj["status"]
            state.set_node_topology(obj["metadata"]["name"], NodeTopology.from_spec(obj["spec"]))
        assert state.node_names() == frozenset(nodes)
        again = await agents.publish_simulated_topologies(kube, nodes, FIXTURES / TWO_SOCKET)
        assert set(again.values()) == {SpecAction.NONE}
    finally:
        for name in nodes:
            try:
                await custom.delete_cluster_custom_object(GROUP, VERSION, PLURAL, name)
            except client.ApiException as exc:
                if exc.status != 404:
                    raise
