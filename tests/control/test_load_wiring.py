"""The scheduler feeds agents' load reports and its own placements to the predictor, applies
loadAware settings live, and never lets a broken report cost anything but that sample."""

from __future__ import annotations

from datetime import UTC, datetime
from typing import Any

import pytest

from scheduler.agent.resource import node_topology_object
from scheduler.control.queue import QueueName, pod_key
from scheduler.control.scheduler import Scheduler
from scheduler.control.settings import SettingsError, parse_spec
from scheduler.model.topology import (
    LOCAL_NUMA_DISTANCE,
    NodeLoad,
    NodeTopology,
    NodeTopologyStatus,
    NumaNode,
)
from scheduler.obs.metrics import Metrics
from scheduler.predict import LoadStatus
from tests.builders import make_node, make_pod

GIB = 1024**3
NOW = 1_800_000_000.0


def topology_body(node: str, cpu_fraction: float | None, *, at: float = NOW - 5) -> dict[str, Any]:
    topo = NodeTopology(
        numa_nodes=(
            NumaNode(
                id=0,
                cpus=frozenset(range(4)),
                memory_bytes=16 * GIB,
                distances=(LOCAL_NUMA_DISTANCE,),
            ),
        )
    )
    stamp = datetime.fromtimestamp(at, UTC)
    load = None
    if cpu_fraction is not None:
        load = NodeLoad(
            sample_time=stamp,
            window_seconds=15.0,
            samples=3,
            cpu_used_milli=round(cpu_fraction * 4000),
            cpu_capacity_milli=4000,
            mem_used_bytes=4 * GIB,
            mem_capacity_bytes=16 * GIB,
        )
    status = NodeTopologyStatus(last_report_time=stamp, load=load)
    return dict(node_topology_object(node, topo, status))


def scheduler(spec: dict[str, Any] | None = None, nodes: int = 2) -> Scheduler:
    sched = Scheduler(
        parse_spec(spec or {}, "lattice"),
        writer=None,
        metrics=Metrics.create(),
        wall_clock=lambda: NOW,
    )
    for i in range(nodes):
        sched.node_upserted(make_node(f"n{i}", cpu="4", memory="16Gi").obj())
    return sched


def queue_pod(sched: Scheduler, name: str, cpu: str = "200m") -> dict[str, Any]:
    body = make_pod(name, cpu).obj()
    body["spec"]["schedulerName"] = "lattice"
    sched.pod_upserted(body)
    return body


def schedule_next(sched: Scheduler) -> str | None:
    info = sched.queue.try_pop()
    assert info is not None
    node_before = {
        n: sched.cache.snapshot.pod_counts[i] for i, n in enumerate(sched.cache.snapshot.node_names)
    }
    sched.schedule_one(info)
    after = {
        n: sched.cache.snapshot.pod_counts[i] for i, n in enumerate(sched.cache.snapshot.node_names)
    }
    placed = [n for n in after if after[n] > node_before[n]]
    return placed[0] if placed else None


@pytest.fixture(autouse=True)
def _no_binding(monkeypatch: pytest.MonkeyPatch) -> None:
    # With writer=None the binder cannot run; swallow the spawned coroutine.
    monkeypatch.setattr(Scheduler, "_spawn", lambda self, coro: coro.close())


def test_reports_steer_placement_away_from_the_hot_node() -> None:
    sched = scheduler()
    sched.node_reports.topology_upserted(topology_body("n0", 0.9))
    sched.node_reports.topology_upserted(topology_body("n1", 0.3))
    assert sched.load.status("n0", NOW) is LoadStatus.FRESH
    queue_pod(sched, "p")
    assert schedule_next(sched) == "n1"
    assert sched.load.inflight_pods("n1") == ("default/p",)


def test_own_placements_count_until_reported() -> None:
    """Both nodes equally loaded: big pods alternate because each placement is counted."""
    sched = scheduler()
    for n in ("n0", "n1"):
        sched.node_reports.topology_upserted(topology_body(n, 0.2))
    chosen: list[str] = []
    for i in range(4):
        queue_pod(sched, f"p{i}", cpu="1")
        chosen.append(str(schedule_next(sched)))
    assert sorted(chosen) == ["n0", "n0", "n1", "n1"]


def test_deleted_pod_drops_its_estimate() -> None:
    sched = scheduler()
    sched.node_reports.topology_upserted(topology_body("n0", 0.2))
    body = queue_pod(sched, "p")
    node = schedule_next(sched)
    assert node is not None
    sched.pod_deleted(body)
    assert sched.load.inflight_pods(node) == ()


def test_heartbeat_without_load_and_broken_load_are_harmless() -> None:
    sched = scheduler()
    sched.node_reports.topology_upserted(topology_body("n0", None))
    assert sched.load.status("n0", NOW) is LoadStatus.UNKNOWN
    broken = topology_body("n1", 0.5)
    broken["status"]["load"]["cpu"]["usedMillicores"] = "lots"
    sched.node_reports.topology_upserted(broken)
    assert sched.load.status("n1", NOW) is LoadStatus.UNKNOWN
    assert (
        sched.metrics.registry.get_sample_value(
            "lattice_load_reports_total", {"outcome": "unreadable"}
        )
        == 1
    )
    # The spec was fine, so the topology itself is still known.
    assert sched.cache.topology.layout("n1") is not None


def test_settings_apply_live_and_keep_state() -> None:
    sched = scheduler()
    sched.node_reports.topology_upserted(topology_body("n0", 0.2, at=NOW - 20))
    sched.node_reports.topology_upserted(topology_body("n0", 0.8, at=NOW - 5))
    before = sched.load.config.cpu_alpha
    sched.apply_settings(parse_spec({"loadAware": {"cpuAlpha": 0.9}}, "lattice"))
    assert sched.load.config.cpu_alpha == 0.9 != before
    assert sched.load.status("n0", NOW) is LoadStatus.FRESH  # series kept
    with pytest.raises(SettingsError, match="cpuAlpha"):
        parse_spec({"loadAware": {"cpuAlpha": 0}}, "lattice")


def test_hot_everywhere_waits_and_is_retried_when_load_falls() -> None:
    sched = scheduler({"loadAware": {"cpuThreshold": 0.8}})
    sched.node_reports.topology_upserted(topology_body("n0", 0.95))
    sched.node_reports.topology_upserted(topology_body("n1", 0.9))
    queue_pod(sched, "p")
    assert schedule_next(sched) is None
    key = pod_key("default", "p")
    assert sched.queue.where(key) is QueueName.UNSCHEDULABLE
    sched.node_reports.topology_upserted(topology_body("n1", 0.3, at=NOW - 1))
    assert sched.queue.where(key) in (QueueName.ACTIVE, QueueName.BACKOFF)


def test_load_reports_move_nothing_without_a_load_filter() -> None:
    """Agents report every 15 s; without a load filter no report can help a pod."""
    sched = scheduler(nodes=1)
    sched.node_reports.topology_upserted(topology_body("n0", 0.5, at=NOW - 10))
    queue_pod(sched, "huge", cpu="64")
    assert schedule_next(sched) is None
    key = pod_key("default", "huge")
    assert sched.queue.where(key) is QueueName.UNSCHEDULABLE
    # same spec, lower load
    sched.node_reports.topology_upserted(topology_body("n0", 0.1, at=NOW - 1))
    assert sched.queue.where(key) is QueueName.UNSCHEDULABLE


def _bound_body(name: str, node: str, scheduled: float | None) -> dict[str, Any]:
    body = make_pod(name, "1").obj()
    body["spec"]["nodeName"] = node
    body["metadata"]["uid"] = f"uid-{name}"
    if scheduled is not None:
        stamp = datetime.fromtimestamp(scheduled, UTC).strftime("%Y-%m-%dT%H:%M:%SZ")
        body["status"] = {
            "phase": "Running",
            "conditions": [{"type": "PodScheduled", "status": "True", "lastTransitionTime": stamp}],
        }
    return body


def test_pods_bound_by_others_count_until_samples_cover_them() -> None:
    sched = scheduler()
    sched.node_reports.topology_upserted(topology_body("n0", 0.2, at=NOW - 5))
    sched.pod_upserted(_bound_body("fresh", "n0", NOW - 2))  # after the sample
    sched.pod_upserted(_bound_body("covered", "n0", NOW - 100))  # long before it
    sched.pod_upserted(_bound_body("no-condition", "n0", None))
    assert sched.load.inflight_pods("n0") == ("default/fresh",)
    sched.pod_deleted(_bound_body("fresh", "n0", NOW - 2))
    assert sched.load.inflight_pods("n0") == ()


def test_prefer_below_defaults_can_be_changed_or_switched_off() -> None:
    default = parse_spec({}, "lattice").profile.load_aware.predict
    assert (default.cpu_prefer_below, default.memory_prefer_below) == (0.8, 0.9)
    spec = {"loadAware": {"cpuPreferBelow": 0.7, "memoryPreferBelow": None}}
    tuned = parse_spec(spec, "lattice").profile.load_aware.predict
    assert (tuned.cpu_prefer_below, tuned.memory_prefer_below) == (0.7, None)
    with pytest.raises(SettingsError, match="cpuPreferBelow") as err:
        parse_spec({"loadAware": {"cpuPreferBelow": 1.5, "cpuAlpha": 2}}, "lattice")
    assert "cpuAlpha" in str(err.value)  # every problem at once
