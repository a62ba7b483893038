"""NodeLoad: the wire form of ``status.load`` and its round trip."""

from __future__ import annotations

import json
from dataclasses import replace
from datetime import UTC, datetime, timedelta, timezone
from typing import Any

import pytest

from scheduler.model.topology import (
    NodeLoad,
    NodeTopologyStatus,
    TopologyParseError,
    format_micro_time,
)

T = datetime(2025, 3, 1, 12, 0, 5, 123456, tzinfo=UTC)
LOAD = NodeLoad(
    sample_time=T,
    window_seconds=15.0,
    samples=3,
    cpu_used_milli=3_210,
    cpu_capacity_milli=8_000,
    cpu_peak_milli=7_999,
    mem_used_bytes=3 << 30,
    mem_capacity_bytes=16 << 30,
)


def test_to_spec() -> None:
    assert LOAD.to_spec() == {
        "sampleTime": "2025-03-01T12:00:05.123456Z",
        "windowSeconds": 15.0,
        "samples": 3,
        "cpu": {"usedMillicores": 3210, "capacityMillicores": 8000, "peakMillicores": 7999},
        "memory": {"usedBytes": 3 << 30, "capacityBytes": 16 << 30},
        "cpuPercent": 40,
        "memoryPercent": 19,
    }
    assert "peakMillicores" not in replace(LOAD, cpu_peak_milli=None).to_spec()["cpu"]


@pytest.mark.parametrize(
    "load",
    [
        pytest.param(LOAD, id="full"),
        pytest.param(replace(LOAD, cpu_peak_milli=None), id="no-peak"),
        pytest.param(replace(LOAD, window_seconds=4.25, samples=1), id="fractional-window"),
    ],
)
def test_round_trip_through_json(load: NodeLoad) -> None:
    assert NodeLoad.from_spec(json.loads(json.dumps(load.to_spec()))) == load


def test_integral_window_from_the_server_parses() -> None:
    raw: dict[str, Any] = dict(LOAD.to_spec())
    raw["windowSeconds"] = 15  # a JSON 15.0 may come back as 15
    assert NodeLoad.from_spec(raw) == LOAD


def test_sample_time_keeps_microseconds_and_converts_to_utc() -> None:
    cet = timezone(timedelta(hours=1))
    assert format_micro_time(T.astimezone(cet)) == "2025-03-01T12:00:05.123456Z"
    assert format_micro_time(T.replace(microsecond=0)) == "2025-03-01T12:00:05.000000Z"


def test_status_round_trip_with_load() -> None:
    status = NodeTopologyStatus(last_report_time=T.replace(microsecond=0), load=LOAD)
    raw = status.to_status()
    assert raw["load"]["sampleTime"] == "2025-03-01T12:00:05.123456Z"
    assert NodeTopologyStatus.from_status(raw) == status
    assert NodeTopologyStatus.from_status({"lastReportTime": raw["lastReportTime"]}).load is None


@pytest.mark.parametrize(
    "changes",
    [
        pytest.param({"sample_time": datetime(2025, 3, 1)}, id="naive-time"),
        pytest.param({"cpu_capacity_milli": 0}, id="no-cpu-capacity"),
        pytest.param({"mem_capacity_bytes": 0}, id="no-memory-capacity"),
        pytest.param({"cpu_used_milli": -1}, id="negative-cpu"),
        pytest.param({"samples": -1}, id="negative-samples"),
        pytest.param({"window_seconds": float("nan")}, id="nan-window"),
    ],
)
def test_invalid_loads_are_refused(changes: dict[str, Any]) -> None:
    with pytest.raises(ValueError, match=r"load|window|aware|capacit"):
        replace(LOAD, **changes)


@pytest.mark.parametrize(
    ("path", "value"),
    [
        pytest.param(("cpu", "usedMillicores"), "3", id="string-number"),
        pytest.param(("memory", "capacityBytes"), 0, id="zero-capacity"),
        pytest.param(("sampleTime",), "yesterday", id="bad-time"),
        pytest.param(("samples",), True, id="bool-samples"),
    ],
)
def test_from_spec_rejects_garbage(path: tuple[str, ...], value: object) -> None:
    raw: Any = json.loads(json.dumps(LOAD.to_spec()))
    target = raw
    for key in path[:-1]:
        target = target[key]
    target[path[-1]] = value
    with pytest.raises(TopologyParseError):
        NodeLoad.from_spec(raw)
    with pytest.raises(TopologyParseError):
        NodeLoad.from_spec({k: v for k, v in LOAD.to_spec().items() if k != "memory"})
