"""Gang-aware preemption in the scheduler process, without a server (a fake writer records
the writes): a gang preempts only when the whole gang then fits, a lower gang goes whole
or not at all, single-pod preemption takes a gang whole too, and the gang binds once the
victims' deletions are seen."""

from __future__ import annotations

import itertools
from typing import Any

import pytest

from scheduler.control import gang_flow
from scheduler.control.gangs import entry_key
from scheduler.control.queue import ClusterEvent, ClusterEventType, QueueName, pod_key
from scheduler.control.scheduler import Scheduler
from scheduler.control.settings import parse_spec
from scheduler.solver import GangPlan, GangProblem, solve
from scheduler.solver.solve import SolveStatus
from tests.builders import make_pod
from tests.control.test_gangs import LABEL, FakeWriter, podgroup, run_one, scheduler

_rv = itertools.count(100)


def bound(
    name: str, node: str, cpu: str, priority: int, group: str | None = None
) -> dict[str, Any]:
    builder = make_pod(name, cpu).priority(priority).uid(f"uid-{name}")
    if group is not None:
        builder.label(LABEL, group)
    body = builder.obj()
    body["spec"]["nodeName"] = node
    body["metadata"]["resourceVersion"] = str(next(_rv))
    body["status"] = {"phase": "Running", "startTime": "2026-01-01T00:00:00Z"}
    return body


def pending(name: str, cpu: str, priority: int, group: str | None = None) -> dict[str, Any]:
    builder = make_pod(name, cpu).priority(priority).uid(f"uid-{name}")
    if group is not None:
        builder.label(LABEL, group)
    body = builder.obj()
    body["spec"]["schedulerName"] = "lattice"
    body["metadata"]["resourceVersion"] = str(next(_rv))
    body["status"] = {"phase": "Pending"}
    return body


def full(sched: Scheduler, single_priority: int = 5) -> list[dict[str, Any]]:
    """4 nodes of 4 cpu: gang "lo" (4 x 2 cpu, priority 1, one per node) and a 2-cpu
    single pod per node."""
    sched.podgroup_upserted(podgroup("lo", 4))
    lo = [bound(f"lo-{i}", f"n{i}", "2", 1, "lo") for i in range(4)]
    for body in lo:
        sched.pod_upserted(body)
    for i in range(4):
        sched.pod_upserted(bound(f"s-{i}", f"n{i}", "2", single_priority))
    return lo


def high_gang(sched: Scheduler, n: int = 4, cpu: str = "2", priority: int = 100) -> None:
    sched.podgroup_upserted(podgroup("hi", n))
    for i in range(n):
        sched.pod_upserted(pending(f"hi-{i}", cpu, priority, "hi"))


def preempted_events(writer: FakeWriter) -> list[tuple[str, str]]:
    return [(name, msg) for kind, name, reason, msg in writer.events if reason == "Preempted"]


async def test_a_gang_preempts_the_whole_lower_gang_then_binds_once_it_is_gone() -> None:
    sched, writer = scheduler(4, "4")
    lo = full(sched)
    high_gang(sched)
    await run_one(sched)
    # The lower gang is the cheapest unit that makes room: all four members go, nothing else.
    assert sorted(writer.deletes) == [f"lo-{i}" for i in range(4)]
    assert all(
        msg.startswith("Preempted by PodGroup default/hi on node n")
        for _, msg in preempted_events(writer)
    )
    assert len(preempted_events(writer)) == 4
    patched = {name for name, status in writer.status_patches if "conditions" in status}
    assert patched == {f"lo-{i}" for i in range(4)}  # DisruptionTarget before the deletion
    pg_events = [e for e in writer.events if e[0] == "PodGroup" and e[2] == "Preempting"]
    assert len(pg_events) == 1
    assert "preempting 4 lower-priority pods" in pg_events[0][3]
    # Every member is nominated (in memory and in its status) and nothing is bound yet.
    assert not writer.binds
    nominated = {p.name: node for p, node in sched.preemptor.nominations.values()}
    assert set(nominated) == {f"hi-{i}" for i in range(4)}
    written = {c[0]: c[3] for c in writer.conditions if c[0].startswith("hi-")}
    assert written == nominated
    assert sched.queue.where(entry_key("default/hi")) is QueueName.UNSCHEDULABLE

    # Retried before the victims are gone: it waits, no second preemption.
    sched.queue.move_all_on_event(ClusterEvent(ClusterEventType.POD_DELETED, subject="x"))
    sched.queue.flush(now=float("inf"))
    await run_one(sched)
    assert len(writer.deletes) == 4
    assert any("waiting for 4 preempted pods" in c[2] for c in writer.conditions)

    # The deletions arrive: the gang binds, on the nodes it was nominated to.
    for body in lo:
        sched.pod_deleted(body)
    sched.queue.flush(now=float("inf"))
    await run_one(sched)
    assert sorted(name for name, _ in writer.binds) == [f"hi-{i}" for i in range(4)]
    assert not sched.preemptor.nominations


async def test_nothing_is_evicted_when_the_gang_cannot_fit_even_then() -> None:
    sched, writer = scheduler(4, "4")
    full(sched)
    high_gang(sched, 5, cpu="4")  # 5 x 4 cpu on 4 nodes of 4 cpu
    await run_one(sched)
    assert writer.deletes == []
    assert not preempted_events(writer)
    assert not sched.preemptor.nominations
    message = [c[2] for c in writer.conditions if c[0] == "hi-0"][-1]
    assert "preemption: the gang does not fit even with every lower-priority pod evicted" in message


async def test_equal_priority_and_preemption_policy_never_evict_nothing() -> None:
    sched, writer = scheduler(4, "4")
    full(sched)
    high_gang(sched, priority=1)  # nothing below priority 1
    await run_one(sched)
    assert writer.deletes == []

    sched, writer = scheduler(4, "4")
    full(sched)
    sched.podgroup_upserted(podgroup("hi", 4))
    for i in range(4):
        body = pending(f"hi-{i}", "2", 100, "hi")
        if i == 2:
            body["spec"]["preemptionPolicy"] = "Never"
        sched.pod_upserted(body)
    await run_one(sched)
    assert writer.deletes == []
    assert any("preemptionPolicy=Never" in c[2] for c in writer.conditions)


async def test_single_pod_preemption_takes_a_gang_whole() -> None:
    # Two 2-cpu nodes, each holding one member of gang "lo": a 2-cpu high-priority pod
    # needs one node, and evicting one member evicts the other too.
    sched, writer = scheduler(2, "2")
    sched.podgroup_upserted(podgroup("lo", 2))
    for i in range(2):
        sched.pod_upserted(bound(f"lo-{i}", f"n{i}", "2", 1, "lo"))
    sched.pod_upserted(pending("hi", "2", 100))
    await run_one(sched)
    assert sorted(writer.deletes) == ["lo-0", "lo-1"]
    uid = "uid-hi"
    node = sched.preemptor.nominations[uid][1]
    messages = dict(preempted_events(writer))
    assert set(messages) == {"lo-0", "lo-1"}
    assert messages[f"lo-{node[-1]}"] == f"Preempted by pod {uid} on node {node}"
    other = "n1" if node == "n0" else "n0"
    assert messages[f"lo-{other[-1]}"] == f"Preempted by pod {uid} on node {other}"


async def test_single_pod_prefers_a_single_victim_to_a_gang() -> None:
    sched, writer = scheduler(3, "2")
    sched.podgroup_upserted(podgroup("lo", 2))
    for i in range(2):
        sched.pod_upserted(bound(f"lo-{i}", f"n{i}", "2", 1, "lo"))
    sched.pod_upserted(bound("s", "n2", "2", 1))
    sched.pod_upserted(pending("hi", "2", 100))
    await run_one(sched)
    assert writer.deletes == ["s"]
    assert pod_key("default", "hi") in sched.queue


async def test_nominations_end_when_no_eviction_can_help_any_more() -> None:
    sched, writer = scheduler(4, "4")
    lo = full(sched, single_priority=500)  # only the gang is below the preemptor
    high_gang(sched)
    await run_one(sched)
    assert sorted(writer.deletes) == [f"lo-{i}" for i in range(4)]
    assert len(sched.preemptor.nominations) == 4
    # The room goes to pods of a higher priority before the gang is retried.
    for body in lo:
        sched.pod_deleted(body)
    for i in range(4):
        sched.pod_upserted(bound(f"top-{i}", f"n{i}", "2", 1000))
    sched.queue.flush(now=float("inf"))
    await run_one(sched)
    assert len(writer.deletes) == 4
    assert not sched.preemptor.nominations
    cleared = {c[0] for c in writer.conditions if c[3] == ""}
    assert cleared == {f"hi-{i}" for i in range(4)}


async def test_only_pods_on_the_plans_nodes_are_evicted_when_short_solves_time_out(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    # 50 nodes of 4 cpu, each full with two 2-cpu pods of priority 1 (100 victim units);
    # a gang of 4 x 4 cpu needs 4 whole nodes. Solves given less than the gang's own limit
    # run out of time, as a 9-16-member solve does in 0.25 s.
    limit = parse_spec({}, "lattice").gang.solver_time_limit_s

    def slow_solve(problem: GangProblem, *, time_limit_s: float, **kw: Any) -> GangPlan:
        if time_limit_s < limit:
            return GangPlan(
                status=SolveStatus.TIMEOUT_REJECTED,
                placements=(),
                admitted=False,
                message="timed out",
                solve_time_s=time_limit_s,
                members=problem.reports,
                need=problem.need,
            )
        return solve(problem, time_limit_s=time_limit_s, **kw)

    monkeypatch.setattr(gang_flow, "solve", slow_solve)
    sched, writer = scheduler(50, "4")
    on: dict[str, list[str]] = {}
    for n in range(50):
        for j in range(2):
            sched.pod_upserted(bound(f"p{n}-{j}", f"n{n}", "2", 1))
            on.setdefault(f"n{n}", []).append(f"p{n}-{j}")
    high_gang(sched, 4, cpu="4")
    await run_one(sched)
    nominated = {node for _, node in sched.preemptor.nominations.values()}
    assert len(nominated) == 4
    assert sorted(writer.deletes) == sorted(p for node in nominated for p in on[node])
