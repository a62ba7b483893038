"""DefaultPreemption, case by case: each test is one rule of kube-scheduler 1.34's."""

from __future__ import annotations

from collections.abc import Sequence

import pytest

from lattice_dev.core.oracle import preemption as oracle
from scheduler.core.preemption import (
    NEVER_MESSAGE,
    TERMINATING_MESSAGE,
    Inputs,
    Preemption,
    ineligible_reason,
    no_preemption_message,
    num_candidates,
    preempt,
)
from scheduler.core.schedule import Framework
from scheduler.core.snapshot import Snapshot
from scheduler.model.errors import InvalidObjectError
from scheduler.model.pdb import IntOrPercent, PodDisruptionBudget
from scheduler.model.pod import Pod
from scheduler.model.pod_facts import PodFacts, PreemptionPolicy
from tests.builders import NodeBuilder, cluster, make_node, make_pod

FRAMEWORK = Framework()


def low(name: str, cpu: str, priority: int, **labels: str) -> Pod:
    builder = make_pod(name, cpu=cpu).priority(priority).uid(name)
    for key, value in labels.items():
        builder.label(key, value)
    return builder.build()


def high(cpu: str = "2", priority: int = 100) -> Pod:
    return make_pod("hi", cpu=cpu).priority(priority).uid("hi").build()


def pdb(
    selector: dict[str, str] | None, allowed: int, namespace: str = "default"
) -> PodDisruptionBudget:
    spec = {} if selector is None else {"selector": {"matchLabels": selector}}
    return PodDisruptionBudget.from_api(
        {
            "metadata": {"name": "b", "namespace": namespace},
            "spec": {"maxUnavailable": 1, **spec},
            "status": {"disruptionsAllowed": allowed},
        }
    )


def run_both(
    nodes: Sequence[NodeBuilder], placed: Sequence[tuple[Pod, str]], pod: Pod, inputs: Inputs
) -> Preemption | None:
    """Fast evaluator and oracle must agree; returns the fast one's answer."""
    snapshot = cluster(nodes, placed)
    decision = FRAMEWORK.schedule(snapshot, pod)
    assert decision.selected is None
    fast = preempt(FRAMEWORK, snapshot, decision, inputs)
    slow = oracle.preempt(FRAMEWORK, snapshot, decision, inputs)
    assert summary(fast) == summary(slow)
    return fast


def summary(p: Preemption | None) -> tuple[str, list[str], int] | None:
    return None if p is None else (p.node, [v.name for v in p.victims], p.pdb_violations)


def names(p: Preemption | None) -> tuple[str, set[str]] | None:
    return None if p is None else (p.node, {v.name for v in p.victims})


def test_evicts_the_fewest_lower_priority_pods_needed() -> None:
    placed = [(low("a", "1", 1), "n1"), (low("b", "1", 2), "n1"), (low("c", "2", 3), "n1")]
    got = run_both([make_node("n1", cpu="4")], placed, high("2"), Inputs())
    # c (most important) is reprieved first and takes the room; a and b must go.
    assert names(got) == ("n1", {"a", "b"})


def test_never_evicts_equal_or_higher_priority() -> None:
    placed = [(low("a", "4", 100), "n1")]
    assert run_both([make_node("n1", cpu="4")], placed, high("2"), Inputs()) is None


def test_preemption_policy_never() -> None:
    placed = [(low("a", "4", 1), "n1")]
    inputs = Inputs(facts={"hi": PodFacts(preemption_policy=PreemptionPolicy.NEVER)})
    assert run_both([make_node("n1", cpu="4")], placed, high("2"), inputs) is None
    snapshot = cluster([make_node("n1", cpu="4")], placed)
    decision = FRAMEWORK.schedule(snapshot, high("2"))
    assert ineligible_reason(snapshot, high("2"), decision, inputs) == NEVER_MESSAGE


def test_terminating_victim_on_nominated_node_makes_the_pod_wait() -> None:
    placed = [(low("a", "4", 1), "n1")]
    pod = Pod.from_api(
        {
            **make_pod("hi", cpu="2").priority(100).uid("hi").obj(),
            "status": {"nominatedNodeName": "n1"},
        }
    )
    inputs = Inputs(facts={"a": PodFacts(terminating_by_preemption=True)})
    snapshot = cluster([make_node("n1", cpu="4")], placed)
    decision = FRAMEWORK.schedule(snapshot, pod)
    assert ineligible_reason(snapshot, pod, decision, inputs) == TERMINATING_MESSAGE
    assert preempt(FRAMEWORK, snapshot, decision, inputs) is None
    assert ineligible_reason(snapshot, pod, decision, Inputs()) is None


def test_unresolvable_nodes_are_not_candidates() -> None:
    nodes = [make_node("n1", cpu="1"), make_node("n2", cpu="4").taint("k", "v")]
    placed = [(low("a", "1", 1), "n1"), (low("b", "4", 1), "n2")]
    # n1 is too small in total (UnschedulableAndUnresolvable); n2's taint is unresolvable.
    assert run_both(nodes, placed, high("2"), Inputs()) is None


def test_fewest_pdb_violations_first() -> None:
    nodes = [make_node("n1", cpu="2"), make_node("n2", cpu="2")]
    placed = [(low("a", "2", 1, app="guarded"), "n1"), (low("b", "2", 5), "n2")]
    got = run_both(nodes, placed, high("2"), Inputs(pdbs=[pdb({"app": "guarded"}, 0)]))
    assert summary(got) == ("n2", ["b"], 0)
    # An allowance of one lets the lower-priority pod go.
    got = run_both(nodes, placed, high("2"), Inputs(pdbs=[pdb({"app": "guarded"}, 1)]))
    assert summary(got) == ("n1", ["a"], 0)


@pytest.mark.parametrize("selector", [None, {}])
def test_nil_and_empty_pdb_selectors_protect_nothing(selector: dict[str, str] | None) -> None:
    nodes = [make_node("n1", cpu="2"), make_node("n2", cpu="2")]
    placed = [(low("a", "2", 1, app="x"), "n1"), (low("b", "2", 5), "n2")]
    got = run_both(nodes, placed, high("2"), Inputs(pdbs=[pdb(selector, 0)]))
    assert summary(got) == ("n1", ["a"], 0)


def test_violating_victims_are_reprieved_first() -> None:
    # One of a and b must go. Unprotected, the less important a would; protected, it is
    # re-added first and the more important b goes.
    placed = [(low("a", "2", 1, app="g"), "n1"), (low("b", "2", 5), "n1")]
    nodes = [make_node("n1", cpu="4")]
    assert summary(run_both(nodes, placed, high("2"), Inputs())) == ("n1", ["a"], 0)
    got = run_both(nodes, placed, high("2"), Inputs(pdbs=[pdb({"app": "g"}, 0)]))
    assert summary(got) == ("n1", ["b"], 0)


def test_lowest_highest_victim_priority_then_sum_then_count() -> None:
    nodes = [make_node(f"n{i}", cpu="2") for i in range(3)]
    placed = [
        (low("a", "2", 10), "n0"),
        (low("b", "1", 3), "n1"),
        (low("c", "1", 3), "n1"),
        (low("d", "1", 3), "n2"),
        (low("e", "1", 2), "n2"),
    ]
    got = run_both(nodes, placed, high("2"), Inputs())
    # n0's top victim has priority 10; n1 and n2 top 3; n2's sum is smaller.
    assert names(got) == ("n2", {"d", "e"})


def test_negative_priorities_sum_with_the_offset() -> None:
    # Two victims of -5 sum to 2*(2**31 - 5): more than one victim of -5 alone.
    nodes = [make_node("n0", cpu="2"), make_node("n1", cpu="2")]
    placed = [
        (low("a", "1", -5), "n0"),
        (low("b", "1", -5), "n0"),
        (low("c", "2", -5), "n1"),
    ]
    assert names(run_both(nodes, placed, high("2"), Inputs())) == ("n1", {"c"})


def test_latest_start_of_the_earliest_top_victim_wins() -> None:
    nodes = [make_node("n0", cpu="2"), make_node("n1", cpu="2")]
    placed = [(low("a", "2", 1), "n0"), (low("b", "2", 1), "n1")]
    facts = {"a": PodFacts(start_time=100.0), "b": PodFacts(start_time=200.0)}
    got = run_both(nodes, placed, high("2"), Inputs(facts=facts))
    assert got is not None
    assert got.node == "n1"
    assert got.tied == ("n1",)


def test_exact_ties_are_reported() -> None:
    nodes = [make_node("n0", cpu="2"), make_node("n1", cpu="2")]
    placed = [(low("a", "2", 1), "n0"), (low("b", "2", 1), "n1")]
    got = run_both(nodes, placed, high("2"), Inputs())
    assert got is not None
    assert set(got.tied) == {"n0", "n1"}


def test_nominated_pods_of_higher_priority_hold_their_place() -> None:
    nodes = [make_node("n0", cpu="4"), make_node("n1", cpu="4")]
    placed = [(low("a", "4", 1), "n0"), (low("b", "4", 2), "n1")]
    nominated = make_pod("nom", cpu="3").priority(200).uid("nom").build()
    got = run_both(nodes, placed, high("2"), Inputs(nominated=[(nominated, "n0")]))
    assert names(got) == ("n1", {"b"})
    # A nominated pod of lower priority does not count.
    lower = make_pod("nom", cpu="3").priority(50).uid("nom").build()
    got = run_both(nodes, placed, high("2"), Inputs(nominated=[(lower, "n0")]))
    assert names(got) == ("n0", {"a"})


def test_inter_pod_anti_affinity_victim() -> None:
    nodes = [make_node("n0", cpu="4"), make_node("n1", cpu="4")]
    blocker = make_pod("x", cpu="100m").priority(1).uid("x").label("app", "db").build()
    other = make_pod("y", cpu="4").priority(1).uid("y").build()
    pod = (
        make_pod("hi", cpu="1")
        .priority(100)
        .uid("hi")
        .pod_anti_affinity("kubernetes.io/hostname", {"app": "db"})
        .build()
    )
    got = run_both(nodes, [(blocker, "n0"), (other, "n1")], pod, Inputs())
    # One victim of priority 1 either way (the anti-affine pod on n0, the big one on n1):
    # the nodes tie at every criterion.
    assert got is not None
    assert set(got.tied) == {"n0", "n1"}
    assert {v.name for v in got.victims} == ({"x"} if got.node == "n0" else {"y"})


def test_snapshot_is_restored_exactly() -> None:
    nodes = [make_node("n0", cpu="4"), make_node("n1", cpu="4")]
    placed = [
        (low("a", "1", 1, app="db"), "n0"),
        (low("b", "2", 2), "n0"),
        (make_pod("c", cpu="1").priority(500).uid("c").build(), "n0"),
        (low("d", "4", 1), "n1"),
    ]
    snapshot = cluster(nodes, placed)
    before = [[p.key for p in snapshot.pods_on(i)] for i in range(snapshot.num_nodes)]
    requested = snapshot.requested.copy()
    decision = FRAMEWORK.schedule(snapshot, high("3"))
    assert preempt(FRAMEWORK, snapshot, decision) is not None
    assert [[p.key for p in snapshot.pods_on(i)] for i in range(snapshot.num_nodes)] == before
    assert (snapshot.requested == requested).all()


def test_num_candidates() -> None:
    assert [num_candidates(n) for n in (1, 100, 999, 1000, 5000)] == [1, 100, 100, 100, 500]


def test_pdb_parsing() -> None:
    budget = PodDisruptionBudget.from_api(
        {
            "metadata": {"name": "b", "namespace": "ns", "generation": 2},
            "spec": {"minAvailable": "50%", "selector": {"matchLabels": {"app": "x"}}},
            "status": {
                "disruptionsAllowed": 1,
                "disruptedPods": {"p1": "2024-01-01T00:00:00Z"},
                "observedGeneration": 1,
            },
        }
    )
    assert budget.min_available == IntOrPercent(50, percent=True)
    assert budget.min_available.scaled(3, round_up=True) == 2
    assert budget.disrupted_pods == frozenset({"p1"})
    assert not budget.status_current
    p1 = make_pod("p1", namespace="ns").label("app", "x").build()
    p2 = make_pod("p2", namespace="ns").label("app", "x").build()
    assert not budget.covers(p1)  # already counted as disrupted
    assert budget.covers(p2)
    with pytest.raises(InvalidObjectError):
        PodDisruptionBudget.from_api({"metadata": {"name": "b"}, "spec": {"maxUnavailable": "x"}})


def test_pod_facts_parsing() -> None:
    body = {
        "metadata": {"name": "p", "deletionTimestamp": "2024-01-01T00:00:10Z"},
        "spec": {"preemptionPolicy": "Never"},
        "status": {
            "startTime": "2024-01-01T00:00:00Z",
            "conditions": [
                {"type": "DisruptionTarget", "status": "True", "reason": "PreemptionByScheduler"}
            ],
        },
    }
    facts = PodFacts.from_api(body)
    assert facts.start_time == 1704067200.0
    assert facts.terminating_by_preemption
    assert facts.preemption_policy is PreemptionPolicy.NEVER
    assert PodFacts.from_api({"metadata": {"name": "p"}}) == PodFacts()


def test_preempting_keeps_snapshot_usable_for_scheduling() -> None:
    snapshot: Snapshot = cluster([make_node("n0", cpu="2")], [(low("a", "2", 1), "n0")])
    decision = FRAMEWORK.schedule(snapshot, high("2"))
    result = preempt(FRAMEWORK, snapshot, decision)
    assert result is not None
    for victim in result.victims:
        snapshot.remove_pod(victim)
    assert FRAMEWORK.schedule(snapshot, high("2")).selected == "n0"


def test_no_preemption_message_counts_the_dry_run() -> None:
    nodes = [make_node("n1", cpu="1"), make_node("n2", cpu="2"), make_node("n3", cpu="3")]
    placed = [
        (low("a", "1", 1), "n1"),
        (low("b", "2", 500), "n2"),
        (low("c", "2", 500), "n3"),
        (low("d", "1", 1), "n3"),
    ]
    snapshot = cluster(nodes, placed)
    decision = FRAMEWORK.schedule(snapshot, high("2"))
    assert preempt(FRAMEWORK, snapshot, decision) is None
    # n1 is too small in total (not a candidate at all), n2 holds only a more important pod,
    # n3 stays short of cpu with d gone.
    assert no_preemption_message(FRAMEWORK, snapshot, decision) == (
        "0/3 nodes are available: 1 Insufficient cpu, "
        "1 No preemption victims found for incoming pod, "
        "1 Preemption is not helpful for scheduling."
    )
    never = Inputs(facts={"hi": PodFacts(preemption_policy=PreemptionPolicy.NEVER)})
    assert no_preemption_message(FRAMEWORK, snapshot, decision, never) == NEVER_MESSAGE


def test_a_pod_needing_a_node_feature_preempts_only_where_the_node_declares_it() -> None:
    """A full node lacking the feature is rejected by NodeResourcesFit first (kube appends
    NodeDeclaredFeatures last), so it is a candidate; only re-running every filter without
    the victims finds that evicting cannot help there (the counted shortcut must not apply)."""
    feature = "RestartAllContainersOnContainerExits"
    needy = make_pod("hi", cpu="2").priority(100).uid("hi").restart_rule().build()
    full = [(low("a", "4", 1), "n1"), (low("b", "4", 1), "n2")]
    nodes = [make_node("n1", cpu="4"), make_node("n2", cpu="4").declared_features(feature)]
    assert names(run_both(nodes, full, needy, Inputs())) == ("n2", {"b"})
    assert run_both(nodes[:1], full[:1], needy, Inputs()) is None
