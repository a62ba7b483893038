"""Outcomes drive the queue and what is written: Unschedulable waits for an event, an error
or an unreadable pod backs off with reason SchedulerError; PodScheduled is patched only when
it changes and FailedScheduling is not repeated within a backoff window. Also: the metrics
these paths feed, NodeResourceTopology input, the status's graph and task ownership."""

from __future__ import annotations

import asyncio
import json
import time
from collections.abc import Mapping
from typing import Any, cast

import pytest

from scheduler.control.kubeio import BindOutcome, BindResult, KubeWriter, PodRef
from scheduler.control.queue import ClusterEvent, ClusterEventType, QueueName, pod_key
from scheduler.control.ratelimit import TokenBucket
from scheduler.control.scheduler import Scheduler
from scheduler.control.settings import parse_spec
from scheduler.control.status import build_status
from scheduler.core.schedule import Framework
from scheduler.obs.metrics import Metrics
from tests.builders import make_node, make_pod
from tests.topology.support import annotate, gpu_node, gpu_pod
from tests.topology.test_noderesourcetopology import nrt

NOW = 1_800_000_000.0


class Clock:
    """The scheduler's monotonic clock, moved by hand."""

    def __init__(self) -> None:
        self.t = 5000.0

    def __call__(self) -> float:
        return self.t


class RecordingWriter:
    """Every write the scheduler makes, in order; ``hold`` blocks events until set."""

    def __init__(self) -> None:
        self.limiter = TokenBucket(1000.0, 1000)
        self.events: list[tuple[str, str, str]] = []
        self.conditions: list[tuple[str, str, str]] = []
        self.binds: list[tuple[str, str]] = []
        self.hold: asyncio.Event | None = None

    async def bind(
        self, pod: PodRef, node: str, annotations: dict[str, str] | None = None
    ) -> BindOutcome:
        self.binds.append((pod.name, node))
        return BindOutcome(BindResult.BOUND, node=node)

    async def event(self, pod: PodRef, *, reason: str, message: str, **_: Any) -> None:
        if self.hold is not None:
            await self.hold.wait()
        self.events.append((pod.name, reason, message))

    async def mark_unschedulable(
        self, pod: PodRef, message: str, *, reason: str = "Unschedulable", **_: Any
    ) -> None:
        self.conditions.append((pod.name, reason, message))

    async def podgroup_status(self, namespace: str, name: str, status: Mapping[str, Any]) -> None:
        return None


def scheduler(nodes: int = 2) -> tuple[Scheduler, RecordingWriter, Clock]:
    writer, clock = RecordingWriter(), Clock()
    sched = Scheduler(
        parse_spec({}, "lattice"),
        writer=cast(KubeWriter, writer),
        metrics=Metrics.create(),
        clock=clock,
        wall_clock=lambda: NOW,
    )
    sched.plugin_timer.sample_every = 1
    for i in range(nodes):
        sched.node_upserted(make_node(f"n{i}", cpu="4", memory="16Gi").obj())
    return sched, writer, clock


def ours(body: dict[str, Any]) -> dict[str, Any]:
    body["spec"]["schedulerName"] = "lattice"
    return body


async def attempt(sched: Scheduler) -> None:
    """Make every waiting pod poppable, pop one, run its cycle and its reports."""
    sched.queue.flush(now=time.monotonic() + 10_000)
    info = sched.queue.try_pop()
    assert info is not None
    sched.schedule_one(info)
    await sched.drain(5)


def sample(sched: Scheduler, name: str, **labels: str) -> float | None:
    return sched.metrics.registry.get_sample_value(name, labels)


async def test_unschedulable_waits_for_an_event_with_reason_unschedulable() -> None:
    sched, writer, _ = scheduler()
    sched.pod_upserted(ours(make_pod("big", "64").obj()))
    await attempt(sched)
    assert sched.queue.where(pod_key("default", "big")) is QueueName.UNSCHEDULABLE
    assert [c[1] for c in writer.conditions] == ["Unschedulable"]
    assert [e[1] for e in writer.events] == ["FailedScheduling"]
    assert (
        sample(
            sched, "scheduler_schedule_attempts_total", result="unschedulable", profile="lattice"
        )
        == 1
    )


async def test_a_broken_pod_backs_off_with_reason_scheduler_error() -> None:
    sched, writer, _ = scheduler()
    body = ours(make_pod("bad", "1").obj())
    body["spec"]["containers"][0]["resources"]["requests"]["cpu"] = "lots"
    sched.pod_upserted(body)
    await attempt(sched)
    assert sched.queue.where(pod_key("default", "bad")) is QueueName.BACKOFF
    assert writer.conditions[0][:2] == ("bad", "SchedulerError")
    assert "lots" in writer.conditions[0][2]
    assert (
        sample(sched, "scheduler_schedule_attempts_total", result="error", profile="lattice") == 1
    )


async def test_an_internal_error_backs_off_with_reason_scheduler_error(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    sched, writer, _ = scheduler()

    def broken(*_: Any, **__: Any) -> Any:
        raise RuntimeError("plugin bug")

    monkeypatch.setattr(sched._timed_framework, "schedule", broken)
    sched.pod_upserted(ours(make_pod("p", "1").obj()))
    await attempt(sched)
    assert sched.queue.where(pod_key("default", "p")) is QueueName.BACKOFF
    assert writer.conditions == [("p", "SchedulerError", "internal error: plugin bug")]
    # A cluster event does not touch a pod in backoff: only time does.
    sched.queue.move_all_on_event(ClusterEvent(ClusterEventType.NODE_ADDED, subject="n9"))
    assert sched.queue.where(pod_key("default", "p")) is QueueName.BACKOFF


async def test_an_unchanged_condition_is_not_patched_and_events_are_aggregated() -> None:
    sched, writer, clock = scheduler()
    sched.pod_upserted(ours(make_pod("big", "64").obj()))
    await attempt(sched)
    await attempt(sched)  # same message, same backoff window
    assert len(writer.conditions) == 1
    assert len(writer.events) == 1
    clock.t += sched.event_repeat_after
    await attempt(sched)  # same message, a window later: the event again, no patch
    assert len(writer.conditions) == 1
    assert len(writer.events) == 2
    sched.node_deleted({"metadata": {"name": "n1"}})
    await attempt(sched)  # a new message: both
    assert len(writer.conditions) == 2
    assert len(writer.events) == 3
    assert writer.conditions[-1][2].startswith("0/1 nodes are available")


async def test_a_new_leader_does_not_repatch_what_the_pod_already_says() -> None:
    sched, writer, _ = scheduler()
    body = ours(make_pod("big", "64").obj())
    sched.pod_upserted(body)
    await attempt(sched)
    written = writer.conditions[0]
    successor, theirs, _ = scheduler()
    body["status"] = {
        "conditions": [
            {"type": "PodScheduled", "status": "False", "reason": written[1], "message": written[2]}
        ]
    }
    successor.pod_upserted(body)
    await attempt(successor)
    assert theirs.conditions == []
    assert len(theirs.events) == 1, "the event is still sent: it is per attempt"


async def test_binding_counts_as_kube_scheduler_counts_it() -> None:
    sched, writer, _ = scheduler()
    sched.pod_upserted(ours(make_pod("p", "1").obj()))
    await attempt(sched)
    assert writer.binds == [("p", "n0")] or writer.binds == [("p", "n1")]
    assert (
        sample(sched, "scheduler_schedule_attempts_total", result="scheduled", profile="lattice")
        == 1
    )
    assert sample(sched, "scheduler_pod_scheduling_sli_duration_seconds_count", attempts="1") == 1
    assert sample(sched, "lattice_scheduling_e2e_duration_seconds_count") == 1
    filters = sample(
        sched,
        "scheduler_plugin_execution_duration_seconds_count",
        plugin="NodeResourcesFit",
        extension_point="Filter",
        status="Success",
    )
    assert filters == 1
    scores = [
        s
        for family in sched.metrics.registry.collect()
        if family.name == "scheduler_plugin_execution_duration_seconds"
        for s in family.samples
        if s.name.endswith("_count") and s.labels["extension_point"] == "Score" and s.value
    ]
    assert scores, "every score plugin that ran is timed"
    sched.tick()
    assert sample(sched, "scheduler_pending_pods", queue="active") == 0
    assert sample(sched, "lattice_graph_patches_total") == sched.cache.snapshot.affinity_graph.seq
    assert sched.cache.snapshot.affinity_graph.seq > 0


async def test_a_rejecting_filter_is_timed_with_its_status() -> None:
    sched, _, _ = scheduler()
    sched.pod_upserted(ours(make_pod("big", "64").obj()))
    await attempt(sched)
    statuses = {
        s.labels["status"]
        for family in sched.metrics.registry.collect()
        if family.name == "scheduler_plugin_execution_duration_seconds"
        for s in family.samples
        if s.name.endswith("_count")
        and s.value
        and s.labels["plugin"] == "NodeResourcesFit"
        and s.labels["extension_point"] == "Filter"
    }
    # The plugin's own rejection code, by kube-scheduler's name for it.
    assert statuses in ({"Unschedulable"}, {"UnschedulableAndUnresolvable"})


async def test_plugin_timing_is_sampled() -> None:
    sched, _, _ = scheduler()
    sched.plugin_timer.sample_every = 10
    for i in range(10):
        sched.pod_upserted(ours(make_pod(f"p{i}", "100m").obj()))
    for _ in range(10):
        await attempt(sched)
    timed = sample(
        sched,
        "scheduler_plugin_execution_duration_seconds_count",
        plugin="NodeResourcesFit",
        extension_point="Filter",
        status="Success",
    )
    assert timed == 1, "cycles 1..10: only the 10th is sampled"


def test_the_gang_solver_still_finds_plugins_by_type() -> None:
    sched, _, _ = scheduler()
    assert type(sched.framework) is Framework
    names = [p.name for p in sched._timed_framework.plugins.filters]
    assert names == [p.name for p in sched.framework.plugins.filters]
    assert all(type(p).__name__ != "TimedPlugin" for p in sched.framework.plugins.filters)


async def test_shutdown_cancels_what_does_not_finish(no_leaked_tasks: None) -> None:
    sched, writer, _ = scheduler()
    writer.hold = asyncio.Event()  # the API server stopped answering
    sched.pod_upserted(ours(make_pod("big", "64").obj()))
    sched.queue.flush(now=time.monotonic() + 10_000)
    info = sched.queue.try_pop()
    assert info is not None
    sched.schedule_one(info)
    assert sched._tasks
    await sched.shutdown(0.05)
    assert not sched._tasks
    assert writer.events == []


def test_status_shows_the_affinity_graph() -> None:
    sched, _, _ = scheduler()
    bound = make_pod("web", "1").label("app", "web").node_name("n0").obj()
    bound["metadata"]["resourceVersion"] = "3"
    sched.pod_upserted(bound)
    status = build_status(sched, leader="me", ready=True, settings_error=None, generation=1)
    graph = sched.cache.snapshot.affinity_graph.graph
    assert status["graph"] == {"vertices": len(graph), "edges": graph.number_of_edges()}
    assert status["graph"]["vertices"] >= 3  # two nodes and the pod at least
    assert status["graph"]["edges"] >= 1


def gpu_scheduler() -> Scheduler:
    sched = Scheduler(parse_spec({}, "lattice"), writer=None, metrics=Metrics.create())
    sched.node_upserted(gpu_node("n").obj())
    return sched


def decide(sched: Scheduler, builder: Any) -> Any:
    return sched.framework.schedule(
        sched.cache.snapshot, builder.build(), topology=sched.cache.topology
    )


def test_a_node_resource_topology_makes_placement_numa_aware() -> None:
    sched = gpu_scheduler()
    assert decide(sched, gpu_pod("x", 8)).selected == "n", "without NUMA facts 8 GPUs fit"
    sched.node_reports.nrt_upserted(nrt("n"))
    assert decide(sched, gpu_pod("x", 8)).summary == (
        "0/1 nodes are available: 1 node(s) cannot hold 8 GPUs on one NUMA node."
    )
    aligned = decide(sched, annotate(gpu_pod("a", 2), "lattice.dev/gpu-alignment", "strict"))
    assert json.loads(aligned.annotations["lattice.dev/devices"])["numa"] == 0
    sched.node_reports.nrt_deleted({"metadata": {"name": "n"}})
    assert decide(sched, gpu_pod("x", 8)).selected == "n"


def test_an_unchanged_or_broken_node_resource_topology_moves_nothing() -> None:
    sched = gpu_scheduler()
    sched.pod_upserted(ours(gpu_pod("x", 16).obj()))
    sched.queue.flush(now=time.monotonic() + 10_000)
    info = sched.queue.try_pop()
    assert info is not None
    sched.schedule_one(info)
    assert sched.queue.where(pod_key("default", "x")) is QueueName.UNSCHEDULABLE
    sched.node_reports.nrt_upserted(nrt("n"))
    assert sched.queue.where(pod_key("default", "x")) is not QueueName.UNSCHEDULABLE
    sched.queue.flush(now=time.monotonic() + 10_000)
    info = sched.queue.try_pop()
    assert info is not None
    sched.schedule_one(info)
    assert sched.queue.where(pod_key("default", "x")) is QueueName.UNSCHEDULABLE
    sched.node_reports.nrt_upserted(nrt("n"))  # the updater's periodic rewrite: same zones
    assert sched.queue.where(pod_key("default", "x")) is QueueName.UNSCHEDULABLE
    broken = nrt("n")
    broken["zones"] = {"node-0": {}}
    sched.node_reports.nrt_upserted(broken)
    assert sched.node_reports.nrt_names() == set()
    assert decide(sched, gpu_pod("y", 8)).selected == "n"


async def test_a_node_declaring_a_feature_wakes_only_the_pods_that_need_one() -> None:
    """kube's NodeDeclaredFeatures registers Node/UpdateNodeDeclaredFeature with a hint that
    queues on a change of ``status.declaredFeatures``; no other plugin registers for it."""
    feature = "RestartAllContainersOnContainerExits"
    sched, writer, _ = scheduler()

    async def attempt_within_stay() -> None:
        # Backoffs (seconds) end, the unschedulable pods' 5-minute stay does not.
        sched.queue.flush(now=time.monotonic() + 100)
        info = sched.queue.try_pop()
        assert info is not None
        sched.schedule_one(info)
        await sched.drain(5)

    sched.pod_upserted(ours(make_pod("needy", "1").restart_rule().obj()))
    sched.pod_upserted(ours(make_pod("big", "64").obj()))
    await attempt_within_stay()
    await attempt_within_stay()
    needy, big = pod_key("default", "needy"), pod_key("default", "big")
    assert sched.queue.where(needy) is QueueName.UNSCHEDULABLE
    assert sched.queue.where(big) is QueueName.UNSCHEDULABLE
    message = next(e[2] for e in writer.events if e[:2] == ("needy", "FailedScheduling"))
    assert "2 node(s) didn't match Pod's required features" in message

    same = make_node("n0", cpu="4", memory="16Gi")
    sched.node_upserted(same.obj())  # nothing a decision reads changed
    assert sched.queue.where(needy) is QueueName.UNSCHEDULABLE

    sched.node_upserted(same.declared_features(feature).obj())
    assert sched.queue.where(needy) is not QueueName.UNSCHEDULABLE
    assert sched.queue.where(big) is QueueName.UNSCHEDULABLE, "no feature helps it"
    await attempt_within_stay()
    assert writer.binds == [("needy", "n0")]


async def test_identical_pods_are_batched_and_counted() -> None:
    """A run of identical pods: the first runs the full cycle, the others reuse it (kube's
    OpportunisticBatching); a sampled cycle times every plugin, so it runs in full."""
    sched, _, _ = scheduler()
    sched.plugin_timer.sample_every = 1_000_000
    for i in range(6):
        sched.pod_upserted(ours(make_pod(f"p{i}", "100m").obj()))
    for _ in range(6):
        await attempt(sched)
    assert sample(sched, "lattice_scheduling_batched_cycles_total") == 5
    assert sched.counters.scheduled == 6
