"""Publishing: pure change detection, and the create/patch/heartbeat flow on a fake API."""

from __future__ import annotations

import asyncio
import copy
from collections.abc import Mapping
from dataclasses import dataclass, field
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

import pytest

from scheduler.agent.publisher import (
    AgentSettings,
    ConflictError,
    SpecAction,
    plan_spec,
    publish_once,
    run_publisher,
)
from scheduler.agent.resource import MANAGED_BY, MANAGED_BY_LABEL
from scheduler.model.topology import NodeTopology
from tests.agent.trees import TWO_SOCKET, VM, read_fixture, roots

NOW = datetime(2025, 3, 1, 12, 0, tzinfo=UTC)


@dataclass
class FakeApi:
    """An in-memory TopologyApi that records calls."""

    objects: dict[str, dict[str, Any]] = field(default_factory=dict)
    calls: list[str] = field(default_factory=list)
    node_uids: dict[str, str] = field(default_factory=dict)
    race_on_create: dict[str, Any] | None = None
    fail_get: bool = False
    second_get: asyncio.Event = field(default_factory=asyncio.Event)

    async def get(self, name: str) -> Mapping[str, Any] | None:
        self.calls.append("get")
        if self.calls.count("get") >= 2:
            self.second_get.set()
        if self.fail_get:
            raise ConnectionError("api server down")
        obj = self.objects.get(name)
        return copy.deepcopy(obj) if obj is not None else None

    async def create(self, body: Mapping[str, Any]) -> None:
        self.calls.append("create")
        name = body["metadata"]["name"]
        if self.race_on_create is not None:
            self.objects[name] = self.race_on_create
            raise ConflictError("already exists")
        stored = copy.deepcopy(dict(body))
        stored.pop("status", None)  # the status subresource ignores status on create
        self.objects[name] = stored

    async def replace_spec(self, name: str, spec: Mapping[str, Any]) -> None:
        self.calls.append("replace_spec")
        self.objects[name]["spec"] = copy.deepcopy(dict(spec))

    async def replace_status(self, name: str, status: Mapping[str, Any]) -> None:
        self.calls.append("replace_status")
        self.objects[name]["status"] = copy.deepcopy(dict(status))

    async def node_uid(self, name: str) -> str | None:
        self.calls.append("node_uid")
        return self.node_uids.get(name)


def test_plan_spec() -> None:
    spec = read_fixture(TWO_SOCKET).topology.to_spec()
    other = read_fixture(VM).topology.to_spec()
    assert plan_spec(None, spec) is SpecAction.CREATE
    assert plan_spec({"spec": copy.deepcopy(spec)}, spec) is SpecAction.NONE
    assert plan_spec({"spec": other}, spec) is SpecAction.UPDATE
    assert plan_spec({"metadata": {}}, spec) is SpecAction.UPDATE
    changed = copy.deepcopy(spec)
    changed["pcie"]["devices"][3]["numaNode"] = 1
    assert plan_spec({"spec": changed}, spec) is SpecAction.UPDATE


async def test_first_publish_creates_then_heartbeats() -> None:
    api = FakeApi(node_uids={"n1": "uid-1"})
    reading = read_fixture(TWO_SOCKET)
    assert await publish_once(api, "n1", reading, NOW) is SpecAction.CREATE
    stored = api.objects["n1"]
    assert stored["metadata"]["ownerReferences"] == [
        {"apiVersion": "v1", "kind": "Node", "name": "n1", "uid": "uid-1"}
    ]
    assert stored["metadata"]["labels"] == {MANAGED_BY_LABEL: MANAGED_BY}
    assert stored["status"]["lastReportTime"] == "2025-03-01T12:00:00Z"
    assert NodeTopology.from_spec(stored["spec"]) == reading.topology

    api.calls.clear()
    later = NOW.replace(minute=1)
    assert await publish_once(api, "n1", reading, later) is SpecAction.NONE
    assert api.calls == ["get", "replace_status"]  # no spec write for unchanged hardware
    assert stored is api.objects["n1"]
    assert api.objects["n1"]["status"]["lastReportTime"] == "2025-03-01T12:01:00Z"


async def test_changed_hardware_replaces_the_spec() -> None:
    api = FakeApi()
    await publish_once(api, "n1", read_fixture(TWO_SOCKET), NOW)
    api.calls.clear()
    vm = read_fixture(VM)
    assert await publish_once(api, "n1", vm, NOW) is SpecAction.UPDATE
    assert api.calls == ["get", "replace_spec", "replace_status"]
    assert NodeTopology.from_spec(api.objects["n1"]["spec"]) == vm.topology
    assert "ownerReferences" not in api.objects["n1"]["metadata"]  # node uid was unknown


async def test_create_race_falls_back_to_patch() -> None:
    reading = read_fixture(TWO_SOCKET)
    theirs = {"metadata": {"name": "n1"}, "spec": read_fixture(VM).topology.to_spec()}
    api = FakeApi(race_on_create=theirs)
    assert await publish_once(api, "n1", reading, NOW) is SpecAction.UPDATE
    assert api.calls == ["get", "node_uid", "create", "get", "replace_spec", "replace_status"]
    assert api.objects["n1"]["spec"] == reading.topology.to_spec()


def _settings() -> AgentSettings:
    sysfs, procfs = roots(TWO_SOCKET)
    return AgentSettings(
        node_name="n1", sysfs_root=sysfs, procfs_root=procfs, interval_seconds=0.01
    )


async def test_run_publisher_once() -> None:
    api = FakeApi()
    ok = await run_publisher(_settings(), api, asyncio.Event(), once=True, clock=lambda: NOW)
    assert ok
    assert "n1" in api.objects


async def test_run_publisher_survives_api_errors_until_stopped() -> None:
    api = FakeApi(fail_get=True)
    stop = asyncio.Event()
    task = asyncio.create_task(run_publisher(_settings(), api, stop, clock=lambda: NOW))
    await asyncio.wait_for(api.second_get.wait(), timeout=5)  # failed cycle retried, loop lives
    stop.set()
    assert await asyncio.wait_for(task, timeout=5) is False


@pytest.mark.parametrize("missing", ["sys", "proc"])
async def test_run_publisher_with_missing_roots(tmp_path: Path, missing: str) -> None:
    sysfs, procfs = roots(TWO_SOCKET)
    settings = AgentSettings(
        node_name="n1",
        sysfs_root=tmp_path if missing == "sys" else sysfs,
        procfs_root=tmp_path if missing == "proc" else procfs,
    )
    api = FakeApi()
    assert await run_publisher(settings, api, asyncio.Event(), once=True, clock=lambda: NOW)
    status = api.objects["n1"]["status"]
    if missing == "sys":
        assert status["warnings"]
    else:  # a kernel without PSI is normal: no readings, no warning
        assert "pressure" not in status
        assert "warnings" not in status
