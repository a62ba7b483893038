"""Single-pod preemption with gangs: a placed gang is evicted whole or not at all.

Each case runs the integer-sum path and the filter simulation (``force_simulation``); both
must agree."""

from __future__ import annotations

from collections.abc import Mapping, Sequence

import pytest

from scheduler.core.preemption import Inputs, Preemption, no_preemption_message, preempt
from scheduler.core.schedule import Framework
from scheduler.model.pdb import PodDisruptionBudget
from scheduler.model.pod import Pod
from scheduler.model.pod_facts import PodFacts
from tests.builders import NodeBuilder, cluster, make_node, make_pod

FRAMEWORK = Framework()


def low(name: str, cpu: str, priority: int, **labels: str) -> Pod:
    return make_pod(name, cpu=cpu).priority(priority).uid(name).labels(labels).build()


def high(cpu: str = "2", priority: int = 100) -> Pod:
    return make_pod("hi", cpu=cpu).priority(priority).uid("hi").build()


def gang_inputs(placed: Sequence[tuple[Pod, str]], gangs: Mapping[str, Sequence[str]]) -> Inputs:
    """Inputs naming ``gangs`` (gang key -> member names) among ``placed``."""
    by_name = {p.name: p for p, _ in placed}
    return Inputs(
        gangs={by_name[m].key: g for g, members in gangs.items() for m in members},
        gang_members={g: tuple(by_name[m] for m in members) for g, members in gangs.items()},
    )


def run(
    nodes: Sequence[NodeBuilder], placed: Sequence[tuple[Pod, str]], pod: Pod, inputs: Inputs
) -> Preemption | None:
    """Both paths on fresh snapshots; they must agree. Returns the counted path's answer."""
    answers = []
    for force in (False, True):
        snapshot = cluster(nodes, placed)
        decision = FRAMEWORK.schedule(snapshot, pod)
        assert decision.selected is None
        answers.append(preempt(FRAMEWORK, snapshot, decision, inputs, force_simulation=force))
    assert summary(answers[0]) == summary(answers[1])
    return answers[0]


def summary(p: Preemption | None) -> tuple[str, list[str], int] | None:
    return None if p is None else (p.node, sorted(v.name for v in p.victims), p.pdb_violations)


def test_a_gang_member_victim_takes_its_whole_gang_on_every_node() -> None:
    nodes = [make_node("n0", cpu="2"), make_node("n1", cpu="2")]
    placed = [(low("g-0", "2", 1), "n0"), (low("g-1", "2", 1), "n1")]
    got = run(nodes, placed, high("2"), gang_inputs(placed, {"default/g": ["g-0", "g-1"]}))
    assert got is not None
    assert sorted(v.name for v in got.victims) == ["g-0", "g-1"]
    # The same pods without the gang: one victim is enough.
    alone = run(nodes, placed, high("2"), Inputs())
    assert alone is not None
    assert len(alone.victims) == 1


def test_a_gang_with_a_member_of_equal_or_higher_priority_is_no_victim() -> None:
    nodes = [make_node("n0", cpu="2"), make_node("n1", cpu="2")]
    placed = [(low("g-0", "2", 1), "n0"), (low("g-1", "2", 100), "n1")]
    inputs = gang_inputs(placed, {"default/g": ["g-0", "g-1"]})
    assert run(nodes, placed, high("2"), inputs) is None
    snapshot = cluster(nodes, placed)
    decision = FRAMEWORK.schedule(snapshot, high("2"))
    assert "No preemption victims found" in no_preemption_message(
        FRAMEWORK, snapshot, decision, inputs
    )


def test_a_single_pod_is_preferred_to_a_gang_of_the_same_priority() -> None:
    nodes = [make_node(f"n{i}", cpu="2") for i in range(3)]
    placed = [(low("g-0", "2", 1), "n0"), (low("g-1", "2", 1), "n1"), (low("s", "2", 1), "n2")]
    got = run(nodes, placed, high("2"), gang_inputs(placed, {"default/g": ["g-0", "g-1"]}))
    assert summary(got) == ("n2", ["s"], 0)


def test_the_gang_is_reprieved_as_one_unit_by_its_highest_priority() -> None:
    # n0 holds two members of a gang (priorities 1 and 5) and a single pod of priority 3;
    # one cpu must be freed. The gang's unit ranks by its highest member (5), so it is put
    # back first and the single pod goes; split up, the priority-1 member would go.
    nodes = [make_node("n0", cpu="3")]
    placed = [(low("g-0", "1", 1), "n0"), (low("g-1", "1", 5), "n0"), (low("s", "1", 3), "n0")]
    inputs = gang_inputs(placed, {"default/g": ["g-0", "g-1"]})
    assert summary(run(nodes, placed, high("1"), inputs)) == ("n0", ["s"], 0)
    assert summary(run(nodes, placed, high("1"), Inputs())) == ("n0", ["g-0"], 0)


def test_when_a_gang_must_go_all_its_members_go_with_it() -> None:
    # Only the gang's room on n0 helps: both members on n0 and the one on n1 are victims.
    nodes = [make_node("n0", cpu="2"), make_node("n1", cpu="4")]
    placed = [
        (low("g-0", "1", 1), "n0"),
        (low("g-1", "1", 1), "n0"),
        (low("g-2", "1", 1), "n1"),
        (low("big", "3", 200), "n1"),
    ]
    inputs = gang_inputs(placed, {"default/g": ["g-0", "g-1", "g-2"]})
    assert summary(run(nodes, placed, high("2"), inputs)) == ("n0", ["g-0", "g-1", "g-2"], 0)


def test_budgets_are_spent_for_every_member_of_the_gang() -> None:
    # The budget allows one disruption and selects both members: evicting the gang
    # violates it once, so the single pod of higher priority on n1 is chosen instead.
    nodes = [make_node("n0", cpu="2"), make_node("n1", cpu="2"), make_node("n2", cpu="2")]
    placed = [
        (low("g-0", "2", 1, job="g"), "n0"),
        (low("g-1", "2", 1, job="g"), "n2"),
        (low("s", "2", 5), "n1"),
    ]
    budget = PodDisruptionBudget.from_api(
        {
            "metadata": {"name": "b", "namespace": "default"},
            "spec": {"selector": {"matchLabels": {"job": "g"}}},
            "status": {"disruptionsAllowed": 1},
        }
    )
    base = gang_inputs(placed, {"default/g": ["g-0", "g-1"]})
    guarded = Inputs(pdbs=[budget], gangs=base.gangs, gang_members=base.gang_members)
    assert summary(run(nodes, placed, high("2"), guarded)) == ("n1", ["s"], 0)
    assert summary(run(nodes, placed, high("2"), base))[0] in ("n0", "n2")  # type: ignore[index]


@pytest.mark.parametrize("older", ["g", "s"])
def test_a_gangs_start_is_its_earliest_members(older: str) -> None:
    # Equal priorities, counts and sums are made equal by two singles vs a gang of two;
    # then kube's last criterion prefers the candidate whose top victims started latest.
    nodes = [make_node("n0", cpu="2"), make_node("n1", cpu="2")]
    placed = [
        (low("g-0", "1", 1), "n0"),
        (low("g-1", "1", 1), "n0"),
        (low("s-0", "1", 1), "n1"),
        (low("s-1", "1", 1), "n1"),
    ]
    early, late = PodFacts(start_time=100.0), PodFacts(start_time=200.0)
    base = gang_inputs(placed, {"default/g": ["g-0", "g-1"]})
    facts = {
        "g-0": early if older == "g" else late,
        "g-1": late,
        "s-0": late if older == "g" else early,
        "s-1": late,
    }
    inputs = Inputs(facts=facts, gangs=base.gangs, gang_members=base.gang_members)
    got = run(nodes, placed, high("2"), inputs)
    assert got is not None
    assert got.node == ("n1" if older == "g" else "n0")


def test_a_gang_member_terminating_elsewhere_still_counts_in_its_unit() -> None:
    # A member missing from gang_members (the mapping lags the snapshot) is still evicted.
    nodes = [make_node("n0", cpu="2")]
    placed = [(low("g-0", "2", 1), "n0")]
    inputs = Inputs(gangs={"g-0": "default/g"}, gang_members={"default/g": ()})
    assert summary(run(nodes, placed, high("2"), inputs)) == ("n0", ["g-0"], 0)
