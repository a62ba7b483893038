"""The agent's cadence on a fake clock: sample every 5 s, report every 15 s, hardware every 60."""

from __future__ import annotations

import asyncio
import shutil
from dataclasses import dataclass
from datetime import datetime
from pathlib import Path
from typing import Any

import pytest

from scheduler.agent.publisher import run_publisher
from scheduler.agent.reader import NodeReading
from scheduler.agent.runner import AgentSettings, run_agent
from scheduler.model.topology import NodeLoad, NodeTopology
from tests.agent.crd_schema import object_schema, validate
from tests.agent.fakes import FakeApi, FakeClock, LiveProc
from tests.agent.trees import VM, roots


@dataclass
class Report:
    elapsed: float
    reading: NodeReading
    time: datetime

    @property
    def load(self) -> NodeLoad:
        assert self.reading.load is not None, self.reading.warnings
        return self.reading.load


class Recorder:
    def __init__(self, clock: FakeClock) -> None:
        self.clock = clock
        self.reports: list[Report] = []

    async def __call__(self, reading: NodeReading, now: datetime) -> None:
        self.reports.append(Report(self.clock.elapsed, reading, now))


def _setup(
    tmp_path: Path, *, stop_at: float | None = None, sample_interval: float = 5.0
) -> tuple[AgentSettings, FakeClock, LiveProc]:
    clock = FakeClock(stop_at=stop_at)
    proc = LiveProc(tmp_path / "proc")
    clock.on_advance.append(proc.advance)
    settings = AgentSettings(
        node_name="n1",
        sysfs_root=roots(VM)[0],
        procfs_root=proc.root,
        sample_interval_seconds=sample_interval,
    )
    return settings, clock, proc


async def test_reports_every_report_interval_with_the_window_since_the_last(
    tmp_path: Path,
) -> None:
    settings, clock, proc = _setup(tmp_path, stop_at=66)
    record = Recorder(clock)

    def shape(elapsed: float) -> None:
        proc.utilisation = 0.75 if 20 < elapsed <= 25 else 0.25

    clock.on_advance.insert(0, shape)
    assert await run_agent(settings, record, asyncio.Event(), clock=clock)

    assert [r.elapsed for r in record.reports] == [5, 20, 35, 50, 65]
    assert set(clock.sleeps) == {5.0}  # one sample every 5 s, never a catch-up burst
    loads = [r.load for r in record.reports]
    assert [x.samples for x in loads] == [2, 3, 3, 3, 3]
    assert [x.window_seconds for x in loads] == [5, 15, 15, 15, 15]
    assert [x.sample_time for x in loads] == [r.time for r in record.reports]
    assert [x.cpu_capacity_milli for x in loads] == [4000] * 5
    assert [x.cpu_used_milli for x in loads] == [1000, 1000, 1667, 1000, 1000]
    assert [x.cpu_peak_milli for x in loads] == [None, 1000, 3000, 1000, 1000]
    assert all(r.reading.warnings == () for r in record.reports)
    assert all(r.reading.pressure is not None for r in record.reports)


async def test_once_takes_two_samples_one_interval_apart(tmp_path: Path) -> None:
    settings, clock, _ = _setup(tmp_path, sample_interval=0.5)
    record = Recorder(clock)
    assert await run_agent(settings, record, asyncio.Event(), once=True, clock=clock)
    (report,) = record.reports
    assert (report.elapsed, report.load.samples, report.load.window_seconds) == (0.5, 2, 0.5)


async def test_publisher_writes_only_the_status_after_the_first_report(tmp_path: Path) -> None:
    settings, clock, _ = _setup(tmp_path, stop_at=66)
    api = FakeApi()
    assert await run_publisher(settings, api, asyncio.Event(), clock=clock)
    assert api.calls == ["get", "node_uid", "create", *["replace_status"] * 5]
    status = api.objects["n1"]["status"]
    assert status["load"]["cpuPercent"] == 50
    assert status["load"]["samples"] == 3
    assert status["lastReportTime"] == "2025-03-01T12:01:05Z"
    obj = api.objects["n1"]
    assert validate({**obj, "apiVersion": "lattice.dev/v1alpha1"}, object_schema()) == []


async def test_hardware_is_reread_at_the_topology_interval(tmp_path: Path) -> None:
    settings, clock, _ = _setup(tmp_path, stop_at=81)
    sysfs = tmp_path / "sys"
    shutil.copytree(roots(VM)[0], sysfs, symlinks=True)
    settings = AgentSettings(node_name="n1", sysfs_root=sysfs, procfs_root=settings.procfs_root)
    cpulist = sysfs / "devices" / "system" / "node" / "node0" / "cpulist"

    def hot_unplug(elapsed: float) -> None:
        if elapsed == 30:
            cpulist.write_text("0-3\n")

    clock.on_advance.append(hot_unplug)
    api = FakeApi()
    assert await run_publisher(settings, api, asyncio.Event(), clock=clock)
    # reports at 5, 20, 35, 50 | 65 (hardware re-read: changed, so look and patch) | 80
    assert api.calls == [
        "get", "node_uid", "create", "replace_status",
        "replace_status", "replace_status", "replace_status",
        "get", "replace_spec", "replace_status",
        "replace_status",
    ]  # fmt: skip
    assert NodeTopology.from_spec(api.objects["n1"]["spec"]).cpu_count == 4


async def test_a_failed_report_is_retried_at_the_next_and_reads_again(tmp_path: Path) -> None:
    settings, clock, _ = _setup(tmp_path, stop_at=36)
    api = FakeApi()
    stop = asyncio.Event()

    def fail_second(elapsed: float) -> None:
        if elapsed == 20:
            api.fail_status = 1

    clock.on_advance.append(fail_second)
    assert await run_publisher(settings, api, stop, clock=clock)  # the last one succeeded
    assert api.calls == [
        "get", "node_uid", "create", "replace_status",
        "replace_status",  # failed at 20
        "get", "replace_status",  # 35: read again, the spec is fine, heartbeat
    ]  # fmt: skip


async def test_slow_work_skips_ticks_instead_of_catching_up(tmp_path: Path) -> None:
    settings, clock, _ = _setup(tmp_path, stop_at=36)
    record = Recorder(clock)

    async def slow(reading: NodeReading, now: datetime) -> None:
        await record(reading, now)
        if len(record.reports) == 1:
            clock.advance(12)  # the API server took 12 s to answer

    assert await run_agent(settings, slow, asyncio.Event(), clock=clock)
    assert [r.elapsed for r in record.reports] == [5, 20, 35]
    assert clock.sleeps[1] == 3  # from 17 to the tick at 20
    assert [r.load.samples for r in record.reports] == [2, 1, 3]  # ticks 10 and 15 skipped
    assert record.reports[1].load.window_seconds == 15


async def test_broken_proc_reports_warnings_and_no_load(tmp_path: Path) -> None:
    settings, clock, proc = _setup(tmp_path)
    (proc.root / "stat").unlink()
    clock.on_advance.clear()  # and nothing writes it again
    record = Recorder(clock)
    assert await run_agent(settings, record, asyncio.Event(), once=True, clock=clock)
    (report,) = record.reports
    assert report.reading.load is None
    assert any(w.endswith("stat: missing") for w in report.reading.warnings)


def test_settings_defaults() -> None:
    settings = AgentSettings(node_name="n")
    assert (
        settings.topology_interval_seconds,
        settings.report_interval_seconds,
        settings.sample_interval_seconds,
    ) == (60.0, 15.0, 5.0)


@pytest.mark.parametrize(
    ("intervals", "match"),
    [
        pytest.param({"report_interval_seconds": 0.5}, "at least 1s", id="report-too-fast"),
        pytest.param({"report_interval_seconds": float("nan")}, "report", id="report-nan"),
        pytest.param({"sample_interval_seconds": 0}, "sample", id="sample-zero"),
        pytest.param({"sample_interval_seconds": 20}, "sample", id="sample-above-report"),
        pytest.param({"topology_interval_seconds": -1}, "topology", id="topology-negative"),
    ],
)
def test_settings_refuse(intervals: dict[str, Any], match: str) -> None:
    with pytest.raises(ValueError, match=match):
        AgentSettings(node_name="n", **intervals)
