"""Publishing: pure change detection, the create/patch/heartbeat flow, and fewer GETs."""

from __future__ import annotations

import asyncio
import copy
from datetime import UTC, datetime
from pathlib import Path

import pytest

from scheduler.agent.publisher import (
    Publisher,
    SpecAction,
    plan_spec,
    publish_once,
    run_publisher,
)
from scheduler.agent.resource import MANAGED_BY, MANAGED_BY_LABEL
from scheduler.agent.runner import AgentSettings
from scheduler.model.topology import NodeTopology
from tests.agent.fakes import FakeApi, FakeClock
from tests.agent.trees import TWO_SOCKET, VM, read_fixture, roots

NOW = datetime(2025, 3, 1, 12, 0, tzinfo=UTC)


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


async def test_publisher_reads_the_object_only_the_first_time() -> None:
    api = FakeApi()
    publisher = Publisher(api, "n1")
    reading = read_fixture(TWO_SOCKET)
    assert await publisher.publish(reading, NOW) is SpecAction.CREATE
    for minute in (1, 2, 3):
        assert await publisher.publish(reading, NOW.replace(minute=minute)) is SpecAction.NONE
    assert api.calls == ["get", "node_uid", "create", *["replace_status"] * 4]
    assert api.objects["n1"]["status"]["lastReportTime"] == "2025-03-01T12:03:00Z"


async def test_publisher_reads_again_when_the_hardware_changed() -> None:
    api = FakeApi()
    publisher = Publisher(api, "n1")
    await publisher.publish(read_fixture(TWO_SOCKET), NOW)
    api.calls.clear()
    vm = read_fixture(VM)
    assert await publisher.publish(vm, NOW) is SpecAction.UPDATE
    assert await publisher.publish(vm, NOW) is SpecAction.NONE
    assert api.calls == ["get", "replace_spec", "replace_status", "replace_status"]
    assert NodeTopology.from_spec(api.objects["n1"]["spec"]) == vm.topology


async def test_publisher_reads_again_after_a_failure() -> None:
    api = FakeApi()
    publisher = Publisher(api, "n1")
    reading = read_fixture(TWO_SOCKET)
    await publisher.publish(reading, NOW)
    del api.objects["n1"]  # deleted behind the agent's back: the status write fails
    with pytest.raises(LookupError):
        await publisher.publish(reading, NOW)
    api.calls.clear()
    assert await publisher.publish(reading, NOW) is SpecAction.CREATE
    assert api.calls == ["get", "node_uid", "create", "replace_status"]

    api.fail_status = 1  # a failed status write alone also means: look again
    with pytest.raises(ConnectionError):
        await publisher.publish(reading, NOW)
    api.calls.clear()
    assert await publisher.publish(reading, NOW) is SpecAction.NONE
    assert api.calls == ["get", "replace_status"]


def _settings(procfs: Path | None = None) -> AgentSettings:
    sysfs, fixture_procfs = roots(TWO_SOCKET)
    return AgentSettings(node_name="n1", sysfs_root=sysfs, procfs_root=procfs or fixture_procfs)


async def test_run_publisher_once() -> None:
    api = FakeApi()
    clock = FakeClock()
    assert await run_publisher(_settings(), api, asyncio.Event(), once=True, clock=clock)
    assert "n1" in api.objects
    assert clock.elapsed == 5.0  # two samples, one sample interval apart
    assert api.calls == ["get", "node_uid", "create", "replace_status"]


async def test_run_publisher_survives_api_errors_until_stopped() -> None:
    api = FakeApi(fail_get=True)
    stop = asyncio.Event()
    clock = FakeClock(stop_at=60)
    assert await run_publisher(_settings(), api, stop, clock=clock) is False
    assert api.calls == ["get"] * 4  # every report retried (and read again), the loop lived


@pytest.mark.parametrize("missing", ["sys", "proc"])
async def test_run_publisher_with_missing_roots(tmp_path: Path, missing: str) -> None:
    sysfs, procfs = roots(TWO_SOCKET)
    settings = AgentSettings(
        node_name="n1",
        sysfs_root=tmp_path if missing == "sys" else sysfs,
        procfs_root=tmp_path if missing == "proc" else procfs,
    )
    api = FakeApi()
    clock = FakeClock()
    assert await run_publisher(settings, api, asyncio.Event(), once=True, clock=clock)
    status = api.objects["n1"]["status"]
    assert status["warnings"]
    if missing == "proc":  # a kernel without PSI is normal; a /proc without stat is not
        assert "pressure" not in status
        assert "load" not in status
        assert [w.rsplit("/", 1)[-1] for w in status["warnings"]] == [
            "stat: missing",
            "meminfo: missing",
        ]
