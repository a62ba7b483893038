"""Reclaim: CapacityScheduling's victim rules across ElasticQuotas, case by case.

The first cases replay scheduler-plugins' ``test/integration/capacity_scheduling_test.go``
in the pure core (two nodes of 100 cpus, 100 bytes of memory, 32 pods; pods of 50 bytes
and 10 millicores; quotas of min 100 bytes / 100m and max 200 bytes / 200m). Each one is
answered differently by kube's priority-only rules, so none passes without reclaim's."""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from fractions import Fraction
from typing import Any

import numpy as np

from scheduler.core import reclaim
from scheduler.core.explain import PREFILTER_REJECTED, Decision, Explanation, Rejection
from scheduler.core.fairshare import FairShare, QuotaState, fair_shares
from scheduler.core.framework import Code
from scheduler.core.preemption import (
    TERMINATING_MESSAGE,
    Inputs,
    Preemption,
    ineligible_reason,
    no_preemption_message,
    preempt,
)
from scheduler.core.quota import Quota, QuotaSnapshot, add
from scheduler.core.reclaim import RECLAIM_HEADROOM, Quotas, held_by
from scheduler.core.schedule import Framework
from scheduler.core.snapshot import Snapshot
from scheduler.model.pod import Pod
from scheduler.model.pod_facts import PodFacts
from scheduler.solver.preempt import candidate_units
from tests.builders import cluster, make_node, make_pod

FRAMEWORK = Framework()
LOW, MID, HIGH = 1, 5, 10


def qpod(name: str, ns: str, memory: int, cpu_milli: int, priority: int) -> Pod:
    cpu = f"{cpu_milli}m" if cpu_milli else None
    return (
        make_pod(name, cpu=cpu, memory=str(memory), namespace=ns)
        .priority(priority)
        .uid(name)
        .build()
    )


def eq(
    ns: str,
    *,
    min: Mapping[str, int] | None = None,
    max: Mapping[str, int] | None = None,
) -> Quota:
    return Quota(
        ns,
        f"eq-{ns}",
        dict({"memory": 100, "cpu": 100} if min is None else min),
        dict({"memory": 200, "cpu": 200} if max is None else max),
    )


def nodes(count: int = 2, memory: int = 100) -> list[object]:
    return [make_node(f"n{i + 1}", cpu="100", memory=str(memory), pods=32) for i in range(count)]


def quotas_of(
    quotas: Sequence[Quota],
    placed: Sequence[tuple[Pod, str]],
    **kwargs: object,
) -> Quotas:
    """The quotas with their use counted from the placed pods."""
    used: dict[str, dict[str, int]] = {}
    for pod, _ in placed:
        used[pod.namespace] = add(used.get(pod.namespace, {}), held_by(pod))
    snapshot = QuotaSnapshot({q.namespace: q.with_used(used.get(q.namespace, {})) for q in quotas})
    return Quotas(snapshot, **kwargs)  # type: ignore[arg-type]


def refused(snapshot: Snapshot, pod: Pod) -> Decision:
    """A cycle whose quota PreFilter refused the pod: every node Unschedulable."""
    rows = np.full(snapshot.num_nodes, PREFILTER_REJECTED, dtype=np.int16)
    rejection = Rejection("CapacityScheduling", Code.UNSCHEDULABLE, "quota: sum of mins used")
    return Decision(
        pod, None, Explanation(snapshot.node_names, rows, prefilter_rejection=rejection)
    )


def run(
    placed: Sequence[tuple[Pod, str]],
    pod: Pod,
    quotas: Quotas | None,
    *,
    node_list: Sequence[object] | None = None,
    prefilter_refused: bool = False,
    inputs: Inputs | None = None,
) -> Preemption | None:
    """The preemption on both paths (integer sums and filter simulation), which must agree."""
    answers = []
    for force in (False, True):
        snapshot = cluster(node_list or nodes(), placed)  # type: ignore[arg-type]
        if prefilter_refused:
            decision = refused(snapshot, pod)
        else:
            decision = FRAMEWORK.schedule(snapshot, pod)
            assert decision.selected is None
        base = inputs or Inputs()
        full = Inputs(
            pdbs=base.pdbs,
            nominated=base.nominated,
            facts=base.facts,
            gangs=base.gangs,
            gang_members=base.gang_members,
            quotas=quotas,
        )
        answers.append(preempt(FRAMEWORK, snapshot, decision, full, force_simulation=force))
    assert summary(answers[0]) == summary(answers[1])
    return answers[0]


def summary(p: Preemption | None) -> tuple[str, set[str]] | None:
    return None if p is None else (p.node, {v.name for v in p.victims})


# --- CapacityScheduling's integration cases -----------------------------------------------


def test_cross_namespace_preemption_takes_from_the_borrower() -> None:
    placed = [
        (qpod("t1-p1", "ns1", 50, 10, MID), "n1"),
        (qpod("t1-p2", "ns1", 50, 10, MID), "n1"),
        (qpod("t1-p3", "ns1", 50, 10, LOW), "n2"),
        (qpod("t1-p4", "ns2", 50, 10, MID), "n2"),
    ]
    quotas = quotas_of([eq("ns1"), eq("ns2")], placed)
    got = run(placed, qpod("t1-p5", "ns2", 50, 10, MID), quotas)
    assert summary(got) == ("n2", {"t1-p3"})
    # ns2 at its min with p5: p6 may take only lower-priority pods of ns2 (there are none).
    after = [p for p in placed if p[0].name != "t1-p3"] + [
        (qpod("t1-p5", "ns2", 50, 10, MID), "n2")
    ]
    quotas = quotas_of([eq("ns1"), eq("ns2")], after)
    assert run(after, qpod("t1-p6", "ns2", 50, 10, LOW), quotas) is None


def test_in_namespace_preemption_above_min_stays_in_the_quota() -> None:
    placed = [
        (qpod("t2-p1", "ns1", 50, 10, MID), "n1"),
        (qpod("t2-p2", "ns1", 50, 10, LOW), "n1"),
        (qpod("t2-p3", "ns2", 50, 10, MID), "n2"),
        (qpod("t2-p4", "ns2", 50, 10, LOW), "n2"),
    ]
    quotas = quotas_of([eq("ns1"), eq("ns2")], placed)
    got = run(placed, qpod("t2-p5", "ns1", 50, 10, MID), quotas)
    assert summary(got) == ("n1", {"t2-p2"})
    assert got is not None
    assert [c.node for c in got.candidates] == ["n1"]
    # kube's rules alone would also offer ns2's low pod on n2
    kube = run(placed, qpod("t2-p5", "ns1", 50, 10, MID), None)
    assert kube is not None
    assert {c.node for c in kube.candidates} == {"n1", "n2"}


def test_no_node_fits_the_pod_even_with_victims_gone() -> None:
    placed = [
        (qpod("t4-p1", "ns1", 50, 10, MID), "n1"),
        (qpod("t4-p2", "ns1", 50, 10, MID), "n1"),
        (qpod("t4-p3", "ns1", 50, 10, LOW), "n2"),
        (qpod("t4-p4", "ns2", 50, 10, MID), "n2"),
    ]
    quotas = quotas_of([eq("ns1"), eq("ns2")], placed)
    for pod in (qpod("t4-p5", "ns1", 150, 10, HIGH), qpod("t4-p6", "ns2", 150, 10, HIGH)):
        assert run(placed, pod, quotas) is None


def test_overused_quota_cannot_take_from_other_quotas() -> None:
    placed = [
        (qpod("t5-p1", "ns1", 50, 10, MID), "n1"),
        (qpod("t5-p2", "ns2", 50, 10, HIGH), "n1"),
        (qpod("t5-p3", "ns2", 50, 10, HIGH), "n2"),
        (qpod("t5-p4", "ns2", 50, 10, HIGH), "n2"),
    ]
    quotas = quotas_of([eq("ns1"), eq("ns2")], placed)
    pod = qpod("t5-p5", "ns2", 50, 10, HIGH)
    assert run(placed, pod, quotas) is None
    assert summary(run(placed, pod, None)) == ("n1", {"t5-p1"})  # kube's rules would


def test_victims_are_taken_on_one_node_only() -> None:
    placed = [
        (qpod("t6-p1", "ns1", 50, 10, LOW), "n1"),
        (qpod("t6-p2", "ns1", 50, 10, LOW), "n2"),
        (qpod("t6-p3", "ns2", 50, 10, MID), "n1"),
        (qpod("t6-p4", "ns2", 50, 10, MID), "n2"),
    ]
    quotas = quotas_of([eq("ns1"), eq("ns2")], placed)
    pod = qpod("t6-p5", "ns1", 100, 20, HIGH)
    assert run(placed, pod, quotas) is None
    assert run(placed, pod, None) is not None  # kube's rules would take ns2's pods too


def three_quotas() -> tuple[list[tuple[Pod, str]], list[Quota]]:
    placed = [
        (qpod("t7-p1", "ns1", 0, 1, HIGH), "n1"),
        (qpod("t7-p2", "ns1", 0, 1, MID), "n2"),
        (qpod("t7-p3", "ns1", 0, 1, MID), "n2"),
        (qpod("t7-p5", "ns2", 0, 1, MID), "n2"),
        (qpod("t7-p6", "ns2", 0, 1, MID), "n1"),
        (qpod("t7-p7", "ns2", 0, 1, MID), "n2"),
        (qpod("t7-p9", "ns3", 0, 1, MID), "n1"),
    ]
    quotas = [
        eq("ns1", min={"memory": 100, "cpu": 1}, max={"memory": 200, "cpu": 3}),
        eq("ns2", min={"memory": 100, "cpu": 3}, max={"memory": 200, "cpu": 3}),
        eq("ns3", min={"memory": 100, "cpu": 3}, max={"memory": 200, "cpu": 4}),
    ]
    return placed, quotas


def test_prefilter_refusal_reclaims_although_nodes_have_room() -> None:
    placed, quotas = three_quotas()
    pod = qpod("t7-p10", "ns3", 0, 1, MID)
    got = run(placed, pod, quotas_of(quotas, placed), prefilter_refused=True)
    # ns1 borrows 2m of cpu: one of its mid pods goes (the cheaper node), its high one stays
    assert summary(got) == ("n2", {"t7-p3"})
    # kube's rules: nothing lower than mid anywhere but ns1's high pod... nothing to take
    assert run(placed, pod, None, prefilter_refused=True) is None
    # next: ns1 still borrows 1m, the other mid pod goes
    after = [p for p in placed if p[0].name != "t7-p3"] + [(pod, "n1")]
    got = run(
        after, qpod("t7-p11", "ns3", 0, 1, MID), quotas_of(quotas, after), prefilter_refused=True
    )
    assert summary(got) == ("n2", {"t7-p2"})
    # then ns3 is at its min: the fourth pod may take only lower-priority pods of ns3
    after = [p for p in after if p[0].name != "t7-p2"] + [(qpod("t7-p11", "ns3", 0, 1, MID), "n2")]
    last = qpod("t7-p12", "ns3", 0, 1, MID)
    assert run(after, last, quotas_of(quotas, after), prefilter_refused=True) is None


def test_borrowers_pods_go_whatever_their_priority() -> None:
    placed = [(qpod("b1", "ns1", 50, 0, HIGH), "n1"), (qpod("b2", "ns1", 50, 0, HIGH), "n1")]
    quotas = quotas_of([eq("ns1", min={"memory": 50}), eq("ns2", min={"memory": 50})], placed)
    pod = qpod("p", "ns2", 50, 0, LOW)
    assert summary(run(placed, pod, quotas, node_list=nodes(1))) in (
        ("n1", {"b1"}),
        ("n1", {"b2"}),
    )
    assert run(placed, pod, None, node_list=nodes(1)) is None


def test_a_borrower_is_not_taken_below_its_min_on_one_node() -> None:
    # ns1 borrows 50 over its min of 100: on n1 only its least important pod is a
    # potential victim; the pod needs 100 there, so n1 is no candidate.
    # (n2 holds one more ns1 pod beside a pod of ns2, which does not borrow.)
    placed = [
        (qpod("a", "ns1", 50, 0, LOW), "n1"),
        (qpod("b", "ns1", 50, 0, MID), "n1"),
        (qpod("c", "ns1", 50, 0, MID), "n2"),
        (qpod("e", "ns2", 50, 0, MID), "n2"),
    ]
    qs = [eq("ns1", min={"memory": 100}), eq("ns2", min={"memory": 50}), eq("ns3")]
    quotas = quotas_of(qs, placed)
    assert run(placed, qpod("p", "ns3", 100, 0, LOW), quotas) is None
    got = run(placed, qpod("p", "ns3", 50, 0, LOW), quotas)
    assert summary(got) in (("n1", {"a"}), ("n2", {"c"}))
    # kube's rules (priority) would empty n1 for the high-priority pod
    assert summary(run(placed, qpod("p", "ns3", 100, 0, HIGH), None)) == ("n1", {"a", "b"})


def test_gpu_only_quotas_reclaim_gpus_whatever_cpu_the_pods_ask() -> None:
    # Quotas name GPUs only; the pods ask cpu too. cpu is governed by no quota, so it makes
    # neither team-b's pod "above its min" nor team-a a borrower (admission's reading).
    gpu = "nvidia.com/gpu"
    node = [make_node("g1", cpu="32", memory="64Gi", pods=32).resource(gpu, 8)]

    def gpod(name: str, ns: str, gpus: int, priority: int) -> Pod:
        builder = make_pod(name, cpu="4", namespace=ns, resources={gpu: str(gpus)})
        return builder.priority(priority).uid(name).build()

    placed = [(gpod(f"a{i}", "team-a", 2, HIGH), "g1") for i in range(4)]
    qs = [
        Quota("team-a", "q", {gpu: 4}, {gpu: 8}),
        Quota("team-b", "q", {gpu: 4}, {gpu: 8}),
    ]
    got = run(placed, gpod("b0", "team-b", 4, LOW), quotas_of(qs, placed), node_list=node)
    assert got is not None
    assert len(got.victims) == 2
    assert {v.namespace for v in got.victims} == {"team-a"}


def test_a_pod_without_quota_cannot_take_quota_pods() -> None:
    placed = [(qpod("a", "ns1", 100, 0, LOW), "n1")]
    quotas = quotas_of([eq("ns1")], placed)
    pod = qpod("p", "free", 50, 0, HIGH)
    assert run(placed, pod, quotas, node_list=nodes(1)) is None
    assert run(placed, pod, None, node_list=nodes(1)) is not None
    # ... but takes lower-priority pods of namespaces without one
    placed = [(qpod("a", "other", 100, 0, LOW), "n1")]
    assert summary(run(placed, pod, quotas, node_list=nodes(1))) == ("n1", {"a"})


def test_a_borrowing_gang_is_reclaimed_whole() -> None:
    a, b = qpod("a", "ns1", 50, 0, LOW), qpod("b", "ns1", 50, 0, LOW)
    placed = [(a, "n1"), (b, "n2"), (qpod("c", "ns1", 50, 0, MID), "n1")]
    placed.append((qpod("d", "ns1", 50, 0, MID), "n2"))
    quotas = quotas_of([eq("ns1", min={"memory": 100}), eq("ns2", min={"memory": 100})], placed)
    inputs = Inputs(gangs={"a": "ns1/g", "b": "ns1/g"}, gang_members={"ns1/g": [a, b]})
    got = run(placed, qpod("p", "ns2", 50, 0, LOW), quotas, inputs=inputs)
    assert got is not None
    assert {v.name for v in got.victims} == {"a", "b"}
    # without the gang, one pod would do
    got = run(placed, qpod("p", "ns2", 50, 0, LOW), quotas)
    assert got is not None
    assert len(got.victims) == 1


def test_the_max_is_rechecked_with_the_victims_gone() -> None:
    # ns1 above its min: its own low pod could go, but ns1 would pass its max of 100.
    placed = [(qpod("a", "ns1", 50, 0, LOW), "n1"), (qpod("b", "ns1", 50, 0, MID), "n1")]
    idle = eq("ns9", min={"memory": 100})  # so that the sum of mins is no limit here
    quotas = quotas_of([eq("ns1", min={"memory": 50}, max={"memory": 100}), idle], placed)
    got = run(placed, qpod("p", "ns1", 50, 0, HIGH), quotas, node_list=nodes(1))
    assert summary(got) == ("n1", {"a"})
    got = run(placed, qpod("p", "ns1", 100, 0, HIGH), quotas, node_list=nodes(1))
    assert summary(got) == ("n1", {"a", "b"})
    tight = quotas_of([eq("ns1", min={"memory": 50}, max={"memory": 60}), idle], placed)
    assert run(placed, qpod("p", "ns1", 100, 0, HIGH), tight, node_list=nodes(1)) is None


def test_waits_for_a_terminating_borrower_pod_on_its_nominated_node() -> None:
    placed = [(qpod("a", "ns1", 100, 0, HIGH), "n1")]
    quotas = quotas_of([eq("ns1", min={"memory": 50}), eq("ns2", min={"memory": 50})], placed)
    body = make_pod("p", memory="50", namespace="ns2").priority(LOW).uid("p").obj()
    pod = Pod.from_api({**body, "status": {"nominatedNodeName": "n1"}})
    snapshot = cluster(nodes(1), placed)  # type: ignore[arg-type]
    decision = FRAMEWORK.schedule(snapshot, pod)
    facts = {"a": PodFacts(terminating_by_preemption=True)}
    assert ineligible_reason(snapshot, pod, decision, Inputs(facts=facts, quotas=quotas)) == (
        TERMINATING_MESSAGE
    )
    # kube's rule looks at priority only: a higher-priority pod is no reason to wait
    assert ineligible_reason(snapshot, pod, decision, Inputs(facts=facts)) is None


def test_no_preemption_message_names_the_quota_when_it_refuses() -> None:
    placed = [(qpod("a", "ns1", 50, 0, LOW), "n1"), (qpod("b", "ns1", 50, 0, MID), "n1")]
    quotas = quotas_of([eq("ns1", min={"memory": 50}, max={"memory": 60})], placed)
    pod = qpod("p", "ns1", 100, 0, HIGH)
    snapshot = cluster(nodes(1), placed)  # type: ignore[arg-type]
    decision = FRAMEWORK.schedule(snapshot, pod)
    message = no_preemption_message(FRAMEWORK, snapshot, decision, Inputs(quotas=quotas))
    assert "ElasticQuota would not admit it" in message


# --- fair share -----------------------------------------------------------------------------


def shares_for(
    quotas: Sequence[Quota], used: Mapping[str, Mapping[str, int]], demand: Mapping[str, int]
) -> dict[str, FairShare]:
    states = {
        q.namespace: QuotaState(
            min=q.min,
            max=q.max,
            used=used.get(q.namespace, {}),
            demand={"memory": demand.get(q.namespace, 0)},
        )
        for q in quotas
    }
    return fair_shares({"memory": 100}, states)


def test_fair_share_takes_first_from_the_borrower_furthest_above_its_share() -> None:
    placed = [(qpod("x", "ns1", 50, 0, LOW), "n1"), (qpod("y", "ns2", 50, 0, MID), "n1")]
    qs = [
        eq("ns1", min={"memory": 25}, max={}),
        eq("ns2", min={"memory": 25}, max={}),
        eq("ns3", min={"memory": 100}, max={}),
    ]
    pod = qpod("p", "ns3", 50, 0, LOW)
    flat = quotas_of(qs, placed)
    assert summary(run(placed, pod, flat, node_list=nodes(1))) == ("n1", {"x"})  # priority
    shares = {
        "ns1": FairShare({}, {"memory": Fraction(50)}, Fraction(1, 2)),
        "ns2": FairShare({}, {"memory": Fraction(25)}, Fraction(1, 4)),
        "ns3": FairShare({}, {"memory": Fraction(25)}, Fraction(1, 4)),
    }
    fair = quotas_of(qs, placed, fair_share=shares, capacity={"memory": 100})
    assert summary(run(placed, pod, fair, node_list=nodes(1))) == ("n1", {"y"})


def test_fair_share_lets_a_quota_below_its_share_take_down_to_the_others_share() -> None:
    # ns3's min of 80 is idle: ns2 borrows it. ns1 (min 10) wants 30 more: above its min,
    # so CapacityScheduling lets it take nothing; its fair share (40 of the leftover split
    # evenly, ns2 gets 60) lets it take from ns2, but only down to ns2's share.
    placed = [(qpod("own", "ns1", 10, 0, MID), "n1")]
    placed += [(qpod(f"b{i}", "ns2", 20, 0, HIGH), "n1") for i in range(4)]
    qs = [
        eq("ns1", min={"memory": 10}, max={}),
        eq("ns2", min={"memory": 10}, max={}),
        eq("ns3", min={"memory": 80}, max={}),
    ]
    shares = shares_for(qs, {"ns1": {"memory": 10}, "ns2": {"memory": 80}}, {"ns1": 40, "ns2": 80})
    assert shares["ns1"].share["memory"] == 40
    assert shares["ns2"].share["memory"] == 60
    pod = qpod("p", "ns1", 30, 0, MID)
    assert run(placed, pod, quotas_of(qs, placed), node_list=nodes(1)) is None
    fair = quotas_of(qs, placed, fair_share=shares, capacity={"memory": 100})
    got = run(placed, pod, fair, node_list=nodes(1))
    assert got is not None
    assert len(got.victims) == 1
    assert got.victims[0].namespace == "ns2"
    # a pod that would need two of ns2's pods would take ns2 below its share: nothing
    bigger = qpod("p", "ns1", 50, 0, MID)
    assert run(placed, bigger, fair, node_list=nodes(1)) is None


def test_fair_share_reclaims_only_for_a_quota_clearly_below_its_share(monkeypatch: Any) -> None:
    """The second rule's hysteresis (RECLAIM_HEADROOM, a tenth): ns1, with a share of 40,
    reclaims from ns2 (above its share of 60) at 36 used, not at 37, though the pod would
    keep it within its share either way and the rule without the hysteresis takes the pod."""
    assert Fraction(1, 10) == RECLAIM_HEADROOM
    qs = [
        eq("ns1", min={"memory": 10}, max={}),
        eq("ns2", min={"memory": 10}, max={}),
        eq("ns3", min={"memory": 80}, max={}),
    ]

    def attempt(own: int) -> set[str] | None:
        placed = [(qpod("own", "ns1", own, 0, MID), "n1")]
        placed += [(qpod(f"b{i}", "ns2", 4, 0, HIGH), "n1") for i in range(15)]
        placed += [(qpod("small", "ns2", 100 - own - 60, 0, HIGH), "n1")]  # the node full
        used = {"ns1": {"memory": own}, "ns2": {"memory": 100 - own}}
        shares = shares_for(qs, used, {"ns1": 40, "ns2": 100})
        assert (shares["ns1"].share["memory"], shares["ns2"].share["memory"]) == (
            Fraction(40),
            Fraction(60),
        )
        fair = quotas_of(qs, placed, fair_share=shares, capacity={"memory": 100})
        got = run(placed, qpod("p", "ns1", 40 - own, 0, MID), fair, node_list=nodes(1))
        return None if got is None else {v.name for v in got.victims}

    at_36 = attempt(36)  # one of ns2's pods of 4, whichever the rules pick
    assert at_36 is not None
    assert len(at_36) == 1
    assert at_36 <= {*(f"b{i}" for i in range(15)), "small"}
    assert attempt(37) is None
    monkeypatch.setattr(reclaim, "RECLAIM_HEADROOM", Fraction(0))
    assert attempt(37) == {"small"}  # ns2 keeps its 60: only the hysteresis said no


def test_failed_scheduling_says_which_reclaim_rule_held_the_pod_back() -> None:
    """A pod above its min that may take nothing from other quotas says why in its
    FailedScheduling text: the hysteresis (37 of a share of 40), past its share (the pod
    would take it to 45), fair share off (above its min). A pod that may reclaim, or one
    of a quota within its min, gets kube's text alone."""
    qs = [
        eq("ns1", min={"memory": 10}, max={}),
        eq("ns2", min={"memory": 10}, max={}),
        eq("ns3", min={"memory": 80}, max={}),
    ]

    def message(own: int, ask: int, *, fair: bool = True) -> str:
        placed = [(qpod("own", "ns1", own, 0, MID), "n1")]
        placed += [(qpod("theirs", "ns2", 100 - own, 0, HIGH), "n1")]
        used = {"ns1": {"memory": own}, "ns2": {"memory": 100 - own}}
        shares = shares_for(qs, used, {"ns1": 40, "ns2": 100}) if fair else None
        quotas = quotas_of(qs, placed, fair_share=shares, capacity={"memory": 100})
        snapshot = cluster(nodes(1), placed)  # type: ignore[arg-type]
        decision = FRAMEWORK.schedule(snapshot, qpod("p", "ns1", ask, 0, MID))
        assert decision.selected is None
        return no_preemption_message(FRAMEWORK, snapshot, decision, Inputs(quotas=quotas))

    held = message(37, 3)
    assert held.startswith("0/1 nodes are available: 1 No preemption victims found")
    assert held.endswith(
        " Reclaim: quota ns1/eq-ns1 goes above its min with the pod and already uses 37 of "
        "its fair share of 40 memory: fair share takes from other quotas only for a quota "
        "using at most 9/10 of its share; only its own quota's lower-priority pods may be "
        "preempted."
    )
    assert message(30, 15).endswith(
        " Reclaim: quota ns1/eq-ns1 goes above its min with the pod and past its fair share "
        "of 40 memory (45 with it): only its own quota's lower-priority pods may be preempted."
    )
    assert message(37, 3, fair=False).endswith(
        " Reclaim: quota ns1/eq-ns1 goes above its min with the pod: only its own quota's "
        "lower-priority pods may be preempted."
    )
    assert "Reclaim:" not in message(5, 4)  # within its min: it may take from borrowers


def test_the_snapshot_is_left_as_it_was() -> None:
    placed, qs = three_quotas()
    snapshot = cluster(nodes(), placed)  # type: ignore[arg-type]
    before = [list(snapshot.pods_on(r)) for r in range(snapshot.num_nodes)]
    quotas = quotas_of(qs, placed)
    pod = qpod("t7-p10", "ns3", 0, 1, MID)
    assert preempt(FRAMEWORK, snapshot, refused(snapshot, pod), Inputs(quotas=quotas)) is not None
    assert [list(snapshot.pods_on(r)) for r in range(snapshot.num_nodes)] == before
    ns1 = quotas.snapshot.of("ns1")
    assert ns1 is not None
    assert ns1.used.get("cpu") == 3


# --- gangs as preemptors ------------------------------------------------------------------


def test_a_gang_preempts_only_what_the_quota_rules_allow() -> None:
    placed = [
        (qpod("a0", "team-a", 0, 2000, LOW), "n1"),
        (qpod("a1", "team-a", 0, 2000, HIGH), "n1"),
        (qpod("b0", "team-b", 0, 2000, LOW), "n1"),
        (qpod("b1", "team-b", 0, 2000, LOW), "n1"),
    ]
    node = [make_node("n1", cpu="8", memory="8Gi", pods=32)]
    snapshot = cluster(node, placed)
    members = [qpod(f"g{i}", "team-b", 0, 2000, MID) for i in range(2)]

    def units(quotas: Quotas | None) -> set[str]:
        found = candidate_units(FRAMEWORK, snapshot, members, Inputs(quotas=quotas))
        return {p.name for unit in found for p in unit}

    assert units(None) == {"a0", "b0", "b1"}  # kube's rule: every lower-priority pod
    cpu = "cpu"
    above = [Quota("team-a", "q", {cpu: 8000}, {}), Quota("team-b", "q", {cpu: 2000}, {})]
    assert units(quotas_of(above, placed)) == {"b0", "b1"}  # above its min: its own only
    below = [Quota("team-a", "q", {cpu: 2000}, {}), Quota("team-b", "q", {cpu: 10000}, {})]
    assert units(quotas_of(below, placed)) == {"a0", "a1"}  # within: the borrower's, any priority
