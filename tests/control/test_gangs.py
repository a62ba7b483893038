"""Gangs in the scheduler process, without a server: a fake writer records what would be
written. Quorum gates the gang's one queue entry; a commit assumes every member or none;
a failed binding is re-placed or makes the gang partial and first in line."""

from __future__ import annotations

import importlib
import time
from collections.abc import Callable, Mapping
from typing import Any, cast

import numpy as np
import pytest
from structlog.testing import capture_logs

from scheduler.control.gangs import PARTIAL_BOOST, GangEntry, entry_key
from scheduler.control.kubeio import BindOutcome, BindResult, KubeWriter, PodRef
from scheduler.control.queue import QueueName, pod_key
from scheduler.control.ratelimit import TokenBucket
from scheduler.control.scheduler import Scheduler
from scheduler.control.settings import parse_spec
from scheduler.model.gang import GANG_TOPOLOGY_ANNOTATION
from scheduler.obs.metrics import Metrics
from scheduler.solver.model import ModelOutcome, ModelStatus
from scheduler.solver.problem import GangProblem
from tests.builders import make_node, make_pod

NOW = 1_800_000_000.0
LABEL = "scheduling.x-k8s.io/pod-group"


class FakeWriter:
    """What KubeWriter would send, recorded; bindings of names in ``fail`` fail once."""

    def __init__(self) -> None:
        self.limiter = TokenBucket(1000.0, 1000)
        self.binds: list[tuple[str, str]] = []
        self.bind_annotations: dict[str, dict[str, str]] = {}
        """Per bound pod, the Binding's annotations (the API server copies them on)."""
        self.events: list[tuple[str, str, str, str]] = []
        self.statuses: list[tuple[str, Mapping[str, Any]]] = []
        self.fail: set[str] = set()
        self.conditions: list[tuple[str, str, str, str | None]] = []
        """PodScheduled=False patches: pod, reason, message, nominatedNodeName written."""
        self.status_patches: list[tuple[str, dict[str, Any]]] = []
        self.deletes: list[str] = []
        self.gone: set[str] = set()
        """Pods the API no longer has: their status patch and deletion answer 404."""
        self.on_fail: Callable[[str], None] = lambda node: None
        """Called with the node of a failed binding (a test deletes it: node gone)."""
        self.rates: list[tuple[float, int]] = []
        """Client QPS and burst of each settings change, as the real writer takes them."""

    def reconfigure(self, qps: float, burst: int) -> None:
        self.rates.append((qps, burst))

    async def bind(
        self, pod: PodRef, node: str, annotations: dict[str, str] | None = None
    ) -> BindOutcome:
        if pod.name in self.fail:
            self.fail.discard(pod.name)
            self.on_fail(node)
            return BindOutcome(BindResult.ERROR, "500: injected")
        self.binds.append((pod.name, node))
        self.bind_annotations[pod.name] = dict(annotations or {})
        return BindOutcome(BindResult.BOUND, node=node)

    async def event(
        self,
        pod: PodRef,
        *,
        reason: str,
        message: str,
        warning: bool = False,
        action: str = "Scheduling",
        trace_id: str | None = None,
        kind: str = "Pod",
        api_version: str = "v1",
    ) -> None:
        self.events.append((kind, pod.name, reason, message))

    async def mark_unschedulable(
        self,
        pod: PodRef,
        message: str,
        *,
        reason: str = "Unschedulable",
        nominated_node: str | None = None,
    ) -> None:
        self.conditions.append((pod.name, reason, message, nominated_node))

    async def patch_pod_status(self, pod: PodRef, status: Mapping[str, Any]) -> bool:
        self.status_patches.append((pod.name, dict(status)))
        return pod.name not in self.gone

    async def delete_pod(self, pod: PodRef) -> bool:
        if pod.name in self.gone:
            return False
        self.deletes.append(pod.name)
        return True

    async def podgroup_status(self, namespace: str, name: str, status: Mapping[str, Any]) -> None:
        self.statuses.append((name, status))

    async def upstream_podgroup_status(
        self, namespace: str, name: str, status: Mapping[str, Any]
    ) -> None:
        self.statuses.append((f"scheduling.k8s.io:{name}", status))


def node_gone(sched: Scheduler) -> Callable[[str], None]:
    return lambda node: sched.node_deleted({"metadata": {"name": node}})


class Clock:
    """A monotonic clock a test moves by hand."""

    def __init__(self) -> None:
        self.now = 1000.0

    def __call__(self) -> float:
        return self.now


def scheduler(
    nodes: int = 3,
    cpu: str = "4",
    *,
    clock: Clock | None = None,
    spec: dict[str, Any] | None = None,
) -> tuple[Scheduler, FakeWriter]:
    writer = FakeWriter()
    sched = Scheduler(
        parse_spec(spec or {}, "lattice"),
        writer=cast(KubeWriter, writer),
        metrics=Metrics.create(),
        clock=clock if clock is not None else Clock(),
        wall_clock=lambda: NOW,
    )
    for i in range(nodes):
        sched.node_upserted(make_node(f"n{i}", cpu=cpu, memory="16Gi").obj())
    return sched, writer


def podgroup(name: str, min_member: int, **annotations: str) -> dict[str, Any]:
    return {
        "apiVersion": "scheduling.x-k8s.io/v1alpha1",
        "kind": "PodGroup",
        "metadata": {
            "name": name,
            "namespace": "default",
            "uid": f"pg-{name}",
            "annotations": dict(annotations),
        },
        "spec": {"minMember": min_member},
    }


def member(name: str, group: str, cpu: str = "1") -> dict[str, Any]:
    body = make_pod(name, cpu).label(LABEL, group).obj()
    body["spec"]["schedulerName"] = "lattice"
    return body


async def run_one(sched: Scheduler) -> None:
    """Pop one entry, run its cycle, and let its solve, commit and bindings finish."""
    info = sched.queue.try_pop()
    assert info is not None
    if isinstance(info.pod, GangEntry):
        sched.gang_flow.schedule(info)
    else:
        sched.schedule_one(info)
    await sched.drain(30)
    await sched.drain(30)  # bindings spawned by a commit


async def test_quorum_gates_the_one_entry_and_members_never_queue_alone() -> None:
    sched, writer = scheduler()
    sched.podgroup_upserted(podgroup("g", 3))
    sched.pod_upserted(member("a", "g"))
    sched.pod_upserted(member("b", "g"))
    key = entry_key("default/g")
    assert sched.queue.where(key) is QueueName.GATED
    assert sched.queue.where(pod_key("default", "a")) is None
    await sched.drain(5)
    waiting = [e for e in writer.events if e[2] == "FailedScheduling"]
    assert {e[1] for e in waiting} == {"a", "b"}
    assert "waiting for quorum" in waiting[0][3]
    sched.pod_upserted(member("c", "g"))
    assert sched.queue.where(key) is QueueName.ACTIVE
    await run_one(sched)
    assert sorted(n for n, _ in writer.binds) == ["a", "b", "c"]
    assert sched.queue.where(key) is None
    assert sched.metrics.gang_attempts.labels(outcome="optimal")._value.get() == 1


async def test_missing_podgroup_waits_with_a_clear_event() -> None:
    sched, writer = scheduler()
    sched.pod_upserted(member("a", "nope"))
    assert sched.queue.where(entry_key("default/nope")) is QueueName.GATED
    await sched.drain(5)
    assert any("waiting for PodGroup default/nope" in e[3] for e in writer.events)
    sched.podgroup_upserted(podgroup("nope", 1))
    assert sched.queue.where(entry_key("default/nope")) is QueueName.ACTIVE


async def test_a_gang_that_does_not_fit_binds_nothing_and_waits_as_one() -> None:
    sched, writer = scheduler(nodes=2)
    sched.podgroup_upserted(podgroup("g", 3))
    for name in "abc":
        sched.pod_upserted(member(name, "g", cpu="3"))
    await run_one(sched)
    assert writer.binds == []
    assert sched.queue.where(entry_key("default/g")) is QueueName.UNSCHEDULABLE
    failed = [e for e in writer.events if e[2] == "FailedScheduling" and "quorum" not in e[3]]
    assert {e[1] for e in failed} == {"a", "b", "c"}
    assert all(e[3].startswith("gang default/g: ") for e in failed)
    assert sched.cache.snapshot.pod_counts.sum() == 0, "nothing reserved for a rejected gang"
    sched.node_upserted(make_node("n9", cpu="4", memory="16Gi").obj())
    assert sched.queue.where(entry_key("default/g")) in (QueueName.ACTIVE, QueueName.BACKOFF)


async def test_members_beyond_min_member_are_placed_one_by_one_after_admission() -> None:
    sched, writer = scheduler()
    sched.podgroup_upserted(podgroup("g", 2))
    for name in "ab":
        sched.pod_upserted(member(name, "g"))
    await run_one(sched)
    assert len(writer.binds) >= 2
    sched.pod_upserted(member("late", "g"))
    assert sched.queue.where(pod_key("default", "late")) is QueueName.ACTIVE
    await run_one(sched)
    assert "late" in {n for n, _ in writer.binds}


async def test_a_failed_binding_is_replaced_elsewhere() -> None:
    sched, writer = scheduler(nodes=3, cpu="4")
    sched.podgroup_upserted(podgroup("g", 2))
    for name in "ab":
        sched.pod_upserted(member(name, "g", cpu="3"))
    writer.fail.add("a")
    lost: list[str] = []

    def lose(node: str) -> None:
        lost.append(node)
        node_gone(sched)(node)

    writer.on_fail = lose
    await run_one(sched)
    await sched.drain(10)
    assert sorted(n for n, _ in writer.binds) == ["a", "b"]
    assert len({node for _, node in writer.binds}) == 2
    assert lost[0] not in {node for _, node in writer.binds}
    assert sched.gang_flow.gangs.partial_count() == 0


async def test_a_member_that_cannot_be_replaced_makes_the_gang_partial_and_first() -> None:
    sched, writer = scheduler(nodes=2, cpu="4")
    sched.podgroup_upserted(podgroup("g", 2))
    for name in "ab":
        sched.pod_upserted(member(name, "g", cpu="3"))
    writer.fail.add("a")
    writer.on_fail = node_gone(sched)
    await run_one(sched)
    await sched.drain(10)
    assert [n for n, _ in writer.binds] == ["b"]
    gang = sched.gang_flow.gangs.get("default/g")
    assert gang is not None
    assert gang.partial
    queued = sched.queue.get(entry_key("default/g"))
    assert queued is not None
    assert queued.pod.priority >= PARTIAL_BOOST
    assert any(e[0] == "PodGroup" and e[2] == "GangPartial" for e in writer.events)
    sched.tick()
    assert sched.metrics.gangs_partial._value.get() == 1


async def test_status_is_written_on_change_only() -> None:
    sched, writer = scheduler()
    sched.podgroup_upserted(podgroup("g", 2))
    for name in "ab":
        sched.pod_upserted(member(name, "g"))
    await run_one(sched)
    await sched.gang_flow.write_statuses()
    assert writer.statuses
    name, status = writer.statuses[-1]
    assert name == "g"
    assert status["phase"] == "Scheduled"
    assert status["scheduled"] == 2
    assert status.get("scheduleStartTime")
    count = len(writer.statuses)
    sched.gang_flow.dirty.add("default/g")
    await sched.gang_flow.write_statuses()
    assert len(writer.statuses) == count


async def test_an_invalid_podgroup_is_reported_and_crashes_nothing() -> None:
    sched, writer = scheduler()
    bad = podgroup("g", 2)
    bad["spec"]["minMember"] = "two"
    sched.podgroup_upserted(bad)
    sched.pod_upserted(member("a", "g"))
    assert sched.queue.where(entry_key("default/g")) is QueueName.GATED
    await sched.drain(5)
    assert any("PodGroup is invalid" in e[3] for e in writer.events)


async def test_restart_counts_bound_members_so_the_rest_is_completed() -> None:
    sched, writer = scheduler()
    sched.podgroup_upserted(podgroup("g", 3))
    bound = member("a", "g")
    bound["spec"]["nodeName"] = "n0"
    bound["metadata"]["resourceVersion"] = "5"
    sched.cache.observe_bound_pod(bound)  # as the start-up list fills the cache
    sched.gang_flow.note_bound_members([bound])
    for name in "bc":
        sched.pod_upserted(member(name, "g"))
    gang = sched.gang_flow.gangs.get("default/g")
    assert gang is not None
    assert gang.need == 2
    assert gang.partial
    await run_one(sched)
    assert sorted(n for n, _ in writer.binds) == ["b", "c"]


def test_every_solver_outcome_has_a_precreated_metric_series() -> None:
    from scheduler.obs.metrics import GANG_OUTCOMES
    from scheduler.solver import SolveStatus

    assert set(GANG_OUTCOMES) == {s.value for s in SolveStatus}


async def test_a_finishing_gang_with_nobody_waiting_is_not_partial() -> None:
    sched, _ = scheduler()
    sched.podgroup_upserted(podgroup("g", 2))
    for name in "ab":
        sched.pod_upserted(member(name, "g"))
    await run_one(sched)
    done = member("a", "g")
    done["spec"]["nodeName"] = "n0"
    done["status"] = {"phase": "Succeeded"}
    sched.pod_upserted(done)
    gang = sched.gang_flow.gangs.get("default/g")
    assert gang is not None
    assert gang.need == 1
    assert not gang.partial
    assert sched.queue.get(entry_key("default/g")) is None


async def test_a_valid_spread_plan_is_committed_as_planned() -> None:
    """a1 holds two small members or one large one, b1 two large ones: the one valid plan
    (small+small on a1, large+large on b1, maxSkew 1 over zones) must commit as it stands.
    Re-checked in member order, the second small member failed on a1 (skew 2), moved to b1,
    and the second large member then found no room: the gang retried the same plan forever."""
    sched, writer = scheduler(nodes=0)
    sched.node_upserted(make_node("a1", cpu="2", memory="16Gi").label("zone", "a").obj())
    sched.node_upserted(make_node("b1", cpu="4", memory="16Gi").label("zone", "b").obj())
    sched.podgroup_upserted(podgroup("g", 4))
    for name, cpu in (("y0", "1"), ("y1", "1"), ("x0", "2"), ("x1", "2")):
        body = make_pod(name, cpu).label(LABEL, "g").label("app", "g")
        body.spread(1, "zone", {"app": "g"})
        obj = body.obj()
        obj["spec"]["schedulerName"] = "lattice"
        sched.pod_upserted(obj)
    await run_one(sched)
    assert dict(writer.binds) == {"y0": "a1", "y1": "a1", "x0": "b1", "x1": "b1"}
    assert sched.gang_flow.last_plans["default/g"].status.value == "optimal"
    assert sched.queue.where(entry_key("default/g")) is None


def spanning_solver(
    monkeypatch: pytest.MonkeyPatch, sched: Scheduler, a2_cpu: str, cpus: tuple[str, str]
) -> None:
    """Nodes a1 (8 CPU), a2 in zone a, b1 (8 CPU) in zone b; a two-member gang that must
    share a zone. CP-SAT is replaced by an answer putting member 0 on a1 and member 1 on b1
    (two zones), with an objective no valid answer reaches: what a model bug does. Both
    members score best on a1, which holds one: greedy stays below the bound, the solver
    runs."""

    def fake(problem: GangProblem, nodes: Any, hint: Any, **_: Any) -> ModelOutcome:
        counts = np.zeros_like(problem.limit)
        counts[problem.member_class[0], problem.node_names.index("a1")] = 1
        counts[problem.member_class[1], problem.node_names.index("b1")] = 1
        return ModelOutcome(ModelStatus.FEASIBLE, counts, 10**15, None, 0, 0, 0.0)

    monkeypatch.setattr(importlib.import_module("scheduler.solver.solve"), "solve_counts", fake)
    sched.node_upserted(make_node("a1", cpu="8", memory="16Gi").label("zone", "a").obj())
    sched.node_upserted(make_node("a2", cpu=a2_cpu, memory="16Gi").label("zone", "a").obj())
    sched.node_upserted(make_node("b1", cpu="8", memory="16Gi").label("zone", "b").obj())
    sched.podgroup_upserted(podgroup("g", 2, **{GANG_TOPOLOGY_ANNOTATION: "zone"}))
    for name, cpu in zip("ab", cpus, strict=True):
        sched.pod_upserted(member(name, "g", cpu=cpu))


async def test_an_invalid_plan_is_counted_and_greedys_is_committed(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """Greedy puts the members on a1 and a2 (5 + 4 CPUs). The solver's plan fits every node
    it names, so the commit's one-pod re-check alone would bind it, across two zones."""
    sched, writer = scheduler(nodes=0)
    spanning_solver(monkeypatch, sched, "6", ("5", "4"))
    with capture_logs() as logs:
        await run_one(sched)
    assert dict(writer.binds) == {"a": "a1", "b": "a2"}
    assert sched.metrics.gang_invalid_plans._value.get() == 1
    assert sched.gang_flow.last_plans["default/g"].status.value == "invalid_greedy"
    invalid = [e for e in logs if e["event"] == "gang_plan_invalid"]
    assert len(invalid) == 1
    assert invalid[0]["gang"] == "default/g"
    assert "members span 2 domains of zone" in invalid[0]["reason"]


async def test_an_invalid_plan_without_a_valid_greedy_one_retries(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """7 and 6 CPUs, a2 has 5: zone a holds one member (greedy places 1 of 2), and only the
    invalid two-zone plan places both. Nothing is bound or evicted; the gang backs off."""
    sched, writer = scheduler(nodes=0)
    spanning_solver(monkeypatch, sched, "5", ("7", "6"))
    await run_one(sched)
    assert writer.binds == []
    assert writer.deletes == []
    assert sched.metrics.gang_invalid_plans._value.get() == 1
    assert sched.queue.where(entry_key("default/g")) is QueueName.BACKOFF
    assert sched.cache.snapshot.pod_counts.sum() == 0


async def partial_gang(
    clock: Clock, *, timeout_s: int | None = None, spec: dict[str, Any] | None = None
) -> tuple[Scheduler, FakeWriter]:
    """A gang of 2 whose member "a" could not be bound nor re-placed (its node went away):
    "b" is bound, "a" waits, the gang is partial; and a single pod of priority 1000 waits."""
    sched, writer = scheduler(nodes=2, cpu="4", clock=clock, spec=spec)
    group = podgroup("g", 2)
    if timeout_s is not None:
        group["spec"]["scheduleTimeoutSeconds"] = timeout_s
    sched.podgroup_upserted(group)
    for name in "ab":
        sched.pod_upserted(member(name, "g", cpu="3"))
    writer.fail.add("a")
    writer.on_fail = node_gone(sched)
    await run_one(sched)
    await sched.drain(10)
    for name, node in writer.binds:  # the watch's echo of each binding
        echo = member(name, "g", cpu="3")
        echo["spec"]["nodeName"] = node
        echo["metadata"]["resourceVersion"] = "7"
        sched.pod_upserted(echo)
    gang = sched.gang_flow.gangs.get("default/g")
    assert gang is not None
    assert gang.partial
    single = make_pod("vip", "1").priority(1000).obj()
    single["spec"]["schedulerName"] = "lattice"
    sched.pod_upserted(single)
    return sched, writer


def gang_priority(sched: Scheduler) -> int:
    queued = sched.queue.get(entry_key("default/g"))
    assert queued is not None
    return queued.pod.priority


def first_popped(sched: Scheduler) -> str:
    info = sched.queue.try_pop()
    assert info is not None
    return info.pod.name


async def test_a_partial_gang_without_a_timeout_jumps_the_queue_for_a_bounded_time() -> None:
    clock = Clock()
    sched, _ = await partial_gang(clock)
    assert gang_priority(sched) >= PARTIAL_BOOST
    clock.now += 59
    sched.tick()
    assert gang_priority(sched) >= PARTIAL_BOOST, "boosted within 60 s"
    clock.now += 2
    sched.tick()
    assert gang_priority(sched) == 0, "its members' priority after 60 s"
    assert first_popped(sched) == "vip"


async def test_the_partial_boost_is_the_podgroups_timeout_or_the_setting() -> None:
    clock = Clock()
    sched, _ = await partial_gang(clock, timeout_s=10)
    clock.now += 11
    sched.tick()
    assert first_popped(sched) == "vip"
    clock = Clock()
    sched, _ = await partial_gang(clock, spec={"gang": {"partialBoostSeconds": 300}})
    clock.now += 299
    sched.tick()
    assert first_popped(sched).startswith("podgroup:")
    clock.now += 2
    sched.tick()
    assert gang_priority(sched) == 0, "the setting's 300 s ran out"


async def test_a_gang_that_is_completed_again_gets_a_fresh_boost() -> None:
    clock = Clock()
    sched, writer = await partial_gang(clock)
    clock.now += 61
    sched.tick()
    sched.node_upserted(make_node("n7", cpu="4", memory="16Gi").obj())
    while (info := sched.queue.try_pop()) is not None and info.pod.name != "podgroup:g":
        sched.queue.done(info)
    assert info is not None
    sched.gang_flow.schedule(info)
    await sched.drain(10)
    await sched.drain(10)
    assert sorted(n for n, _ in writer.binds) == ["a", "b"]
    gang = sched.gang_flow.gangs.get("default/g")
    assert gang is not None
    assert not gang.boost_ended
    assert gang.short_since is None


def sample(sched: Scheduler, name: str, **labels: str) -> float:
    value = sched.metrics.registry.get_sample_value(name, labels)
    return 0.0 if value is None else value


async def test_pending_pods_counts_a_gangs_members_where_its_entry_waits() -> None:
    sched, _ = scheduler()
    sched.podgroup_upserted(podgroup("g", 4))
    for name in "abc":
        sched.pod_upserted(member(name, "g"))
    single = make_pod("solo", "1").obj()
    single["spec"]["schedulerName"] = "lattice"
    sched.pod_upserted(single)
    sched.tick()
    assert sample(sched, "scheduler_pending_pods", queue="gated") == 3, "waiting for quorum"
    assert sample(sched, "scheduler_pending_pods", queue="active") == 1
    sched.pod_upserted(member("d", "g"))
    sched.tick()
    assert sample(sched, "scheduler_pending_pods", queue="gated") == 0
    assert sample(sched, "scheduler_pending_pods", queue="active") == 5
    assert sample(sched, "lattice_queue_pending_pods", queue="active") == 5
    assert sched.queue_counts()["active"] == 5


async def test_a_gang_attempt_is_timed_from_pop_to_outcome_and_counted_per_member() -> None:
    sched, _ = scheduler(nodes=2)
    sched.podgroup_upserted(podgroup("g", 3))
    for name in "abc":
        sched.pod_upserted(member(name, "g", cpu="3"))
    await run_one(sched)  # does not fit
    solved = sample(sched, "lattice_gang_solve_duration_seconds_sum")
    assert solved > 0
    cycle = "lattice_scheduling_cycle_duration_seconds_sum"
    assert sample(sched, cycle, result="unschedulable") >= solved, "the solve is in the cycle"
    attempts = "scheduler_schedule_attempts_total"
    assert sample(sched, attempts, result="unschedulable", profile="lattice") == 3

    sched, _ = scheduler(nodes=3)
    sched.podgroup_upserted(podgroup("g", 3))
    for name in "abc":
        sched.pod_upserted(member(name, "g", cpu="3"))
    await run_one(sched)  # fits
    solved = sample(sched, "lattice_gang_solve_duration_seconds_sum")
    assert sample(sched, "lattice_scheduling_attempts_total", result="scheduled") == 1
    assert sample(sched, cycle, result="scheduled") >= solved > 0
    assert sample(sched, attempts, result="scheduled", profile="lattice") == 3


async def test_finished_members_count_for_nothing_as_in_coscheduling() -> None:
    """Coscheduling's quorum lists the group's pods from kube-scheduler's pod informer,
    which drops Succeeded and Failed pods, and its Permit counts assigned pods in the
    snapshot, which holds none: a finished member is neither present nor placed. Live
    members, running or pending, are; so replacements beside running members are placed,
    and a lone replacement after the rest finished waits for quorum."""
    sched, writer = scheduler()
    sched.podgroup_upserted(podgroup("g", 3))
    for name in "abc":
        sched.pod_upserted(member(name, "g"))
    await run_one(sched)
    nodes = dict(writer.binds)

    def finish(name: str) -> None:
        done = member(name, "g")
        done["spec"]["nodeName"] = nodes[name]
        done["status"] = {"phase": "Succeeded"}
        sched.pod_upserted(done)

    finish("a")
    sched.pod_upserted(member("d", "g"))  # with b and c running: 3 live members
    gang = sched.gang_flow.gangs.get("default/g")
    assert gang is not None
    assert gang.need == 1
    await run_one(sched)
    assert "d" in {n for n, _ in writer.binds}
    nodes = dict(writer.binds)
    for name in "bcd":
        finish(name)
    sched.pod_upserted(member("e", "g"))
    assert gang.need == 3, "finished members are not placed"
    assert sched.queue.where(entry_key("default/g")) is QueueName.GATED
    await sched.drain(5)
    waiting = [e for e in writer.events if e[1] == "e" and e[2] == "FailedScheduling"]
    assert "waiting for quorum: 1/3 members present" in waiting[-1][3]


async def test_a_plan_that_no_longer_fits_at_commit_is_rolled_back_whole() -> None:
    """Pods placed while the solver ran: the commit re-checks each member, assumes none
    when one no longer fits (the ones it had assumed are forgotten), binds nothing and
    retries the gang after its backoff (a short requeue, not the unschedulable pool), its
    members pending again. A race is Unschedulable, never SchedulerError: before, it was
    counted as result=error and reported as SchedulerError."""
    sched, writer = scheduler(nodes=2, cpu="4")
    sched.podgroup_upserted(podgroup("g", 2))
    for name in "ab":
        sched.pod_upserted(member(name, "g", cpu="3"))
    info = sched.queue.try_pop()
    assert info is not None
    sched.gang_flow.schedule(info)  # problem built; the solve waits for the loop
    intruder = make_pod("intruder", "3").build()
    sched.cache.assume(intruder, "n0", {})  # placed while the solver ran
    await sched.drain(10)
    await sched.drain(10)
    assert writer.binds == []
    assert sched.cache.snapshot.pod_counts.sum() == 1, "only the intruder holds a node"
    gang = sched.gang_flow.gangs.get("default/g")
    assert gang is not None
    assert not gang.placed
    assert set(gang.pending) == {pod_key("default", "a"), pod_key("default", "b")}
    assert sched.queue.where(entry_key("default/g")) is QueueName.BACKOFF
    failed = [e for e in writer.events if "the plan no longer fits" in e[3]]
    assert {e[1] for e in failed} == {"a", "b"}
    errors = sample(sched, "scheduler_schedule_attempts_total", result="error", profile="lattice")
    assert errors == 0
    unschedulable = sample(
        sched, "scheduler_schedule_attempts_total", result="unschedulable", profile="lattice"
    )
    assert unschedulable == 2
    reasons = {c[1] for c in writer.conditions if c[0] in ("a", "b")}
    assert reasons == {"Unschedulable"}, writer.conditions


async def test_a_gang_past_its_schedule_timeout_is_failed_and_still_retried() -> None:
    """scheduleTimeoutSeconds counts from the scheduleStartTime the scheduler wrote (read
    back from the watch, so a restart keeps it): past it the PodGroup is Failed with reason
    ScheduleTimeout and a ScheduleTimeout Event, once; the gang is still retried."""
    wall = [NOW]
    writer = FakeWriter()
    sched = Scheduler(
        parse_spec({}, "lattice"),
        writer=cast(KubeWriter, writer),
        metrics=Metrics.create(),
        clock=Clock(),
        wall_clock=lambda: wall[0],
    )
    for i in range(2):
        sched.node_upserted(make_node(f"n{i}", cpu="4", memory="16Gi").obj())
    group = podgroup("g", 3)
    group["spec"]["scheduleTimeoutSeconds"] = 30
    sched.podgroup_upserted(group)
    for name in "abc":
        sched.pod_upserted(member(name, "g", cpu="3"))
    await run_one(sched)  # does not fit: 3 members, 2 nodes
    await sched.gang_flow.write_statuses()
    _, status = writer.statuses[-1]
    assert status["phase"] == "Scheduling"
    group["status"] = dict(status)  # the watch's echo of our write
    sched.podgroup_upserted(group)
    wall[0] += 29
    sched.tick()
    await sched.gang_flow.write_statuses()
    assert writer.statuses[-1][1]["phase"] == "Scheduling", "within the timeout"
    wall[0] += 2
    sched.tick()
    sched.tick()
    await sched.gang_flow.write_statuses()
    await sched.drain(5)
    _, status = writer.statuses[-1]
    assert status["phase"] == "Failed"
    assert [c["reason"] for c in status["conditions"]] == ["ScheduleTimeout"]
    timeouts = [e for e in writer.events if e[0] == "PodGroup" and e[2] == "ScheduleTimeout"]
    assert len(timeouts) == 1
    assert "not admitted within scheduleTimeoutSeconds (30); still retrying" in timeouts[0][3]
    assert sched.queue.where(entry_key("default/g")) is not None, "still retried"
    sched.node_upserted(make_node("n2", cpu="4", memory="16Gi").obj())
    sched.queue.flush(now=time.monotonic() + 3600)  # past its backoff (the queue's clock)
    info = sched.queue.try_pop()
    assert info is not None
    sched.gang_flow.schedule(info)
    await sched.drain(10)
    await sched.drain(10)
    assert sorted(n for n, _ in writer.binds) == ["a", "b", "c"]


async def test_members_whose_claims_do_not_exist_are_not_placed_without_their_devices() -> None:
    sched, writer = scheduler()
    sched.podgroup_upserted(podgroup("g", 2))
    for name in "ab":
        body = member(name, "g")
        body["spec"]["resourceClaims"] = [{"name": "gpu", "resourceClaimName": f"{name}-gpu"}]
        sched.pod_upserted(body)
    await run_one(sched)
    assert writer.binds == []
    assert sched.queue.where(entry_key("default/g")) is QueueName.UNSCHEDULABLE
    failed = [e for e in writer.events if e[2] == "FailedScheduling" and "quorum" not in e[3]]
    assert {e[1] for e in failed} == {"a", "b"}
    assert all('resourceclaim "a-gpu" not found' in e[3] for e in failed), failed[0][3]


@pytest.mark.parametrize("levels", [True, False], ids=["levels", "no-levels"])
async def test_preferred_rack_reads_the_levels_from_the_spec(levels: bool) -> None:
    """Four 4-CPU members, racks holding 2 and 3 (block b1), 2 and 1 (block b2): with
    ``spec.topology.levels`` the gang takes the two racks of one block; without them the
    tightest pair of racks, which crosses the blocks."""
    spec = {"topology": {"levels": ["example.com/block", "example.com/rack"]}} if levels else {}
    sched, writer = scheduler(nodes=0, spec=spec)
    for block, rack, cpu in (("b1", "r11", "8"), ("b1", "r12", "12"), ("b2", "r21", "8")):
        node = make_node(rack, cpu=cpu, memory="16Gi").label("example.com/block", block)
        sched.node_upserted(node.label("example.com/rack", rack).obj())
    node = make_node("r22", cpu="4", memory="16Gi").label("example.com/block", "b2")
    sched.node_upserted(node.label("example.com/rack", "r22").obj())
    sched.podgroup_upserted(
        podgroup("g", 4, **{"lattice.dev/topology-preferred": "example.com/rack"})
    )
    for i in range(4):
        sched.pod_upserted(member(f"m{i}", "g", cpu="4"))
    await run_one(sched)
    racks = set(dict(writer.binds).values())
    assert len(dict(writer.binds)) == 4
    assert len(racks) == 2
    assert (racks == {"r11", "r12"}) is levels


async def test_a_partial_gang_joins_the_required_domain_of_its_bound_member() -> None:
    """Member "a" is bound in zone a (a new leader finds it so); "b" is left. Zone b's node
    is emptier (kube's scores) and tighter (BestFit), but "b" must join "a" in zone a."""
    sched, writer = scheduler(nodes=0)
    sched.node_upserted(make_node("a1", cpu="16", memory="16Gi").label("zone", "a").obj())
    sched.node_upserted(make_node("b1", cpu="4", memory="16Gi").label("zone", "b").obj())
    sched.podgroup_upserted(podgroup("g", 2, **{"lattice.dev/topology-required": "zone"}))
    bound = member("a", "g")
    bound["spec"]["nodeName"] = "a1"
    sched.pod_upserted(bound)
    sched.pod_upserted(member("b", "g"))
    await run_one(sched)
    assert dict(writer.binds) == {"b": "a1"}


async def test_slices_bind_with_their_slice_each_inside_one_rack() -> None:
    """Racks of 3 and 2 four-CPU slots (levels block, rack): 4 members in slices of 2 take
    2 + 2, each member's Binding carrying its slice; a slice level that is no level makes
    the PodGroup invalid, said in the members' events."""
    levels = ["example.com/block", "example.com/rack"]
    sched, writer = scheduler(nodes=0, spec={"topology": {"levels": levels}})
    for rack, cpu in (("ra", "12"), ("rb", "8")):
        node = make_node(rack, cpu=cpu, memory="16Gi").label("example.com/block", "b1")
        sched.node_upserted(node.label("example.com/rack", rack).obj())
    sliced = {
        "lattice.dev/topology-slice-size": "2",
        "lattice.dev/topology-slice-required": "example.com/rack",
    }
    sched.podgroup_upserted(podgroup("g", 4, **sliced))
    for i in range(4):
        sched.pod_upserted(member(f"m{i}", "g", cpu="4"))
    await run_one(sched)
    binds = dict(writer.binds)
    assert len(binds) == 4
    by_slice: dict[str, list[str]] = {}
    for name, bound in binds.items():
        k = writer.bind_annotations[name]["lattice.dev/topology-slice"]
        by_slice.setdefault(k, []).append(bound)
    assert sorted(by_slice) == ["0", "1"]
    assert all(len(v) == 2 and len(set(v)) == 1 for v in by_slice.values()), by_slice

    bad = {**sliced, "lattice.dev/topology-slice-required": "example.com/zone"}
    sched.podgroup_upserted(podgroup("h", 2, **bad))
    gang = sched.gang_flow.gangs.get("default/h")
    assert gang is not None
    assert gang.spec is None
    assert "must be one of spec.topology.levels (example.com/block, example.com/rack)" in (
        gang.waiting_message()
    )
    # The level configured live: the PodGroup is read again and valid.
    wider = {"topology": {"levels": [*levels, "example.com/zone"]}}
    sched.apply_settings(parse_spec(wider, "lattice"))
    again = sched.gang_flow.gangs.get("default/h")
    assert again is not None
    assert again.spec is not None
    assert again.spec.slice_key == "example.com/zone"
    assert again.spec_error is None


async def test_a_slice_member_whose_binding_fails_stays_in_its_slice_domain() -> None:
    """Racks ra (2 nodes) and rb (3 nodes), one 3-CPU member a node, 4 members in slices
    of 2. Every first binding fails and the first ra node fails with it: the rb members
    are re-placed in rb, the ra member that lost its node cannot be (ra is full; rb2 is
    free but not its slice's rack), so the gang is partial; the re-solve keeps it out of
    rb too, and a new ra node takes it, with its slice."""
    levels = ["example.com/rack"]
    sched, writer = scheduler(nodes=0, spec={"topology": {"levels": levels}})

    def add(name: str) -> None:
        node = make_node(name, cpu="4", memory="16Gi").label("example.com/rack", name[:2])
        sched.node_upserted(node.obj())

    for name in ("ra0", "ra1", "rb0", "rb1", "rb2"):
        add(name)
    sliced = {
        "lattice.dev/topology-slice-size": "2",
        "lattice.dev/topology-slice-required": "example.com/rack",
    }
    sched.podgroup_upserted(podgroup("g", 4, **sliced))
    for i in range(4):
        sched.pod_upserted(member(f"m{i}", "g", cpu="3"))
    writer.fail.update(f"m{i}" for i in range(4))
    lost: list[str] = []

    def lose(node: str) -> None:
        if node.startswith("ra") and not lost:
            lost.append(node)
            node_gone(sched)(node)

    writer.on_fail = lose
    await run_one(sched)
    await sched.drain(10)
    binds = dict(writer.binds)
    assert len(binds) == 3, binds
    assert lost
    gang = sched.gang_flow.gangs.get("default/g")
    assert gang is not None
    assert gang.partial
    slice_of = {n: writer.bind_annotations[n]["lattice.dev/topology-slice"] for n in binds}
    racks: dict[str, set[str]] = {}
    for name, node in binds.items():
        racks.setdefault(slice_of[name], set()).add(node[:2])
    assert all(len(r) == 1 for r in racks.values()), racks
    (ra_slice,) = [k for k, r in racks.items() if r == {"ra"}]
    # The re-solve (the partial gang goes first; it may have run while bindings drained):
    # rb2 has room, but the member's slice is in ra, which is full.
    plan = sched.gang_flow.last_plans["default/g"]
    if plan.admitted:  # not re-solved yet
        sched.queue.flush(now=time.monotonic() + 3600)
        await run_one(sched)
        plan = sched.gang_flow.last_plans["default/g"]
    short = f"slice {ra_slice} is short of 1 member in example.com/rack=ra, where no node can"
    assert short in plan.message, plan.message
    assert len(writer.binds) == 3
    (missing,) = {f"m{i}" for i in range(4)} - set(binds)
    add("ra9")
    sched.queue.flush(now=time.monotonic() + 3600)
    await run_one(sched)
    assert dict(writer.binds)[missing] == "ra9"
    assert writer.bind_annotations[missing]["lattice.dev/topology-slice"] == ra_slice


async def test_an_upstream_podgroup_is_its_own_gang_beside_a_scheduler_plugins_one() -> None:
    """A ``scheduling.k8s.io`` PodGroup named like a scheduler-plugins one in the namespace
    is another gang: members by ``spec.schedulingGroup``, a re-list of either API leaves
    the other's gangs alone, and its status is the condition kube-scheduler writes."""
    sched, writer = scheduler()
    sched.podgroup_upserted(podgroup("g", 2))
    upstream = {
        "metadata": {"name": "g", "namespace": "default", "uid": "up-g"},
        "spec": {"schedulingPolicy": {"gang": {"minCount": 2}}},
    }
    sched.podgroup_upserted(upstream, upstream=True)
    assert sched.podgroup_keys() == {"default/g"}
    assert sched.podgroup_keys(upstream=True) == {"default/scheduling.k8s.io:g"}
    for name in ("u0", "u1"):
        body = make_pod(name, "1").obj()
        body["spec"] |= {"schedulerName": "lattice", "schedulingGroup": {"podGroupName": "g"}}
        sched.pod_upserted(body)
    assert sched.queue.where(entry_key("default/g")) is None  # no members of its own
    assert sched.queue.where(entry_key("default/scheduling.k8s.io:g")) is QueueName.ACTIVE
    await run_one(sched)
    assert sorted(n for n, _ in writer.binds) == ["u0", "u1"]
    await sched.gang_flow.write_statuses()
    written = dict(writer.statuses)
    (condition,) = written["scheduling.k8s.io:g"]["conditions"]
    assert (condition["type"], condition["status"], condition["reason"]) == (
        "PodGroupInitiallyScheduled",
        "True",
        "Scheduled",
    )
    sched.podgroup_deleted({"metadata": {"name": "g", "namespace": "default"}}, upstream=True)
    assert sched.podgroup_keys() == {"default/g"}
