"""Reclaim in the scheduler process, without a server: a pod of a quota within its min, refused
by the quota PreFilter although a node has room, evicts a borrower's pod; the victim's
Event names the quota and pod that reclaimed it and the per-quota counter counts it.
Preemption inside one quota is announced and counted as plain preemption."""

from __future__ import annotations

from fractions import Fraction
from typing import Any

from scheduler.control.queue import pod_key
from scheduler.control.scheduler import Scheduler
from scheduler.control.settings import parse_spec
from scheduler.core.quota import Quota, QuotaSnapshot
from tests.builders import make_pod, quota_body
from tests.control.test_gangs import FakeWriter, scheduler

_rv = iter(range(100, 10_000_000))
COUNTER = "lattice_quota_reclaim_evictions_total"


def bound(name: str, ns: str, node: str, cpu: str, priority: int) -> dict[str, Any]:
    body = make_pod(name, cpu, namespace=ns).priority(priority).uid(f"uid-{name}").obj()
    body["spec"]["nodeName"] = node
    body["metadata"]["resourceVersion"] = str(next(_rv))
    body["status"] = {"phase": "Running", "startTime": "2026-01-01T00:00:00Z"}
    return body


def pending(name: str, ns: str, cpu: str, priority: int) -> dict[str, Any]:
    body = make_pod(name, cpu, namespace=ns).priority(priority).uid(f"uid-{name}").obj()
    body["spec"]["schedulerName"] = "lattice"
    body["metadata"]["resourceVersion"] = str(next(_rv))
    body["status"] = {"phase": "Pending"}
    return body


def two_teams() -> tuple[Scheduler, FakeWriter]:
    """Two 4-cpu nodes; team-a (min 2) borrows: 3 cpus on n0, team-b (min 2) uses 1 on n1."""
    sched, writer = scheduler(2, "4")
    sched.quota_upserted(quota_body("team-a", min={"cpu": "2"}, max={"cpu": "8"}))
    sched.quota_upserted(quota_body("team-b", min={"cpu": "2"}, max={"cpu": "8"}))
    for i in range(3):
        sched.pod_upserted(bound(f"a{i}", "team-a", "n0", "1", 100))
    sched.pod_upserted(bound("b0", "team-b", "n1", "1", 1))
    return sched, writer


def cycle(sched: Scheduler, ns: str, name: str) -> None:
    info = sched.queue.try_pop()
    assert info is not None
    assert (info.pod.namespace, info.pod.name) == (ns, name)
    sched.schedule_one(info)


async def test_a_pod_within_its_min_reclaims_from_the_borrower_and_says_so() -> None:
    sched, writer = two_teams()
    sched.pod_upserted(pending("b1", "team-b", "1", 1))  # n1 has room; the mins do not
    cycle(sched, "team-b", "b1")
    await sched.drain(10)
    assert len(writer.deletes) == 1
    victim = writer.deletes[0]
    assert victim.startswith("a")  # a borrower's pod, whatever its priority (100 > 1)
    (event,) = [e for e in writer.events if e[2] == "Preempted"]
    assert event[1] == victim
    assert event[3] == (
        "Reclaimed by ElasticQuota team-b/quota for pod team-b/b1 on node n0: "
        "quota team-a/quota used more than its min"
    )
    registry = sched.metrics.registry
    assert registry.get_sample_value(COUNTER, {"namespace": "team-a", "quota": "quota"}) == 1.0
    (condition,) = [c for c in writer.conditions if c[0] == "b1"]
    assert condition[3] == "n0"  # nominated where the victim was
    assert "all quotas use 4 of the 4 cpu their mins sum to" in condition[2]


async def test_preemption_inside_one_quota_is_plain_preemption() -> None:
    sched, writer = two_teams()
    # an idle quota's min leaves the sum of mins no limit; nodes full; team-b above its min
    sched.quota_upserted(quota_body("team-c", min={"cpu": "10"}))
    sched.pod_upserted(bound("a3", "team-a", "n0", "1", 100))  # n0 full too
    sched.pod_upserted(bound("b1", "team-b", "n1", "3", 1))
    sched.pod_upserted(pending("b2", "team-b", "1", 50))
    cycle(sched, "team-b", "b2")
    await sched.drain(10)
    assert sorted(writer.deletes) in (["b0"], ["b1"])
    (event,) = [e for e in writer.events if e[2] == "Preempted"]
    assert event[3].startswith("Preempted by pod uid-b2 on node n1")
    registry = sched.metrics.registry
    assert registry.get_sample_value(COUNTER, {"namespace": "team-b", "quota": "quota"}) is None


async def test_a_pod_above_its_min_says_why_it_takes_nothing_from_other_quotas() -> None:
    """team-b goes above its min with b2 and has no pod of lower priority: nothing is
    evicted (team-a's borrowed pods are not its to take), and the FailedScheduling says
    which rule held it back after kube's preemption text."""
    sched, writer = two_teams()
    sched.quota_upserted(quota_body("team-c", min={"cpu": "10"}))  # the mins no limit
    sched.pod_upserted(bound("a3", "team-a", "n0", "1", 100))  # n0 full
    sched.pod_upserted(bound("b1", "team-b", "n1", "3", 1))  # n1 full
    sched.pod_upserted(pending("b2", "team-b", "1", 0))
    cycle(sched, "team-b", "b2")
    await sched.drain(10)
    assert writer.deletes == []
    (failed,) = [e[3] for e in writer.events if e[2] == "FailedScheduling" and e[1] == "b2"]
    assert "preemption: 0/2 nodes are available: 2 No preemption victims found" in failed
    assert failed.endswith(
        "for incoming pod. Reclaim: quota team-b/quota goes above its min with the pod: only "
        "its own quota's lower-priority pods may be preempted."
    ), failed


def test_the_fair_policy_hands_the_last_shares_to_reclaim() -> None:
    sched, _ = two_teams()
    assert sched.reclaim_quotas() is not None
    quotas = sched.reclaim_quotas()
    assert quotas is not None
    assert quotas.fair_share is None  # no refresh yet: CapacityScheduling's rules alone
    snapshot = QuotaSnapshot(
        {
            "team-a": Quota("team-a", "quota", {"cpu": 4000}, {}, {"cpu": 3000}),
            "team-b": Quota("team-b", "quota", {"cpu": 4000}, {}, {"cpu": 1000}),
        }
    )
    sched.tenant_ranks.refresh(snapshot, {}, {"cpu": 8000}, {"team-b": {"cpu": 4000}})
    quotas = sched.reclaim_quotas()
    assert quotas is not None
    assert quotas.fair_share is not None
    # b: its min, and the 1000 of a's min a does not ask for.
    assert quotas.fair_share["team-b"].share["cpu"] == Fraction(5000)
    assert quotas.capacity == {"cpu": 8000}
    sched.apply_settings(parse_spec({"quota": {"policy": "Capacity"}}, "lattice"))
    quotas = sched.reclaim_quotas()
    assert quotas is not None
    assert quotas.fair_share is None


def test_no_quota_no_reclaim_inputs() -> None:
    sched, _ = scheduler(1, "4")
    assert sched.reclaim_quotas() is None
    assert sched.preemption_inputs().quotas is None
    assert sched.queue.get(pod_key("default", "nothing")) is None


async def test_room_reclaimed_above_the_min_stays_with_its_pod(monkeypatch: Any) -> None:
    """Fair share's second rule: team-a, above its min but within its fair share with its
    pod, evicts one of team-b's (b keeps its share). The victim, created again as a new pod
    (as a Job's controller does), must not take back the room in the sum of mins that the
    nominated pod waits for: it did, and the two evicted each other's pods by turns."""
    monkeypatch.setattr(Scheduler, "RANKS_EVERY", 0.0)
    sched, writer = scheduler(2, "4")
    # Mins 1 + 1 + 4 (team-c idle: its 4 lent) = 6 of the 8 cpus usable together.
    sched.quota_upserted(quota_body("team-a", min={"cpu": "1"}, max={"cpu": "8"}))
    sched.quota_upserted(quota_body("team-b", min={"cpu": "1"}, max={"cpu": "8"}))
    sched.quota_upserted(quota_body("team-c", min={"cpu": "4"}))
    for i, node in enumerate(("n0", "n0")):
        sched.pod_upserted(bound(f"a{i}", "team-a", node, "1", 1))
    for i, node in enumerate(("n0", "n0", "n1", "n1")):
        sched.pod_upserted(bound(f"b{i}", "team-b", node, "1", 1))
    sched.pod_upserted(pending("a2", "team-a", "1", 1))
    # Demand a 3, b 4: shares 1 + 2 = 3 each of the 6. a uses 2, b 4: all 6 in use.
    sched.refresh_tenant_ranks()
    cycle(sched, "team-a", "a2")
    await sched.drain(10)
    (victim,) = writer.deletes
    assert victim.startswith("b")
    (event,) = [e for e in writer.events if e[2] == "Preempted"]
    # team-a uses 2 of its min of 1: only the second rule lets it take from team-b.
    assert event[3].startswith("Reclaimed by ElasticQuota team-a/quota for pod team-a/a2")
    # and says so: team-b borrows too, but the rule that took its pod is fair share's
    assert event[3].endswith(": quota team-b/quota was above its fair share"), event[3]
    # The victim goes; its replacement (same size, same team) comes at once.
    gone = bound(victim, "team-b", "n0" if victim in ("b0", "b1") else "n1", "1", 1)
    sched.pod_deleted(gone)
    sched.pod_upserted(pending("b9", "team-b", "1", 1))
    sched.refresh_tenant_ranks()
    while (info := sched.queue.try_pop()) is not None:
        sched.schedule_one(info)
    await sched.drain(10)
    assert writer.deletes == [victim]  # nobody evicted again
    assert pod_key("team-b", "b9") in sched.queue  # waits: a2's room is spoken for
    assert pod_key("team-a", "a2") not in sched.queue  # placed in the room it reclaimed


async def test_a_preemptor_does_not_preempt_again_before_its_victims_go() -> None:
    """Retried while its victim's deletion is not seen yet (the queue pops a pod backing off
    when nothing else is active), the preemptor would find the victim in place and evict
    another pod for the same room; it waits for the victim instead, as kube's async
    preemption keeps it out of the cycle until its last victim goes."""
    sched, writer = two_teams()
    sched.pod_upserted(bound("x", "default", "n1", "1", 0))
    sched.pod_upserted(pending("b1", "team-b", "1", 1))
    cycle(sched, "team-b", "b1")
    await sched.drain(10)
    (victim,) = writer.deletes
    sched.pod_deleted(bound("x", "default", "n1", "1", 0))  # any pod going retries b1
    cycle(sched, "team-b", "b1")
    await sched.drain(10)
    assert writer.deletes == [victim]
    last = [c for c in writer.conditions if c[0] == "b1"][-1]
    assert "not eligible due to a terminating pod on the nominated node" in last[2]
    assert last[3] is None  # the nomination unchanged: still where its victim was
    assert sched.preemptor.nominations["uid-b1"][1] == "n0"
    sched.pod_deleted(bound(victim, "team-a", "n0", "1", 100))
    cycle(sched, "team-b", "b1")
    await sched.drain(10)
    assert pod_key("team-b", "b1") not in sched.queue
    assert writer.deletes == [victim]


def test_a_victim_seen_terminating_or_gone_ends_the_wait() -> None:
    sched, _ = two_teams()
    p = sched.preemptor
    p.evicting_for(["uid-b1", "uid-b2"], ["uid-a0", "uid-a1"])
    terminating = bound("a0", "team-a", "n0", "1", 100)
    terminating["metadata"]["deletionTimestamp"] = "2026-01-01T00:00:01Z"
    p.note_facts("uid-a0", terminating)  # graceful: the eligibility rule takes over
    assert p.evicting == {"uid-b1": {"uid-a1"}, "uid-b2": {"uid-a1"}}
    p.forget_pod("uid-a1")  # gone
    assert not p.still_evicting("uid-b1")
    assert not p.still_evicting("uid-b2")
    p.evicting_for(["uid-b1"], ["uid-a2"])
    p.pod_bound("uid-b1")  # placed elsewhere meanwhile
    assert p.evicting == {}
