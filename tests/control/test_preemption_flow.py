"""Preemption in the scheduler process, without a server: a fake writer records what would
be written. The cycle preempts what the pure evaluator chooses, nominates the pod, marks
and deletes the victims; the nomination holds the node for lower-or-equal priority pods
until the preemptor binds; budgets, start times and preemptionPolicy come from the watch."""

from __future__ import annotations

import copy
from typing import Any, cast

import pytest
from kubernetes_asyncio import client

from scheduler.control import intake
from scheduler.control.feed import Feed
from scheduler.control.intake import Batch, Event, EventType, RawObject
from scheduler.control.kubeio import KubeWriter, PodRef
from scheduler.control.queue import QueueName, pod_key
from scheduler.control.ratelimit import TokenBucket
from scheduler.control.scheduler import Scheduler
from scheduler.control.settings import parse_spec
from scheduler.core.nominated import schedule_with_nominated
from scheduler.core.preemption import Preemption, preempt
from scheduler.core.schedule import Framework
from scheduler.model.pod_facts import PreemptionPolicy
from scheduler.obs.metrics import Metrics
from tests.builders import make_node, make_pod
from tests.control.test_gangs import FakeWriter, scheduler

_rv = iter(range(100, 10_000_000))


def setup(nodes: int = 2, cpu: str = "2") -> tuple[Scheduler, FakeWriter]:
    return scheduler(nodes, cpu)


def bound(
    name: str, node: str, cpu: str, priority: int, *, start: str | None = None, **labels: str
) -> dict[str, Any]:
    body = make_pod(name, cpu).priority(priority).labels(labels).obj()
    body["spec"]["nodeName"] = node
    body["metadata"]["resourceVersion"] = str(next(_rv))
    body["status"] = {"phase": "Running"}
    if start is not None:
        body["status"]["startTime"] = start
    return body


def pending(name: str, cpu: str, priority: int, **spec: Any) -> dict[str, Any]:
    body = make_pod(name, cpu).priority(priority).obj()
    body["spec"]["schedulerName"] = "lattice"
    body["spec"].update(spec)
    body["metadata"]["resourceVersion"] = str(next(_rv))
    body["status"] = {"phase": "Pending"}
    return body


def cycle(sched: Scheduler, name: str | None = None) -> None:
    info = sched.queue.try_pop()
    assert info is not None, sched.queue.counts()
    assert name is None or info.pod.name == name, info.pod.name
    sched.schedule_one(info)


def full(sched: Scheduler) -> None:
    """n0: a (old), b (new); n1: c (old), d (new): 1 cpu each, priority 1, 2 cpu nodes."""
    sched.pod_upserted(bound("a", "n0", "1", 1, start="2026-01-01T00:00:00Z"))
    sched.pod_upserted(bound("b", "n0", "1", 1, start="2026-01-02T00:00:00Z"))
    sched.pod_upserted(bound("c", "n1", "1", 1, start="2026-01-01T00:00:00Z"))
    sched.pod_upserted(bound("d", "n1", "1", 1, start="2026-01-03T00:00:00Z"))


def expected(sched: Scheduler, name: str) -> Preemption:
    """What the pure evaluator chooses on the scheduler's own state."""
    info = sched.queue.get(pod_key("default", name))
    assert info is not None
    pod = info.pod
    decision = sched.framework.schedule(sched.cache.snapshot, pod)  # type: ignore[arg-type]
    found = preempt(sched.framework, sched.cache.snapshot, decision, sched.preemption_inputs())
    assert found is not None
    return found


async def test_a_high_priority_pod_preempts_what_the_evaluator_chooses() -> None:
    sched, writer = setup()
    full(sched)
    sched.pod_upserted(pending("hi", "1", 100))
    choice = expected(sched, "hi")
    cycle(sched)
    await sched.drain(10)
    assert nominated_to(sched, "hi") == choice.node
    victims = [v.name for v in choice.victims]
    assert sorted(writer.deletes) == sorted(victims)
    # the youngest pod of the node goes: the most important (earliest start) are reprieved
    assert victims in (["b"], ["d"])
    for name in victims:
        patched = [s for n, s in writer.status_patches if n == name]
        assert patched
        assert patched[0]["conditions"][0] == {
            **patched[0]["conditions"][0],
            "type": "DisruptionTarget",
            "status": "True",
            "reason": "PreemptionByScheduler",
            "message": "lattice: preempting to accommodate a higher priority pod",
        }
    preempted = [e for e in writer.events if e[2] == "Preempted"]
    assert [e[1] for e in preempted] == victims
    assert preempted[0][3] == f"Preempted by pod {choice_uid(sched, 'hi')} on node {choice.node}"
    ((_, reason, message, nominated),) = [c for c in writer.conditions if c[0] == "hi"]
    assert (reason, nominated) == ("Unschedulable", choice.node)
    assert message == "0/2 nodes are available: 2 Insufficient cpu."
    assert sched.queue.counts().get(QueueName.UNSCHEDULABLE) == 1

    # the victim leaves: the preemptor is woken and binds there; its nomination ends
    for name in victims:
        sched.pod_deleted(
            {"metadata": {"namespace": "default", "name": name, "uid": uid(sched, name)}}
        )
    sched.queue.flush(now=float("inf"))
    cycle(sched)
    await sched.drain(10)
    assert ("hi", choice.node) in writer.binds
    assert nominated_to(sched, "hi") is None


def nominated_to(sched: Scheduler, name: str) -> str | None:
    found = [node for pod, node in sched.nominated() if pod.name == name]
    return found[0] if found else None


def uid(sched: Scheduler, name: str) -> str:
    cached = sched.cache.cached_pod(pod_key("default", name))
    assert cached is not None
    return cached.pod.uid


def choice_uid(sched: Scheduler, name: str) -> str:
    info = sched.queue.get(pod_key("default", name))
    assert info is not None
    return info.pod.uid


async def test_the_nomination_holds_the_node_for_lower_or_equal_priority_pods() -> None:
    sched, writer = setup()
    full(sched)
    sched.pod_upserted(pending("hi", "2", 100))  # needs a whole node
    cycle(sched)
    await sched.drain(10)
    node = nominated_to(sched, "hi")
    other = "n1" if node == "n0" else "n0"
    for name in writer.deletes:
        sched.pod_deleted(
            {"metadata": {"namespace": "default", "name": name, "uid": uid(sched, name)}}
        )
    # a lower-priority pod that would fit on the freed node must not take it: it preempts
    # on the other node instead
    sched.pod_upserted(pending("lo", "1", 50))
    cycle(sched, "lo")
    await sched.drain(10)
    assert not any(n == "lo" for n, _ in writer.binds)
    assert nominated_to(sched, "lo") == other
    lo = [c for c in writer.conditions if c[0] == "lo"][-1]
    assert lo[2] == "0/2 nodes are available: 2 Insufficient cpu."
    # a higher-priority pod is not held back by the nomination
    sched.pod_upserted(pending("top", "1", 1000))
    cycle(sched, "top")
    await sched.drain(10)
    assert ("top", node) in writer.binds


def test_nominated_pods_count_only_for_lower_or_equal_priority() -> None:
    sched, _ = setup(nodes=1, cpu="2")
    fw = Framework()
    nominee = make_pod("hi", "2").priority(100).build()
    snap = sched.cache.snapshot
    for priority, fits in ((50, False), (100, False), (101, True)):
        pod = make_pod(f"p{priority}", "1").priority(priority).build()
        d = schedule_with_nominated(fw, snap, pod, [(nominee, "n0")])
        assert (d.selected == "n0") is fits, (priority, d.summary)
        if not fits:
            assert d.summary == "0/1 nodes are available: 1 Insufficient cpu."
            assert int(d.explanation.node_codes[0]) == 2  # Unschedulable: preemption may help
    assert snap.node_of_pod(nominee.key) is None  # restored
    assert list(snap.pods_on(0)) == []


async def test_lower_priority_nominations_to_the_node_are_cleared() -> None:
    sched, writer = setup(nodes=1, cpu="2")
    sched.pod_upserted(bound("a", "n0", "1", 1))
    sched.pod_upserted(bound("b", "n0", "1", 1))
    lo = pending("lo", "2", 10)
    lo["status"]["nominatedNodeName"] = "n0"  # nominated by an earlier leader
    sched.pod_upserted(lo)
    assert nominated_to(sched, "lo") == "n0"
    sched.queue.delete(sched.queue.get(pod_key("default", "lo")).pod)  # type: ignore[union-attr]
    sched.pod_upserted(pending("hi", "2", 100))
    cycle(sched)
    await sched.drain(10)
    assert nominated_to(sched, "hi") == "n0"
    assert nominated_to(sched, "lo") is None
    assert ("lo", {"nominatedNodeName": None}) in writer.status_patches


async def test_preemption_policy_never_preempts_nothing_and_says_why() -> None:
    sched, writer = setup()
    full(sched)
    sched.pod_upserted(pending("hi", "1", 100, preemptionPolicy="Never"))
    assert (
        sched.preemptor.facts[choice_uid(sched, "hi")].preemption_policy is PreemptionPolicy.NEVER
    )
    cycle(sched)
    await sched.drain(10)
    assert writer.deletes == []
    assert nominated_to(sched, "hi") is None
    ((_, _, message, nominated),) = [c for c in writer.conditions if c[0] == "hi"]
    assert message == (
        "0/2 nodes are available: 2 Insufficient cpu. preemption: not eligible due to "
        "preemptionPolicy=Never."
    )
    assert nominated is None


async def test_nothing_to_preempt_appends_kube_schedulers_message() -> None:
    sched, writer = setup(nodes=1)
    sched.pod_upserted(bound("a", "n0", "2", 100))
    sched.pod_upserted(pending("hi", "1", 100))
    cycle(sched)
    await sched.drain(10)
    assert writer.deletes == []
    ((_, _, message, _),) = [c for c in writer.conditions if c[0] == "hi"]
    assert message == (
        "0/1 nodes are available: 1 Insufficient cpu. preemption: 0/1 nodes are available: "
        "1 No preemption victims found for incoming pod."
    )


def pdb(name: str, allowed: int, **match: str) -> dict[str, Any]:
    return {
        "metadata": {"name": name, "namespace": "default", "generation": 1},
        "spec": {"selector": {"matchLabels": match}, "minAvailable": 1},
        "status": {"disruptionsAllowed": allowed, "observedGeneration": 1},
    }


async def test_a_budget_protects_a_pod_while_another_choice_exists() -> None:
    sched, writer = setup()
    sched.pod_upserted(bound("guarded", "n0", "2", 1, start="2026-01-02T00:00:00Z", app="db"))
    sched.pod_upserted(bound("free", "n1", "2", 1, start="2026-01-01T00:00:00Z", app="web"))
    sched.preemptor.pdb_upserted(pdb("db", 0, app="db"))
    sched.preemptor.pdb_upserted(
        {"metadata": {"name": "bad", "namespace": "default"}, "spec": {"minAvailable": "x%"}}
    )
    assert set(sched.preemptor.pdbs) == {"default/db"}  # the unreadable one is left out
    sched.pod_upserted(pending("hi", "2", 100))
    cycle(sched)
    await sched.drain(10)
    assert writer.deletes == ["free"]
    sched.preemptor.pdb_deleted({"metadata": {"name": "db", "namespace": "default"}})
    assert sched.preemptor.pdbs == {}


async def test_a_victim_already_gone_is_not_deleted_or_announced() -> None:
    sched, writer = setup(nodes=1)
    sched.pod_upserted(bound("a", "n0", "2", 1))
    writer.gone.add("a")
    sched.pod_upserted(pending("hi", "1", 100))
    cycle(sched)
    await sched.drain(10)
    assert writer.deletes == []
    assert not [e for e in writer.events if e[2] == "Preempted"]
    assert nominated_to(sched, "hi") == "n0"


async def test_a_broken_evaluator_costs_the_pod_its_preemption_only(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    sched, writer = setup()
    full(sched)

    def boom(*_: Any, **__: Any) -> None:
        raise RuntimeError("bug")

    monkeypatch.setattr("scheduler.control.scheduler.preempt", boom)
    sched.pod_upserted(pending("hi", "1", 100))
    cycle(sched)
    await sched.drain(10)
    assert writer.deletes == []
    ((_, reason, message, _),) = [c for c in writer.conditions if c[0] == "hi"]
    assert reason == "Unschedulable"
    assert message.endswith("preemption: internal error: bug")
    assert sched.queue.counts().get(QueueName.UNSCHEDULABLE) == 1


def test_the_feed_keeps_facts_and_budgets_current_on_its_fast_paths() -> None:
    sched = Scheduler(parse_spec({}, "lattice"), writer=None, metrics=Metrics.create())
    feed = Feed(sched)
    sched.node_upserted(make_node("n0").obj())
    body = bound("a", "n0", "1", 1)
    del body["status"]["phase"]
    feed.apply(
        [Batch(intake.ASSIGNED_PODS, (Event(EventType.ADDED, "x", cast(RawObject, body)),), "1")]
    )
    key = body["metadata"]["uid"]
    assert key not in sched.preemptor.facts  # not started: no facts
    started = copy.deepcopy(body)
    started["metadata"]["resourceVersion"] = str(next(_rv))
    started["status"] = {"phase": "Running", "startTime": "2026-01-01T00:00:00Z"}
    unchanged = feed.stats.bound_unchanged
    feed.apply(
        [
            Batch(
                intake.ASSIGNED_PODS,
                (Event(EventType.MODIFIED, "x", cast(RawObject, started)),),
                "2",
            )
        ]
    )
    assert feed.stats.bound_unchanged == unchanged + 1  # the fast path, and yet:
    assert sched.preemptor.facts[key].start_time == 1767225600.0
    budget = pdb("db", 1, app="db")
    feed.apply([Batch(intake.PDBS, (Event(EventType.ADDED, "p", cast(RawObject, budget)),), "3")])
    assert sched.preemptor.pdbs["default/db"].disruptions_allowed == 1
    feed.apply([intake.Relisted(intake.PDBS, (), "4", initial=False)])
    assert sched.preemptor.pdbs == {}
    feed.apply(
        [
            Batch(
                intake.ASSIGNED_PODS,
                (Event(EventType.DELETED, "x", cast(RawObject, started)),),
                "5",
            )
        ]
    )
    assert key not in sched.preemptor.facts


class FakeCore:
    def __init__(self, status: int) -> None:
        self.status = status
        self.calls: list[tuple[str, Any]] = []

    async def _answer(self, what: str, body: Any) -> Any:
        self.calls.append((what, body))
        if self.status >= 300:
            exc = client.ApiException(status=self.status, reason="x")
            exc.body = b'{"message": "no"}'
            raise exc

        class Resp:
            status = 200

            def release(self) -> None:
                return None

        return Resp()

    async def patch_namespaced_pod_status(self, name: str, ns: str, body: Any, **_: Any) -> Any:
        return await self._answer("patch", body)

    async def delete_namespaced_pod(self, name: str, ns: str, *, body: Any, **_: Any) -> Any:
        return await self._answer("delete", body)


@pytest.mark.parametrize(("status", "done"), [(200, True), (404, False), (409, False), (500, None)])
async def test_victim_writes_are_judged_by_their_status(status: int, done: bool | None) -> None:
    ref = PodRef("default", "v", "uid-v")
    async with client.ApiClient() as api:
        writer = KubeWriter(api, component="lattice", instance="t", limiter=TokenBucket(100, 10))
        core = FakeCore(status)
        writer._core = cast(client.CoreV1Api, core)
        for call in ("patch", "delete"):
            write = (
                writer.patch_pod_status(ref, {"conditions": []})
                if call == "patch"
                else writer.delete_pod(ref)
            )
            if done is None:
                with pytest.raises(client.ApiException):
                    await write
            else:
                assert await write is done
    patch, delete = core.calls
    assert patch[1] == {"metadata": {"uid": "uid-v"}, "status": {"conditions": []}}
    assert delete[1].preconditions.uid == "uid-v"


async def test_unreadable_facts_are_logged_and_read_as_none() -> None:
    sched, writer = setup(nodes=1)
    broken = bound("a", "n0", "2", 1, start="yesterday")
    sched.pod_upserted(broken)
    assert broken["metadata"]["uid"] not in sched.preemptor.facts
    odd = pending("hi", "1", 100, preemptionPolicy="Sometimes")
    sched.pod_upserted(odd)
    cycle(sched, "hi")  # the record itself is readable: scheduled, and it may preempt
    await sched.drain(10)
    assert writer.deletes == ["a"]


async def test_preemption_metrics_count_as_kube_schedulers() -> None:
    sched, _ = setup()
    full(sched)
    sched.pod_upserted(pending("hi", "1", 100))
    sched.pod_upserted(pending("never", "1", 100, preemptionPolicy="Never"))
    cycle(sched)
    cycle(sched)
    await sched.drain(10)
    registry = sched.metrics.registry
    assert registry.get_sample_value("scheduler_preemption_attempts_total") == 2
    assert registry.get_sample_value("scheduler_preemption_victims_count") == 1
    assert registry.get_sample_value("scheduler_preemption_victims_sum") == 1


async def test_a_nomination_ends_when_the_pod_is_deleted_or_bound_elsewhere() -> None:
    sched, _ = setup()
    gone = pending("gone", "1", 10)
    gone["status"]["nominatedNodeName"] = "n0"
    moved = pending("moved", "1", 10)
    moved["status"]["nominatedNodeName"] = "n1"
    sched.pod_upserted(gone)
    sched.pod_upserted(moved)
    assert (nominated_to(sched, "gone"), nominated_to(sched, "moved")) == ("n0", "n1")
    sched.pending_left(gone, bound=False)
    assert nominated_to(sched, "gone") is None
    elsewhere = copy.deepcopy(moved)
    elsewhere["spec"]["nodeName"] = "n0"  # bound by someone else, not where nominated
    sched.pod_upserted(elsewhere)
    assert nominated_to(sched, "moved") is None
    assert sched.preemptor.nominations == {}


@pytest.mark.parametrize("how", ["deleted", "terminating"])
async def test_a_nominated_pods_deletion_retries_the_pods_it_kept_out(how: str) -> None:
    """As kube-scheduler's deletePodFromSchedulingQueue: a pending pod with a nomination
    deleted moves the unschedulable pods of lower or equal priority (its room is free), at
    once rather than at the unschedulable pool's flush; pods of higher priority, which the
    nomination never held back, stay where they are."""
    sched, writer = setup(nodes=1, cpu="2")
    hi = pending("hi", "2", 100)
    hi["status"]["nominatedNodeName"] = "n0"  # nominated by an earlier leader
    sched.pod_upserted(hi)
    sched.queue.delete(sched.queue.get(pod_key("default", "hi")).pod)  # type: ignore[union-attr]
    sched.pod_upserted(pending("lo", "1", 100))  # equal priority: held back
    sched.pod_upserted(pending("top", "3", 1000))  # too big anyway, never held back
    cycle(sched, "top")
    cycle(sched, "lo")
    await sched.drain(10)
    assert not writer.binds
    lo, top = pod_key("default", "lo"), pod_key("default", "top")
    assert sched.queue.where(lo) is sched.queue.where(top) is QueueName.UNSCHEDULABLE
    if how == "deleted":
        sched.pending_left(hi, bound=False)
    else:
        terminating = copy.deepcopy(hi)
        terminating["metadata"]["deletionTimestamp"] = "2026-01-01T00:00:00Z"
        sched.pod_upserted(terminating)
    assert sched.preemptor.nominations == {}
    assert sched.queue.where(lo) in (QueueName.ACTIVE, QueueName.BACKOFF)
    assert sched.queue.where(top) is QueueName.UNSCHEDULABLE
    sched.queue.flush(now=float("inf"))  # its backoff (and top's stay) over
    cycle(sched, "top")
    cycle(sched, "lo")
    await sched.drain(10)
    assert ("lo", "n0") in writer.binds
